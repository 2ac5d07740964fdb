"""The gradient method (sec. 5.2, 5.4): exact cases, unbiasedness, a non-conjugate target."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_fit
from helpers import family_rel_err, tiered
from scipy import optimize

import jaxvb
from jaxvb.methods.gradient import MEAN_CHOLESKY, Parameterization, gradient

KEY = jax.random.key(20130917)


# A user-written parameterisation (sec. 5.4): the logs of the usual Gamma parameters.
LOG_GAMMA = Parameterization(
    to_params=lambda q: jnp.log(jnp.concatenate([q.concentration, q.rate])),
    from_params=lambda q, phi: jaxvb.Gamma(*jnp.split(jnp.exp(phi), 2)),
)

# target p, the q at which the statistics are estimated (also q0 of the fits), phi
SAME_FAMILY = {
    "gaussian": (
        jaxvb.Gaussian(jnp.array([1.0, -2.0]), jnp.array([[2.0, 0.6], [0.6, 0.5]])),
        jaxvb.Gaussian(jnp.array([0.3, 0.1]), jnp.array([[1.0, 0.3], [0.3, 0.8]])),
        None,
    ),
    "gaussian_mean_cholesky": (
        jaxvb.Gaussian(jnp.array([1.0, -2.0]), jnp.array([[2.0, 0.6], [0.6, 0.5]])),
        jaxvb.Gaussian(jnp.array([0.3, 0.1]), jnp.array([[1.0, 0.3], [0.3, 0.8]])),
        MEAN_CHOLESKY,
    ),
    # concentrations below 1 take jax.random.gamma's boosted branch
    "gamma": (jaxvb.Gamma(3.5, 0.7), jaxvb.Gamma(jnp.array([0.6]), jnp.array([1.3])), None),
    "gamma_log": (
        jaxvb.Gamma(3.5, 0.7),
        jaxvb.Gamma(jnp.array([0.6]), jnp.array([1.3])),
        LOG_GAMMA,
    ),
    "beta": (jaxvb.Beta(2.0, 7.0), jaxvb.Beta(jnp.array([0.7]), jnp.array([1.5])), None),
    "inverse_gamma": (
        jaxvb.InverseGamma(4.0, 3.0),
        jaxvb.InverseGamma(jnp.array([2.5]), jnp.array([1.0])),
        None,
    ),
    "exponential": (
        jaxvb.Exponential(jnp.array([1.0, 3.0])),
        jaxvb.Exponential(jnp.array([1.5, 2.0])),
        None,
    ),
}


def same_family_log_joint(name, x):
    return SAME_FAMILY[name][0].log_prob(x) + 3.0  # unnormalised


@pytest.mark.parametrize(
    "name", tiered(sorted(SAME_FAMILY), slow=["beta", "inverse_gamma"])
)
def test_one_draw_statistics_are_exact_and_unbiased(name):
    """Eq. grad per draw: ``g^ = C^ eta_p`` when p is in the family, and
    ``E[C^] = d/dphi E_q[T]`` (eq. reggrad1, grad2): this checks the derivatives of
    the samplers, including the implicit ones of jax.random.gamma and beta."""
    target, q, param = SAME_FAMILY[name]
    method = gradient(param)
    log_joint = functools.partial(same_family_log_joint, name)
    n = 4000

    @jax.jit
    def draws(keys):
        def one(k):
            stats, x, log_p = method.estimate(method.noise(k, q), q, log_joint)
            return stats, log_p - log_joint(x)

        return jax.vmap(one)(keys), method.init(KEY, q, log_joint).C

    (stats, log_p_err), c_1 = draws(jax.random.split(KEY, n))
    assert stats.C.shape == (n, q.num_stats, q.num_stats)
    assert bool(jnp.all(jnp.isfinite(stats.C))) and bool(jnp.all(jnp.isfinite(stats.g)))
    assert float(jnp.max(jnp.abs(log_p_err))) == 0.0
    # C^ = (dx/dphi)' (dT/dx)' has rank dim(x); min_draws draws together have full rank.
    d, k, m = math.prod(q.event_shape), q.num_stats, method.min_draws(q)
    assert max(np.linalg.matrix_rank(c) for c in np.asarray(stats.C[:20])) == min(d, k)
    assert np.linalg.matrix_rank(np.asarray(stats.C[:m].sum(0))) == k
    # log p - log q is constant in x, so its derivative vanishes draw by draw.
    predicted = jnp.einsum("nij,j->ni", stats.C, target.natural_params)
    scale = jnp.max(jnp.abs(stats.C), axis=(1, 2)) * jnp.max(jnp.abs(target.natural_params))
    assert float(jnp.max(jnp.abs(stats.g - predicted) / scale[:, None])) <= 1e-12
    # init's C_1 is the exact expectation; the mean of n draws is within 5 standard
    # errors of it entrywise (about 100 entries in all: a false alarm ~1e-4 per run).
    # Some entries do not depend on z (e.g. dx/dm = 1); those must match to rounding.
    mean = np.asarray(stats.C.mean(0))
    stderr = np.asarray(stats.C.std(0)) / math.sqrt(n)
    tol = 5 * stderr + 1e-12 * np.max(np.abs(c_1))
    assert np.all(np.abs(mean - np.asarray(c_1)) <= tol)


@pytest.mark.parametrize(
    "name",
    tiered(
        ["gaussian", "gaussian_mean_cholesky", "gamma", "beta"],
        slow=["gaussian_mean_cholesky", "gamma", "beta"],
    ),
)
def test_same_family_target_is_recovered_exactly(name):
    target, _, param = SAME_FAMILY[name]
    q0 = {
        jaxvb.Gaussian: jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
        jaxvb.Gamma: jaxvb.Gamma(1.0, 1.0),
        jaxvb.Beta: jaxvb.Beta(1.0, 1.0),
    }[type(target)]
    # test_fit's log joint, the target traced, and 60 steps: test_float32's float64
    # Gaussian by this method is the same program
    log_joint = test_fit.shifted(target, 3.0)
    res = jaxvb.fit(log_joint, q0, KEY, num_steps=60, method=gradient(param))
    assert bool(res.ok)
    assert type(res.q) is type(q0)
    assert family_rel_err(res.q, target) <= 1e-8
    assert float(res.r_squared) >= 1 - 1e-10
    assert float(res.log_evidence) == pytest.approx(3.0, abs=1e-8)


def test_arguments_are_checked():
    log_joint = functools.partial(same_family_log_joint, "gamma")
    with pytest.raises(TypeError, match="pair of functions"):
        gradient(parameterization=lambda q: q)
    with pytest.raises(TypeError, match="MEAN_CHOLESKY parameterization is for"):
        jaxvb.fit(
            log_joint,
            jaxvb.Gamma(1.0, 1.0),
            KEY,
            num_steps=4,
            method=gradient(MEAN_CHOLESKY),
        )
    too_few = Parameterization(lambda q: q.mean.ravel(), lambda q, phi: q)
    with pytest.raises(ValueError, match="as many as its natural parameters"):
        jaxvb.fit(
            log_joint, jaxvb.Gamma(1.0, 1.0), KEY, num_steps=4, method=gradient(too_few)
        )
    assert gradient() is gradient()  # cached: one compile per method, as for fit's jit
    # A draw's C^ has rank dim(x): ceil(k / dim(x)) draws make the average solvable.
    assert gradient().min_draws(jaxvb.Gamma(1.0, 1.0)) == 2
    assert gradient().min_draws(jaxvb.Exponential(jnp.ones(3))) == 1
    assert gradient().min_draws(jaxvb.Gaussian(jnp.zeros(3), jnp.eye(3))) == 3
    with pytest.raises(ValueError, match="num_steps >= 4"):
        jaxvb.fit(log_joint, jaxvb.Gamma(1.0, 1.0), KEY, num_steps=2, method=gradient())


# --- a non-conjugate target ----------------------------------------------------------------


def quartic(x):
    """p(x) ∝ exp(-x^4 / 4 + x): skewed, lighter tails than any Gaussian."""
    return -0.25 * x[0] ** 4 + x[0]


@functools.cache
def quadrature_optimum():
    """The KL-optimal Gaussian ``(m, v)``: maximise the ELBO by Gauss-Hermite quadrature."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)  # exact for degree 4
    weights = weights / weights.sum()

    def neg_elbo(params):
        m, log_s = params
        return -(weights @ quartic([m + math.exp(log_s) * nodes]) + log_s)

    opt = optimize.minimize(
        neg_elbo,
        [0.5, -0.5],
        method="Nelder-Mead",
        options={"xatol": 1e-12, "fatol": 1e-14, "maxiter": 4000},
    )
    m, v = opt.x[0], math.exp(2 * opt.x[1])
    # For this target the stationarity conditions are polynomial: check them.
    assert abs(m**3 + 3 * m * v - 1) < 1e-6 and abs(3 * v * (m**2 + v) - 1) < 1e-6
    return m, v


NUM_KEYS = 256


@functools.cache
def quartic_fits(method):
    """Fitted ``(mean, variance)`` over NUM_KEYS keys, 400 steps of 16 draws each."""
    q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
    run = jax.jit(
        jax.vmap(
            lambda k: jaxvb.fit(
                quartic,
                q0,
                k,
                num_steps=400,
                num_draws=16,
                method=method,
                num_eval_draws=100,
            )
        )
    )
    res = run(jax.random.split(KEY, NUM_KEYS))
    # Every fit settles and fits; k-hat from 100 diagnostic draws is noisy, and a
    # Gaussian q leaves this target's R^2 at ~0.6 (Var[log p - log q] past HIGH_KHAT's
    # 0.5), so a few fits flag HIGH_KHAT at k-hat 0.72-0.91 (2 of 256 each here)
    status = np.asarray(res.status)
    assert np.all((status == 0) | (status == int(jaxvb.Status.HIGH_KHAT)))
    assert np.mean(status != 0) <= 0.02
    return np.asarray(res.q.mean[:, 0]), np.asarray(res.q.cov[:, 0, 0])


# 2 x 256 fits of 400 steps x 16 draws, shared by the next two tests on one worker.
quartic_group = pytest.mark.xdist_group("quartic_fits")


@pytest.mark.slow
@quartic_group
def test_quartic_agrees_with_algorithm_1_and_quadrature():
    """Monte Carlo tolerance: 5 standard errors of the mean of 16 fits, the standard
    error estimated from their spread (a t with 15 degrees of freedom exceeds 5 with
    probability 2e-4). Constant-step averaging also has a bias of order w / num_draws;
    over 2048 keys at these settings it is at most 0.33 standard deviations of a single
    fit (1.3 standard errors here: Algorithm 1's variance), inside the tolerance."""
    ref = quadrature_optimum()
    grad = quartic_fits(gradient())
    reg = quartic_fits("regression")
    for g, r, true in zip(grad, reg, ref, strict=True):
        g, r = g[:16], r[:16]
        se_g, se_r = g.std(ddof=1) / 4, r.std(ddof=1) / 4
        assert abs(g.mean() - true) <= 5 * se_g
        assert abs(r.mean() - true) <= 5 * se_r
        assert abs(g.mean() - r.mean()) <= 5 * math.hypot(se_g, se_r)


@pytest.mark.slow
@quartic_group
def test_quartic_gradient_is_more_efficient_than_algorithm_1():
    """Sec. 5.2: one draw with gradients is worth about 2 dim(x) = 2 plain draws, so the
    spread of the fitted mean should shrink by about sqrt(2) at equal steps and draws.
    Measured over 8 groups of 256 keys: ratio 1.23 to 1.49 for the mean, 1.97 to 2.3 for
    the variance; 256 keys resolve the ratio to about 6%."""
    grad_mean, grad_var = quartic_fits(gradient())
    reg_mean, reg_var = quartic_fits("regression")
    assert reg_mean.std() >= 1.15 * grad_mean.std()
    assert reg_var.std() >= 1.6 * grad_var.std()


@pytest.mark.slow
def test_vmap_over_keys_keeps_float32():
    target = jaxvb.Gaussian(
        jnp.array([1.0, -2.0], jnp.float32),
        jnp.array([[2.0, 0.6], [0.6, 0.5]], jnp.float32),
    )
    q0 = jaxvb.Gaussian(jnp.zeros(2, jnp.float32), jnp.eye(2, dtype=jnp.float32))
    run = jax.vmap(
        lambda k: jaxvb.fit(
            target.log_prob, q0, k, num_steps=20, method=gradient(), num_eval_draws=100
        )
    )
    res = run(jax.random.split(KEY, 4))
    for leaf in jax.tree_util.tree_leaves((res.q, res.elbo, res.r_squared)):
        assert leaf.dtype == jnp.float32
    assert res.q.cov.shape == (4, 2, 2)
    assert np.all(np.asarray(res.status) == 0)
    np.testing.assert_allclose(res.q.mean, np.broadcast_to(target.mean, (4, 2)), rtol=1e-4)
    np.testing.assert_allclose(res.q.cov, np.broadcast_to(target.cov, (4, 2, 2)), rtol=1e-4)
