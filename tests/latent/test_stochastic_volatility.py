"""The stochastic-volatility model of section 6.1 and the hierarchical composite.

The fit compiles for ~30-50 s on CPU (once per series length), so the default run has
one fit: the paper's, on the shipped 945-point series, checked against the stored
NumPyro NUTS reference (``tests/data/sv_nuts.json``, 4 x 10000 draws). Fits of other
series, a fresh NUTS run and the T = 10^5 run are behind ``JAXVB_SLOW=1``.
"""

import dataclasses
import importlib
import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxvb
from jaxvb import linalg
from jaxvb.models import stochastic_volatility as sv


def slow(test):
    """Beyond the full suite's budget: run only with ``JAXVB_SLOW=1``."""
    skip = pytest.mark.skipif(
        os.environ.get("JAXVB_SLOW") != "1",
        reason="compiles another fit or runs NUTS (~30-60 s each); set JAXVB_SLOW=1",
    )
    return pytest.mark.slow(skip(test))


TRUE = {"phi": 0.95, "s2": 0.05, "beta": 0.7}
NUTS = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "sv_nuts.json").read_text()
)


# The paper's fit (~1-2 min with its compilation) once, on one worker.
gbpusd_group = pytest.mark.xdist_group("sv_gbpusd")


@pytest.fixture(scope="module")
def gbpusd_fit():
    return sv.fit(jaxvb.data.sv_gbpusd(), jax.random.key(0))


@pytest.mark.slow
@gbpusd_group
def test_paper_fit_agrees_with_nuts(gbpusd_fit):
    """The issue's accuracy targets: means within 0.1 NUTS sd, sds within 15%.

    Plus 4 Monte Carlo standard errors of the reference (sd / sqrt(ESS) for the mean,
    ~1 / sqrt(2 ESS) relative for the sd; ESS >= 2142) and of the 5000 draws of q.

    One fixed key: a regression check of the paper's fit, not a proof of the targets.
    Over keys the 250-step fit varies (benchmarks/stochastic_volatility.py: phi mean
    error +0.04..+0.16 sd over 10 keys; 2000-step fits settle at +0.08), so the
    benchmark, not this test, says whether the targets are met.
    """
    res = gbpusd_fit
    assert int(res.status) == 0, jaxvb.explain(res.result)
    assert float(res.r_squared) > 0.99
    n = 5000
    d = res.sample(jax.random.key(9), n)
    for k in ("phi", "s2", "beta"):
        ref = NUTS["params"][k]
        se = 4 * math.hypot(ref["mean_mc_error"], ref["sd"] / math.sqrt(n))
        assert abs(float(d[k].mean()) - ref["mean"]) <= 0.1 * ref["sd"] + se, k
        rel = 4 * math.hypot(1 / math.sqrt(2 * ref["ess"]), 1 / math.sqrt(2 * n))
        assert abs(float(d[k].std()) / ref["sd"] - 1) <= 0.15 + rel, k
    # Smoothed log-volatilities: within 0.25 NUTS sd at every one of the 945 days.
    v_mean = np.asarray(d["v"].mean(0))
    gap = np.abs(v_mean - np.asarray(NUTS["v"]["mean"])) / np.asarray(NUTS["v"]["sd"])
    assert gap.max() < 0.25, gap.max()


@pytest.fixture(scope="module")
def short_series():
    return sv.simulate(jax.random.key(0), 200, TRUE["phi"], TRUE["s2"], TRUE["beta"])


@pytest.fixture(scope="module")
def short_fit(short_series):
    return sv.fit(short_series, jax.random.key(1))


@pytest.mark.parametrize(
    "y, match",
    [
        (np.array([0.1, 0.0, -0.3, 0.2]), "zeros"),
        (np.array([0.1, np.nan, -0.3, 0.2]), "non-finite"),
        (np.array([0.1, np.inf, -0.3, 0.2]), "non-finite"),
        (np.array([0.1, -0.2]), "at least 3"),
        (np.ones((4, 2)), "1-D"),
        (np.array(["a", "b", "c"]), "real numbers"),
    ],
)
def test_bad_input_names_the_problem(y, match):
    with pytest.raises(ValueError, match=match):
        sv.fit(y, jax.random.key(0))


def _theta(phi, s2):
    return jnp.array([(phi + 1) / 2, s2])


@pytest.mark.slow
def test_rao_blackwellised_expectations_equal_monte_carlo():
    """E log p(y_t|eta_t), E d/deta_t and E d^2/deta_t^2 under q(f | theta), eta = v +
    2 log beta: the closed form (log-normal) vs 100k draws, and vs the Gauss-Hermite
    quadrature every jaxvb.LatentGaussian uses.

    Tolerance: 5 Monte Carlo standard errors per element (a false alarm about once in
    10^6 elements; there are ~100).
    """
    y = jnp.asarray(sv.simulate(jax.random.key(3), 30, 0.9, 0.1, 0.8))
    q = sv.initial_q(y)
    model = sv.model_structure(y)
    theta = _theta(0.9, 0.1)
    names = ("loglik", "grad", "hess")

    @jax.jit  # one program, not one per operation
    def expectations(q, model, theta):
        mean, factor, _ = q.gaussian.conditional(theta)
        cov = linalg.selected_inverse_arrowhead(factor)
        f = linalg.sample_arrowhead(jax.random.key(4), factor, mean, (100_000,))
        v, lb = f[:, :-1], f[:, -1:]
        e = y**2 * jnp.exp(-v - 2 * lb)
        draws = {
            "loglik": -0.5 * math.log(2 * math.pi) - lb - 0.5 * v - 0.5 * e,
            "grad": 0.5 * e - 0.5,
            "hess": -0.5 * e,
        }
        eta_mean = mean[:-1] + 2 * mean[-1]
        eta_var = cov.band[0] + 4 * cov.border[:, 0] + 4 * cov.corner[0, 0]
        exact = model.site_expectations(eta_mean, eta_var, theta)
        quadrature = jaxvb.LatentGaussian.site_expectations(model, eta_mean, eta_var, theta)
        moments = {
            k: (jnp.mean(d, 0), jnp.std(d, 0) / math.sqrt(d.shape[0]))
            for k, d in draws.items()
        }
        return moments, dict(zip(names, exact, strict=True)), quadrature

    moments, exact, quadrature = expectations(q, model, theta)
    for name, (mean, se) in moments.items():
        z = np.abs(np.asarray(mean) - np.asarray(exact[name])) / np.asarray(se)
        assert float(np.max(z)) < 5.0, name
    for name, value in zip(names, quadrature, strict=True):
        np.testing.assert_allclose(value, exact[name], rtol=1e-9, err_msg=name)


@pytest.mark.slow
def test_selected_moments_and_log_prob_match_dense():
    y = jnp.asarray(sv.simulate(jax.random.key(5), 6, 0.9, 0.1, 0.8))
    q = sv.initial_q(y)
    # A non-trivial q(s2 | phi): eta5 != 0.
    s2_block = q.scalars[1].from_natural(jnp.array([8.0, 0.3, 0.1]))
    q = type(q)(scalars=(q.scalars[0], s2_block), gaussian=q.gaussian)

    @jax.jit  # one program, not one per operation
    def evaluate(q):
        x = q.sample(jax.random.key(6))
        _, precision, shift = q.gaussian.precision_and_shift(x[:2])
        _, prior, log_norm = q.gaussian.model.prior_of_field(x[:2])
        dense = linalg.to_dense_arrowhead
        return (
            (x, dense(precision), shift, q.log_prob(x)),
            (dense(prior), log_norm, q.gaussian.log_marginal(x[:2])),
        )

    (x, p, shift, log_q), (prior, log_norm, log_marginal) = evaluate(q)
    x, p, eta_u = np.asarray(x), np.asarray(p), np.asarray(q.scalars[0].eta)
    u, s2, f = x[0], x[1], x[2:]
    phi = 2 * u - 1
    m = np.linalg.solve(p, np.asarray(shift))
    expected = (
        stats.beta(eta_u[0] + 1, eta_u[1] + 1).logpdf(u)
        + stats.invgamma(7.0, scale=0.3 + 0.1 * phi**2).logpdf(s2)
        + stats.multivariate_normal(m, np.linalg.inv(p)).logpdf(np.asarray(f))
    )
    # betaln and the dense inverse of an ill-conditioned precision limit the match.
    np.testing.assert_allclose(float(log_q), expected, rtol=0, atol=1e-7)
    # log q(y | theta) = log ∫ p(f|theta) q(y|f) df, against the dense formula (the
    # prior flat along log beta: its density's constant is the AR(1)'s)
    q_dense = np.asarray(prior)[:-1, :-1]
    t = y.shape[0]
    c = np.asarray(shift)
    dense = (
        0.5 * np.linalg.slogdet(q_dense)[1]
        + 0.5 * math.log(2 * math.pi)
        - 0.5 * np.linalg.slogdet(p)[1]
        + 0.5 * c @ np.linalg.solve(p, c)
    )
    np.testing.assert_allclose(float(log_marginal), dense, rtol=1e-10)
    np.testing.assert_allclose(
        float(2 * log_norm + t * math.log(2 * math.pi)),
        np.linalg.slogdet(q_dense)[1],
        rtol=1e-10,
    )


def test_log_joint_matches_scipy():
    y = sv.simulate(jax.random.key(7), 5, 0.9, 0.1, 0.8)
    u, s2, v, lb = 0.93, 0.07, np.linspace(-0.5, 0.5, 5), -0.2
    phi = 2 * u - 1
    expected = (
        stats.beta(20, 1.5).logpdf(u)
        + stats.invgamma(5, scale=0.25).logpdf(s2)
        + stats.norm(0, math.sqrt(s2 / (1 - phi**2))).logpdf(v[0])
        + np.sum(stats.norm(phi * v[:-1], math.sqrt(s2)).logpdf(v[1:]))
        + np.sum(stats.norm(0, np.exp(lb + v / 2)).logpdf(y))
    )
    x = jnp.concatenate([jnp.array([u, s2]), v, jnp.array([lb])])
    # jaxvb._special.betaln(20, 1.5) differs from scipy by 4e-8.
    np.testing.assert_allclose(float(sv.log_joint(x, y)), expected, rtol=0, atol=1e-7)
    assert float(sv.log_joint(x.at[0].set(1.2), y)) == -np.inf


@pytest.mark.slow
def test_sample_keys_shapes_and_determinism(short_series):
    y = jnp.asarray(short_series)
    q = sv.initial_q(y)
    zero = jnp.zeros(())
    res = sv.SVFit(jaxvb.Result(q, *(zero,) * (len(jaxvb.Result._fields) - 2), None))
    assert res.q is q and res.elbo is res.result.elbo
    d = res.sample(jax.random.key(0), 5)
    assert set(d) == {"phi", "s2", "beta", "v"}
    assert d["v"].shape == (5, 200)
    for k in ("phi", "s2", "beta"):
        assert d[k].shape == (5,)
    phi, s2, beta = (np.asarray(d[k]) for k in ("phi", "s2", "beta"))
    assert np.all((phi > -1) & (phi < 1) & (s2 > 0) & (beta > 0))
    again = res.sample(jax.random.key(0), 5)
    for k in d:
        np.testing.assert_array_equal(d[k], again[k])


@slow
def test_fit_on_simulated_series(short_fit):
    res = short_fit
    assert int(res.status) == 0
    for name in ("elbo", "log_evidence", "kl", "r_squared"):
        assert np.isfinite(float(getattr(res, name))), name
    assert float(res.r_squared) > 0.99
    d = res.sample(jax.random.key(2), 20_000)
    # The truth lies within 3 posterior sds (a loose sanity check, T = 200).
    for k, truth in TRUE.items():
        assert abs(float(d[k].mean()) - truth) < 3 * float(d[k].std()), k


@slow
def test_fit_agrees_with_nuts(short_series, short_fit):
    """Means within 0.3 NUTS sd, sds within 25%.

    Budget: the approximation gap the issue allows (0.1 sd, 15%) plus the Monte Carlo
    error of one 2000-draw NUTS chain (effective size >= 200 here: mean error <= 3 *
    sd / sqrt(200) = 0.21 sd; sd error ~ 3 / sqrt(2 * 200) = 15%).
    """
    ref = sv.nuts_reference(
        short_series, jax.random.key(8), num_warmup=1000, num_samples=2000, num_chains=1
    )
    d = short_fit.sample(jax.random.key(9), 50_000)
    for k in ("phi", "s2", "beta"):
        sd = ref[k].std()
        assert abs(float(d[k].mean()) - ref[k].mean()) < 0.3 * sd, k
        assert abs(float(d[k].std()) / sd - 1) < 0.25, k


@slow
@pytest.mark.parametrize("source", ["salimans_knowles", "ksc"])
def test_shipped_series(source):
    import jaxvb

    res = sv.fit(jaxvb.data.sv_gbpusd(source), jax.random.key(0))
    assert int(res.status) == 0
    assert np.isfinite(float(res.elbo)) and float(res.r_squared) > 0.99


@slow
def test_indirect_effects_agree_with_direct(short_series, short_fit):
    res = sv.fit(short_series, jax.random.key(1), indirect_effects=True)
    assert int(res.status) == 0
    a = short_fit.sample(jax.random.key(3), 20_000)
    b = res.sample(jax.random.key(3), 20_000)
    for k in ("phi", "s2", "beta"):
        assert abs(float(a[k].mean() - b[k].mean())) < 0.2 * float(a[k].std()), k


@slow
def test_long_series_is_linear_in_T():
    """T = 10^5: a T x T float64 matrix would need 80 GB; the fit runs in O(T)."""
    y = sv.simulate(jax.random.key(10), 100_000, 0.95, 0.05, 0.7)
    res = sv.fit(y, jax.random.key(11), num_steps=20, num_eval_draws=4, on_failure="ignore")
    assert np.isfinite(float(res.result.q.gaussian.site_shift[-1]))


@pytest.mark.slow
def test_direct_gradient_equals_autodiff_through_the_factorisation():
    """Eq. svapprox's dH/dtheta from the selected inverse == jax.grad through the scans."""
    # The module, not the function of the same name that jaxvb.composite exports.
    h = importlib.import_module("jaxvb.latent.hierarchical")
    y = jnp.asarray(sv.simulate(jax.random.key(3), 40, 0.9, 0.1, 0.8))
    q = sv.initial_q(y)
    model = q.gaussian.model

    def log_marginal(theta):
        return model.prior_log_density(theta) + q.gaussian.log_marginal(theta)

    # one program for all three points, not one per operation
    gradients = jax.jit(
        lambda q, theta: (h._direct_gradient(q, theta)[0], jax.grad(log_marginal)(theta))
    )
    for phi, s2 in ((0.9, 0.1), (0.99, 0.02), (-0.5, 1.0)):
        got, want = gradients(q, _theta(phi, s2))
        np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.slow
def test_draw_jacobians_equal_jacfwd_through_the_sampler():
    """One linearised pass gives the same ``d theta / d eta_i`` as ``jacfwd`` of the draws.

    Direct (svapprox: only the block's own draw moves) and total (sv2: the Inv-Gamma
    draw of ``s2`` also moves with ``eta_u`` through ``phi``).
    """
    q = sv.initial_q(jnp.asarray(sv.simulate(jax.random.key(4), 20, 0.9, 0.1, 0.8)))
    q_s2 = dataclasses.replace(
        q.scalars[1], eta=jnp.array([6.0, 0.2, 0.1])
    )  # phi-dependent
    q = dataclasses.replace(q, scalars=(q.scalars[0], q_s2))
    etas = tuple(b.eta for b in q.scalars)
    # Jitted once: eagerly, every op of the samplers would compile on its own.
    linearised = jax.jit(
        lambda q, noise, total: q.draw_scalars_and_jacobians(noise, total=total),
        static_argnums=2,
    )
    draw = jax.jit(lambda q, noise: q.draw_scalars(noise))

    def draws(etas, noise):
        scalars = tuple(
            dataclasses.replace(b, eta=e) for b, e in zip(q.scalars, etas, strict=True)
        )
        return dataclasses.replace(q, scalars=scalars).draw_scalars(noise)

    # d theta / d eta_i for every block i, in one program
    jacobians = jax.jit(jax.jacfwd(draws))
    for seed in range(3):
        noise = jax.random.split(jax.random.key(seed), q.num_scalars)
        theta, direct = linearised(q, noise, False)
        theta_t, total = linearised(q, noise, True)
        np.testing.assert_array_equal(theta, draw(q, noise))
        np.testing.assert_array_equal(theta_t, theta)
        references = jacobians(etas, noise)
        for i in range(q.num_scalars):
            reference = np.asarray(references[i])
            np.testing.assert_allclose(total[i], reference, rtol=1e-12)
            # Direct: only the block's own draw moves (earlier ones do not depend on
            # eta_i; the later ones are held).
            own = np.zeros_like(reference)
            own[i] = reference[i]
            np.testing.assert_allclose(direct[i], own, rtol=1e-12, atol=0)
        assert np.any(np.asarray(total[0][1]) != 0) and np.all(
            np.asarray(direct[0][1]) == 0
        )


@pytest.mark.slow
@gbpusd_group
def test_a_draw_of_phi_that_rounds_to_one_leaves_the_fit_clean(gbpusd_fit):
    """Key 134 once drew ``u`` = 1 (to float64) at step 5, where ``q(f | theta)`` is
    singular: the step's statistics were NaN and the fit raised. ``phi`` is now kept
    within 1e-6 of +-1 in ``q(f | theta)`` (bit-identical elsewhere: key 0 unchanged)."""
    del gbpusd_fit  # compiled the default fit; this one reuses it
    res = sv.fit(jaxvb.data.sv_gbpusd(), jax.random.key(134))
    assert int(res.status) == 0 and int(res.first_nonfinite_step) == -1
    y = jnp.asarray(sv.simulate(jax.random.key(5), 30, 0.9, 0.1, 0.8))
    q = sv.initial_q(y)
    conditional = importlib.import_module("jaxvb.latent.hierarchical")._conditional
    # one program for the three points, not one per operation
    moments = jax.jit(lambda q, theta: conditional(q, theta)[:2])
    for u in (1.0, 1.0 - 2.0**-53, 0.0):
        mean, cov = moments(q, jnp.array([u, 0.05]))
        assert np.all(np.isfinite(mean)) and np.all(np.isfinite(cov.band))


def test_trust_region_refuses_the_jump_that_stalled_a_fit():
    """``hierarchical(max_step_kl=1)``: the update of q(s2 | phi) seen in a stalled fit.

    The natural parameters (shape + 1, eta4, eta5) before and after the step that drew
    s2 = 78822 from a q(s2 | phi) of shape 0.13 (key 0, before the trust region): the
    next q(s2 | phi) had shape 475, a KL of ~16 nats from the last. An ordinary early step
    moves it by < 1 nat.
    """
    from jaxvb.composite import hierarchical

    y = jnp.asarray(sv.simulate(jax.random.key(0), 20, 0.95, 0.05, 0.7))
    q = sv.initial_q(y)
    method = hierarchical(sv.model_structure(y))

    def with_s2(eta):
        blocks = (q.scalars[0], dataclasses.replace(q.scalars[1], eta=jnp.asarray(eta)))
        return dataclasses.replace(q, scalars=blocks)

    flat = with_s2([1.132, 0.1273, -0.0252])
    assert not bool(method.accept(flat, with_s2([476.6, 27.53, -5.058])))
    assert bool(method.accept(flat, with_s2([1.2, 0.13, -0.026])))
    assert hierarchical(sv.model_structure(y), max_step_kl=None).accept is None


def test_sites_are_proper_when_their_precisions_are_positive():
    # diagonal sites on eta = v + 2 log beta: P = Q + L'diag(a)L is positive definite
    # for every theta when a > 0 (the AR(1) prior proper on v, the sites inform log beta)
    from jaxvb.composite import GaussianSitesBlock
    from jaxvb.families._base import build

    model = sv.model_structure(jnp.array([0.5, -1.2, 0.3, 2.0]))
    block = build(
        GaussianSitesBlock, site_precision=jnp.ones(4), site_shift=jnp.zeros(4), model=model
    )
    assert bool(block.is_proper) and block.event_shape == (5,)
    negative = dataclasses.replace(block, site_precision=jnp.ones(4).at[1].set(-1e-3))
    assert not bool(negative.is_proper)
    nan = dataclasses.replace(block, site_shift=jnp.zeros(4).at[0].set(jnp.nan))
    assert not bool(nan.is_proper)
