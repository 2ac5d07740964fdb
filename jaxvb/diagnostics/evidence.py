"""The evidence and KL of a mixture by importance sampling (:func:`mixture_evidence`).

For a :class:`~jaxvb.GaussianMixture` ``q`` the paper's ``s^2 / 2`` (section 4) assumes
a near-Gaussian residual ``log p - log q``, which a mixture's is not: on the
beta-binomial posterior it falls well short of the exact KL at one component
(``tests/diagnostics/test_mixture_diagnostics.py``). :func:`jaxvb.diagnostics.evaluate` takes a
mixture's KL and log evidence from here instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxvb.diagnostics._draws import map_chunks
from jaxvb.diagnostics.pareto import psis
from jaxvb.families.mixture import GaussianMixture, _halton

__all__ = [
    "EVIDENCE_SCALE",
    "EVIDENCE_SHARE",
    "MAX_QUASI_RANDOM_DIM",
    "Evidence",
    "mixture_evidence",
]


class Evidence(NamedTuple):
    """:func:`mixture_evidence`'s estimates and their Monte Carlo standard errors.

    Attributes:
      log_evidence: ``log Z``, ``Z`` the integral of ``p``.
      kl: ``KL(q || p) = E_q[log q - log p] + log Z``.
      log_evidence_stderr, kl_stderr: delta-method standard errors as for independent
        draws (the quasi-random draws do better: an upper bound in practice).
      num_nonfinite: draws at which ``log_joint`` was NaN or ``+inf`` (left out).
      khat: the Pareto k-hat of the importance ratios ``p / proposal`` (:func:`psis`):
        above 0.7 the estimates cannot be trusted, e.g. when the wide draws reach mass
        that ``q`` misses (a mode it does not cover).

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.GaussianMixture(jnp.ones(1), jnp.zeros((1, 1)), jnp.ones((1, 1, 1)))
      >>> ev = jaxvb.diagnostics.mixture_evidence(jax.random.key(0), q, q.log_prob)
      >>> round(float(ev.log_evidence), 6), ev._fields[-1]   # p = q: log Z = 0
      (0.0, 'khat')
    """

    log_evidence: jax.Array
    kl: jax.Array
    log_evidence_stderr: jax.Array
    kl_stderr: jax.Array
    num_nonfinite: jax.Array
    khat: jax.Array


#: Share and covariance scale of the wide half of :func:`mixture_evidence`'s proposal.
EVIDENCE_SHARE, EVIDENCE_SCALE = 0.5, 2.5
#: Up to this many dimensions (label included) the proposal's uniforms are a randomly
#: shifted Halton sequence, above it independent (Halton points lose their evenness).
MAX_QUASI_RANDOM_DIM = 16


def _uniforms(key: jax.Array, n: int, dim: int, dtype) -> jax.Array:
    """``n`` points, each uniform on ``(0, 1)^dim``: a Halton sequence shifted by one
    uniform vector modulo 1 (Cranley-Patterson), or independent uniforms above
    :data:`MAX_QUASI_RANDOM_DIM`; kept off 0 and 1, where normal quantiles are
    infinite."""
    if dim <= MAX_QUASI_RANDOM_DIM:
        shift = jax.random.uniform(key, (dim,), dtype)
        u = jnp.mod(jnp.asarray(_halton(n, dim), dtype) + shift, 1.0)
    else:
        u = jax.random.uniform(key, (n, dim), dtype)
    eps = jnp.finfo(dtype).eps
    return jnp.clip(u, eps, 1.0 - eps)


def mixture_evidence(
    key: jax.Array,
    q: GaussianMixture,
    log_joint: Callable[[jax.Array], jax.Array],
    num_draws: int = 1000,
    *,
    chunk_size: int = 100,
) -> Evidence:
    r"""``log Z`` and ``KL(q || p)`` of a mixture ``q`` by importance sampling.

    Why not ``s^2 / 2``: it is right for a Gaussian residual ``log p - log q``; a
    mixture's is not, and where ``p``'s tails are heavier than any Gaussian's,
    ``p / q`` has infinite variance: on the beta-binomial posterior (section 6.2.1)
    ``s^2 / 2`` falls well below the quadrature KL at ``K = 1``, and plain importance
    sampling from ``q`` misses ``log Z`` by far more than its standard error says.

    The estimate: ``num_draws`` draws ``x_i`` of the defensive proposal
    ``r = (1 - a) q + a q_c`` (:meth:`~jaxvb.GaussianMixture.widened`, ``a = 0.5``,
    ``c = 2.5``: ``q / r <= 2``, and the wide half covers ``p``'s tails) made from
    randomly shifted Halton points (each draw is a draw of ``r``; together they cover
    the labels and the normals evenly, which cuts the variance several-fold in few
    dimensions), and with ``w_i = p(x_i) / r(x_i)`` and ``v_i = q(x_i) / r(x_i)``
    (mean 1 by construction, a control variate):

    .. math::

        \hat Z = \frac{\sum_i w_i}{\sum_i v_i}, \qquad
        \widehat{KL} = \frac{\sum_i v_i (\log q - \log p)(x_i)}{\sum_i v_i} + \log\hat Z.

    Both are exact to rounding where ``p`` is ``q`` times a constant;
    ``tests/diagnostics/test_mixture_diagnostics.py`` checks them against quadrature on the
    beta-binomial posterior (``K = 1..8``). A ``log_joint`` of ``-inf`` is a weight of
    zero (and a KL of ``inf``, rightly); NaN or ``+inf`` draws are left out and
    counted. Costs ``num_draws`` more evaluations of ``log_joint``.

    Args:
      key: a JAX random key.
      q: the mixture.
      log_joint: the unnormalised log posterior, ``x -> scalar``.
      num_draws: draws of the proposal (at least 2).
      chunk_size: at most this many evaluated at once (as in :func:`evaluate`).

    Returns:
      :class:`Evidence`.

    Example:
      ``p`` is ``q`` times ``e^2``: exact.

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.GaussianMixture(jnp.array([0.3, 0.7]), jnp.array([[-2.0], [1.0]]),
      ...                           jnp.ones((2, 1, 1)))
      >>> ev = jaxvb.diagnostics.mixture_evidence(
      ...     jax.random.key(0), q, lambda x: q.log_prob(x) + 2.0)
      >>> round(float(ev.log_evidence), 5), abs(float(ev.kl)) < 1e-5   # float32 rounding
      (2.0, True)
    """
    if num_draws < 2:
        raise ValueError(f"num_draws must be at least 2, got {num_draws}")
    proposal = q.widened(EVIDENCE_SHARE, EVIDENCE_SCALE)
    u = _uniforms(key, num_draws, q.dim + 1, q.dtype)
    x = jax.vmap(lambda v: proposal.from_noise(proposal.noise_from_uniforms(v)))(u)

    def one(x):
        log_p = jnp.asarray(log_joint(x)).astype(q.dtype)
        return jnp.stack([log_p, q.log_prob(x), proposal.log_prob(x)])

    log_p, log_q, log_r = map_chunks(one, x, chunk_size).T
    ok = ~jnp.isnan(log_p) & (log_p < jnp.inf)
    n = jnp.maximum(jnp.sum(ok), 2).astype(q.dtype)
    log_w = jnp.where(ok, log_p - log_r, -jnp.inf)
    log_v = jnp.where(ok, log_q - log_r, -jnp.inf)
    log_z = jax.nn.logsumexp(log_w) - jax.nn.logsumexp(log_v)
    # ratios relative to their means (finite: log_v <= log 2 and log_w's largest is 0)
    w = jnp.exp(log_w - jax.nn.logsumexp(log_w)) * n
    v = jnp.exp(log_v - jax.nn.logsumexp(log_v)) * n
    gap = jnp.where(ok & (v > 0), log_q - log_p, 0.0)
    gap_mean = jnp.sum(v * gap) / n
    kl = gap_mean + log_z
    # delta method: each draw's influence on the two ratio estimates
    d_log_z = jnp.where(ok, w - v, 0.0)
    d_kl = jnp.where(ok, v * (gap - gap_mean), 0.0) + d_log_z

    def stderr(d):
        return jnp.sqrt(
            jnp.sum(jnp.where(ok, (d - jnp.sum(d) / n) ** 2, 0.0)) / (n - 1) / n
        )

    return Evidence(
        log_evidence=log_z,
        kl=kl,
        log_evidence_stderr=stderr(d_log_z),
        kl_stderr=stderr(d_kl),
        num_nonfinite=num_draws - jnp.sum(ok),
        khat=psis(log_w).khat,
    )
