"""The NumPyro probit baselines: NUTS agrees with quadrature, SVI gets close to it.

A two-coefficient probit posterior is computed exactly (up to quadrature error, far
below the Monte Carlo error) on a grid. NUTS's tolerances are 5 Monte Carlo standard
errors from its own effective sample sizes (a false failure rate of about 1e-6 per
coordinate for a normal error; the keys are fixed, so the test is deterministic).
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxvb.models import probit

pytest.importorskip("numpyro")
pytest.importorskip("optax")

from jaxvb.baselines import numpyro_probit  # noqa: E402

# One worker computes the quadrature reference for the whole module.
pytestmark = pytest.mark.xdist_group("numpyro_baselines")


@jax.jit  # one program, not one per operation
def _quadrature(design, y):
    """The posterior's mean and covariance on a grid, and its mass near the edges."""
    # Spacing 0.04, a sixth of the smaller posterior sd: the sum over an even grid of a
    # smooth density negligible at the edges converges geometrically (to 1e-13 here,
    # as on a grid twice as fine), far below NUTS's Monte Carlo error of ~0.01.
    grid = jnp.linspace(-6.0, 6.0, 301)
    x = jnp.stack(jnp.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, 2)
    log_p = jax.vmap(partial(probit.log_joint, design=design, y=y))(x)
    w = jnp.exp(log_p - log_p.max())
    w = w / w.sum()
    mean = w @ x
    cov = (x - mean).T @ ((x - mean) * w[:, None])
    edge = (jnp.abs(x) > 5.5).any(-1)
    return mean, cov, jnp.sum(jnp.where(edge, w, 0.0))


@pytest.fixture(scope="module")
def problem():
    """20 observations, 2 coefficients, and the exact posterior moments by quadrature."""
    _, design, y = probit.simulate(jax.random.key(3), 1, num_obs=20, num_features=2)
    design, y = design[0], y[0]
    mean, cov, edge_mass = _quadrature(design, y)
    # The grid must hold the whole posterior: its mass at the edges is negligible.
    assert float(edge_mass) < 1e-10
    return design, y, np.asarray(mean), np.asarray(cov)


@pytest.mark.slow
def test_model_is_the_jaxvb_log_joint(problem):
    from numpyro.infer.util import log_density

    design, y, _, _ = problem
    x = jnp.array([0.3, -1.2])
    lp, _ = log_density(numpyro_probit.model, (design, y), {}, {"x": x})
    assert np.isclose(lp, probit.log_joint(x, design, y), rtol=1e-12, atol=1e-12)


@pytest.mark.integration
def test_nuts_matches_quadrature(problem):
    design, y, mean, cov = problem
    res = numpyro_probit.nuts(
        design, y, jax.random.key(0), num_warmup=500, num_samples=2000, num_chains=2
    )
    assert res.samples.shape == (2, 2000, 2)
    assert res.num_divergent == 0 and np.all(res.r_hat < 1.01)
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_array_less(np.abs(res.mean - mean), 5 * sd / np.sqrt(res.ess))
    # Standard error of a sample covariance entry: sqrt((s_ii s_jj + s_ij^2) / ESS).
    ess = np.minimum.outer(res.ess, res.ess)
    se = np.sqrt((np.outer(sd**2, sd**2) + cov**2) / ess)
    np.testing.assert_array_less(np.abs(res.cov - cov), 5 * se)


@pytest.mark.slow
def test_svi_gets_close_to_the_posterior(problem):
    import optax

    design, y, mean, cov = problem
    num_steps = 2000
    fit = jax.jit(
        partial(
            numpyro_probit.svi,
            num_steps=num_steps,
            learning_rate=optax.cosine_decay_schedule(0.03, num_steps),
            num_particles=10,
        )
    )
    res = fit(design, y, jax.random.key(1))
    assert res.loss.shape == (num_steps,)
    assert float(res.loss[-100:].mean()) < float(res.loss[:100].mean())
    sd = np.sqrt(np.diag(cov))
    # The best Gaussian's mean is within a few percent of a posterior sd of the exact
    # mean for this nearly Gaussian posterior; SVI's noise adds a little more.
    np.testing.assert_array_less(np.abs(np.asarray(res.mean) - mean), 0.1 * sd)
    np.testing.assert_allclose(np.sqrt(np.diag(res.cov)), sd, rtol=0.15)
    # Same key, same answer: the run is pure.
    again = fit(design, y, jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(res.mean), np.asarray(again.mean))
