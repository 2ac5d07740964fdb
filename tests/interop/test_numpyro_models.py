"""NumPyro models in, ArviZ out: jaxvb.numpyro against exact posteriors and NUTS.

Exact cases (a Gaussian posterior on NumPyro's unconstrained scale) are asserted to
near machine precision against closed forms computed with numpy/scipy. Statistical
comparisons use fixed keys and tolerances of 5 Monte Carlo standard errors (a false
failure rate of about 6e-7 per comparison for a normal error, 2e-3 where the standard
error itself is estimated from 8 fits: Student's t with 7 degrees of freedom).
"""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxvb

pytest.importorskip("numpyro")

import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

import jaxvb.numpyro  # noqa: E402

PRIOR_SD, NOISE_SD = 2.0, 1.0


def regression(X, y, batch_size=None):
    """Bayesian linear regression with a known noise scale: a Gaussian posterior."""
    w = numpyro.sample("w", dist.Normal(0.0, PRIOR_SD).expand([X.shape[1]]).to_event(1))
    numpyro.deterministic("fitted", X @ w)
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size) as idx:
        numpyro.sample("y", dist.Normal(X[idx] @ w, NOISE_SD), obs=y[idx])


@pytest.fixture(scope="module")
def regression_data():
    """200 observations, 2 coefficients, the exact posterior and log evidence."""
    rng = np.random.default_rng(0)
    X = np.column_stack([np.ones(200), rng.normal(size=200)])
    y = X @ np.array([1.0, -0.5]) + NOISE_SD * rng.normal(size=200)
    precision = np.eye(2) / PRIOR_SD**2 + X.T @ X / NOISE_SD**2
    cov = np.linalg.inv(precision)
    mean = cov @ X.T @ y / NOISE_SD**2
    marginal = NOISE_SD**2 * np.eye(200) + PRIOR_SD**2 * X @ X.T  # y ~ N(0, marginal)
    log_evidence = stats.multivariate_normal(np.zeros(200), marginal).logpdf(y)
    return jnp.asarray(X), jnp.asarray(y), mean, cov, log_evidence


@pytest.mark.integration
def test_import_jaxvb_does_not_import_numpyro():
    code = (
        "import sys, jaxvb\n"
        "assert 'numpyro' not in sys.modules and 'arviz' not in sys.modules\n"
        "sys.modules['numpyro'] = None  # as if it were not installed\n"
        "try:\n"
        "    import jaxvb.numpyro\n"
        "except ImportError as e:\n"
        "    assert 'pip install numpyro' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_conjugate_regression_is_exact(regression_data):
    X, y, mean, cov, log_evidence = regression_data
    res = jaxvb.numpyro.fit(
        regression,
        jax.random.key(0),
        X,
        y,
        num_steps=50,
        fit_kwargs={"num_eval_draws": 100},
    )
    assert type(res.log_joint) is jaxvb.numpyro.LogJoint
    np.testing.assert_allclose(res.q.mean, mean, rtol=1e-8)
    np.testing.assert_allclose(res.q.cov, cov, rtol=1e-8)
    # log p - log q is the same constant at every draw: both are exact.
    np.testing.assert_allclose(res.log_evidence, log_evidence, rtol=1e-10)
    np.testing.assert_allclose(res.elbo, log_evidence, rtol=1e-10)
    assert float(res.r_squared) == pytest.approx(1.0, abs=1e-8)
    assert int(res.status) == 0 and bool(res.ok)

    draws = res.sample(jax.random.key(1), 50)
    assert list(draws) == ["w", "fitted"]  # model order; the observed y is not there
    assert draws["w"].shape == (50, 2) and draws["fitted"].shape == (50, 200)
    np.testing.assert_allclose(draws["fitted"], draws["w"] @ X.T, rtol=1e-12)


def lognormal_scale(z):
    """log z_i ~ N(log s, 1/4), log s ~ N(0, 1): Gaussian in NumPyro's unconstrained log s."""
    s = numpyro.sample("s", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("data", z.shape[0]):
        numpyro.sample("z", dist.LogNormal(jnp.log(s), 0.5), obs=z)


@pytest.mark.integration
def test_constrained_site_exact_and_against_nuts():
    from numpyro.diagnostics import effective_sample_size
    from numpyro.infer import MCMC, NUTS

    z = jnp.exp(0.3 + 0.5 * jax.random.normal(jax.random.key(3), (10,)))
    # The exact posterior of u = log s (a Jacobian left out would shift its mean by -v).
    v = 1.0 / (1.0 + 10 / 0.25)
    m = v * float(jnp.sum(jnp.log(z))) / 0.25
    marginal = 0.25 * np.eye(10) + np.ones((10, 10))  # log z ~ N(0, marginal)
    log_evidence = stats.multivariate_normal(np.zeros(10), marginal).logpdf(np.log(z))
    log_evidence -= float(jnp.sum(jnp.log(z)))  # the density of z, not of log z

    # From any proper Gaussian (no mode search): Algorithm 2's estimates are exact for
    # a Gaussian target, so the average over the second half is.
    q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
    res = jaxvb.numpyro.fit(lognormal_scale, jax.random.key(0), z, num_steps=50, init=q0)
    np.testing.assert_allclose(res.q.mean, [m], rtol=1e-8)
    np.testing.assert_allclose(res.q.cov, [[v]], rtol=1e-8)
    np.testing.assert_allclose(res.log_evidence, log_evidence, rtol=1e-10)

    n = 20000
    ours = np.asarray(res.sample(jax.random.key(1), n)["s"])
    mcmc = MCMC(NUTS(lognormal_scale), num_warmup=300, num_samples=2000, progress_bar=False)
    mcmc.run(jax.random.key(2), z)
    theirs = np.asarray(mcmc.get_samples()["s"])
    post = stats.lognorm(s=np.sqrt(v), scale=np.exp(m))  # the exact posterior of s

    def ess(values):
        return float(effective_sample_size(np.asarray(values, float)[None, :, None])[0])

    se = np.sqrt(post.var() / n + post.var() / ess(theirs))
    assert abs(ours.mean() - theirs.mean()) < 5 * se
    for p in (0.05, 0.5, 0.95):
        q = post.ppf(p)
        # Standard error of a sample quantile: sqrt(p (1 - p) / ESS) / density there,
        # with the ESS of the indicator s <= q for the NUTS chain.
        var_p = p * (1 - p) / post.pdf(q) ** 2
        se = np.sqrt(var_p / n + var_p / ess(theirs <= q))
        assert abs(np.quantile(ours, p) - np.quantile(theirs, p)) < 5 * se, p


def shapes(y):
    """Vector, plate, simplex and deterministic sites (the simplex is 2-d unconstrained)."""
    loc = numpyro.sample("loc", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with numpyro.plate("groups", 3):
        scale = numpyro.sample("scale", dist.HalfNormal(1.0))
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(3)))
    numpyro.deterministic("mix_loc", weights @ loc)
    numpyro.deterministic("standardised", loc / scale)
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(weights @ loc, 1.0), obs=y)


@pytest.fixture(scope="module")
def shapes_fit():
    y = jnp.array([0.3, -0.2, 1.1, 0.8])
    q0 = jaxvb.Gaussian(jnp.zeros(8), jnp.eye(8))  # over x; no mode search, to save time
    return y, jaxvb.numpyro.fit(shapes, jax.random.key(0), y, num_steps=300, init=q0)


@pytest.mark.slow
def test_sample_gives_constrained_sites_with_the_model_shapes(shapes_fit):
    _, res = shapes_fit
    assert res.log_joint.dim == 3 + 3 + 2
    assert res.log_joint.latent_shapes == {"loc": (3,), "scale": (3,), "weights": (3,)}
    assert res.log_joint.deterministic_shapes == {"mix_loc": (), "standardised": (3,)}
    draws = res.sample(jax.random.key(1), 500)
    assert list(draws) == ["loc", "scale", "weights", "mix_loc", "standardised"]
    assert {k: v.shape for k, v in draws.items()} == {
        "loc": (500, 3),
        "scale": (500, 3),
        "weights": (500, 3),
        "mix_loc": (500,),
        "standardised": (500, 3),
    }
    assert np.all(draws["scale"] > 0) and np.all(draws["weights"] >= 0)
    np.testing.assert_allclose(draws["weights"].sum(-1), 1.0, rtol=1e-12)
    mix = jnp.sum(draws["weights"] * draws["loc"], -1)
    np.testing.assert_allclose(draws["mix_loc"], mix, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(draws["standardised"], draws["loc"] / draws["scale"])


@pytest.mark.slow
def test_to_arviz_matches_the_model_and_arviz_reads_it(shapes_fit, tmp_path):
    az = pytest.importorskip("arviz")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    y, res = shapes_fit
    idata = res.to_arviz(jax.random.key(2), 400, num_chains=4)
    post = idata.posterior
    assert set(post.data_vars) == {"loc", "scale", "weights", "mix_loc", "standardised"}
    assert dict(post.sizes)["chain"] == 4 and dict(post.sizes)["draw"] == 100
    shapes_ = {name: post[name].shape for name in post.data_vars}
    assert shapes_ == {
        "loc": (4, 100, 3),
        "scale": (4, 100, 3),
        "weights": (4, 100, 3),
        "mix_loc": (4, 100),
        "standardised": (4, 100, 3),
    }
    assert post["scale"].dims == ("chain", "draw", "groups")  # named after its plate
    draws = res.sample(jax.random.key(2), 400)  # the same key gives the same draws
    np.testing.assert_array_equal(post["loc"].values.reshape(400, 3), draws["loc"])
    assert "y" not in post and np.array_equal(idata.observed_data["y"].values, y)

    summary = az.summary(idata)
    assert len(summary) == 3 + 3 + 3 + 1 + 3
    assert np.all(np.abs(summary["r_hat"] - 1.0) < 0.05)  # independent draws
    axes = az.plot_posterior(idata, var_names=["mix_loc", "scale"])
    assert np.size(axes) == 4
    plt.savefig(tmp_path / "posterior.png")
    plt.close("all")

    # The same for a plain jaxvb.fit result: names for the coordinates of x.
    generic = jaxvb.to_arviz(res.result, jax.random.key(3), 100, names=list("abcdefgh"))
    assert list(generic.posterior.data_vars) == list("abcdefgh")
    assert generic.posterior["a"].shape == (1, 100)


@pytest.mark.slow
def test_minibatch_fit_converges_to_the_full_data_fit(regression_data):
    X, y, mean, cov, log_evidence = regression_data
    # The full-data log joint of the subsampled model is that of the whole data.
    full = jaxvb.numpyro.LogJoint(regression, X, y, batch_size=20)
    minibatch = jaxvb.numpyro.log_joint(regression, X, y, batch_size=20)
    assert type(minibatch) is jaxvb.numpyro.MinibatchLogJoint
    assert minibatch.subsample_plates == {"data": (200, 20)}
    x = jnp.array([0.4, -1.3])
    np.testing.assert_allclose(minibatch(x), full(x), rtol=1e-12)
    exact = jaxvb.numpyro.log_joint(regression, X, y)(x)
    np.testing.assert_allclose(full(x), exact, rtol=1e-12)

    # 8 minibatch fits (batches of 20 of the 200 observations) from the prior.
    prior = jaxvb.Gaussian(jnp.zeros(2), PRIOR_SD**2 * jnp.eye(2))

    def one(key):
        return jaxvb.numpyro.fit(
            regression,
            key,
            X,
            y,
            batch_size=20,
            num_steps=2000,
            init=prior,
            fit_kwargs={"num_eval_draws": 200},
        )

    res = jax.vmap(one)(jax.random.split(jax.random.key(4), 8))
    assert isinstance(res, jaxvb.numpyro.NumPyroResult)
    assert np.all(np.asarray(res.status) == 0)
    sd = np.sqrt(np.diag(cov))
    err = (np.asarray(res.q.mean) - mean) / sd  # in posterior sds, one row per fit
    # Unbiased: the mean over the fits is the full-data answer, within its Monte
    # Carlo error estimated from their spread.
    assert np.all(np.abs(err.mean(0)) < 5 * err.std(0, ddof=1) / np.sqrt(8))
    # And close: every fit's mean within 0.3 posterior sds, its sds within 5%; the
    # diagnostics use all the data, so the log evidence is second order in the error.
    assert np.all(np.abs(err) < 0.3)
    sd_fit = np.sqrt(np.diagonal(np.asarray(res.q.cov), axis1=1, axis2=2))
    np.testing.assert_allclose(sd_fit / sd, 1.0, atol=0.05)
    np.testing.assert_allclose(res.log_evidence, log_evidence, atol=0.05)

    first = jax.tree_util.tree_map(lambda v: v[0], res)
    assert first.sample(jax.random.key(5), 10)["fitted"].shape == (10, 200)


def test_discrete_latent_site_is_a_clear_error():
    def mixture(y):
        z = numpyro.sample("z", dist.Bernoulli(0.3))
        numpyro.sample("y", dist.Normal(2.0 * z, 1.0), obs=y)

    with pytest.raises(
        ValueError, match="discrete latent site\\(s\\) 'z' \\(Bernoulli"
    ) as e:
        jaxvb.numpyro.fit(mixture, jax.random.key(0), jnp.array(1.0), num_steps=100)
    message = str(e.value)
    assert "continuous" in message and "Sum the discrete variable out" in message
    assert "DiscreteHMCGibbs" in message and "enumerate" in message

    def enumerated(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        c = numpyro.sample(
            "c", dist.Categorical(jnp.ones(3) / 3), infer={"enumerate": "parallel"}
        )
        numpyro.sample("y", dist.Normal(mu + c, 1.0), obs=y)

    with pytest.raises(ValueError, match="'c' \\(Categorical"):
        jaxvb.numpyro.log_joint(enumerated, jnp.array(1.0))


@pytest.mark.slow
def test_improper_uniform_priors_are_fitted():
    """ImproperUniform priors (flat, on a constrained support
    too) were refused with an empty NotImplementedError. With p(mu, s) flat, mu's
    posterior is symmetric about the sample mean, so the fitted q's mean is there."""

    def flat(y):
        mu = numpyro.sample("mu", dist.ImproperUniform(dist.constraints.real, (), ()))
        s = numpyro.sample("s", dist.ImproperUniform(dist.constraints.positive, (), ()))
        numpyro.sample("y", dist.Normal(mu, s), obs=y)

    y = jnp.array([0.3, -0.5, 1.2, 0.8, 2.0, 1.1, 0.4, 1.5])
    res = jaxvb.numpyro.fit(flat, jax.random.key(0), y, num_steps=400)
    assert int(res.status) == 0
    mu = res.log_joint.constrain(res.q.mean)["mu"]
    sd = float(jnp.sqrt(res.q.cov[0, 0]))
    assert abs(float(mu) - float(y.mean())) < 0.05 * sd


def test_other_bad_models_are_clear_errors():
    def all_observed(y):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises(ValueError, match="no latent sample sites"):
        jaxvb.numpyro.fit(all_observed, jax.random.key(0), jnp.array(1.0), num_steps=100)

    def broken(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y["missing"])

    with pytest.raises(ValueError, match="running the model failed \\(TypeError"):
        jaxvb.numpyro.log_joint(broken, jnp.ones(3))

    def local_latents(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=2):
            theta = numpyro.sample("theta", dist.Normal(mu, 1.0))
            numpyro.sample("y", dist.Normal(theta, 1.0), obs=y[:2])

    with pytest.raises(ValueError, match="'theta' \\(plate 'data'\\).*subsample_size"):
        jaxvb.numpyro.log_joint(local_latents, jnp.ones(4))

    def with_param(y):
        mu = numpyro.param("mu", 0.0)
        numpyro.sample("sigma", dist.HalfNormal(1.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    with pytest.raises(ValueError, match="numpyro.param site\\(s\\) \\['mu'\\]"):
        jaxvb.numpyro.log_joint(with_param, jnp.ones(3))

    with pytest.raises(TypeError, match="not in fit_kwargs"):
        jaxvb.numpyro.fit(
            lognormal_scale, jax.random.key(0), jnp.ones(3), num_steps=10,
            fit_kwargs={"num_steps": 20},
        )  # fmt: skip
    with pytest.raises(ValueError, match="shape \\(1,\\)"):
        jaxvb.numpyro.fit(
            lognormal_scale, jax.random.key(0), jnp.ones(3), num_steps=10,
            init=jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
        )  # fmt: skip


def centred_eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


@pytest.mark.slow
def test_a_centred_hierarchy_names_its_funnel_and_the_scale_site():
    # The joint density of a centred hierarchy has no maximum (a funnel), so there is
    # no Laplace start: the error names the site it climbs along and the remedies.
    y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    with pytest.raises(ValueError, match="no maximum") as info:
        jaxvb.numpyro.fit(centred_eight_schools, jax.random.key(0), sigma, y, num_steps=50)
    message = str(info.value)
    assert "(tau, unconstrained)" in message
    assert "Non-centre" in message and "latent=" in message
    assert len(message) < 700
    lj = jaxvb.numpyro.log_joint(centred_eight_schools, sigma, y)
    names = [lj.coordinate_name(i) for i in range(lj.dim)]
    assert names == ["mu", "tau", *(f"theta[{j}]" for j in range(8))]


def bnn(x, y):
    """Four tanh units: the posterior is symmetric under each unit's sign flip and
    under permutations of the units, with saddles between the modes."""
    w1 = numpyro.sample("w1", dist.Normal(0.0, 1.0).expand([4]).to_event(1))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([4]).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(0.0, 1.0).expand([4]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.HalfNormal(1.0))
    mean = jnp.tanh(x[:, None] * w1 + b1) @ w2 + b2
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mean, noise), obs=y)


@pytest.mark.slow
def test_symmetric_modes_get_an_error_naming_the_sites_and_the_remedies():
    """A neural network's weights (benchmarks/hierarchical.py's): no update is
    proper, and the error says so in a few lines, without advice to raise num_steps,
    naming NUTS, a mixture and the sites."""
    rng = np.random.default_rng(4)
    x = np.sort(rng.uniform(-2.0, 2.0, 40))
    y = np.tanh(2.0 * x) + 0.5 * x + rng.normal(0.0, 0.2, x.size)
    with pytest.raises(jaxvb.FitError) as err:
        jaxvb.numpyro.fit(
            bnn, jax.random.key(0), jnp.asarray(x), jnp.asarray(y), num_steps=1000
        )
    message = str(err.value)
    assert "no update was a proper distribution" in message
    assert "NUTS" in message and "GaussianMixture" in message
    assert "Increase num_steps" not in message and "may still be fine" not in message
    assert "along the site(s) w" in message and len(message) < 1200
