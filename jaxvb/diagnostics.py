"""Approximation quality and the marginal likelihood (paper, section 4).

At convergence ``log p(x) = eta_0 + U(eta) + log q(x) + r(x)`` with a residual ``r`` of
mean zero under ``q``. With ``s^2 = Var_q[r] = Var_q[log p - log q]``:

    ELBO           = E_q[log p(x) - log q(x)]          (the usual lower bound)
    KL(q || p)     ~ s^2 / 2
    log p(y)       ~ ELBO + s^2 / 2                     (eq. 17)
    R^2            = 1 - s^2 / Var_q[log p(x)]

All expectations are Monte Carlo averages over draws of ``q``, vmapped in chunks of a
bounded size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Diagnostics(NamedTuple):
    """Section 4's measures for one approximation (scalars; batched under ``vmap``).

    Attributes:
      elbo: ``E_q[log p - log q]``.
      elbo_stderr: Monte Carlo standard error of ``elbo``.
      residual_variance: ``s^2 = Var_q[log p - log q]``.
      kl: ``s^2 / 2``, the approximate ``KL(q || p)``.
      log_evidence: ``elbo + s^2 / 2``, the approximate log marginal likelihood.
      r_squared: ``1 - s^2 / Var_q[log p]``.
      num_nonfinite: draws at which ``log_joint`` was not finite (left out above).
      khat: the Pareto k-hat of the importance ratios ``p / q`` at the draws
        (:func:`psis`); above 0.7 importance sampling from ``q`` is unreliable, which
        says that ``q``'s tails are lighter than the posterior's or that it misses
        mass (a mode). Not informative when the log ratios are nearly constant (an
        almost exact fit): see :func:`jaxvb.explain`. NaN with too few finite draws.
      kl_stderr, log_evidence_stderr, r_squared_stderr: Monte Carlo standard errors
        of ``kl``, ``log_evidence`` and ``r_squared`` (delta method over the draws:
        the standard deviation of each draw's influence on the estimate over
        ``sqrt(n)``); 0 for an exact fit, where ``log p - log q`` is constant.

    Example:
      ``q = N(0, 1)`` against the normalised ``p = N(0, 2)``: the ELBO is ``-KL(q || p)
      = -0.097`` up to its Monte Carlo error; against ``q`` itself times ``e^2`` all is
      exact:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> p = jaxvb.Gaussian(jnp.zeros(1), 2.0 * jnp.eye(1))
      >>> d = jaxvb.diagnostics.evaluate(jax.random.key(0), q, p.log_prob)
      >>> round(float(d.elbo), 3), round(float(d.elbo_stderr), 3), int(d.num_nonfinite)
      (-0.103, 0.011, 0)
      >>> d = jaxvb.diagnostics.evaluate(jax.random.key(0), q, lambda x: q.log_prob(x) + 2.0)
      >>> round(float(d.log_evidence), 12), round(float(d.kl), 12), round(float(d.r_squared), 12)
      (2.0, 0.0, 1.0)
    """

    elbo: jax.Array
    elbo_stderr: jax.Array
    residual_variance: jax.Array
    kl: jax.Array
    log_evidence: jax.Array
    r_squared: jax.Array
    num_nonfinite: jax.Array
    khat: jax.Array
    kl_stderr: jax.Array
    log_evidence_stderr: jax.Array
    r_squared_stderr: jax.Array


def evaluate(
    key: jax.Array,
    q,
    log_joint: Callable[[jax.Array], jax.Array],
    num_draws: int = 1000,
    *,
    chunk_size: int = 100,
) -> Diagnostics:
    """Section 4's diagnostics of ``q`` as an approximation to ``log_joint``.

    Args:
      key: a JAX random key.
      q: a fitted family.
      log_joint: the unnormalised log posterior, ``x -> scalar``.
      num_draws: Monte Carlo draws (at least 2).
      chunk_size: at most this many draws are evaluated at once (vmapped), the chunks
        one after another (``lax.scan``), so that memory is that of one chunk whatever
        ``num_draws`` is. The numbers do not depend on it: draw ``i`` comes from the
        ``i``-th of ``jax.random.split(key, num_draws)``, as in ``q.sample``.

    Returns:
      :class:`Diagnostics`. Draws where ``log_joint`` is not finite are left out of the
      averages and counted in ``num_nonfinite``; with fewer than two finite draws
      every measure is NaN.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> d = jaxvb.diagnostics.evaluate(jax.random.key(0), q, q.log_prob)
      >>> float(d.kl)
      0.0
    """
    if num_draws < 2:
        raise ValueError(f"num_draws must be at least 2, got {num_draws}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    log_p, log_q = _log_densities(key, q, log_joint, num_draws, chunk_size)
    ok = jnp.isfinite(log_p)
    n = jnp.sum(ok)
    nn = jnp.maximum(n, 2).astype(q.dtype)

    def mean(v):
        return jnp.sum(jnp.where(ok, v, 0.0)) / nn

    def var(v):
        m = mean(v)
        return jnp.sum(jnp.where(ok, (v - m) ** 2, 0.0)) / (nn - 1.0)

    r = log_p - log_q
    elbo = mean(r)
    s2 = var(r)
    var_p = var(log_p)
    tiny = jnp.finfo(q.dtype).tiny
    var_p_safe = jnp.maximum(var_p, tiny)
    # Monte Carlo standard errors by the delta method: each measure is a smooth
    # function of sample means, so its error is the standard deviation of its
    # influence over the draws divided by sqrt(n) (the draws are independent).
    dr2 = (r - elbo) ** 2 - s2  # the influence of a draw on s^2
    dp2 = (log_p - mean(log_p)) ** 2 - var_p  # ... on Var_q[log p]

    def stderr(influence):
        return jnp.sqrt(var(influence) / nn)

    kl_stderr = 0.5 * stderr(dr2)
    evidence_stderr = stderr((r - elbo) + 0.5 * dr2)
    r2_stderr = stderr(dr2 / var_p_safe - s2 * dp2 / var_p_safe**2)
    # Fewer than two finite draws: no estimate at all, so NaN (not an ELBO of 0 and an
    # R^2 of 1 that read as a perfect fit under jit/vmap); num_nonfinite says why.
    na = jnp.asarray(jnp.nan, q.dtype)

    def known(v):
        return jnp.where(n >= 2, v, na)

    return Diagnostics(
        elbo=known(elbo),
        elbo_stderr=known(jnp.sqrt(s2 / nn)),
        residual_variance=known(s2),
        kl=known(0.5 * s2),
        log_evidence=known(elbo + 0.5 * s2),
        r_squared=known(1.0 - s2 / var_p_safe),
        num_nonfinite=num_draws - n,
        khat=psis(jnp.where(ok, r, -jnp.inf)).khat,
        kl_stderr=known(kl_stderr),
        log_evidence_stderr=known(evidence_stderr),
        r_squared_stderr=known(r2_stderr),
    )


def _log_densities(key, q, log_joint, num_draws: int, chunk_size: int):
    """``log p`` and ``log q`` at ``num_draws`` draws of ``q``, in equal chunks.

    ``num_draws`` is cut into ``n`` chunks of equal size ``c <= chunk_size`` (the last
    padded with repeated keys, whose values are dropped): one traced program, not a
    second one for a remainder.
    """

    def one(k):
        x, log_q = q.sample_and_log_prob(k)
        return jnp.asarray(log_joint(x)).astype(q.dtype), log_q

    keys = jax.random.split(key, num_draws)
    num_chunks = -(-num_draws // chunk_size)
    if num_chunks == 1:
        return jax.vmap(one)(keys)
    size = -(-num_draws // num_chunks)
    padded = jnp.concatenate([keys, keys[: num_chunks * size - num_draws]])
    log_p, log_q = jax.lax.map(one, padded, batch_size=size)
    return log_p[:num_draws], log_q[:num_draws]


# --- Pareto-smoothed importance sampling -------------------------------------------
#
# Vehtari, Simpson, Gelman, Yao & Gabry (2024), "Pareto smoothed importance sampling",
# JMLR 25(72): the largest M = ceil(min(n / 5, 3 sqrt(n / r_eff))) importance ratios
# are replaced by the expected order statistics of a generalized Pareto distribution
# fitted to them (Zhang & Stephens 2009, with the paper's weak prior on k), and the
# fitted shape k-hat says how far the ratios' tail can be trusted (k-hat < 0.7: the
# smoothed estimates are reliable; the error falls with n only slowly above 0.7). Why
# written here and not taken from ArviZ: it runs inside the compiled fit (under jit
# and vmap), where ArviZ's NumPy code cannot; a test checks it against ArviZ's psislw.


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
      :class:`PSIS`. Agrees with ArviZ's ``psislw`` (``tests/test_psis.py``).

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
    n = lw.shape[0]
    m = _tail_length(n, reff)
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
    index = jax.random.categorical(key, log_weights, shape=(n,))
    return jnp.asarray(draws)[index]
