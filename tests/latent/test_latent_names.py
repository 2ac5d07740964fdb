"""A LatentGaussian that names its hyperparameters, maps them to their constrained
scale, names its field and simulates its data: the summary and ArviZ read them.

The model: Poisson counts on a log rate ``f`` with an AR(1) prior about a level ``mu``,
its scale ``sigma = exp(theta[0])`` reported on the constrained scale and ``mu =
theta[1]`` as it is. Its functions are module-level, so that the tests' fits share
their compiled programs.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln

import jaxvb
from jaxvb import _static
from jaxvb.core import fit as _fit
from jaxvb.interop import arviz as _arviz
from jaxvb.linalg import Banded

az = pytest.importorskip("arviz")

KEY = jax.random.key(0)
Y = jnp.array([0.0, 2.0, 1.0, 4.0, 3.0, 5.0, 2.0, 1.0])
T = Y.shape[0]
NUM_STEPS = 60
#: Draws for ArviZ: one size, so that the tests share the programs that make them
N = 400


def _ar1_band(phi=0.6):
    diag = jnp.full(T, 1.0 + phi**2).at[0].set(1.0).at[-1].set(1.0)
    return jnp.stack([diag, jnp.full(T, -phi).at[-1].set(0.0)])


def _log_prior(th):
    return -0.5 * jnp.sum(th**2)


def _prior(th):
    return th[1] * jnp.ones(T), Banded(jnp.exp(-2.0 * th[0]) * _ar1_band())


def _log_lik(f, y):
    return y * f - jnp.exp(f) - jax.scipy.special.gammaln(y + 1.0)


def _simulate(key, f, y):
    return jax.random.poisson(key, jnp.exp(f)).astype(f.dtype)


def _model(data=Y, **names):
    named = dict(
        theta_names=("sigma", "mu"),
        theta_transforms={"sigma": jnp.exp},
        field_name="log_rate",
        simulate=_simulate,
    )
    return jaxvb.LatentGaussian(
        log_prior=_log_prior, prior=_prior, log_lik=_log_lik, data=data, **(named | names)
    )


def _unnamed(res):
    """``res`` with the model's names, transforms and simulate taken away (the fitted
    ``q`` unchanged): a plain ``LatentGaussian`` fit without a second fit."""
    model = dataclasses.replace(
        res.q.model, theta_names=None, theta_transforms=None, field_name="f", simulate=None
    )
    return res._replace(q=dataclasses.replace(res.q, model=model))


#: The tests of a fitted model: slow (the fit compiles for ~10 s), and on one xdist
#: worker, so that the module's fit runs once.
def fitted(test):
    return pytest.mark.slow(pytest.mark.xdist_group("latent_names")(test))


@pytest.fixture(scope="module")
def res():
    return jaxvb.fit(_model(), jnp.zeros(2), KEY, num_steps=NUM_STEPS)


# ----------------------------------------------------------------------- the model


@pytest.mark.parametrize(
    "fields, error, match",
    [
        ({"theta_names": "sigma"}, ValueError, "theta_names must be distinct"),
        ({"theta_names": ("a", "a")}, ValueError, "theta_names must be distinct"),
        ({"theta_names": ("a", "")}, ValueError, "theta_names must be distinct"),
        ({"theta_transforms": jnp.exp}, TypeError, "one per hyperparameter"),
        ({"theta_transforms": (jnp.exp, 2.0)}, TypeError, "sequence of functions"),
        ({"theta_transforms": {"tau": jnp.exp}}, ValueError, "keyed by theta_names"),
        ({"theta_names": None, "theta_transforms": {"a": jnp.exp}}, ValueError, "keyed"),
        ({"field_name": "mu"}, ValueError, "field_name must be a non-empty string"),
        ({"field_name": ""}, ValueError, "field_name must be a non-empty string"),
        (
            {"theta_names": None, "theta_transforms": None, "field_name": "theta"},
            ValueError,
            "other than the",
        ),
        ({"simulate": "poisson"}, TypeError, "simulate must be a function"),
    ],
)
def test_bad_names_get_clear_errors(fields, error, match):
    with pytest.raises(error, match=match):
        _model(**fields)


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"theta_names": ("sigma", "mu", "rho")}, "3 theta_names for the 2 hyperparam"),
        ({"theta_transforms": (jnp.exp,)}, "1 theta_transforms for the 2 hyperparam"),
        (
            {"theta_transforms": (lambda u: jnp.stack([u, u]), None)},
            r"theta_transforms\[0\] must map one unconstrained value",
        ),
    ],
)
def test_names_that_do_not_fit_theta0_are_named_before_the_fit(fields, match):
    with pytest.raises(ValueError, match=match):
        _model(**fields).bind(jnp.zeros(2))


def test_names_are_static_and_leave_the_leaves_alone():
    plain = jaxvb.LatentGaussian(
        log_prior=_log_prior, prior=_prior, log_lik=_log_lik, data=Y
    )
    named = _model()
    assert named.theta_transforms == (jnp.exp, None)  # the dict, in the names' order
    a, b = jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(named)
    assert len(a) == len(b) == 1 and a[0] is b[0]  # the data: the only traced leaf
    assert (plain.theta_names, plain.theta_transforms, plain.field_name) == (
        None,
        None,
        "f",
    )
    # another data set of the same shapes: the same static part, one compiled program
    assert _static.partition(_model())[1] == _static.partition(_model(Y + 1.0))[1]


@fitted
def test_new_data_reuses_the_compiled_fit(res):
    """The names are static: a new data set of the same shapes compiles no new fit."""
    size = _fit._fit._cache_size()
    again = jaxvb.fit(_model(Y + 1.0), jnp.zeros(2), jax.random.key(1), num_steps=NUM_STEPS)
    assert _fit._fit._cache_size() == size
    assert again.q.model.theta_names == ("sigma", "mu")


@fitted
def test_a_named_fit_is_the_unnamed_fit_bit_for_bit(res):
    plain = jaxvb.LatentGaussian(
        log_prior=_log_prior, prior=_prior, log_lik=_log_lik, data=Y
    )
    other = jaxvb.fit(plain, jnp.zeros(2), KEY, num_steps=NUM_STEPS)
    for a, b in zip(
        jax.tree_util.tree_leaves((res.q.theta, res.q.site_precision, res.elbo)),
        jax.tree_util.tree_leaves((other.q.theta, other.q.site_precision, other.elbo)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


@fitted
def test_constrained_applies_each_transform_to_its_column(res):
    theta, _ = res.sample(jax.random.key(3), 50)
    out = res.q.constrained(theta)
    np.testing.assert_array_equal(out[:, 0], jnp.exp(theta[:, 0]))
    np.testing.assert_array_equal(out[:, 1], theta[:, 1])
    np.testing.assert_array_equal(_unnamed(res).q.constrained(theta), theta)


# --------------------------------------------------------------------- the summary


@fitted
def test_summary_names_the_hyperparameters_on_their_scale_and_the_field(res):
    n = 1000
    s = res.summary(num_samples=n)
    assert s.names == ("sigma", "mu", *(f"log_rate[{t}]" for t in range(T)))
    # sigma from the summary's draws of q (key 0), exp'd; mu exact, from q(theta)
    draws = jax.jit(lambda q, key: q.sample(key, (n,)))(res.q, jax.random.key(0))
    sigma = np.exp(np.asarray(draws[:, 0], np.float64))
    np.testing.assert_allclose(s["sigma"]["mean"], sigma.mean(), rtol=1e-13)
    np.testing.assert_allclose(s["sigma"]["sd"], sigma.std(ddof=1), rtol=1e-12)
    assert s["sigma"]["mcse"] > 0
    assert s["mu"]["mean"] == pytest.approx(float(res.q.theta.mean[1]), rel=1e-12)
    assert s["mu"]["mcse"] == 0.0  # exact
    np.testing.assert_allclose(
        s["log_rate[2]"]["mean"], np.asarray(draws[:, 4]).mean(), rtol=1e-12
    )
    assert any(note.startswith("(sigma, log_rate: from 1000 draws") for note in s.notes)
    assert "sigma" in str(s)


@fitted
def test_summary_of_an_unnamed_model_is_what_it_was(res):
    s = _unnamed(res).summary(num_samples=200)
    assert s.names == ("theta[0]", "theta[1]", *(f"f[{t}]" for t in range(T)))
    assert s["theta[0]"]["mcse"] == 0.0
    assert s["theta[0]"]["mean"] == pytest.approx(float(res.q.theta.mean[0]), rel=1e-12)
    assert s.notes[-1] == "(f: from 200 draws of q)"
    assert res.summary(names=["a", "b"], num_samples=200).names[:2] == ("a", "b")


# ------------------------------------------------------------------------ ArviZ


@fitted
def test_to_arviz_groups_hold_the_named_draws(res):
    key, n = jax.random.key(4), N
    idata = jaxvb.to_arviz(res, key, n, num_chains=2, psis=False)
    assert set(idata.groups()) == {
        "posterior",
        "log_likelihood",
        "posterior_predictive",
        "observed_data",
    }
    post = idata.posterior
    assert set(post.data_vars) == {"sigma", "mu", "log_rate"}
    assert post["sigma"].shape == (2, 200) and post["log_rate"].shape == (2, 200, T)
    assert post.attrs["jaxvb_draws"] == f"{n} draws of q"
    # psis=False: the draws of res.sample(key, n), the transform applied to them
    theta, f = res.sample(key, n)
    np.testing.assert_array_equal(post["sigma"].values.ravel(), jnp.exp(theta[:, 0]))
    np.testing.assert_array_equal(post["mu"].values.ravel(), theta[:, 1])
    np.testing.assert_array_equal(post["log_rate"].values.reshape(n, T), f)
    # pointwise log-likelihood at the same draws
    y = np.asarray(Y)
    f = np.asarray(f)
    expected = y * f - np.exp(f) - gammaln(y + 1.0)
    ll = idata.log_likelihood["y"].values
    assert ll.shape == (2, 200, T)
    np.testing.assert_allclose(ll.reshape(n, T), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)
    assert idata.posterior_predictive["y"].shape == (2, 200, T)


@fitted
def test_loo_runs_and_gives_a_finite_elpd(res):
    idata = jaxvb.to_arviz(res, jax.random.key(5), N, psis=False)
    # (az.loo may warn about its own k-hat values: with one value of the field per
    # observation, each observation is influential)
    loo = az.loo(idata, pointwise=True)
    assert np.isfinite(loo.elpd_loo) and np.isfinite(loo.se) and loo.n_data_points == T
    # elpd_loo is below the in-sample log pointwise predictive density
    ll = idata.log_likelihood["y"].values.reshape(-1, T)
    lppd = np.sum(np.log(np.mean(np.exp(ll), axis=0)))
    assert loo.elpd_loo < lppd


@fitted
def test_posterior_predictive_has_the_poisson_means_of_its_draws(res):
    """Given the draws' ``f``, the replicated counts are independent Poisson(exp f):
    ``mean(y_rep_t) - mean(exp f_t)`` over ``n`` draws has sd ``sqrt(mean(exp f_t) /
    n)`` about 0. Within 4.5 of those at every one of the ``T = 8`` sites fails with
    probability about ``8 * 7e-6``."""
    n = N
    idata = jaxvb.to_arviz(res, jax.random.key(6), n, psis=False)
    rate = np.exp(idata.posterior["log_rate"].values.reshape(n, T))
    y_rep = idata.posterior_predictive["y"].values.reshape(n, T)
    assert np.all(y_rep == np.round(y_rep)) and np.all(y_rep >= 0)
    se = np.sqrt(rate.mean(0) / n)
    z = (y_rep.mean(0) - rate.mean(0)) / se
    assert np.all(np.abs(z) < 4.5), z


@fitted
def test_psis_chooses_between_the_resampled_draws_and_q(res, monkeypatch):
    key, n = jax.random.key(7), 100
    out = res.q.importance_resample(key, n, num_theta=2000, warn=False)
    assert float(out.khat) <= 1.0
    idata = jaxvb.to_arviz(res, key, n, log_likelihood=False, posterior_predictive=False)
    np.testing.assert_array_equal(idata.posterior["mu"].values.ravel(), out.theta[:, 1])
    np.testing.assert_array_equal(idata.posterior["log_rate"].values[0], out.f)
    assert "resampled from 2000 of q(theta)" in idata.posterior.attrs["jaxvb_draws"]
    assert set(idata.groups()) == {"posterior", "observed_data"}
    # a k-hat over the limit: q's own draws, or with psis=True the resampled, warned
    monkeypatch.setattr(_arviz, "KHAT_RESAMPLE_LIMIT", -1.0)
    own = jaxvb.to_arviz(res, key, n, log_likelihood=False)
    theta, _ = res.sample(key, n)
    np.testing.assert_array_equal(own.posterior["mu"].values.ravel(), theta[:, 1])
    assert "k-hat is" in own.posterior.attrs["jaxvb_draws"]
    with pytest.warns(RuntimeWarning, match="psis=None gives q's own draws"):
        forced = jaxvb.to_arviz(res, key, n, psis=True, log_likelihood=False)
    np.testing.assert_array_equal(forced.posterior["mu"].values.ravel(), out.theta[:, 1])


@fitted
def test_to_arviz_of_an_unnamed_model_and_its_errors(res):
    plain = _unnamed(res)
    idata = jaxvb.to_arviz(plain, jax.random.key(8), N, psis=False, log_likelihood=False)
    assert set(idata.posterior.data_vars) == {"theta", "f"}
    assert idata.posterior["theta"].shape == (1, N, 2)
    assert set(idata.groups()) == {"posterior", "observed_data"}
    names = ["s", "m"]
    named = jaxvb.to_arviz(plain, KEY, N, psis=False, log_likelihood=False, names=names)
    assert set(named.posterior.data_vars) == {"s", "m", "f"}
    with pytest.raises(ValueError, match="needs the model's simulate"):
        jaxvb.to_arviz(plain, KEY, 20, psis=False, posterior_predictive=True)
    with pytest.raises(ValueError, match="names must be 2 strings"):
        jaxvb.to_arviz(plain, KEY, 20, psis=False, names=["s"])
    with pytest.raises(ValueError, match="repeat one"):
        jaxvb.to_arviz(plain, KEY, N, psis=False, log_likelihood=False, names=["s", "f"])
    q = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    with pytest.raises(ValueError, match="apply to a jaxvb.LatentGaussian fit"):
        jaxvb.to_arviz(q, KEY, 20, psis=True)
