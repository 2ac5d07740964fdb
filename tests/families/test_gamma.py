"""jaxvb._gamma: exact standard-gamma draws and their implicit derivative in the shape.

References no one here wrote: SciPy's gamma distribution (KS tests of the draws, and the
regularised incomplete gamma function, differentiated in ``a`` by central differences)
and ``jax.lax.random_gamma_grad`` (JAX's series / continued-fraction derivative).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from jaxvb._gamma import log_sample_derivative, log_standard_gamma, standard_gamma

SHAPES = [0.02, 0.3, 0.9, 1.0, 2.5, 9.99, 10.0, 47.0, 330.0, 1e4, 1e6]
# Jitted once per shape: eagerly, every op of the sampler would compile on its own.
_draw = jax.jit(standard_gamma, static_argnums=2)
_log_draw = jax.jit(log_standard_gamma, static_argnums=2)
_derivative = jax.jit(log_sample_derivative)
QUANTILES = [1e-9, 1e-4, 0.02, 0.3, 0.5, 0.7, 0.98, 1 - 1e-4, 1 - 1e-9]


def _grid():
    a = np.repeat(SHAPES, len(QUANTILES))
    q = np.tile(QUANTILES, len(SHAPES))
    x = special.gammaincinv(a, q)
    keep = x > 0  # quantile 1e-9 of Gamma(0.02) underflows
    return a[keep], x[keep]


def test_derivative_matches_jax_random_gamma_grad():
    a, x = _grid()
    ours = np.asarray(_derivative(jnp.asarray(a), jnp.log(jnp.asarray(x)))) * x
    ref = np.asarray(jax.lax.random_gamma_grad(jnp.asarray(a), jnp.asarray(x)))
    # JAX's own loops stop at ~1e-13 relative for a up to 1e4; beyond, at ~1e-10.
    tol = np.where(a <= 1e4, 1e-11, 1e-8)
    np.testing.assert_array_less(np.abs(ours / ref - 1.0), tol)


def test_derivative_matches_scipy_finite_differences():
    # dx/da = -dP(a, x)/da / p(x; a), SciPy's P differenced centrally. P varies in a on
    # the scale min(a, sqrt(a)); a step of 1e-4 of it leaves ~1e-8 truncation error
    # and ~1e-12 rounding error.
    a, x = _grid()
    mid = (QUANTILES[0] < special.gammainc(a, x)) & (special.gammainc(a, x) < 0.999)
    a, x = a[mid], x[mid]
    h = 1e-4 * np.minimum(a, np.sqrt(a))
    dp_da = (special.gammainc(a + h, x) - special.gammainc(a - h, x)) / (2 * h)
    ref = -dp_da / stats.gamma(a).pdf(x) / x
    ours = np.asarray(_derivative(jnp.asarray(a), jnp.log(jnp.asarray(x))))
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=0)


@pytest.mark.slow
def test_derivative_is_the_jvp_of_the_draw():
    a = jnp.array([0.4, 3.0, 250.0])
    key = jax.random.key(3)

    @jax.jit  # one program, not one per operation
    def draw(a):
        log_x, tangent = jax.jvp(lambda s: log_standard_gamma(key, s), (a,), (jnp.ones(3),))
        return log_x, tangent, log_standard_gamma(key, a), log_sample_derivative(a, log_x)

    log_x, tangent, plain, derivative = draw(a)
    np.testing.assert_array_equal(log_x, plain)
    np.testing.assert_allclose(tangent, derivative, rtol=1e-15)
    # and the mean of the draws moves as E x = a does: E[dx/da] = 1
    draws = jax.jit(
        jax.vmap(lambda k: jax.grad(lambda s: standard_gamma(k, s))(jnp.float64(6.0)))
    )(jax.random.split(jax.random.key(4), 20000))
    se = float(jnp.std(draws)) / np.sqrt(draws.shape[0])
    assert abs(float(jnp.mean(draws)) - 1.0) < 5 * se


@pytest.mark.parametrize("a", [0.01, 0.3, 1.0, 2.5, 30.0, 1e4])
def test_draws_follow_gamma(a):
    x = np.asarray(_draw(jax.random.key(int(a * 100)), jnp.full((100000,), a), 4))
    assert np.all(np.isfinite(x)) and np.all(x >= 0)
    # A fixed key: deterministic. A correct sampler fails with probability 1e-4.
    assert stats.kstest(x, stats.gamma(a).cdf).pvalue > 1e-4


def test_log_draws_of_tiny_shapes_do_not_underflow():
    # Gamma(0.002) draws underflow float64 about a fifth of the time; their logs do not.
    log_x = _log_draw(jax.random.key(0), jnp.full((10000,), 0.002), 4)
    assert bool(jnp.all(jnp.isfinite(log_x)))
    assert float(jnp.mean(jnp.exp(log_x) == 0.0)) > 0.05


def test_every_element_is_accepted():
    # One candidate per element: ~2-5% of the elements need the while loop's retries.
    a = jnp.linspace(1.0, 3.0, 5000)
    log_x = _log_draw(jax.random.key(5), a, 1)
    assert bool(jnp.all(jnp.isfinite(log_x)))
    u = stats.gamma(np.asarray(a)).cdf(np.exp(np.asarray(log_x)))
    assert stats.kstest(u, "uniform").pvalue > 1e-4


def test_float32():
    a = jnp.array([0.5, 4.0, 200.0], jnp.float32)
    log_x = _log_draw(jax.random.key(0), a, 4)
    d = _derivative(a, log_x)
    assert log_x.dtype == d.dtype == jnp.float32
    ref = jax.lax.random_gamma_grad(a, jnp.exp(log_x)) / jnp.exp(log_x)
    np.testing.assert_allclose(d, ref, rtol=2e-4)


def test_shapes_that_are_not_positive_give_nan_and_do_not_hang():
    a = jnp.array([2.0, 0.0, -1.5, jnp.nan, 0.5])
    log_x = _log_draw(jax.random.key(0), a, 4)
    assert np.all(np.isfinite(np.asarray(log_x)[[0, 4]]))
    assert np.all(np.isnan(np.asarray(log_x)[1:4]))
