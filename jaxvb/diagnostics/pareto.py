"""Pareto-smoothed importance sampling (PSIS) and its diagnostic k-hat.

Vehtari, Simpson, Gelman, Yao & Gabry (2024), "Pareto smoothed importance sampling",
JMLR 25(72): the largest ``M = ceil(min(n / 5, 3 sqrt(n / r_eff)))`` importance ratios
are replaced by the expected order statistics of a generalized Pareto distribution
fitted to them (Zhang & Stephens 2009, with the paper's weak prior on ``k``), and the
fitted shape k-hat says how far the ratios' tail can be trusted (k-hat < 0.7: the
smoothed estimates are reliable; above 0.7 their error falls with ``n`` only slowly).

Why written here and not taken from ArviZ: it runs inside the compiled fit (under
``jit`` and ``vmap``), where ArviZ's NumPy code cannot; ``tests/diagnostics/test_psis.py`` checks it
against ArviZ's ``psislw``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "PSIS",
    "khat_sd",
    "psis",
    "psis_expectation",
    "psis_resample",
    "resample_indices",
]


class PSIS(NamedTuple):
    """Pareto-smoothed importance weights and their diagnostic.

    Attributes:
      log_weights: normalised smoothed log weights (``logsumexp = 0``), the input's
        shape; ``-inf`` where the input was not finite.
      khat: the fitted generalized Pareto shape of the ratios' right tail; NaN when
        there are too few finite ratios (fewer than 5 in the tail).

    Example:
      Heavy-tailed ratios (a Cauchy's log ratios against a Gaussian's draws):

      >>> import jax, jaxvb
      >>> x = jax.random.normal(jax.random.key(0), (2000,))
      >>> out = jaxvb.diagnostics.psis(0.5 * x**2 - jax.numpy.log1p(x**2))
      >>> out.log_weights.shape, bool(out.khat > 0.0)
      ((2000,), True)
    """

    log_weights: jax.Array
    khat: jax.Array


def _tail_length(n: int, reff: float) -> int:
    return int(math.ceil(min(0.2 * n, 3.0 * math.sqrt(n / reff))))


def _gpd_fit(x: jax.Array):
    """``(k, sigma)`` of a generalized Pareto distribution for the ascending
    exceedances ``x`` (``M``,), by Zhang & Stephens' (2009) posterior-mean estimate of
    ``b = -k / sigma`` over a grid of ``30 + floor(sqrt(M))`` values, with PSIS's weak
    prior pulling ``k`` towards 0.5 (as if 10 more observations at ``k = 0.5``)."""
    m = x.shape[0]
    grid = 30 + int(math.sqrt(m))
    j = jnp.arange(1, grid + 1, dtype=x.dtype)
    quartile = x[int(m / 4 + 0.5) - 1]
    b = 1.0 / x[-1] + (1.0 - jnp.sqrt(grid / (j - 0.5))) / (3.0 * quartile)
    k = jnp.mean(jnp.log1p(-b[:, None] * x[None, :]), axis=1)
    profile = m * (jnp.log(-b / k) - k - 1.0)  # the profile log likelihood of each b
    w = jax.nn.softmax(profile)
    # grid points with negligible weight are dropped (as in the published algorithm)
    w = jnp.where(w >= 10.0 * jnp.finfo(x.dtype).eps, w, 0.0)
    w = w / jnp.sum(w)
    b_post = jnp.sum(w * b)
    k_post = jnp.mean(jnp.log1p(-b_post * x))
    sigma = -k_post / b_post
    k_post = (m * k_post + 10.0 * 0.5) / (m + 10.0)
    return k_post, sigma


def _gpd_quantile(p: jax.Array, k: jax.Array, sigma: jax.Array) -> jax.Array:
    """Quantiles ``p`` of a generalized Pareto distribution (location 0)."""
    small = jnp.abs(k) < 1e-12
    safe_k = jnp.where(small, 1.0, k)
    general = sigma * jnp.expm1(-safe_k * jnp.log1p(-p)) / safe_k
    return jnp.where(small, -sigma * jnp.log1p(-p), general)


def psis(log_ratios: jax.Array, reff: float = 1.0) -> PSIS:
    """Pareto-smoothed importance sampling of ``log_ratios`` (``log p - log q`` at
    draws of ``q``, up to a constant): smoothed, normalised log weights and k-hat.

    Traceable (``jit``, ``vmap``); ``log_ratios`` of shape ``(n,)``, ``n >= 5 / 0.2``
    for a tail of at least 5. Non-finite ratios get weight 0 and are left out of the
    tail (they count in ``n``).

    Args:
      log_ratios: ``(n,)`` log importance ratios.
      reff: relative efficiency of the draws (1 for independent draws, as from ``q``).

    Returns:
      :class:`PSIS`. Agrees with ArviZ's ``psislw`` (``tests/diagnostics/test_psis.py``).

    Example:
      Ratios of ``N(0, 1)`` to draws of ``N(0, 1.1^2)``: a light tail, k-hat below 0:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> x = 1.1 * jax.random.normal(jax.random.key(0), (4000,))
      >>> log_r = -0.5 * x**2 + 0.5 * (x / 1.1) ** 2
      >>> out = jaxvb.diagnostics.psis(log_r)
      >>> bool(out.khat < 0.0), round(float(jax.nn.logsumexp(out.log_weights)), 12)
      (True, 0.0)
    """
    lw = jnp.asarray(log_ratios)
    if not jnp.issubdtype(lw.dtype, jnp.floating):
        lw = lw.astype(jnp.result_type(float))
    if lw.ndim != 1:
        raise ValueError(f"psis: log_ratios must have shape (n,), got {lw.shape}")
    return _psis(lw, _tail_length(lw.shape[0], reff))


@functools.partial(jax.jit, static_argnums=1)
def _psis(lw: jax.Array, m: int) -> PSIS:
    """:func:`psis` with a tail of ``m`` draws, as one compiled program: called
    eagerly, its ~40 operations are then compiled together rather than one by one;
    inside a trace the ``jit`` is inlined."""
    n = lw.shape[0]
    finite = jnp.isfinite(lw)
    lw = jnp.where(finite, lw, -jnp.inf)
    lw = lw - jnp.max(jnp.where(finite, lw, -jnp.inf))
    order = jnp.argsort(lw)
    sorted_lw = lw[order]
    cutoff = jnp.maximum(sorted_lw[n - m - 1], jnp.log(jnp.finfo(lw.dtype).tiny))
    tail = sorted_lw[n - m :]
    in_tail = tail > cutoff
    exceed = jnp.where(in_tail, jnp.exp(tail) - jnp.exp(cutoff), 0.0)
    k, sigma = _gpd_fit(exceed)
    enough = (jnp.sum(in_tail) > 4) & (jnp.sum(finite) > m)
    k = jnp.where(enough, k, jnp.nan)
    # the tail's expected order statistics under the fit, capped at the largest ratio
    p = (jnp.arange(m, dtype=lw.dtype) + 0.5) / m
    smooth = jnp.log(_gpd_quantile(p, k, sigma) + jnp.exp(cutoff))
    smooth = jnp.minimum(smooth, 0.0)
    use = enough & jnp.isfinite(k) & in_tail
    tail = jnp.where(use, smooth, tail)
    sorted_lw = sorted_lw.at[n - m :].set(tail)
    out = jnp.empty_like(lw).at[order].set(sorted_lw)
    out = out - jax.nn.logsumexp(out)
    return PSIS(log_weights=out, khat=k)


#: Bootstrap replicates :func:`khat_sd` computes k-hat on.
KHAT_SD_RESAMPLES = 16


def khat_sd(key: jax.Array, log_ratios: jax.Array, reff: float = 1.0) -> jax.Array:
    """The Monte Carlo standard deviation of ``psis(log_ratios).khat``, by bootstrap.

    k-hat is fitted again on :data:`KHAT_SD_RESAMPLES` resamples of the ratios (with
    replacement, of the same size); their standard deviation estimates how far
    k-hat moves between independent sets of draws. A tail index's bootstrap is not
    consistent in general, but for PSIS's tail of ``3 sqrt(n)`` ratios it tracks the
    spread over independent replicates closely (``tests/diagnostics/test_psis.py``
    checks it within 25% on heavy and light tails), including where a few rare draws
    decide the tail, which an asymptotic formula from k-hat alone would not show.
    Disjoint batches would not do: k-hat is biased at small sizes, by more than its
    spread. Traceable; ``(n,)`` ratios, NaN where fewer than two resamples have a
    k-hat.

    Example:
      Ratios with a heavy tail (``q = N(0, 1)`` against a Student-t with 2 degrees of
      freedom): k-hat near 0.7, which another 4000 draws move by about 0.1:

      >>> import jax, jax.numpy as jnp
      >>> from jaxvb.diagnostics import khat_sd, psis
      >>> x = jax.random.normal(jax.random.key(0), (4000,))
      >>> log_r = -1.5 * jnp.log1p(x**2 / 2) + 0.5 * x**2
      >>> k, sd = float(psis(log_r).khat), float(khat_sd(jax.random.key(1), log_r))
      >>> bool(0.03 < sd < 0.3), bool(abs(k - 0.7) < 0.3)
      (True, True)
    """
    lw = jnp.asarray(log_ratios)
    if not jnp.issubdtype(lw.dtype, jnp.floating):
        lw = lw.astype(jnp.result_type(float))
    if lw.ndim != 1:
        raise ValueError(f"khat_sd: log_ratios must have shape (n,), got {lw.shape}")
    n = lw.shape[0]
    m = _tail_length(n, reff)
    picks = jax.random.randint(key, (KHAT_SD_RESAMPLES, n), 0, n)
    k = jax.vmap(lambda i: _psis(lw[i], m).khat)(picks)
    known = jnp.isfinite(k)
    count = jnp.sum(known)
    mean = jnp.sum(jnp.where(known, k, 0.0)) / jnp.maximum(count, 1)
    var = jnp.sum(jnp.where(known, (k - mean) ** 2, 0.0)) / jnp.maximum(count - 1, 1)
    return jnp.where(count >= 2, jnp.sqrt(var), jnp.nan)


def psis_expectation(values: jax.Array, log_weights: jax.Array) -> jax.Array:
    """``E_p[values]`` by self-normalised importance sampling with the (smoothed,
    normalised) ``log_weights`` of :func:`psis`; ``values`` of shape ``(n, ...)``.

    Example:
      ``E[x]`` under ``N(1, 1)`` from draws of ``q = N(0, 1.5^2)``:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> x = 1.5 * jax.random.normal(jax.random.key(0), (4000,))
      >>> log_r = -0.5 * (x - 1.0) ** 2 + 0.5 * (x / 1.5) ** 2
      >>> w = jaxvb.diagnostics.psis(log_r).log_weights
      >>> round(float(jaxvb.diagnostics.psis_expectation(x, w)), 1)
      1.0
    """
    values = jnp.asarray(values)
    w = jnp.exp(log_weights - jax.nn.logsumexp(log_weights))
    w = w.reshape(w.shape + (1,) * (values.ndim - 1))
    return jnp.sum(jnp.where(w > 0, w * values, 0.0), axis=0)


def psis_resample(key: jax.Array, draws: jax.Array, log_weights: jax.Array, n: int):
    """``n`` draws resampled (with replacement) from ``draws`` ``(m, ...)`` in
    proportion to the smoothed weights of :func:`psis`: approximate draws of ``p``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> x = 1.5 * jax.random.normal(jax.random.key(0), (4000,))
      >>> log_r = -0.5 * (x - 1.0) ** 2 + 0.5 * (x / 1.5) ** 2
      >>> w = jaxvb.diagnostics.psis(log_r).log_weights
      >>> y = jaxvb.diagnostics.psis_resample(jax.random.key(1), x, w, 2000)
      >>> y.shape, bool(abs(float(y.mean()) - 1.0) < 0.15)   # within its noise
      ((2000,), True)
    """
    return jnp.asarray(draws)[resample_indices(key, log_weights, n)]


def resample_indices(key: jax.Array, log_weights: jax.Array, n: int) -> jax.Array:
    """``n`` indices drawn with replacement in proportion to ``exp(log_weights)``
    (multinomial resampling) by inverting the weights' cumulative sum at ``n``
    uniforms: ``O(m + n log m)`` time and memory, where ``jax.random.categorical``'s
    Gumbel trick holds an ``(n, m)`` array.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> i = jaxvb.diagnostics.resample_indices(
      ...     jax.random.key(0), jnp.log(jnp.array([0.0, 1.0, 3.0])), 1000)
      >>> i.shape, int((i == 0).sum())   # a zero weight is never drawn
      ((1000,), 0)
    """
    w = jnp.exp(log_weights - jnp.max(log_weights))
    cdf = jnp.cumsum(w)
    u = jax.random.uniform(key, (n,), cdf.dtype) * cdf[-1]
    return jnp.minimum(jnp.searchsorted(cdf, u, side="right"), w.shape[0] - 1)
