"""NumPyroResult.sample's importance-resampled draws (PSIS) and NumPyroResult.importance.

Against closed forms: a Poisson rate under a Gamma prior, whose Gaussian fit on the log
scale is close but not exact (the resampled draws close the gap), and a Cauchy, whose
tails no Gaussian proposal can weigh (k-hat above 1: q's own draws by default).
"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
import jaxvb.numpyro  # noqa: E402

# the fast tier reaches the resampled draws through every sample() of its NumPyro tests
pytestmark = pytest.mark.slow

COUNTS = jnp.array([1.0, 2.0])


def poisson_rate(y):
    rate = numpyro.sample("rate", dist.Gamma(1.0, 1.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Poisson(rate), obs=y)


def cauchy():
    numpyro.sample("x", dist.Cauchy(0.0, 1.0))


@pytest.fixture(scope="module")
def rate_fit():
    return jaxvb.numpyro.fit(poisson_rate, jax.random.key(0), COUNTS, num_steps=200)


def test_resampled_draws_match_the_exact_posterior(rate_fit):
    """rate | y ~ Gamma(4, 3): mean 4/3, sd 2/3. The resampled draws' mean and sd are
    within 4 Monte Carlo standard errors of them (n = 8000 draws from 32000 weighed
    proposals; the sd's relative error is about 1 / sqrt(2 ess)), while q's own sd,
    a log-normal's, is off by more than that."""
    n = 8000
    imp = rate_fit.importance(jax.random.key(1), n)
    assert imp.num_proposals == 32000 and imp.reliable
    assert float(imp.ess) > 0.5 * 32000
    # the verdict's k-hat comes with its Monte Carlo spread (a bootstrap of the weights)
    assert 0.0 < float(imp.khat_sd) < 0.5 and 0.0 < float(rate_fit.khat_sd) < 0.5
    rate = np.asarray(rate_fit.sample(jax.random.key(1), n)["rate"])
    mean, sd = 4.0 / 3.0, 2.0 / 3.0
    assert abs(rate.mean() - mean) < 4 * sd / np.sqrt(n)
    assert abs(rate.std() / sd - 1.0) < 4 / np.sqrt(2 * n)
    own = np.asarray(rate_fit.sample(jax.random.key(1), 200_000, psis=False)["rate"])
    assert abs(own.std() / sd - 1.0) > 4 / np.sqrt(2 * n)


def test_psis_false_gives_q_own_draws(rate_fit):
    """psis=False is q's draws mapped through the bijection, key for key."""
    x = rate_fit.q.sample(jax.random.key(3), (50,))
    own = rate_fit.sample(jax.random.key(3), 50, psis=False)["rate"]
    np.testing.assert_array_equal(own, jnp.exp(x[:, 0]))


def test_heavy_tails_fall_back_to_q_and_psis_true_warns():
    """A Cauchy: the weights' k-hat is near or above 1 (their mean does not exist).
    The fit's k-hat decides which draws ``sample`` gives, whatever the key of the
    call (one call's 4000 proposals read far higher than the fit's 16,000); with a
    k-hat above 1 the default draws are q's own and psis=True warns that its resample
    is not a reliable correction."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = jaxvb.numpyro.fit(
            cauchy, jax.random.key(0), num_steps=200, fit_kwargs=dict(on_failure="ignore")
        )
    imp = res.importance(jax.random.key(1), 1000)
    assert float(imp.khat) > 1.0 and not imp.reliable
    resampled = float(res.khat) <= 1.0
    for key in (jax.random.key(1), jax.random.key(2)):
        default = res.sample(key, 1000)["x"]
        own = res.sample(key, 1000, psis=False)["x"]
        assert bool(jnp.any(default != own)) == resampled

    heavy = dataclasses.replace(res, result=res.result._replace(khat=imp.khat))
    default = heavy.sample(jax.random.key(1), 1000)["x"]
    own = heavy.sample(jax.random.key(1), 1000, psis=False)["x"]
    np.testing.assert_array_equal(default, own)
    with pytest.warns(RuntimeWarning, match="k-hat"):
        heavy.sample(jax.random.key(1), 1000, psis=True)


def test_importance_refuses_too_few_proposals(rate_fit):
    with pytest.raises(ValueError, match="num_proposals must be >= 25"):
        rate_fit.importance(jax.random.key(1), 10, num_proposals=10)
