"""After a jaxvb.numpyro fit: posterior predictive draws, the pointwise log-likelihood
(ArviZ's ``log_likelihood`` group, ``az.loo``), plate dimensions of deterministic sites,
and batches of fits from ``jax.vmap`` sliced into single, usable results.

The model is a Bayesian linear regression with a known noise scale: the posterior of
the weights is Gaussian, so the fit is exact (checked to 1e-8) and the leave-one-out
predictive densities, the posterior predictive moments and each fit of a batch have
closed forms. Statistical checks compare Monte Carlo estimates with those closed forms
within 5 standard errors estimated from the same draws (fixed keys).
"""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")
# ArviZ is imported where a test runs, not when the module is collected (seconds of
# imports in every worker); without it the module is skipped.
if importlib.util.find_spec("arviz") is None:
    pytest.skip("arviz is not installed", allow_module_level=True)
import numpyro.distributions as dist  # noqa: E402
from test_numpyro_latent import COUNTS, WALK, poisson_walk, walk_group  # noqa: E402

import jaxvb  # noqa: E402
import jaxvb.numpyro  # noqa: E402

NOISE = 0.5  # the known noise sd
N, P = 10, 2


def regression(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([P]).to_event(1))
    numpyro.deterministic("w_sum", w.sum())  # outside every plate
    with numpyro.plate("data", X.shape[0]):
        mean = numpyro.deterministic("mean", X @ w)  # a deterministic inside a plate
        numpyro.sample("y", dist.Normal(mean, NOISE), obs=y)


def posterior(X, y):
    """Mean and covariance of ``w`` given ``(X, y)``: conjugate, in closed form."""
    X, y = np.asarray(X), np.asarray(y)
    cov = np.linalg.inv(np.eye(P) + X.T @ X / NOISE**2)
    return cov @ X.T @ y / NOISE**2, cov


def exact_loo(X, y):
    """``log p(y_i | y_-i)`` for each ``i``: the posterior without ``i``, predicting it."""
    X, y = np.asarray(X), np.asarray(y)
    out = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        m, V = posterior(X[keep], y[keep])
        var = NOISE**2 + X[i] @ V @ X[i]
        out.append(-0.5 * np.log(2 * np.pi * var) - 0.5 * (y[i] - X[i] @ m) ** 2 / var)
    return np.array(out)


def make_data(key, n=N):
    k1, k2 = jax.random.split(key)
    X = jax.random.normal(k1, (n, P))
    y = X @ jnp.array([1.0, -0.5]) + NOISE * jax.random.normal(k2, (n,))
    return X, y


Q0 = jaxvb.Gaussian(jnp.zeros(P), jnp.eye(P))  # over x = w; no mode search, to save time
OPTIONS = {"num_steps": 20, "init": Q0, "fit_kwargs": {"num_eval_draws": 10}}


@pytest.fixture(scope="module")
def fitted():
    """The regression's fit, which five tests read: they run on one xdist worker
    (``fitted_group``), so that it is computed once."""
    X, y = make_data(jax.random.key(0))
    res = jaxvb.numpyro.fit(regression, jax.random.key(1), X, y, **OPTIONS)
    mean, cov = posterior(X, y)
    np.testing.assert_allclose(res.q.mean, mean, rtol=1e-8)  # exact: Algorithm 2
    np.testing.assert_allclose(res.q.cov, cov, rtol=1e-8)
    return X, y, res


fitted_group = pytest.mark.xdist_group("numpyro_after_fitted")


@pytest.mark.slow
@fitted_group
def test_loo_from_to_arviz_matches_the_exact_leave_one_out(fitted):
    import arviz as az

    X, y, res = fitted
    idata = res.to_arviz(jax.random.key(2), 4000, num_chains=4)
    ll = idata.log_likelihood["y"]
    assert ll.dims == ("chain", "draw", "data") and ll.shape == (4, 1000, N)
    # The pointwise log-likelihood at the posterior draws, by hand.
    w = idata.posterior["w"].values.reshape(-1, P)
    by_hand = -0.5 * np.log(2 * np.pi * NOISE**2) - 0.5 * ((y - w @ X.T) / NOISE) ** 2
    np.testing.assert_allclose(ll.values.reshape(-1, N), by_hand, rtol=1e-10)

    loo = az.loo(idata, pointwise=True)
    exact = exact_loo(X, y)
    # Monte Carlo standard error of each point's log(1 / mean(1 / p(y_i | w))) from
    # the same draws (delta method); the points share draws, so the total's standard
    # error is at most the sum of theirs.
    r = np.exp(-by_hand + by_hand.max(0))  # 1 / p, rescaled per point
    se = r.std(0) / r.mean(0) / np.sqrt(r.shape[0])
    assert np.all(loo.pareto_k.values < 0.7)
    np.testing.assert_array_less(np.abs(loo.loo_i.values - exact), 5 * se)
    assert abs(loo.elpd_loo - exact.sum()) < 5 * se.sum()
    # The tolerance can fail: the in-sample log predictive density (no point left
    # out) is off by p_loo (about the number of weights), more than twice it.
    lppd = np.sum(np.log(np.mean(np.exp(by_hand), 0)))
    assert abs(lppd - exact.sum()) > 2 * 5 * se.sum()


@pytest.mark.slow
@fitted_group
def test_to_arviz_names_plates_of_deterministic_sites_and_adds_predictive(fitted):
    X, y, res = fitted
    key = jax.random.key(3)
    idata = res.to_arviz(key, 200, num_chains=2, posterior_predictive=True)
    assert set(idata.groups()) == {
        "posterior",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
    }
    post = idata.posterior
    assert post["mean"].dims == ("chain", "draw", "data")  # a deterministic in a plate
    assert post["w_sum"].dims == ("chain", "draw")
    assert post["w"].dims == ("chain", "draw", "w_dim_0")
    assert res.log_joint.arviz_dims()["mean"] == ["data"]
    pp = idata.posterior_predictive
    assert list(pp.data_vars) == ["y"] and pp["y"].dims == ("chain", "draw", "data")
    # The same draws as predictive(key, n) (and the posterior as sample(key, n)).
    np.testing.assert_array_equal(
        pp["y"].values.reshape(200, N), res.predictive(key, 200)["y"]
    )
    assert "log_likelihood" not in res.to_arviz(key, 10, log_likelihood=False).groups()


@fitted_group
def test_predictive_redraws_the_observed_sites_from_the_fitted_posterior(fitted):
    X, y, res = fitted
    key, n = jax.random.key(4), 4000
    draws = res.predictive(key, n)
    assert list(draws) == ["w", "w_sum", "mean", "y"]
    assert {k: v.shape for k, v in draws.items()} == {
        "w": (n, P),
        "w_sum": (n,),
        "mean": (n, N),
        "y": (n, N),
    }
    np.testing.assert_array_equal(draws["w"], res.sample(key, n)["w"])
    np.testing.assert_allclose(draws["mean"], draws["w"] @ X.T, rtol=1e-12)
    # y given w is N(X w, NOISE^2), drawn anew (not the observed y).
    z = np.asarray((draws["y"] - draws["mean"]) / NOISE)
    assert np.all(np.abs(z.mean(0)) < 5 / np.sqrt(n))
    assert np.all(np.abs(z.var(0) - 1.0) < 5 * np.sqrt(2 / n))

    # New covariates, y=None: the posterior predictive at X_new, whose mean and
    # variance are known in closed form.
    X_new = jnp.array([[0.0, 0.0], [1.0, 2.0], [-3.0, 1.0]])
    new = res.predictive(key, n, X_new)
    assert new["y"].shape == (n, 3) and new["mean"].shape == (n, 3)
    np.testing.assert_array_equal(new["w"], draws["w"])
    m, V = posterior(X, y)
    var = NOISE**2 + np.einsum("ij,jk,ik->i", X_new, V, X_new)
    sample_mean = np.asarray(new["y"]).mean(0)
    assert np.all(np.abs(sample_mean - X_new @ m) < 5 * np.sqrt(var / n))
    sample_var = np.asarray(new["y"]).var(0)
    assert np.all(np.abs(sample_var / var - 1.0) < 5 * np.sqrt(2 / n))


@pytest.mark.slow
@fitted_group
def test_minibatch_model_predicts_and_scores_all_the_data(fitted):
    X, y, res = fitted

    def minibatch(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([P]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=3) as idx:
            mean = numpyro.deterministic("mean", X[idx] @ w)
            numpyro.sample("y", dist.Normal(mean, NOISE), obs=None if y is None else y[idx])

    # The full-data fit's q is the answer for the minibatch model too (same x = w).
    lj = jaxvb.numpyro.log_joint(minibatch, X, y)
    assert lj.subsample_plates == {"data": (N, 3)}
    sub = jaxvb.numpyro.NumPyroResult(res.result, lj)
    key = jax.random.key(5)
    draws = sub.predictive(key, 50)
    assert draws["y"].shape == (50, N) and draws["mean"].shape == (50, N)
    np.testing.assert_allclose(draws["mean"], draws["w"] @ X.T, rtol=1e-12)
    assert sub.predictive(key, 50, X[:7])["y"].shape == (50, 7)  # all 7, not 3
    ll = sub.log_likelihood(key, 50)["y"]  # unscaled: log p(y_i | w) of every i
    np.testing.assert_allclose(ll, res.log_likelihood(key, 50)["y"], rtol=1e-12)
    idata = sub.to_arviz(key, 50)
    assert idata.log_likelihood["y"].shape == (1, 50, N)


@pytest.mark.slow
def test_log_likelihood_of_a_multivariate_observation_is_one_value_per_plate_entry(
    fitted,
):
    X, y, res = fitted
    Z = jnp.stack([y, -y], axis=1)

    def bivariate(Z):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([P]).to_event(1))
        numpyro.factor("penalty", -0.5 * jnp.sum(w**2))  # has no values: left out
        with numpyro.plate("data", Z.shape[0]):
            numpyro.sample("z", dist.MultivariateNormal(w, jnp.eye(P)), obs=Z)

    other = jaxvb.numpyro.NumPyroResult(res.result, jaxvb.numpyro.log_joint(bivariate, Z))
    key = jax.random.key(6)
    ll = other.log_likelihood(key, 20)
    assert list(ll) == ["z"] and ll["z"].shape == (20, N)
    w = other.sample(key, 20)["w"]
    expected = dist.MultivariateNormal(w[:, None, :], jnp.eye(P)).log_prob(Z)
    np.testing.assert_allclose(ll["z"], expected, rtol=1e-12)
    assert list(other.predictive(key, 20)) == ["w", "z"]  # no factor site
    idata = other.to_arviz(key, 20, posterior_predictive=True)
    assert idata.log_likelihood["z"].dims == ("chain", "draw", "data")
    assert idata.posterior_predictive["z"].dims == ("chain", "draw", "data", "z_dim_1")


@fitted_group
def test_a_single_fit_is_not_a_batch(fitted):
    _, _, res = fitted
    assert res.batch_shape == () and bool(res)
    with pytest.raises(TypeError, match="single fit"):
        res[0]
    with pytest.raises(TypeError, match="single NumPyroResult"):
        len(res)


def _assert_no_tracer(res):
    leaves = jax.tree_util.tree_leaves(res)
    lj = res.log_joint
    attrs = jax.tree_util.tree_leaves(
        [lj.model_args, lj.model_kwargs, lj.observed, vars(lj)]
    )
    for leaf in leaves + attrs:
        assert not isinstance(leaf, jax.core.Tracer)


@pytest.mark.slow
def test_vmap_over_data_sets_gives_a_batch_that_slices_into_usable_fits():
    keys = jax.random.split(jax.random.key(7), 3)
    X, _ = make_data(jax.random.key(0))
    ys = jnp.stack([make_data(k)[1] for k in keys])  # three data sets, one X

    def one(y):
        return jaxvb.numpyro.fit(regression, jax.random.key(8), X, y, **OPTIONS)

    res = jax.vmap(one)(ys)
    assert isinstance(res, jaxvb.numpyro.NumPyroResult)
    assert res.batch_shape == (3,) and len(res) == 3
    assert [r.batch_shape for r in res] == [(), (), ()]
    assert res[1:].batch_shape == (2,) and res[res.ok].batch_shape == (3,)
    with pytest.raises(IndexError, match="batch_shape"):
        res[0, 1]
    with pytest.raises(TypeError, match=r"batch of \(3,\) fits.*res\[i\]"):
        res.sample(jax.random.key(9), 5)
    with pytest.raises(TypeError, match="take one fit with res"):
        _ = res.message
    for i in range(3):
        one_fit = res[i]
        _assert_no_tracer(one_fit)
        mean, cov = posterior(X, ys[i])
        np.testing.assert_allclose(one_fit.q.mean, mean, rtol=1e-8)  # its own data
        assert one_fit.message == jaxvb.explain(one_fit) == "ok"
        draws = one_fit.sample(jax.random.key(9), 5)
        np.testing.assert_allclose(draws["mean"], draws["w"] @ X.T, rtol=1e-12)
        idata = one_fit.to_arviz(jax.random.key(9), 20, posterior_predictive=True)
        np.testing.assert_array_equal(idata.observed_data["y"], ys[i])
        ll = idata.log_likelihood["y"].values.reshape(20, N)
        by_hand = dist.Normal(draws["mean"][:1], NOISE).log_prob(ys[i])
        np.testing.assert_allclose(ll[:1], by_hand, rtol=1e-10)
        assert one_fit.predictive(jax.random.key(9), 4, X[:2])["y"].shape == (4, 2)


@pytest.mark.slow
def test_vmap_over_keys_and_a_plain_result_slice_the_same_way():
    X, y = make_data(jax.random.key(0))
    keys = jax.random.split(jax.random.key(10), 2)
    res = jax.vmap(lambda k: jaxvb.numpyro.fit(regression, k, X, y, **OPTIONS))(keys)
    assert res.batch_shape == (2,)
    second = res[1]
    _assert_no_tracer(second)
    np.testing.assert_array_equal(second.log_joint.model_args[0], X)
    assert second.ok and second.to_arviz(jax.random.key(11), 10).posterior["w"].shape == (
        1,
        10,
        P,
    )

    # A plain jaxvb.Result (a NamedTuple: res[i] is a field) slices with tree_map.
    lj = jaxvb.numpyro.log_joint(regression, X, y)
    plain = jax.vmap(lambda k: jaxvb.fit(lj, Q0, k, num_steps=20, num_eval_draws=10))(keys)
    first = jax.tree.map(lambda v: v[0], plain)
    assert isinstance(first, jaxvb.Result) and first.status.shape == ()
    assert jaxvb.explain(first) == "ok" and first.sample(jax.random.key(12), 3).shape == (
        3,
        P,
    )
    np.testing.assert_allclose(first.q.mean, posterior(X, y)[0], rtol=1e-8)


@pytest.mark.slow
@walk_group
def test_latent_route_predicts_and_scores():
    # Counts with a Gaussian random-walk log-rate, fitted with latent="f" (q(theta)
    # q(f | theta)): test_numpyro_latent's model and settings, whose program its tests
    # compile in this worker.
    res = jaxvb.numpyro.fit(poisson_walk, jax.random.key(13), COUNTS, **WALK)
    key = jax.random.key(14)
    draws = res.predictive(key, 30)
    assert list(draws) == ["s", "f", "rate", "y"]
    assert draws["y"].shape == (30, 8) and draws["f"].shape == (30, 8)
    np.testing.assert_array_equal(draws["f"], res.sample(key, 30)["f"])
    idata = res.to_arviz(key, 30, posterior_predictive=True)
    ll = idata.log_likelihood["y"].values.reshape(30, 8)
    expected = dist.Poisson(jnp.exp(draws["f"])).log_prob(COUNTS)
    np.testing.assert_allclose(ll, expected, rtol=1e-10)
    assert idata.posterior["rate"].dims == ("chain", "draw", "t")
