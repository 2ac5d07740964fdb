"""Algorithm 1: stochastic linear regression of log p(x) on the sufficient statistics.

For ``q_eta(x) = exp(T~(x) eta~)`` with ``T~ = (1, T)`` and ``eta~ = (eta_0, eta)``, the
KL-optimal parameters solve (paper, eq. 9)

    eta~ = C^{-1} g,    C = E_q[T~' T~],    g = E_q[T~' log p(x)].

One draw ``x* ~ q`` gives the unbiased estimates ``C^ = T~(x*)' T~(x*)`` and
``g^ = T~(x*)' log p(x*)``. Using the *same* draw for both is what makes the regression
noise free when ``p`` is in the family (eq. 13: exact after ``2(k + 1)`` steps).

The statistics are kept in the frame of the current ``q``: ``T~ = (1, L^{-1} (T - c))``
with ``c = E_q[T]`` and ``L L' = Cov_q[T]`` (centred and whitened), and moved with ``q``
by :func:`reframe` (``Method.reframe``; the map is linear, and ``eta`` follows from the
solution by ``L^{-T}``). In exact arithmetic this is the paper's algorithm, step for
step; in float32 it is what keeps a concentrated ``q``: for a ``Gamma(219, 50.5)`` the
raw ``E[T~' T~]`` holds the concentration in its sixth digit (condition about 1e6, about
1e3 centred), which the sums over the averaged steps lose to rounding; whitened, ``C``
stays near the identity.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from jaxvb._algebra import solve_gram  # noqa: F401  (re-exported)
from jaxvb.families._base import ExponentialFamily
from jaxvb.methods._base import Method, require_exponential_family
from jaxvb.methods._registry import register

ESTIMATORS = ("joint", "independent", "analytic")
INITS = ("analytic", "diagonal", "identity")
INTERCEPTS = ("estimate", "normalized")


class RegressionStats(NamedTuple):
    """``C`` (``(k+1, k+1)``) and ``g`` (``(k+1,)``) of eq. 9, intercept first, in the
    frame of the ``q`` they belong to (the module's docstring).

    Example:
      In ``q``'s frame ``E_q[T~' T~]`` is the identity, and ``g = C eta~`` with
      ``eta~ = (eta_0 + c' eta, L' eta)`` solves back to ``q``; for ``Exponential(2)``,
      ``T = -x``, ``c = -1/2`` and ``L = 1/2``:

      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.methods.regression import RegressionStats
      >>> q = jaxvb.Exponential(jnp.array([2.0]))
      >>> stats = RegressionStats(C=jnp.eye(2), g=jnp.array([jnp.log(2.0) - 1.0, 1.0]))
      >>> round(float(jaxvb.methods.regression().solve(stats, q, None).rate[0]), 12)
      2.0
    """

    C: jax.Array
    g: jax.Array


def _with_intercept(t):
    return jnp.concatenate([jnp.ones((1,), t.dtype), t])


def expected_outer_stats(q) -> jax.Array:
    """``E_q[T~' T~]`` in closed form, from derivatives of the log normaliser.

    ``E[T] = dU/deta`` and ``E[T'T] = d^2U/deta^2 + E[T] E[T]'`` (the Fisher identity),
    so every family gets the analytic ``C`` of the paper (eq. 14) for free.

    Example:
      ``T~(x) = (1, -x)`` under ``Exponential(2)``: ``E[x] = 1/2``, ``E[x^2] = 1/2``.

      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.methods.regression import expected_outer_stats
      >>> expected_outer_stats(jaxvb.Exponential(jnp.array([2.0]))).tolist()
      [[1.0, -0.5], [-0.5, 0.5]]
    """
    mu = q.mean_sufficient_stats
    second = q.fisher_information + jnp.outer(mu, mu)
    top = jnp.concatenate([jnp.ones((1,), mu.dtype), mu])
    return jnp.concatenate([top[None, :], jnp.concatenate([mu[:, None], second], 1)])


def _frame(q) -> tuple[jax.Array, jax.Array]:
    """``(c, L)``: the statistics are kept as ``L^{-1} (T - c)``, ``c = E_q[T]`` and
    ``L L' = Cov_q[T]``.

    ``L = D chol(D^{-1} Cov D^{-1})`` with ``D`` the standard deviations: the raw
    covariance can be ill-conditioned by scale alone (a Gaussian 3 sd from the origin
    in 8-D: condition 1.6e5), and every step computes the frame of the same ``q`` more
    than once (its draws, the move to the next ``q``, the solve), so in float32 the
    copies must agree to ``eps * condition``, which scaling first makes them do. Where
    rounding leaves no Cholesky factor, ``D`` alone (centred and scaled, not whitened).
    """
    fisher = q.fisher_information
    sd = jnp.sqrt(jnp.diagonal(fisher))
    chol = jnp.linalg.cholesky(fisher / sd[:, None] / sd[None, :])
    ok = jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.diagonal(chol) > 0)
    chol = jnp.where(ok, chol, jnp.eye(len(sd), dtype=sd.dtype))
    return q.mean_sufficient_stats, sd[:, None] * chol


def _to_frame(t: jax.Array, frame) -> jax.Array:
    """``T~ = (1, L^{-1} (T - c))`` of raw statistics ``t``."""
    c, chol = frame
    return _with_intercept(solve_triangular(chol, t - c, lower=True))


def _transform(stats: RegressionStats, shift: jax.Array, lin: jax.Array):
    """``(R C R', R g)`` for ``R = [[1, 0], [shift, lin]]``."""
    k = lin.shape[0]
    r = jnp.zeros((k + 1, k + 1), lin.dtype).at[0, 0].set(1.0)
    r = r.at[1:, 0].set(shift).at[1:, 1:].set(lin)
    return RegressionStats(C=r @ stats.C @ r.T, g=r @ stats.g)


def reframe(stats: RegressionStats, q, q_new) -> RegressionStats:
    """Statistics in the frame of ``q`` (:func:`regression`), in that of ``q_new``.

    ``T~_new = (1, L_n^{-1} (T - c_n)) = R T~_q`` with ``R = [[1, 0], [L_n^{-1} (c_q -
    c_n), L_n^{-1} L_q]]``: ``C -> R C R'``, ``g -> R g``.

    Example:
      In its own frame ``E_q[T~' T~]`` is the identity; moved to another frame and
      back, statistics are unchanged:

      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.methods.regression import RegressionStats, reframe
      >>> q, p = jaxvb.Gamma(jnp.ones(1), jnp.ones(1)), jaxvb.Gamma(4.0 * jnp.ones(1), jnp.ones(1))
      >>> stats = RegressionStats(C=jnp.eye(3), g=jnp.array([0.3, 2.0, -1.0]))
      >>> back = reframe(reframe(stats, q, p), p, q)
      >>> bool(jnp.allclose(back.C, stats.C)), bool(jnp.allclose(back.g, stats.g))
      (True, True)
    """
    (c, chol), (c_new, chol_new) = _frame(q), _frame(q_new)
    shift = solve_triangular(chol_new, c - c_new, lower=True)
    return _transform(stats, shift, solve_triangular(chol_new, chol, lower=True))


def _init(key, q0, log_joint, init: str, intercept: str, num_init_draws: int):
    """Algorithm 1's ``C_1`` and ``g_1 = C_1 eta~_1`` at ``q0``, in ``q0``'s frame
    (:func:`regression`'s ``init``, ``intercept`` and ``num_init_draws``)."""
    require_exponential_family(q0, "regression")
    eta_0 = -q0.log_normalizer
    if intercept == "estimate":
        x = q0.sample(key, (num_init_draws,))
        offset = jax.vmap(log_joint)(x) - jax.vmap(q0.log_prob)(x)
        # A draw where log p is not finite says nothing about the offset.
        ok = jnp.isfinite(offset)
        mean = jnp.sum(jnp.where(ok, offset, 0.0)) / jnp.maximum(jnp.sum(ok), 1)
        eta_0 = eta_0 + mean
    # C_1 as the paper states it (of the raw statistics, centred at 0), in q0's
    # frame; g_1 = C_1 eta~_1 there, with eta~_1 = (eta_0 + c' eta, L' eta).
    c0, chol = _frame(q0)
    eta = q0.natural_params
    eta = jnp.concatenate([(eta_0 + c0 @ eta)[None], chol.T @ eta])
    if init == "analytic":  # E_q0[T~' T~] in q0's frame
        c = jnp.eye(len(eta), dtype=eta.dtype)
    else:
        full = expected_outer_stats(q0)
        c = jnp.diag(jnp.diagonal(full)) if init == "diagonal" else jnp.eye(len(full))
        to = RegressionStats(C=c.astype(full.dtype), g=jnp.zeros_like(eta))
        shift = -solve_triangular(chol, c0, lower=True)
        c = _transform(to, shift, solve_triangular(chol, jnp.eye(len(c0)), lower=True)).C
    return RegressionStats(C=c, g=c @ eta)


@functools.cache
def regression(
    estimator: str = "joint",
    init: str = "analytic",
    intercept: str = "estimate",
    num_init_draws: int = 8,
) -> Method:
    """Algorithm 1 for any exponential family.

    Args:
      estimator: how ``C^`` is formed.
        ``"joint"`` (the paper's choice): ``C^`` and ``g^`` from the same draw.
        ``"independent"``: from two independent draws ("different randomness", sec. 3.1).
        ``"analytic"``: ``C^ = E_q[T~'T~]`` in closed form (eq. 14); only ``g^`` sampled.
        The last two are the weaker estimators the paper compares against.
      init: ``C_1`` of Algorithm 1. ``"analytic"``: ``E_{q0}[T~'T~]``; ``"diagonal"``:
        its diagonal; ``"identity"``: ``I`` (the toy example of section 3.1).
      intercept: the first guess of the intercept ``eta_0`` in ``g_1 = C_1 eta~_1``.
        ``"estimate"``: the mean of ``log p(x) - T(x) eta_1`` over ``num_init_draws``
        draws of ``q0``, so that the first regressions are not spent absorbing the
        unknown log normalising constant of ``p`` (a model whose log density is -500 at
        the mode otherwise throws the first steps far off, into improper proposals).
        ``"normalized"``: ``-U(eta_1)``, as if ``p`` were normalised.
      num_init_draws: draws for ``intercept="estimate"``.

    Returns:
      A :class:`~jaxvb.methods.Method` for :func:`jaxvb.fit`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: jnp.log(2.0) - 2.0 * x   # p(x) = 2 exp(-2x)
      >>> method = jaxvb.methods.regression(init="identity")
      >>> res = jaxvb.fit(log_joint, jaxvb.Exponential(1.0), jax.random.key(0),
      ...                 num_steps=4, method=method)
      >>> round(float(res.q.rate), 10)
      2.0
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if intercept not in INTERCEPTS:
        raise ValueError(f"intercept must be one of {INTERCEPTS}, got {intercept!r}")

    def init_fn(key, q0, log_joint):
        return _init(key, q0, log_joint, init, intercept, num_init_draws)

    def noise_fn(key, q):
        if estimator == "independent":
            k1, k2 = jax.random.split(key)
            return q.noise(k1), q.noise(k2)
        return q.noise(key)

    def estimate_fn(noise, q, log_joint):
        if estimator == "independent":
            noise_c, noise_g = noise
        else:
            noise_c = noise_g = noise
        x = q.from_noise(noise_g)
        log_p = log_joint(x) - q.log_base_measure(x)
        frame = _frame(q)
        t = _to_frame(q.sufficient_stats(x), frame)
        if estimator == "joint":
            c_hat = jnp.outer(t, t)
        elif estimator == "independent":
            t_c = _to_frame(q.sufficient_stats(q.from_noise(noise_c)), frame)
            c_hat = jnp.outer(t_c, t_c)
        else:  # E_q[T~' T~] in q's own frame
            c_hat = jnp.eye(len(t), dtype=t.dtype)
        return RegressionStats(C=c_hat, g=t * log_p), x, log_p

    def solve_fn(stats, q, log_joint=None):
        del log_joint
        # T~ eta~' = eta_0' + (L^{-1} (T - c)) eta': eta = L^{-T} eta'
        chol = _frame(q)[1]
        eta = solve_triangular(chol.T, solve_gram(stats.C, stats.g)[1:], lower=False)
        return q.from_natural(eta)

    def min_draws(q):
        require_exponential_family(q, "regression")
        return 1 if estimator == "analytic" else q.num_stats + 1

    return Method(
        name=f"regression({estimator}, init={init})",
        init=init_fn,
        noise=noise_fn,
        estimate=estimate_fn,
        solve=solve_fn,
        min_draws=min_draws,
        reframe=reframe,
    )


register("regression", regression, default_for=(ExponentialFamily,))
