"""jaxvb.numpyro.fit(..., latent="f"): a NumPyro model as a jaxvb.LatentGaussian.

Exact on a conjugate model (the hyperparameter's posterior in closed form), the same
fit as the LatentGaussian written by hand, compiled once per model structure, and
clear errors for models it cannot take.
"""

import json
import math
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_numpyro_compile import compilations

import jaxvb
from jaxvb.linalg import Banded

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
import jaxvb.numpyro  # noqa: E402
from jaxvb.interop.numpyro._fit import _dense_fields  # noqa: E402

KEY = jax.random.key(0)
Y = jnp.array([0.3, -0.5, 1.2, 0.8, 2.0, 1.1])
FIT = {"num_eval_draws": 50}
#: NUTS references of hierarchical models (benchmarks/hierarchical.py --refs)
REFERENCE = Path(__file__).resolve().parents[1] / "data" / "hierarchical_nuts.json"


def conjugate(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    with numpyro.plate("t", y.shape[0]):
        f = numpyro.sample("f", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(f, math.sqrt(0.5)), obs=y)


@pytest.mark.slow
def test_conjugate_model_is_exact():
    """y_t ~ N(mu, 1 + 0.5) given mu ~ N(0, 4): mu | y is Gaussian, and so is q."""
    res = jaxvb.numpyro.fit(conjugate, KEY, Y, num_steps=30, latent="f", fit_kwargs=FIT)
    n = Y.shape[0]
    prec = 1 / 4.0 + n / 1.5
    mean = float(jnp.sum(Y)) / 1.5 / prec
    assert int(res.status) == 0
    # exact to round-off
    np.testing.assert_allclose(res.q.theta.mean, [mean], rtol=1e-10)
    np.testing.assert_allclose(res.q.theta.cov, [[1 / prec]], rtol=1e-10)
    draws = res.sample(jax.random.key(1), 10)
    assert draws["mu"].shape == (10,) and draws["f"].shape == (10, n)
    assert float(res.r_squared) == pytest.approx(1.0, abs=1e-10)


#: Observations of four groups, unbalanced and out of order (group 3 has none).
GROUP = jnp.array([2, 0, 1, 0, 2, 2, 0, 4, 1, 4])
Y_GROUPED = jnp.array([0.3, -0.5, 1.2, 0.8, 2.0, 1.1, -0.2, 0.4, 0.9, 1.5])


def grouped(y, group):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    with numpyro.plate("g", 5):
        f = numpyro.sample("f", dist.Normal(mu, 1.0))
    with numpyro.plate("t", y.shape[0]):
        numpyro.sample("y", dist.Normal(f[group], math.sqrt(0.5)), obs=y)


@pytest.mark.slow
def test_grouped_observations_are_summed_into_their_value_and_exact():
    """Several observations per value (radon's homes in a county): each group's mean
    is N(mu, 1 + 0.5 / n_g), so mu | y is Gaussian and the latent route exact."""
    res = jaxvb.numpyro.fit(
        grouped, KEY, Y_GROUPED, GROUP, num_steps=30, latent="f", fit_kwargs=FIT
    )
    group, y = np.asarray(GROUP), np.asarray(Y_GROUPED)
    counts = np.bincount(group, minlength=5)
    ybar = np.array([y[group == g].mean() for g in np.flatnonzero(counts)])
    var = 1.0 + 0.5 / counts[counts > 0]
    prec = 1 / 4.0 + np.sum(1 / var)
    assert int(res.status) == 0
    np.testing.assert_allclose(res.q.theta.mean, [np.sum(ybar / var) / prec], rtol=1e-10)
    np.testing.assert_allclose(res.q.theta.cov, [[1 / prec]], rtol=1e-10)
    draws = res.sample(jax.random.key(1), 4000)
    # the group with no observations keeps its prior given mu: sd sqrt(1 + 1/prec)
    assert float(jnp.std(draws["f"][:, 3])) == pytest.approx(
        np.sqrt(1 + 1 / prec), rel=0.05
    )


def poisson_walk(y):
    """Counts with a random-walk log-rate (``test_numpyro_after`` predicts from its fit:
    hence the deterministic site, which is not in the log joint)."""
    s = numpyro.sample("s", dist.HalfNormal(1.0))
    f = numpyro.sample("f", dist.GaussianRandomWalk(s, num_steps=y.shape[0]))
    with numpyro.plate("t", y.shape[0]):
        numpyro.deterministic("rate", jnp.exp(f))
        numpyro.sample("y", dist.Poisson(jnp.exp(f)), obs=y)


COUNTS = jnp.array([0.0, 2.0, 1.0, 4.0, 3.0, 5.0, 4.0, 7.0])
#: The settings of every fit of ``poisson_walk``: one compiled program for the tests
#: below and ``test_numpyro_after``'s latent route, run in one worker.
WALK = {"num_steps": 50, "latent": "f", "fit_kwargs": FIT}
walk_group = pytest.mark.xdist_group("numpyro_latent_walk")


@pytest.mark.slow
@walk_group
def test_same_fit_as_the_latent_gaussian_by_hand():
    """A GaussianRandomWalk prior is a tridiagonal precision; theta = log s, with the
    HalfNormal prior and its log-Jacobian."""
    t = COUNTS.shape[0]
    band = jnp.stack([jnp.full(t, 2.0).at[-1].set(1.0), jnp.full(t, -1.0).at[-1].set(0.0)])
    by_hand = jaxvb.LatentGaussian(
        log_prior=lambda th: dist.HalfNormal(1.0).log_prob(jnp.exp(th[0])) + th[0],
        prior=lambda th: (jnp.zeros(t), Banded(band * jnp.exp(-2 * th[0]))),
        log_lik=lambda f, y: dist.Poisson(jnp.exp(f)).log_prob(y),
        data=COUNTS,
    )
    key_init, key_fit = jax.random.split(KEY)  # as jaxvb.numpyro.fit splits its key
    via = jaxvb.numpyro.fit(poisson_walk, KEY, COUNTS, **WALK)
    # the same start: init_to_median's s, on the log scale
    lj = jaxvb.numpyro.log_joint(poisson_walk, COUNTS)
    x0 = lj.init_point(key_init, numpyro.infer.init_to_median)
    direct = jaxvb.fit(by_hand, x0[:1], key_fit, num_steps=50, **FIT)
    # equal up to round-off (the two compute the model's terms in different orders,
    # and the Hessian's differences amplify round-off)
    tol = {"rtol": 1e-6, "atol": 1e-9}
    np.testing.assert_allclose(via.q.theta.mean, direct.q.theta.mean, **tol)
    np.testing.assert_allclose(via.q.theta.cov, direct.q.theta.cov, **tol)
    np.testing.assert_allclose(via.q.site_shift, direct.q.site_shift, **tol)
    assert float(via.elbo) == pytest.approx(float(direct.elbo), rel=1e-9)


@pytest.mark.slow
@walk_group
def test_compiles_once_per_model_structure():
    # compiled here, or found compiled by the fit of the test above
    jaxvb.numpyro.fit(poisson_walk, KEY, COUNTS, **WALK)
    new_counts, key = COUNTS + 1.0, jax.random.key(1)
    with compilations() as names:
        res = jaxvb.numpyro.fit(poisson_walk, key, new_counts, **WALK)
    assert names == [], names
    assert bool(res.ok), jaxvb.explain(res)


def test_models_it_cannot_take_get_clear_errors():
    with pytest.raises(ValueError, match="latent='g' is not a latent sample site"):
        jaxvb.numpyro.fit(conjugate, KEY, Y, num_steps=10, latent="g")

    def skewed(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
        with numpyro.plate("t", y.shape[0]):
            f = numpyro.sample("f", dist.Gumbel(mu, 1.0))
            numpyro.sample("y", dist.Normal(f, 1.0), obs=y)

    with pytest.raises(TypeError, match="has a Gumbel distribution"):
        jaxvb.numpyro.fit(skewed, KEY, Y, num_steps=10, latent="f")

    def pooled(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
        f = numpyro.sample("f", dist.Normal(mu, 1.0).expand([3]).to_event(1))
        with numpyro.plate("t", y.shape[0]):
            numpyro.sample("y", dist.Normal(jnp.sum(f), 1.0), obs=y)

    with pytest.raises(
        ValueError, match="observation 0 of the observed site 'y' depends on several"
    ):
        jaxvb.numpyro.fit(pooled, KEY, Y, num_steps=10, latent="f")

    def unread(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
        numpyro.sample("f", dist.Normal(mu, 1.0).expand([3]).to_event(1))
        with numpyro.plate("t", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(ValueError, match="observed site 'y' depends on no value of it"):
        jaxvb.numpyro.fit(unread, KEY, Y, num_steps=10, latent="f")

    def alone(y):
        with numpyro.plate("t", y.shape[0]):
            f = numpyro.sample("f", dist.Normal(0.0, 1.0))
            numpyro.sample("y", dist.Normal(f, 1.0), obs=y)

    with pytest.raises(ValueError, match="only latent site"):
        jaxvb.numpyro.fit(alone, KEY, Y, num_steps=10, latent="f")


@pytest.mark.slow
def test_a_multivariate_normal_field():
    """A Gaussian-process-like field with a dense covariance from a hyperparameter."""
    x = jnp.linspace(0.0, 1.0, 6)

    def gp(y):
        ell = numpyro.sample("ell", dist.LogNormal(-1.0, 0.5))
        k = jnp.exp(-0.5 * (x[:, None] - x[None]) ** 2 / ell**2) + 1e-6 * jnp.eye(6)
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(6), k))
        with numpyro.plate("t", 6):
            numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)

    y = jnp.array([0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    res = jaxvb.numpyro.fit(gp, KEY, y, num_steps=200, latent="f", fit_kwargs=FIT)
    assert bool(res.ok), jaxvb.explain(res)
    draws = res.sample(jax.random.key(1), 100)
    assert draws["f"].shape == (100, 6) and bool(jnp.all(draws["ell"] > 0))


def _gp_classification(n):
    x = jnp.linspace(0.0, 1.0, n)

    def gp(y):
        ell = numpyro.sample("ell", dist.LogNormal(-1.0, 0.5))
        k = jnp.exp(-0.5 * (x[:, None] - x[None]) ** 2 / ell**2) + 1e-6 * jnp.eye(n)
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(n), k))
        with numpyro.plate("t", n):
            numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)

    return gp, (jnp.sin(6.0 * x) > 0).astype(float)


@pytest.mark.slow
def test_a_dense_field_without_latent_warns_of_its_cost_and_the_latent_route():
    gp, y = _gp_classification(16)
    options = dict(num_steps=20, fit_kwargs=dict(FIT, on_failure="ignore"))
    with pytest.warns(jaxvb.numpyro.RouteWarning, match="latent='f'") as record:
        jaxvb.numpyro.fit(gp, KEY, y, **options)
    (warning,) = record
    assert warning.filename == __file__  # points at the caller's line
    assert "16 x 16 covariance" in str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", jaxvb.numpyro.RouteWarning)
        jaxvb.numpyro.fit(gp, KEY, y, latent="f", **options)  # the latent route: quiet
    small, y_small = _gp_classification(6)  # a cheap factorisation: no warning
    lj = jaxvb.numpyro.log_joint(small, y_small)
    assert _dense_fields(lj) == {} and _dense_fields(jaxvb.numpyro.log_joint(gp, y)) == {
        "f": 16
    }


def radon_intercepts(y, floor, county, num_counties):
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(2.0))
    b = numpyro.sample("b", dist.Normal(0.0, 10.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(2.0))
    with numpyro.plate("county", num_counties):
        a = numpyro.sample("a", dist.Normal(mu_a, sigma_a))
    with numpyro.plate("home", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[county] + b * floor, sigma_y), obs=y)


@pytest.mark.slow
def test_radon_from_a_poor_start_finds_the_posterior():
    """Radon's varying intercepts from a start far from the posterior (the floor effect
    +2.7 for -0.7, the residual sd 1.8 for 0.76: a point init_to_median can pick).
    Sites taken there make the start's first search run the group sd off to 0; the
    start's bounded rounds refresh them and reach the posterior: every
    hyperparameter's mean within 0.25 sd of the stored NUTS reference."""
    from numpyro.infer import init_to_value

    from jaxvb import data

    y, floor, county, _ = data.radon()
    start = dict(b=2.72, mu_a=2.07, sigma_a=1.17, sigma_y=1.81)
    res = jaxvb.numpyro.fit(
        radon_intercepts,
        KEY,
        jnp.asarray(y),
        jnp.asarray(floor, float),
        jnp.asarray(county),
        int(county.max()) + 1,
        num_steps=300,
        latent="a",
        init=init_to_value(values=start),
    )
    assert int(res.status) == 0
    ref = json.loads(REFERENCE.read_text())["models"]["radon_intercepts"]["sites"]
    draws = res.sample(jax.random.key(1), 4000)
    for site in ("mu_a", "sigma_a", "b", "sigma_y"):
        error = abs(float(draws[site].mean()) - ref[site]["mean"][0]) / ref[site]["sd"][0]
        assert error < 0.25, (site, error)


def crossed(y, subject, item):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma_s = numpyro.sample("sigma_s", dist.HalfNormal(2.0))
    sigma_i = numpyro.sample("sigma_i", dist.HalfNormal(2.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(2.0))
    with numpyro.plate("item", 20):
        b = numpyro.sample("b", dist.Normal(0.0, sigma_i))
    with numpyro.plate("subject", 30):
        a = numpyro.sample("a", dist.Normal(mu, sigma_s))
    with numpyro.plate("trial", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[subject] + b[item], sigma_y), obs=y)


@pytest.mark.slow
def test_a_funnel_among_the_other_sites_is_named_with_its_remedies():
    """Crossed effects with the subjects as the field and the items' effects centred
    among the other sites: the start runs the items' scale off to 0, and the error
    names it and the two remedies."""
    rng = np.random.default_rng(1)
    s, i = (v.ravel() for v in np.meshgrid(np.arange(30), np.arange(20), indexing="ij"))
    y = 1.0 + rng.normal(0, 0.6, 30)[s] + rng.normal(0, 0.4, 20)[i] + rng.normal(0, 1, 600)
    with pytest.raises(jaxvb.FitError, match="ran sigma_i towards 0") as err:
        jaxvb.numpyro.fit(
            crossed,
            KEY,
            jnp.asarray(y),
            jnp.asarray(s),
            jnp.asarray(i),
            num_steps=1000,
            latent="a",
        )
    assert "Non-centre that effect" in str(err.value)
