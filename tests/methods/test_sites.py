"""Factor structure (``jaxvb.Factors``, ``methods.sites``) and minibatches (``Minibatch``).

The probit checks compare every method with a NumPyro NUTS run on a small data set
(``M = 3``, ``N = 40``). Two sources of disagreement are kept apart:

- Monte Carlo error: each method is run with eight keys; its standard error is the
  spread over keys / sqrt(8), NUTS's is sd / sqrt(ESS). Methods that target the same
  KL optimum must agree within ``Z`` combined standard errors.
- The Gaussian approximation itself: the KL-optimal Gaussian is not the posterior. For
  this data set its mean is within 0.02 posterior sd of the exact mean and its sds are
  0.93..0.99 of the exact ones (variational Bayes underestimates variances); the test
  allows 0.04 sd and a ratio in [0.88, 1.02], plus the Monte Carlo error.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiered

import jaxvb
from jaxvb.models import probit

Z = 5.0  # tolerance in Monte Carlo standard errors
NUM_KEYS = 8
M, N = 3, 40


def _probit_data():
    _, design, y = probit.simulate(
        jax.random.key(11), num_datasets=1, num_obs=N, num_features=M
    )
    return design[0], y[0]


def _minibatch(prior, design, y, batch_size=10, schedule="sweep"):
    return jaxvb.Minibatch(
        prior.log_prob,
        lambda x, d: probit.site_log_lik(d[0] @ x, d[1]),
        (design, y),
        batch_size=batch_size,
        schedule=schedule,
    )


@pytest.fixture(scope="module")
def nuts_reference():
    """Mean, sd and the Monte Carlo standard error of the mean from NumPyro NUTS."""
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist
    from numpyro.diagnostics import effective_sample_size
    from numpyro.infer import MCMC, NUTS

    design, y = _probit_data()

    def model():
        x = numpyro.sample("x", dist.Normal(0.0, 1.0).expand([M]).to_event(1))
        numpyro.factor("lik", jnp.sum(probit.site_log_lik(design @ x, y)))

    mcmc = MCMC(
        NUTS(model),
        num_warmup=500,
        num_samples=2000,
        num_chains=2,
        chain_method="vectorized",
        progress_bar=False,
    )
    mcmc.run(jax.random.key(0))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    ess = effective_sample_size(draws)
    flat = draws.reshape(-1, M)
    sd = flat.std(0, ddof=1)
    return {"mean": flat.mean(0), "sd": sd, "se": sd / np.sqrt(ess)}


#: The methods compared, by name (the parametrisations below; ``_cases`` builds them).
NAMES = [
    "basic (Algorithm 1)",
    "gradient",
    "hessian (Algorithm 2)",
    "factor",
    "factor gradient",
    "factor hessian",
    "hessian + minibatches",
]


def _cases():
    design, y = _probit_data()
    prior = jaxvb.Gaussian(jnp.zeros(M), jnp.eye(M))
    plain = functools.partial(probit.log_joint, design=design, y=y)
    factors = jaxvb.Factors(prior, probit.site_log_lik, design, y)
    return prior, {
        "basic (Algorithm 1)": (plain, "regression", 2000),
        "gradient": (plain, "gradient", 500),
        "hessian (Algorithm 2)": (plain, "hessian", 500),
        "factor": (factors, jaxvb.methods.sites("regression"), 1000),
        "factor gradient": (factors, jaxvb.methods.sites("gradient"), 500),
        "factor hessian": (factors, jaxvb.methods.sites("hessian"), 500),
        "hessian + minibatches": (_minibatch(prior, design, y), "hessian", 2000),
    }


@pytest.fixture(scope="module")
def fits():
    """Each method's fit with eight keys: mean, sd and their standard errors over keys."""
    prior, cases = _cases()
    assert list(cases) == NAMES
    keys = jax.random.split(jax.random.key(5), NUM_KEYS)
    out = {}
    for name, (target, method, num_steps) in cases.items():
        res = jax.jit(
            jax.vmap(
                lambda k, t=target, m=method, n=num_steps: jaxvb.fit(
                    t, prior, k, num_steps=n, method=m, on_failure="ignore"
                )
            )
        )(keys)
        means = np.asarray(res.q.mean)
        sds = np.sqrt(np.asarray(jnp.diagonal(res.q.cov, axis1=1, axis2=2)))
        out[name] = {
            "means": means,
            "mean": means.mean(0),
            "mean_se": means.std(0, ddof=1) / math.sqrt(NUM_KEYS),
            "sd": sds.mean(0),
            "sd_se": sds.std(0, ddof=1) / math.sqrt(NUM_KEYS),
            "status": np.asarray(res.status),
            "r_squared": np.asarray(res.r_squared),
        }
    return out


# The fits (7 methods x 8 keys, up to 2000 steps) and the NUTS reference are computed
# once, on one worker.
fits_group = pytest.mark.xdist_group("sites_fits")


@pytest.mark.integration
@pytest.mark.slow
@fits_group
@pytest.mark.parametrize("name", NAMES)
def test_each_method_recovers_the_probit_posterior_of_nuts(name, fits, nuts_reference):
    fit, ref = fits[name], nuts_reference
    assert np.all(fit["status"] == 0)
    se = np.sqrt(fit["mean_se"] ** 2 + ref["se"] ** 2)
    gap = np.abs(fit["mean"] - ref["mean"])
    assert np.all(gap <= 0.04 * ref["sd"] + Z * se), (gap / ref["sd"], se / ref["sd"])
    ratio = fit["sd"] / ref["sd"]
    tol = Z * fit["sd_se"] / ref["sd"] + 2 * ref["se"] / ref["sd"]
    assert np.all((ratio >= 0.88 - tol) & (ratio <= 1.02 + tol)), ratio
    # The paper's measure of fit: R^2 near 1 for this nearly Gaussian posterior. One
    # gradient fit of the eight (key 6) ends at R^2 0.82 (its mean ~0.2 off the Hessian
    # fit's with the same key; the method's 500 steps leave such a fit now and then:
    # over 48 other keys its R^2 is 0.94-0.97, with jax.random.normal's draws too)
    assert np.all(fit["r_squared"] > 0.8) and np.median(fit["r_squared"]) > 0.95


@pytest.mark.slow
@fits_group
@pytest.mark.parametrize("name", [n for n in NAMES if n != "hessian (Algorithm 2)"])
def test_every_method_reaches_the_same_optimum_as_algorithm_2(name, fits):
    """Same KL optimum, so they differ by Monte Carlo error only (minibatches included)."""
    a, b = fits[name], fits["hessian (Algorithm 2)"]
    se_mean = np.sqrt(a["mean_se"] ** 2 + b["mean_se"] ** 2)
    assert np.all(np.abs(a["mean"] - b["mean"]) <= Z * se_mean)
    se_sd = np.sqrt(a["sd_se"] ** 2 + b["sd_se"] ** 2)
    assert np.all(np.abs(a["sd"] - b["sd"]) <= Z * se_sd)


@pytest.mark.slow
@fits_group
def test_site_hessian_is_algorithm_2_with_an_assembled_hessian(fits):
    """Same draws, and V' diag(l'') V is the Hessian of the likelihood: same numbers."""
    np.testing.assert_allclose(
        fits["factor hessian"]["means"], fits["hessian (Algorithm 2)"]["means"], rtol=1e-9
    )


@pytest.mark.parametrize(
    "estimator",
    tiered(["regression", "gradient", "hessian"], slow=["regression", "gradient"]),
)
@pytest.mark.slow
def test_gaussian_sites_are_exact(estimator):
    """Gaussian likelihood sites: each site regression is exact, so the fit is too."""
    rng = np.random.default_rng(0)
    design = jnp.asarray(rng.normal(size=(30, 4)))
    y = jnp.asarray(rng.normal(size=30))
    noise_sd = 0.5
    prior = jaxvb.Gaussian(jnp.asarray([0.5, 0.0, -0.5, 1.0]), 2.0 * jnp.eye(4))
    model = jaxvb.Factors(
        prior,
        lambda f, yi: (
            -0.5 * (yi - f) ** 2 / noise_sd**2 - 0.5 * math.log(2 * math.pi * noise_sd**2)
        ),
        design,
        y,
    )
    precision = prior.precision + design.T @ design / noise_sd**2
    cov = jnp.linalg.inv(precision)
    mean = cov @ (prior.precision @ prior.mean + design.T @ y / noise_sd**2)
    res = jaxvb.fit(
        model, prior, jax.random.key(1), num_steps=20, method=jaxvb.methods.sites(estimator)
    )
    np.testing.assert_allclose(res.q.mean, mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(res.q.cov, cov, rtol=1e-8, atol=1e-12)
    assert abs(float(res.r_squared) - 1.0) < 1e-8
    # log p(y) from the Gaussian identity p(y) = p(y | x) p(x) / p(x | y) at any x.
    x = jnp.zeros(4)
    exact = model(x) - jaxvb.Gaussian(mean, 0.5 * (cov + cov.T)).log_prob(x)
    assert abs(float(res.log_evidence - exact)) < 1e-6


@pytest.mark.slow
def test_method_sites_by_name_and_vmap_over_data_sets_equals_the_loop():
    beta, design, y = probit.simulate(jax.random.key(2), num_datasets=3)
    prior = jaxvb.Gaussian(jnp.zeros(5), jnp.eye(5))
    keys = jax.random.split(jax.random.key(3), 3)

    def one(v, yy, k):
        model = jaxvb.Factors(prior, probit.site_log_lik, v, yy)
        return jaxvb.fit(model, prior, k, num_steps=100, method="sites")

    batched = jax.jit(jax.vmap(one))(design, y, keys)
    single = jax.jit(one)
    for i in range(3):
        res = single(design[i], y[i], keys[i])
        np.testing.assert_allclose(batched.q.mean[i], res.q.mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(batched.q.cov[i], res.q.cov, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(batched.r_squared[i], res.r_squared, rtol=1e-9)


@pytest.mark.slow
def test_minibatch_vmap_equals_the_loop():
    _, design, y = probit.simulate(jax.random.key(4), num_datasets=2)
    prior = jaxvb.Gaussian(jnp.zeros(5), jnp.eye(5))

    def one(v, yy):
        model = _minibatch(prior, v, yy, batch_size=20, schedule="random")
        return jaxvb.fit(model, prior, jax.random.key(0), num_steps=50)

    batched = jax.jit(jax.vmap(one))(design, y)
    for i in range(2):
        res = jax.jit(one)(design[i], y[i])
        np.testing.assert_allclose(batched.q.mean[i], res.q.mean, rtol=1e-9, atol=1e-12)


def test_minibatch_schedules():
    prior = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    data = jnp.zeros((12, 2))
    key = jax.random.key(0)
    sweep = jaxvb.Minibatch(
        prior.log_prob, lambda x, d: d @ x, data, batch_size=3, schedule="sweep"
    )
    # Each pass of 4 steps visits the 4 fixed blocks once, in a new order.
    orders = []
    for start in (1, 5, 9):
        idx = np.stack(
            [np.asarray(sweep.indices(key, jnp.int32(t))) for t in range(start, start + 4)]
        )
        assert sorted(idx.ravel().tolist()) == list(range(12))
        assert np.all(np.diff(idx, axis=1) == 1) and np.all(idx[:, 0] % 3 == 0)
        orders.append(tuple(idx[:, 0]))
    assert len(set(orders)) > 1
    rand = jaxvb.Minibatch(prior.log_prob, lambda x, d: d @ x, data, batch_size=5)
    for t in range(1, 6):
        idx = np.asarray(rand.indices(key, jnp.int32(t)))
        assert len(set(idx.tolist())) == 5 and idx.min() >= 0 and idx.max() < 12


@pytest.mark.slow
def test_minibatch_log_joint_is_unbiased():
    """The average over all blocks of a sweep is the full-data log joint, exactly."""
    _, design, y = probit.simulate(jax.random.key(5), num_datasets=1, num_obs=20)
    prior = jaxvb.Gaussian(jnp.zeros(5), jnp.eye(5))
    model = _minibatch(prior, design[0], y[0], batch_size=5)
    x = jnp.linspace(-1.0, 1.0, 5)
    key = jax.random.key(1)
    values = [model.batch(key, jnp.int32(t))(x) for t in range(1, 5)]
    np.testing.assert_allclose(np.mean(values), model(x), rtol=1e-12)
    np.testing.assert_allclose(model(x), probit.log_joint(x, design[0], y[0]), rtol=1e-12)


def test_bad_factor_and_minibatch_input():
    prior = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    design, y = jnp.ones((4, 2)), jnp.zeros(4)
    with pytest.raises(TypeError, match="prior must be a jaxvb.Gaussian"):
        jaxvb.Factors(jaxvb.Gamma(1.0, 1.0), probit.site_log_lik, design, y)
    with pytest.raises(ValueError, match=r"design must have shape \(N, 2\)"):
        jaxvb.Factors(prior, probit.site_log_lik, jnp.ones((4, 3)), y)
    with pytest.raises(ValueError, match="data has 5 rows but design has 4"):
        jaxvb.Factors(prior, probit.site_log_lik, design, jnp.zeros(5))
    with pytest.raises(TypeError, match="needs the log joint as a jaxvb.Factors"):
        jaxvb.fit(
            lambda x: -jnp.sum(x**2), prior, jax.random.key(0), num_steps=10, method="sites"
        )
    model = jaxvb.Factors(prior, probit.site_log_lik, design, y)
    with pytest.raises(ValueError, match="Does q0 have the dimension"):
        jaxvb.fit(
            model,
            jaxvb.Gaussian(jnp.zeros(3), jnp.eye(3)),
            jax.random.key(0),
            num_steps=10,
            method="sites",
        )
    with pytest.raises(ValueError, match="estimator must be one of"):
        jaxvb.methods.sites("magic")
    lik = lambda x, d: d @ x  # noqa: E731
    with pytest.raises(ValueError, match=r"batch_size must be an integer in \[1, 4\]"):
        jaxvb.Minibatch(prior.log_prob, lik, design, batch_size=5)
    with pytest.raises(ValueError, match="batch_size must divide 4"):
        jaxvb.Minibatch(prior.log_prob, lik, design, batch_size=3, schedule="sweep")
    with pytest.raises(ValueError, match="schedule must be one of"):
        jaxvb.Minibatch(prior.log_prob, lik, design, batch_size=2, schedule="cyclic")
    with pytest.raises(ValueError, match="same leading axis"):
        jaxvb.Minibatch(prior.log_prob, lik, (design, jnp.zeros(3)), batch_size=2)


def _log_f(f, yi):
    return yi * jnp.log(f)  # NaN for f < 0


@functools.cache
def _log_f_model():
    """Two sites ``log f``: one model object (a Factors is static in a fit's program),
    so that the tests below share their compiled programs."""
    prior = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
    return prior, jaxvb.Factors(prior, _log_f, jnp.ones((2, 1)), jnp.ones(2))


@pytest.mark.slow
def test_a_site_with_a_non_finite_log_likelihood_is_flagged():
    """A site that is NaN where a Gaussian puts mass: the draw is left out and flagged.

    ``log f`` is NaN for ``f < 0``; from ``N(0, 1)`` the fits draw negative ``f`` early
    (with this key) and must raise, carrying a finite result. The gradient estimator
    moves away from zero before it draws one and stays finite.
    """
    prior, model = _log_f_model()
    for estimator in ("regression", "hessian"):
        with pytest.raises(jaxvb.FitError, match="log_joint was not finite") as err:
            jaxvb.fit(
                model,
                prior,
                jax.random.key(0),
                num_steps=50,
                method=jaxvb.methods.sites(estimator),
            )
        res = err.value.result
        assert res.status & jaxvb.Status.NONFINITE_LOG_DENSITY
        assert np.all(np.isfinite(res.q.mean)) and np.all(np.isfinite(res.q.cov))
    res = jaxvb.fit(
        model,
        prior,
        jax.random.key(0),
        num_steps=50,
        method=jaxvb.methods.sites("gradient"),
        on_failure="ignore",
    )
    assert np.all(np.isfinite(res.q.mean)) and np.all(np.isfinite(res.q.cov))


@pytest.mark.slow
def test_a_site_fit_that_never_settles_is_flagged():
    """No Gaussian is a stationary point here (KL is infinite for all of them): the fit
    must not end with status 0. Over keys 0-4 it ends flagged
    for draws where log f is not finite (f < 0), a poor fit (R^2 < 0), or an unsettled
    one: which flag depends on the key, that there is one does not."""
    prior, model = _log_f_model()  # the program of the gradient fit above
    failures = (
        jaxvb.Status.NONFINITE_LOG_DENSITY
        | jaxvb.Status.POOR_FIT
        | jaxvb.Status.UNSETTLED
        | jaxvb.Status.NOT_CONVERGED
    )
    for k in range(5):
        res = jaxvb.fit(
            model,
            prior,
            jax.random.key(k),
            num_steps=50,
            method=jaxvb.methods.sites("gradient"),
            on_failure="ignore",
        )
        assert int(res.status) & int(failures), (k, jaxvb.Status(int(res.status)))
