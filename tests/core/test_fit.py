"""The engine: Algorithm 1 through ``jaxvb.fit``, its exact cases, jit/vmap, options."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import family_rel_err, rel_err, tiered

import jaxvb
from jaxvb.models import conjugate

KEY = jax.random.key(20130917)


# --- the exponential toy of section 3.1 ------------------------------------------------


def exponential_target(x):
    return jnp.log(2.0) - 2.0 * x


@pytest.mark.parametrize("intercept", tiered(["normalized", "estimate"], slow=["estimate"]))
@pytest.mark.slow
def test_exponential_toy_exact_in_four_iterations(intercept):
    """Paper, sec. 3.1: q and p of one family -> exact in 2(k + 1) = 4 iterations."""
    method = jaxvb.methods.regression(init="identity", intercept=intercept)
    keys = jax.random.split(KEY, 200)
    run = jax.jit(
        jax.vmap(
            lambda k: jaxvb.fit(
                exponential_target, jaxvb.Exponential(1.0), k, num_steps=4, method=method
            )
        )
    )
    res = run(keys)
    ok = np.asarray(res.ok)
    assert ok.all()
    err = np.abs(np.asarray(res.q.rate) - 2.0) / 2.0
    # Exact up to the conditioning of a regression on two draws: when the two draws of
    # the second half nearly coincide, rounding grows like 1 / (x1 - x2)^2 (1 key in
    # 200 here reaches 1e-10).
    assert np.quantile(err, 0.99) <= 1e-10
    assert err.max() <= 1e-8
    one = int(np.argmax(ok))  # one of the fits, read off the batch
    assert rel_err(res.q.rate[one], 2.0) <= 1e-10
    assert float(res.r_squared[one]) == pytest.approx(1.0, abs=1e-12)
    assert float(res.log_evidence[one]) == pytest.approx(0.0, abs=1e-10)  # p is normalised


# --- targets of the approximating family: exact -----------------------------------------

SAME_FAMILY = {
    "exponential": (
        jaxvb.Exponential(jnp.array([1.0, 3.0])),
        jaxvb.Exponential(jnp.ones(2)),
    ),
    "gamma": (jaxvb.Gamma(3.5, 0.7), jaxvb.Gamma(1.0, 1.0)),
    "inverse_gamma": (jaxvb.InverseGamma(4.0, 3.0), jaxvb.InverseGamma(2.0, 1.0)),
    "beta": (jaxvb.Beta(2.0, 7.0), jaxvb.Beta(1.0, 1.0)),
    "gaussian": (
        jaxvb.Gaussian(jnp.array([1.0, -2.0]), jnp.array([[2.0, 0.6], [0.6, 0.5]])),
        jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
    ),
}


def shifted_log_prob(target, offset, x):
    return target.log_prob(x) + offset


def shifted(target, offset=3.0):
    """``log p = target.log_prob + offset``, unnormalised: its log evidence is
    ``offset``. A ``Partial`` of one module-level function with the family traced, so
    that fits of one family structure, dtype and settings share a compiled program
    (test_float32 and test_gradient fit these targets through it too)."""
    return jax.tree_util.Partial(shifted_log_prob, target, offset)


@pytest.mark.parametrize(
    "name",
    tiered(sorted(SAME_FAMILY), slow=["beta", "exponential", "gamma", "inverse_gamma"]),
)
def test_same_family_target_is_recovered_exactly(name):
    target, q0 = SAME_FAMILY[name]
    offset = 3.0  # an unnormalised target: the offset is the log evidence
    res = jaxvb.fit(shifted(target, offset), q0, KEY, num_steps=60)
    # From a poor start the first updates may be improper (flagged, and skipped by the
    # sampler); the averaged second half is still exact.
    assert bool(res.ok)
    assert type(res.q) is type(q0)
    assert family_rel_err(res.q, target) <= 1e-8
    assert float(res.r_squared) >= 1 - 1e-10
    assert float(res.kl) <= 1e-12
    assert float(res.log_evidence) == pytest.approx(offset, abs=1e-8)


# --- conjugate models: exact posterior and evidence --------------------------------------

COUNTS = np.array([3.0, 0.0, 5.0, 2.0, 4.0, 1.0])


def poisson_log_joint(x, counts):
    return conjugate.gamma_poisson(counts, 2.0, 0.5).log_joint(x)


def _gamma_poisson():
    """The gamma-Poisson model, its log joint a ``Partial`` of ``poisson_log_joint``
    (the same function as the model's own): the loop of
    test_vmap_over_data_and_keys_equals_loop fits data of this shape with the same
    program."""
    model = conjugate.gamma_poisson(jnp.asarray(COUNTS), 2.0, 0.5)
    log_joint = jax.tree_util.Partial(poisson_log_joint, counts=jnp.asarray(COUNTS))
    return model._replace(log_joint=log_joint), jaxvb.Gamma(jnp.ones(1), jnp.ones(1))


# Builders, not models: each solves its posterior and evidence when a test asks for it,
# not when the module is collected (by every xdist worker; ~3.7 s).
CONJUGATE = {
    "gamma_poisson": _gamma_poisson,
    "beta_binomial": lambda: (
        conjugate.beta_binomial(7, 20, 2.0, 3.0),
        jaxvb.Beta(jnp.ones(1), jnp.ones(1)),
    ),
    "gaussian_linear": lambda: (
        conjugate.gaussian_linear(
            np.random.default_rng(0).normal(size=(30, 3)),
            np.random.default_rng(1).normal(size=30),
            noise_sd=0.8,
            prior_sd=2.0,
        ),
        jaxvb.Gaussian(jnp.zeros(3), jnp.eye(3)),
    ),
}


@pytest.mark.parametrize(
    "name", tiered(sorted(CONJUGATE), slow=["beta_binomial", "gamma_poisson"])
)
def test_conjugate_posterior_and_evidence_exact(name):
    model, q0 = CONJUGATE[name]()
    res = jaxvb.fit(model.log_joint, q0, KEY, num_steps=100)
    assert bool(res.ok)
    assert family_rel_err(res.q, model.posterior) <= 1e-8
    assert abs(float(res.log_evidence) - float(model.log_evidence)) <= 1e-6
    assert abs(float(res.elbo) - float(model.log_evidence)) <= 1e-6
    assert float(res.r_squared) == pytest.approx(1.0, abs=1e-10)


# --- a non-conjugate target against quadrature -------------------------------------------


def quartic(x):
    """p(x) ∝ exp(-x^4 / 4 + x): skewed, lighter tails than any Gaussian."""
    return -0.25 * x[0] ** 4 + x[0]


@pytest.mark.slow
def test_gaussian_fit_matches_quadrature_optimum():
    """The fitted Gaussian is the KL-optimal one, computed here by quadrature."""
    from scipy import integrate, optimize

    def neg_elbo(params):
        m, log_s = params
        s = math.exp(log_s)
        nodes, weights = np.polynomial.hermite_e.hermegauss(80)
        x = m + s * nodes
        e_log_p = np.sum(weights * (-0.25 * x**4 + x)) / math.sqrt(2 * math.pi)
        return -(e_log_p + log_s + 0.5 * math.log(2 * math.pi * math.e))

    opt = optimize.minimize(
        neg_elbo,
        [0.5, -0.5],
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000},
    )
    m_ref, s_ref = opt.x[0], math.exp(opt.x[1])
    log_z = math.log(integrate.quad(lambda x: math.exp(-0.25 * x**4 + x), -10, 10)[0])

    res = jaxvb.fit(
        quartic,
        jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1)),
        KEY,
        num_steps=4000,
        num_draws=8,
        num_eval_draws=20000,
    )
    assert int(res.status) == 0
    # Monte Carlo error of the averaged regression: a few 1e-3 here (checked over keys).
    assert float(res.q.mean[0]) == pytest.approx(m_ref, abs=0.01)
    assert math.sqrt(float(res.q.cov[0, 0])) == pytest.approx(s_ref, rel=0.01)
    # ELBO of the fitted q: its MC estimate against quadrature, within 5 standard errors.
    elbo_ref = -neg_elbo([float(res.q.mean[0]), 0.5 * math.log(float(res.q.cov[0, 0]))])
    assert abs(float(res.elbo) - elbo_ref) < 5 * float(res.elbo_stderr)
    # The ELBO is a lower bound; the corrected estimate (eq. 17) is closer to log p(y).
    assert float(res.elbo) < log_z
    assert abs(float(res.log_evidence) - log_z) < abs(float(res.elbo) - log_z)
    # R^2 of the fitted q by Gauss-Hermite quadrature (section 4's definition).
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    weights = weights / weights.sum()
    m, s = float(res.q.mean[0]), math.sqrt(float(res.q.cov[0, 0]))
    x = m + s * nodes
    log_p = -0.25 * x**4 + x
    log_q = -0.5 * nodes**2 - math.log(s * math.sqrt(2 * math.pi))

    def var(v):
        return float(weights @ (v - weights @ v) ** 2)

    r2_ref = 1.0 - var(log_p - log_q) / var(log_p)
    assert float(res.r_squared) == pytest.approx(r2_ref, abs=0.03)  # MC error ~0.01


@pytest.mark.slow
def test_beta_binomial_single_gaussian_matches_paper():
    """Section 6.2.1: the authors' single-Gaussian fit and its R^2 of 0.82."""
    from jaxvb.models import beta_binomial as bb

    res = jaxvb.fit(
        bb.cancer_mortality_log_joint(),
        jaxvb.Gaussian(jnp.array([-7.0, 6.0]), jnp.eye(2)),
        KEY,
        num_steps=4000,
        num_draws=10,
        num_eval_draws=20000,
    )
    assert int(res.status) == 0
    np.testing.assert_allclose(res.q.mean, bb.PAPER_GAUSSIAN_MEAN, atol=0.05)
    np.testing.assert_allclose(res.q.precision, bb.PAPER_GAUSSIAN_PRECISION, rtol=0.1)
    assert float(res.r_squared) == pytest.approx(0.82, abs=0.04)


# --- jit, vmap, determinism, options ------------------------------------------------------


@pytest.mark.slow
def test_vmap_over_data_and_keys_equals_loop():
    counts = jnp.array(np.random.default_rng(3).poisson(3.0, size=(5, COUNTS.size)), float)
    keys = jax.random.split(KEY, 5)
    q0 = jaxvb.Gamma(jnp.ones(1), jnp.ones(1))

    def one(c, k):  # the data traced: one program for the loop's five fits
        return jaxvb.fit(
            jax.tree_util.Partial(poisson_log_joint, counts=c), q0, k, num_steps=100
        )

    batched = jax.vmap(one)(counts, keys)
    for i in range(5):
        single = one(counts[i], keys[i])
        np.testing.assert_allclose(
            batched.q.concentration[i], single.q.concentration, rtol=1e-10
        )
        np.testing.assert_allclose(batched.elbo[i], single.elbo, rtol=1e-10)
        exact = conjugate.gamma_poisson(counts[i], 2.0, 0.5).posterior
        assert family_rel_err(single.q, exact) <= 1e-8


def gamma_4_2(z):
    """A Gamma(4, 2) posterior, unnormalised."""
    return 3.0 * jnp.log(z[0]) - 2.0 * z[0]


@pytest.mark.slow
def test_vmap_over_start_points():
    """Batched plain start points (Laplace first): the status flags combine per fit.

    Regression test: the Laplace flag was an int64 OR'd eagerly into the int32 status,
    which segfaults jaxlib 0.10.2 for batched arrays.
    """
    keys = jax.random.split(KEY, 3)
    x0 = jnp.array([[0.5], [1.0], [2.0]])

    def one(x, k):  # the Gaussian starts at the Laplace fit
        return jaxvb.fit(gamma_4_2, x, k, num_steps=40)

    res = jax.vmap(one)(x0, keys)
    assert res.status.dtype == jnp.int32 and res.status.shape == (3,)
    one_jit = jax.jit(one)
    for i in range(3):
        single = one_jit(x0[i], keys[i])
        np.testing.assert_allclose(res.q.mean[i], single.q.mean, rtol=1e-10)
        assert int(res.status[i]) == int(single.status)


@pytest.mark.slow
def test_same_key_same_result_bit_for_bit_and_jit_equals_eager():
    q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
    a = jaxvb.fit(quartic, q0, KEY, num_steps=300)
    b = jaxvb.fit(quartic, q0, KEY, num_steps=300)
    c = jax.jit(lambda k: jaxvb.fit(quartic, q0, k, num_steps=300))(KEY)
    for u, v in zip(
        jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True
    ):
        np.testing.assert_array_equal(u, v)
    np.testing.assert_allclose(a.q.mean, c.q.mean, rtol=1e-12)
    d = jaxvb.fit(quartic, q0, jax.random.key(1), num_steps=300)
    assert float(d.q.mean[0]) != float(a.q.mean[0])


@pytest.mark.parametrize("antithetic", tiered([False, True], slow=[True]))
def test_several_draws_and_antithetic_pairs(antithetic):
    target, q0 = SAME_FAMILY["gaussian"]
    res = jaxvb.fit(
        target.log_prob,
        q0,
        KEY,
        num_steps=10,
        num_draws=3,
        antithetic=antithetic,
        trace=True,
    )
    assert family_rel_err(res.q, target) <= 1e-8
    assert res.trace.natural_params.shape == (10, q0.num_stats)
    assert res.trace.proper.shape == (10,)


@pytest.mark.slow
def test_weaker_estimators_run_and_are_noisier():
    """Section 3.1: 'different randomness' and 'analytic C' are far noisier."""
    keys = jax.random.split(KEY, 32)

    def rates(estimator):
        m = jaxvb.methods.regression(estimator=estimator, init="identity")
        run = jax.vmap(
            lambda k: (
                jaxvb.fit(
                    exponential_target, jaxvb.Exponential(1.0), k, num_steps=100, method=m
                ).q.rate
            )
        )
        return np.asarray(run(keys))

    joint = rates("joint")
    np.testing.assert_allclose(joint, 2.0, rtol=1e-10)
    for name in ("independent", "analytic"):
        r = rates(name)
        assert np.all(np.isfinite(r)) and r.std() > 1e-3


@pytest.mark.slow
def test_float32_is_kept():
    target = jaxvb.Gaussian(
        jnp.array([1.0, -1.0], jnp.float32),
        jnp.array([[1.0, 0.3], [0.3, 0.5]], jnp.float32),
    )
    q0 = jaxvb.Gaussian(jnp.zeros(2, jnp.float32), jnp.eye(2, dtype=jnp.float32))
    # (test_float32's float32 Gaussian by Algorithm 2 is this program: one compilation)
    res = jaxvb.fit(shifted(target), q0, KEY, num_steps=60)
    for leaf in jax.tree_util.tree_leaves(res.q):
        assert leaf.dtype == jnp.float32
    assert res.elbo.dtype == jnp.float32
    np.testing.assert_allclose(res.q.mean, target.mean, atol=1e-3)
    np.testing.assert_allclose(res.q.cov, target.cov, atol=1e-3)


@pytest.mark.slow
def test_gaussian_closed_form_moments_equal_the_log_normalizer_derivatives():
    """The Gaussian's Isserlis moments agree with d/deta and d^2/deta^2 of U."""
    from jaxvb.families._base import ExponentialFamily

    a = np.random.default_rng(0).normal(size=(3, 3))
    q = jaxvb.Gaussian(jnp.array([1.0, -2.0, 0.5]), jnp.array(a @ a.T + np.eye(3)))

    @jax.jit  # one program, not one per operation
    def moments(q):
        closed = q.mean_sufficient_stats, q.fisher_information
        generic = (
            ExponentialFamily.mean_sufficient_stats.fget(q),
            ExponentialFamily.fisher_information.fget(q),
        )
        return closed, generic

    (mean, fisher), (generic_mean, generic_fisher) = moments(q)
    np.testing.assert_allclose(mean, generic_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fisher, generic_fisher, rtol=1e-12, atol=1e-12)
