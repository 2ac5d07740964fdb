"""Approximation quality and the marginal likelihood (paper, section 4).

At convergence ``log p(x) = eta_0 + U(eta) + log q(x) + r(x)`` with a residual ``r`` of
mean zero under ``q``. With ``s^2 = Var_q[r] = Var_q[log p - log q]``:

    ELBO           = E_q[log p(x) - log q(x)]          (the usual lower bound)
    KL(q || p)     ~ s^2 / 2
    log p(y)       ~ ELBO + s^2 / 2                     (eq. 17)
    R^2            = 1 - s^2 / Var_q[log p(x)]

All expectations are Monte Carlo averages over draws of ``q``, vmapped in chunks of a
bounded size (:mod:`jaxvb.diagnostics._draws`).

For a :class:`~jaxvb.GaussianMixture` ``q`` the KL and the log evidence are not the
paper's ``s^2 / 2`` (which stays available as ``residual_variance / 2``) but the
importance-sampling estimates of :func:`~jaxvb.diagnostics.mixture_evidence`: a
mixture's residual is far from Gaussian (:mod:`jaxvb.diagnostics.evidence`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxvb import _static
from jaxvb._platform import jit_fast, outside_traces
from jaxvb.core.status import KHAT_FLAG_VARIANCE, KHAT_THRESHOLD
from jaxvb.diagnostics._draws import as_pairs, is_paired, log_densities
from jaxvb.diagnostics.evidence import mixture_evidence
from jaxvb.diagnostics.pareto import psis
from jaxvb.families._base import ExponentialFamily
from jaxvb.families.mixture import GaussianMixture

__all__ = ["Diagnostics", "evaluate"]


class Diagnostics(NamedTuple):
    """Section 4's measures for one approximation (scalars; batched under ``vmap``).

    Attributes:
      elbo: ``E_q[log p - log q]``.
      elbo_stderr: Monte Carlo standard error of ``elbo``.
      residual_variance: ``s^2 = Var_q[log p - log q]``.
      kl: ``s^2 / 2``, the approximate ``KL(q || p)``; for a
        :class:`~jaxvb.GaussianMixture`, the importance-sampling estimate of
        :func:`mixture_evidence` (``residual_variance / 2`` stays the paper's).
      log_evidence: ``elbo + s^2 / 2``, the approximate log marginal likelihood; for a
        :class:`~jaxvb.GaussianMixture`, :func:`mixture_evidence`'s estimate, from
        draws of its own, so that ``log_evidence - kl`` is an ELBO estimate of its own,
        close to ``elbo`` but not equal to it.
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
      khat_informative: whether a ``khat`` above 0.7 flags the fit
        (``Status.HIGH_KHAT``): ``q`` is materially off (the log ratios' variance
        ``s^2`` is at least :data:`KHAT_FLAG_VARIANCE`, an approximate KL of 0.25
        nats), or, for a mixture, the evidence's own wide draws gave a k-hat above 0.7
        (:func:`mixture_evidence`: they reached mass that ``q`` misses).
      reachable_variance: the residual variance of the best fit of ``log p`` by the
        family at ``q``'s own draws: the least-squares regression of ``log p`` on
        ``[1, T(x)]`` (``T`` the sufficient statistics; unbiased, divided by ``n - k -
        1``). At a fixed point of the paper's regression ``q``'s own coefficients are
        that regression's in expectation, so ``residual_variance`` exceeds it only by
        Monte Carlo noise; a larger excess says ``q`` is not yet the family's best fit
        (``Status.POOR_FIT``). NaN for families without sufficient statistics or with
        too many of them for the draws (``10 (k + 1) > num_draws``).
      excess_stderr: the Monte Carlo standard error of ``residual_variance -
        reachable_variance`` (delta method; large when one draw in a heavy tail
        dominates both).
      start_excess: with a ``start`` (:func:`evaluate`), how much more mass draws of
        the start find than ``q``'s own: ``log Z_r - log Z_q``, the importance-sampling
        estimates of ``log p(y)`` from the draws of ``r = (q + start) / 2`` (``q``'s
        and as many of the start's, each weighed by ``p / r``) and from ``q``'s draws
        alone. Near 0 (noise) where ``q`` covers the posterior; about ``log 2`` where
        ``q`` sits on one of two equal modes and the start covers both
        (:data:`jaxvb.core.status.START_EXCESS`). NaN without a start.
      start_excess_stderr: the standard error of ``log Z_q`` (delta method over
        ``q``'s draws): the noise ``start_excess`` is judged against.

    Example:
      ``q = N(0, 1)`` against the normalised ``p = N(0, 2)``: the ELBO is ``-KL(q || p)
      = -0.097`` up to its Monte Carlo error; against ``q`` itself times ``e^2`` all is
      exact:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> p = jaxvb.Gaussian(jnp.zeros(1), 2.0 * jnp.eye(1))
      >>> d = jaxvb.diagnostics.evaluate(jax.random.key(0), q, p.log_prob)
      >>> round(float(d.elbo), 3), round(float(d.elbo_stderr), 3), int(d.num_nonfinite)
      (-0.1, 0.011, 0)
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
    khat_informative: jax.Array
    reachable_variance: jax.Array
    excess_stderr: jax.Array
    start_excess: jax.Array = jnp.nan
    start_excess_stderr: jax.Array = jnp.nan


def evaluate(
    key: jax.Array,
    q,
    log_joint: Callable[[jax.Array], jax.Array],
    num_draws: int = 1000,
    *,
    chunk_size: int = 100,
    start=None,
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
        ``i``-th of ``jax.random.split(key, num_draws)``, as in ``q.sample``. A
        family with ``paired_draws`` (a latent field's ``q``:
        :meth:`jaxvb.latent.LatentGaussianApproximation.paired_draws`), without a
        ``start``, is drawn in pairs that share their costly part, pair ``i`` (draws
        ``2i``, ``2i + 1``) from the ``i``-th of ``jax.random.split(key,
        ceil(num_draws / 2))``; the standard errors are then the pairs' (the
        cluster-robust sandwich), not those of independent draws.
      start: ``None``, or the distribution the fit started from (of ``q``'s type):
        ``num_draws`` more draws of it, in the same chunks, give ``start_excess``: the
        posterior mass they reach that ``q`` misses (a second mode, a tail).

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
    if outside_traces():
        # Called on its own: one compiled program (a few hundred operations dispatched
        # one by one would each compile a program of their own, several times the
        # time). Inside a trace (``fit``'s), it is part of the caller's program.
        arrays, static = _static.partition(log_joint)
        return _evaluate_compiled(
            arrays,
            key,
            q,
            start,
            log_joint=static,
            num_draws=int(num_draws),
            chunk_size=chunk_size,
        )
    return _evaluate(key, q, log_joint, num_draws, chunk_size, start)


@jit_fast(static_argnames=("log_joint", "num_draws", "chunk_size"))
def _evaluate_compiled(arrays, key, q, start, *, log_joint, num_draws, chunk_size):
    log_joint = _static.combine(arrays, log_joint)
    return _evaluate(key, q, log_joint, num_draws, chunk_size, start)


def _evaluate(key, q, log_joint, num_draws: int, chunk_size: int, start) -> Diagnostics:
    reach = _reachable(q, num_draws)
    dens = log_densities(key, q, log_joint, num_draws, chunk_size, stats=reach, start=start)
    if start is not None:
        dens, (log_p0, log_q0, log_s0, log_s) = dens
    log_p, log_q = dens[:2]
    ok = jnp.isfinite(log_p)
    n = jnp.sum(ok)
    stats = dens[2] if reach else None
    paired = is_paired(q, start)
    out = _measures(log_p, log_q, stats, ok, n, num_draws, paired, q.dtype)
    known = _if_known(n, q.dtype)
    if start is not None:
        excess, excess_se = _start_excess(log_p, log_q, log_s, log_p0, log_q0, log_s0, ok)
        out = out._replace(start_excess=known(excess), start_excess_stderr=known(excess_se))
    if isinstance(q, GaussianMixture):
        out = _with_mixture_evidence(out, key, q, log_joint, num_draws, chunk_size, known)
    return out


def _measures(log_p, log_q, stats, ok, n, num_draws: int, paired: bool, dtype):
    """:class:`Diagnostics` (without ``start_excess``) from ``log p`` and ``log q`` at
    the draws, over those where ``ok`` (``n`` of them); ``stats``: the draws'
    sufficient statistics for ``reachable_variance``, or ``None``; ``paired``: the
    draws come in pairs (``q.paired_draws``)."""
    nn = jnp.maximum(n, 2).astype(dtype)
    mean, var = _masked_moments(ok, nn)
    r = log_p - log_q
    elbo = mean(r)
    s2 = var(r)
    var_p = var(log_p)
    tiny = jnp.finfo(dtype).tiny
    var_p_safe = jnp.maximum(var_p, tiny)
    dr2 = (r - elbo) ** 2 - s2  # the influence of a draw on s^2
    dp2 = (log_p - mean(log_p)) ** 2 - var_p  # ... on Var_q[log p]
    stderr = _stderr(ok, nn, mean, var, paired, dtype)
    kl_stderr = 0.5 * stderr(dr2)
    if stats is not None:
        reachable, e2 = _ols_variance(stats, log_p, ok)
        # the excess s^2 - reachable by the delta method: each draw's squared residual
        # from q's fit against its squared residual from the family's least squares
        excess_stderr = stderr(jnp.where(ok, (r - elbo) ** 2 - e2, 0.0))
    else:
        reachable = excess_stderr = jnp.asarray(jnp.nan, dtype)
    evidence_stderr = stderr((r - elbo) + 0.5 * dr2)
    r2_stderr = stderr(dr2 / var_p_safe - s2 * dp2 / var_p_safe**2)
    known = _if_known(n, dtype)
    return Diagnostics(
        elbo=known(elbo),
        elbo_stderr=known(stderr(r) if paired else jnp.sqrt(s2 / nn)),
        residual_variance=known(s2),
        kl=known(0.5 * s2),
        log_evidence=known(elbo + 0.5 * s2),
        r_squared=known(1.0 - s2 / var_p_safe),
        num_nonfinite=num_draws - n,
        khat=psis(jnp.where(ok, r, -jnp.inf)).khat,
        kl_stderr=known(kl_stderr),
        log_evidence_stderr=known(evidence_stderr),
        r_squared_stderr=known(r2_stderr),
        khat_informative=s2 >= KHAT_FLAG_VARIANCE,
        reachable_variance=known(reachable),
        excess_stderr=known(excess_stderr),
    )


def _masked_moments(ok, nn):
    """``(mean, var)``: the mean and the unbiased variance of a ``(num_draws,)`` array
    over the draws where ``ok`` (``nn`` of them, at least 2)."""

    def mean(v):
        return jnp.sum(jnp.where(ok, v, 0.0)) / nn

    def var(v):
        m = mean(v)
        return jnp.sum(jnp.where(ok, (v - m) ** 2, 0.0)) / (nn - 1.0)

    return mean, var


def _stderr(ok, nn, mean, var, paired: bool, dtype):
    """``influence -> standard error``: the Monte Carlo standard error of a measure
    from each draw's influence on it.

    By the delta method: each measure is a smooth function of sample means, so its
    error is the standard deviation of its influence over the draws divided by
    ``sqrt(n)`` (the draws are independent); for pairs of draws (``q.paired_draws``),
    which are not, from the pairs' summed influences (the cluster-robust sandwich,
    ``m / (m - 1)`` for ``m`` pairs).
    """

    def stderr(influence):
        if not paired:
            return jnp.sqrt(var(influence) / nn)
        sums = jnp.sum(as_pairs(jnp.where(ok, influence - mean(influence), 0.0)), 1)
        m = jnp.maximum(jnp.sum(jnp.any(as_pairs(ok), 1)).astype(dtype), 2.0)
        return jnp.sqrt(m / (m - 1.0) * jnp.sum(sums**2)) / nn

    return stderr


def _if_known(n, dtype):
    """``v -> v`` where at least two draws are finite, else NaN: with fewer there is no
    estimate at all, so NaN (not an ELBO of 0 and an R^2 of 1 that read as a perfect fit
    under jit/vmap); ``num_nonfinite`` says why."""
    na = jnp.asarray(jnp.nan, dtype)

    def known(v):
        return jnp.where(n >= 2, v, na)

    return known


def _with_mixture_evidence(out, key, q, log_joint, num_draws, chunk_size, known):
    """``out`` with a mixture's KL and log evidence by importance sampling
    (:func:`~jaxvb.diagnostics.mixture_evidence`, from draws of its own): ``s^2 / 2``
    assumes a near-Gaussian residual, which a mixture's is not (and one from the far
    tail dominates ``s^2``)."""
    ev = mixture_evidence(
        jax.random.fold_in(key, 1), q, log_joint, num_draws, chunk_size=chunk_size
    )
    return out._replace(
        log_evidence=known(ev.log_evidence),
        kl=known(ev.kl),
        log_evidence_stderr=known(ev.log_evidence_stderr),
        kl_stderr=known(ev.kl_stderr),
        # the evidence's own ratios too: its wide draws can reach a mode q misses,
        # which q's own draws never see (HIGH_KHAT then says the estimate is off)
        khat=jnp.fmax(out.khat, ev.khat),
        khat_informative=out.khat_informative | (ev.khat > KHAT_THRESHOLD),
    )


def _reachable(q, num_draws: int) -> bool:
    """Whether :func:`evaluate` fits the family's own regression at ``q``'s draws: an
    exponential family with at most ``num_draws / 10 - 1`` statistics, whose draws'
    statistics fit in memory (``num_draws * k <= 2^22``)."""
    if not isinstance(q, ExponentialFamily):
        return False
    k = q.num_stats
    return 10 * (k + 1) <= num_draws and num_draws * k <= 2**22


def _ols_variance(t: jax.Array, log_p: jax.Array, ok: jax.Array):
    """Residual variance (over ``n - k - 1``) of the least-squares fit of ``log p`` on
    ``[1, t]`` over the rows where ``ok``, and the squared residuals; centred first,
    which keeps float32 accurate."""
    n = jnp.sum(ok).astype(log_p.dtype)
    w = ok.astype(log_p.dtype)
    t = jnp.where(ok[:, None], t, 0.0)
    y = jnp.where(ok, log_p, 0.0)
    tc = (t - jnp.sum(t, 0) / jnp.maximum(n, 1.0)) * w[:, None]
    yc = (y - jnp.sum(y) / jnp.maximum(n, 1.0)) * w
    # R of the QR of [tc, yc], then lstsq on its k x k block (the same minimisers, the
    # same minimum-norm solution): XLA:GPU's batched SVD of the n x k design itself
    # forms the full n x n U, n^2 memory per fit under vmap. Only R: forming Q
    # (householder_product) under vmap can hang XLA:CPU.
    k = t.shape[1]
    r = jnp.linalg.qr(jnp.concatenate([tc, yc[:, None]], axis=1), mode="r")
    coef = jnp.linalg.lstsq(r[:k, :k], r[:k, k])[0]
    e2 = (yc - tc @ coef) ** 2  # 0 where not ok
    return jnp.sum(e2) / jnp.maximum(n - k - 1.0, 1.0), e2


def _start_excess(log_p, log_q, log_s, log_p0, log_q0, log_s0, ok):
    """``(log Z_r - log Z_q, stderr of log Z_q)`` (``Diagnostics.start_excess``).

    ``log_s``/``log_s0``: the start's log density at ``q``'s draws and at its own;
    ``log_q0``: ``q``'s at the start's draws. A draw where ``log p`` is not finite
    weighs 0 (outside the support; a NaN says nothing either way).
    """
    n = log_p.shape[0]
    m = jnp.maximum(jnp.sum(ok), 1).astype(log_p.dtype)
    log_w = jnp.where(ok, log_p - log_q, -jnp.inf)
    log_zq = jax.nn.logsumexp(log_w) - jnp.log(m)
    log_r = jnp.logaddexp(log_q, log_s) - math.log(2.0)
    log_r0 = jnp.logaddexp(log_q0, log_s0) - math.log(2.0)
    ok0 = jnp.isfinite(log_p0) & jnp.isfinite(log_r0)
    log_v = jnp.concatenate(
        [jnp.where(ok, log_p - log_r, -jnp.inf), jnp.where(ok0, log_p0 - log_r0, -jnp.inf)]
    )
    log_zr = jax.nn.logsumexp(log_v) - math.log(2 * n)
    w = jnp.exp(log_w - log_zq)  # q's weights over their mean (0 where not ok)
    var_w = jnp.sum(jnp.where(ok, (w - 1.0) ** 2, 0.0)) / jnp.maximum(m - 1.0, 1.0)
    return log_zr - log_zq, jnp.sqrt(var_w / m)
