"""Algorithm 1: stochastic linear regression of log p(x) on the sufficient statistics.

For ``q_eta(x) = exp(T~(x) eta~)`` with ``T~ = (1, T)`` and ``eta~ = (eta_0, eta)``, the
KL-optimal parameters solve (paper, eq. 9)

    eta~ = C^{-1} g,    C = E_q[T~' T~],    g = E_q[T~' log p(x)].

One draw ``x* ~ q`` gives the unbiased estimates ``C^ = T~(x*)' T~(x*)`` and
``g^ = T~(x*)' log p(x*)``. Using the *same* draw for both is what makes the regression
noise free when ``p`` is in the family (eq. 13: exact after ``2(k + 1)`` steps).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxvb._algebra import solve_gram  # noqa: F401  (re-exported)
from jaxvb.families._base import ExponentialFamily
from jaxvb.methods._base import Method, require_exponential_family
from jaxvb.methods._registry import register

ESTIMATORS = ("joint", "independent", "analytic")
INITS = ("analytic", "diagonal", "identity")
INTERCEPTS = ("estimate", "normalized")


class RegressionStats(NamedTuple):
    """``C`` (``(k+1, k+1)``) and ``g`` (``(k+1,)``) of eq. 9, intercept first.

    Example:
      For ``q = Exponential(2)`` (``T(x) = -x``, ``eta = rate``), ``C = E_q[T~' T~]``
      and ``g = C eta~`` solve back to ``q``:

      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.methods.regression import RegressionStats, expected_outer_stats
      >>> q = jaxvb.Exponential(jnp.array([2.0]))
      >>> c = expected_outer_stats(q)
      >>> stats = RegressionStats(C=c, g=c @ jnp.array([jnp.log(2.0), 2.0]))
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
        require_exponential_family(q0, "regression")
        eta_0 = -q0.log_normalizer
        if intercept == "estimate":
            x = q0.sample(key, (num_init_draws,))
            offset = jax.vmap(log_joint)(x) - jax.vmap(q0.log_prob)(x)
            # A draw where log p is not finite says nothing about the offset.
            ok = jnp.isfinite(offset)
            mean = jnp.sum(jnp.where(ok, offset, 0.0)) / jnp.maximum(jnp.sum(ok), 1)
            eta_0 = eta_0 + mean
        eta = _with_intercept(q0.natural_params).at[0].set(eta_0)
        full = expected_outer_stats(q0)
        if init == "analytic":
            c = full
        elif init == "diagonal":
            c = jnp.diag(jnp.diagonal(full))
        else:
            c = jnp.eye(full.shape[0], dtype=full.dtype)
        return RegressionStats(C=c, g=c @ eta)

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
        t = _with_intercept(q.sufficient_stats(x))
        if estimator == "joint":
            c_hat = jnp.outer(t, t)
        elif estimator == "independent":
            t_c = _with_intercept(q.sufficient_stats(q.from_noise(noise_c)))
            c_hat = jnp.outer(t_c, t_c)
        else:
            c_hat = expected_outer_stats(q)
        return RegressionStats(C=c_hat, g=t * log_p), x, log_p

    def solve_fn(stats, q, log_joint=None):
        del log_joint
        return q.from_natural(solve_gram(stats.C, stats.g)[1:])

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
    )


register("regression", regression, default_for=(ExponentialFamily,))
