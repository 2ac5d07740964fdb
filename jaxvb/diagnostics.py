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
        r_squared=known(1.0 - s2 / jnp.maximum(var_p, tiny)),
        num_nonfinite=num_draws - n,
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
