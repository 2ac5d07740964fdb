r"""Mixtures of Gaussians through an auxiliary label (paper, section 6.2).

``q(x) = sum_i w_i N(x | m_i, S_i)`` is the marginal of ``q(x, u) = q(u) q(x | u)`` with a
categorical label ``u``. Fitting the joint to ``p~(x, u) = p(x) q(u | x)`` (eq. kldiv3)
has the optimum of KL(q(x) || p(x)) and is a regression of the usual kind, one per
block. From a draw ``x* ~ q(x)``, Rao-Blackwellised over ``u`` with the
responsibilities ``r_i = q(u = i | x*)`` (by default the expectation over ``x*`` is
stratified by component, see :func:`mixture`):

* the weights, by the basic regression (Algorithm 1) of the categorical ``q(u)``:
  ``C^_i = r_i``, ``g^_i = r_i [log p(x*) - log q(x*) + log w_i]``, ``eta_i = g_i / C_i``,
  ``w = softmax(eta)``;
* component ``i``, by Algorithm 2 on the target ``log p(x) + log q(u = i | x)``, each
  statistic weighted by ``r_i``:
  ``a^_i = r_i grad[log p + log r_i]``, ``P^_i = -r_i hess[log p + log r_i]``,
  ``z^_i = r_i x*``, and ``S_i = C_i P_i^{-1}``, ``m_i = P_i^{-1} a_i + z_i / C_i``.

The ``log q(u = i | x)`` term pushes the components apart. Its derivatives are exact
and need no derivative of ``q`` by JAX: with ``g_j = -S_j^{-1} (x - m_j)`` and
``g_bar = sum_j r_j g_j``,

    grad log r_i = g_i - g_bar,
    hess log r_i = -S_i^{-1} + sum_j r_j S_j^{-1} - sum_j r_j (g_j - g_bar)(g_j - g_bar)',

finite even where ``r_i`` underflows to zero (the product ``r_i * ...`` is then zero).
With ``K = 1`` both vanish exactly and the method is Algorithm 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxvb.families._base import build
from jaxvb.families.mixture import GaussianMixture
from jaxvb.methods._base import Method, value_grad_hessian
from jaxvb.methods._registry import register
from jaxvb.methods.hessian import HessianStats, hessian

SAMPLING = ("stratified", "marginal")


class MixtureStats(NamedTuple):
    """The responsibility-weighted statistics, one row per component (leading ``K``).

    Attributes:
      C: ``(K,)``, ``E_q[r_i]``.
      g: ``(K,)``, ``E_q[r_i (log p - log q + log w_i)]``, the weights' regression.
      a: ``(K, d)``, ``E_q[r_i grad(log p + log r_i)]``.
      P: ``(K, d, d)``, ``-E_q[r_i hess(log p + log r_i)]``.
      z: ``(K, d)``, ``E_q[r_i x]``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.GaussianMixture(jnp.array([0.5, 0.5]), jnp.array([[-1.0], [1.0]]),
      ...                            jnp.stack([jnp.eye(1)] * 2))
      >>> init = jax.jit(jaxvb.methods.mixture().init, static_argnums=2)
      >>> stats = init(jax.random.key(0), q0, lambda x: -x @ x / 2)
      >>> [v.shape for v in stats]   # C, g, a, P, z
      [(2,), (2,), (2, 1), (2, 1, 1), (2, 1)]
    """

    C: jax.Array
    g: jax.Array
    a: jax.Array
    P: jax.Array
    z: jax.Array


def _dead(c: jax.Array) -> jax.Array:
    """Components whose share of the responsibilities is below rounding.

    The ``C_i`` sum to one (every draw's responsibilities do). Where ``C_i`` is below
    ``eps`` of that, the component's statistics are made of rounding and of the far
    tails of the other components, and ``g_i / C_i``, ``P_i / C_i`` mean nothing: such
    a component keeps its last Gaussian and gets weight exactly zero.
    """
    return ~(c > jnp.finfo(c.dtype).eps * jnp.sum(c))


@functools.cache
def mixture(
    sampling: str = "stratified",
    grad_and_hessian: Callable | None = None,
    num_init_draws: int = 8,
    min_weight: float = 1e-3,
) -> Method:
    """Section 6.2's update of a :class:`~jaxvb.GaussianMixture`; the default for one.

    Every draw's statistics are Rao-Blackwellised over the label: the responsibilities
    ``q(u = i | x)`` come from log-sum-exp, each component is updated by Algorithm 2
    with the ``log q(u = i | x)`` term, the weights by the basic regression (see the
    module docstring). Any number of components ``K``, any dimension, any twice
    differentiable log joint.

    Sampling. ``"stratified"`` (the default): one draw from every component per step,
    each counted with its weight, ``E_q[f] = sum_j w_j E_{q_j}[f]``. ``"marginal"``: the
    paper's single draw from ``q(x)`` (label, then the component). Both estimate the
    same statistics without bias and have the same solution. With marginal sampling a
    component of weight ``w_i`` sees about ``w_i`` of the draws but its statistics
    still move by the step ``w`` of ``fit``, so relative to its own statistics the
    step is ``w / w_i``: small components are updated from a draw or two and, on a
    posterior that is not log-concave, can be thrown far off (as on the
    beta-binomial example, ``benchmarks/beta_binomial.py``). Stratified sampling gives
    every component a draw at every step, the same relative step for all, at ``K``
    evaluations of the Hessian per step instead of one. Since the fit settles slowly
    (components slide along the posterior), a larger ``step_size`` than ``fit``'s
    ``1/sqrt(num_steps)`` pays: the benchmark uses ``step_size=0.1``.

    Components that vanish. A component's weight can go to zero (the fit has no use
    for it, or it has drifted where ``p`` has no mass). No NaN results: a component
    whose share of the responsibilities is below rounding (``eps``), or below
    ``min_weight`` with an update that is not a proper Gaussian, is dropped -- its
    weight becomes exactly zero, its Gaussian stays where it was and it is neither
    drawn nor updated again. The fit carries on with the others; ``q.weights`` shows
    how many are left.

    Args:
      sampling: ``"stratified"`` or ``"marginal"``, see above.
      grad_and_hessian: optional ``x -> (grad, hess)`` of the log joint; by default
        ``jax.grad`` and ``jax.hessian`` of the ``log_joint`` given to :func:`jaxvb.fit`.
      num_init_draws: draws of ``q0`` to estimate the level of ``log p - log q0``, the
        first guess of the weights' intercept (as ``regression(intercept="estimate")``):
        without it the first regressions of the weights are thrown off by the unknown
        normalising constant of ``p``.
      min_weight: the share below which a component whose update is improper is
        dropped rather than making the whole update improper (which ``fit`` would
        answer by halving the step, or at the end by flagging the result).

    Returns:
      A :class:`~jaxvb.methods.Method` for :func:`jaxvb.fit` (requires a
      :class:`~jaxvb.GaussianMixture` ``q0``; start it with :func:`jaxvb.init_mixture`).

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> def log_joint(x):   # two separated bumps, 30% and 70%
      ...     a = jnp.log(0.3) - 0.5 * jnp.sum((x + 3.0) ** 2)
      ...     b = jnp.log(0.7) - 0.5 * jnp.sum((x - 3.0) ** 2)
      ...     return jnp.logaddexp(a, b)
      >>> q0 = jaxvb.GaussianMixture(jnp.array([0.5, 0.5]),
      ...                            jnp.array([[-1.0], [1.0]]), jnp.ones((2, 1, 1)))
      >>> res = jaxvb.fit(log_joint, q0, jax.random.key(0), num_steps=400)
      >>> [round(float(v), 4) for v in (*res.q.weights, *res.q.means.ravel())]
      [0.3, 0.7, -3.0, 3.0]
    """

    if sampling not in SAMPLING:
        raise ValueError(f"sampling must be one of {SAMPLING}, got {sampling!r}")
    if not 0.0 <= min_weight < 1.0:
        raise ValueError(f"min_weight must lie in [0, 1), got {min_weight}")

    def init_fn(key, q0, log_joint):
        return _init(key, q0, log_joint, num_init_draws)

    def noise_fn(key, q):
        if sampling == "marginal":
            return q.noise(key)
        return q.component_noise(key)

    def draw_stats(x, q, log_joint):
        return _draw_stats(x, q, log_joint, grad_and_hessian)

    def estimate_fn(noise, q, log_joint):
        if sampling == "marginal":
            x = q.from_noise(noise)
            stats, log_p = draw_stats(x, q, log_joint)
            return stats, x, log_p
        return _stratified_estimate(draw_stats, noise, q, log_joint)

    def solve_fn(stats, q, log_joint=None):
        return _solve(stats, q, log_joint, min_weight)

    return Method(
        name=f"mixture({sampling})",
        init=init_fn,
        noise=noise_fn,
        estimate=estimate_fn,
        solve=solve_fn,
        min_draws=lambda q: 1 if sampling == "stratified" else q.num_components,
    )


def _init(key, q0, log_joint, num_init_draws: int) -> MixtureStats:
    """The statistics of ``q0``, with the weights' intercept estimated from
    ``num_init_draws`` draws (:func:`mixture`'s ``num_init_draws``)."""
    if not isinstance(q0, GaussianMixture):
        raise TypeError(
            f"the mixture method needs a jaxvb.GaussianMixture q0, got "
            f"{type(q0).__name__}; for a Gaussian use method='hessian'."
        )
    w = q0.weights
    x = q0.sample(key, (num_init_draws,))
    offset = jax.vmap(log_joint)(x) - jax.vmap(q0.log_prob)(x)
    ok = jnp.isfinite(offset)
    level = jnp.sum(jnp.where(ok, offset, 0.0)) / jnp.maximum(jnp.sum(ok), 1)
    alive = w > 0
    eta = jnp.where(alive, jnp.log(jnp.where(alive, w, 1.0)) + level, 0.0)
    return MixtureStats(
        C=w,
        g=w * eta,
        a=jnp.zeros_like(q0.means),
        P=w[:, None, None] * q0.precisions,
        z=w[:, None] * q0.means,
    )


def _draw_stats(x, q, log_joint, grad_and_hessian):
    """The statistics of one point ``x``, Rao-Blackwellised over the label, and
    ``log_joint(x)``."""
    if grad_and_hessian is None:
        log_p, grad, hess = value_grad_hessian(log_joint)(x)
    else:
        grad, hess = grad_and_hessian(x)
        log_p = log_joint(x)
    grad = grad.astype(q.dtype)
    hess = (0.5 * (hess + hess.T)).astype(q.dtype)

    precisions = q.precisions  # (K, d, d); not batched over draws under vmap
    joint = q.joint_log_probs(x)
    log_q = jax.nn.logsumexp(joint)
    r = jnp.exp(joint - log_q)
    g = -jnp.einsum("kij,kj->ki", precisions, x - q.means)  # grad log q_j(x)
    dg = g - r @ g  # grad log r_i
    # hess log q = sum_j r_j (-S_j^{-1}) + sum_j r_j dg_j dg_j'
    hess_log_q = jnp.einsum("k,kij->ij", r, -precisions) + jnp.einsum(
        "k,ki,kj->ij", r, dg, dg
    )
    # -hess(log p + log r_i); the bracket is exactly zero for K = 1.
    neg_hess = (precisions + hess_log_q[None]) - hess[None]

    # A zero weight has log w = -inf and r = 0: its row is zero, not NaN.
    alive = r > 0
    level = log_p - log_q + jnp.where(q.weights > 0, q.log_weights, 0.0)
    stats = MixtureStats(
        C=r,
        g=jnp.where(alive, r * level, 0.0),
        a=r[:, None] * (grad + dg),
        P=r[:, None, None] * neg_hess,
        z=r[:, None] * x,
    )
    # A non-finite log density makes the draw's statistics non-finite, so that fit
    # leaves the draw out and flags it.
    bad = ~jnp.isfinite(log_p)
    return stats._replace(a=jnp.where(bad, jnp.nan, stats.a)), log_p


def _stratified_estimate(draw_stats, noise, q, log_joint):
    """``(stats, x, log_p)`` from one draw of every component, each counted with its
    weight; ``x`` is the draw of the component ``noise`` labels (distributed as ``q``)."""
    xs = q.component_draws(noise)
    per_draw, log_ps = jax.vmap(draw_stats, (0, None, None))(xs, q, log_joint)
    # E_q[f] = sum_j w_j E_{q_j}[f]. A component whose weight is below the rounding
    # of the sum is not drawn at all (as with marginal sampling): a dead component
    # that has drifted to where log p overflows must not poison every step.
    w = q.weights
    drawn = w > jnp.finfo(w.dtype).eps

    def combine(v):
        mask = drawn.reshape((-1,) + (1,) * (v.ndim - 1))
        return jnp.tensordot(w, jnp.where(mask, v, 0.0), 1)

    stats = jax.tree_util.tree_map(combine, per_draw)
    u = q.component_label(noise)  # the draw reported back, distributed as q
    return stats, xs[u], log_ps[u]


def _solve(stats, q, log_joint, min_weight: float) -> GaussianMixture:
    """The mixture the statistics define; components that vanish are dropped (see
    :func:`mixture`)."""
    dead = _dead(stats.C)
    c = jnp.where(dead, 1.0, stats.C)
    per_component = HessianStats(
        a=stats.a / c[:, None], P=stats.P / c[:, None, None], z=stats.z / c[:, None]
    )
    gaussians = jax.vmap(lambda s: hessian().solve(s, None, log_joint))(per_component)
    improper = ~jax.vmap(lambda g: g.is_proper)(gaussians)
    small = ~(stats.C > min_weight * jnp.sum(stats.C))
    dropped = dead | (improper & small)
    means = jnp.where(dropped[:, None], q.means, gaussians.mean)
    covs = jnp.where(dropped[:, None, None], q.covs, gaussians.cov)
    eta = jnp.where(dropped, -jnp.inf, stats.g / c)
    weights = jax.nn.softmax(eta)
    return build(GaussianMixture, weights=weights, means=means, covs=covs)


register("mixture", mixture, default_for=(GaussianMixture,))
