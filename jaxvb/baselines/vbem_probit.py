r"""VBEM for Bayesian probit regression (Ormerod & Wand 2010, section 3.3).

The baseline of the paper's probit comparison. With the prior ``x ~ N(0, P0^{-1})``
(``P0 = I`` in the paper), auxiliary variables ``z_i ~ N(v_i' x, 1)`` restricted to
``z_i > 0`` when ``y_i = 1`` and ``z_i <= 0`` otherwise make the model conditionally
conjugate. The factorised approximation ``q(x) prod_i q(z_i)`` then has a Gaussian
``q(x) = N(mu, Sigma)`` with the fixed covariance

    Sigma = (V' V + P0)^{-1},

and truncated-normal ``q(z_i)``. Coordinate ascent alternates, with ``s = 2 y - 1``,

    mu_z = V mu + s * phi(V mu) / Phi(s * V mu)       (mean of q(z))
    mu   = Sigma V' mu_z                              (mean of q(x)),

and never decreases the lower bound (Ormerod & Wand's ``log p(y; q)``, prior mean 0)

    L(mu) = sum_i log Phi(s_i v_i' mu) - mu' P0 mu / 2 - log |V' V + P0| / 2 + log |P0| / 2.

Each iteration is one pass over the ``N`` observations, which is how the paper counts
likelihood evaluations on the horizontal axis of its figure: ``num_iters`` iterations are
``num_iters`` likelihood evaluations.

Two facts the comparison rests on: ``L(mu)`` is the log joint at ``mu`` plus a constant,
so the fixed point ``mu`` is the posterior *mode* (this is the EM algorithm of the
data-augmented probit model); and ``Sigma`` is smaller than the exact posterior
covariance (the Hessian of ``-log p`` at any point is ``V' W V + P0`` with weights
``0 < W_ii < 1``), which is why VBEM's log score is so poor.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from jaxvb.models import probit
  >>> from jaxvb.baselines import vbem_probit
  >>> beta, design, y = probit.simulate(jax.random.key(0), num_datasets=4)
  >>> res = jax.vmap(vbem_probit.vbem)(design, y)
  >>> res.q.mean.shape, res.q.cov.shape, bool(res.converged.all())
  ((4, 5), (4, 5, 5), True)
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.linalg import cho_solve
from jax.scipy.special import log_ndtr
from jax.typing import ArrayLike

from jaxvb.families import Gaussian

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class Trace(NamedTuple):
    """Per-iteration history; row ``t`` is the state after ``t`` iterations (0 = start).

    Attributes:
      mean: shape ``(num_iters + 1, M)``; ``mean[0]`` is the prior mean (zero).
      lower_bound: shape ``(num_iters + 1,)``, ``L`` at ``mean[t]``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.baselines import vbem_probit
      >>> design = jnp.array([[1.0, 0.5], [1.0, -1.0], [1.0, 2.0], [1.0, 0.0]])
      >>> res = vbem_probit.vbem(design, jnp.array([1.0, 0.0, 1.0, 0.0]), num_iters=20,
      ...                        trace=True)
      >>> res.trace.mean.shape, [round(v, 4) for v in res.trace.lower_bound[:3].tolist()]
      ((21, 2), [-4.4562, -3.5538, -3.4182])
      >>> bool(jnp.all(jnp.diff(res.trace.lower_bound) >= 0))   # never decreases
      True
    """

    mean: jax.Array
    lower_bound: jax.Array


class Result(NamedTuple):
    """What :func:`vbem` returns.

    Attributes:
      q: the Gaussian factor ``q(x) = N(mu, Sigma)``.
      lower_bound: Ormerod & Wand's ``log p(y; q)`` at ``q``, a scalar.
      num_iters: iterations run, each one pass over the data (= likelihood evaluations).
      converged: whether the last iteration moved ``mu`` by at most the tolerance.
      trace: a :class:`Trace` when ``trace=True``, else ``None``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.baselines import vbem_probit
      >>> design = jnp.array([[1.0, 0.5], [1.0, -1.0], [1.0, 2.0], [1.0, 0.0]])
      >>> res = vbem_probit.vbem(design, jnp.array([1.0, 0.0, 1.0, 0.0]))
      >>> [round(v, 4) for v in res.q.mean.tolist()], int(res.num_iters), bool(res.converged)
      ([-0.1813, 0.8584], 68, True)
      >>> [round(v, 4) for v in res.q.cov.ravel().tolist()]   # (V'V + I)^{-1}, any y
      [0.2155, -0.0517, -0.0517, 0.1724]
    """

    q: Gaussian
    lower_bound: jax.Array
    num_iters: jax.Array
    converged: jax.Array
    trace: Trace | None


class _State(NamedTuple):
    iteration: jax.Array
    mean: jax.Array
    converged: jax.Array
    lower_bound: jax.Array
    mills: jax.Array  # s * phi(V mu) / Phi(s V mu), cached from the pass that gave L


def _pass(mean, design, sign, prior_precision, logdet_term):
    """One pass over the data at ``mu``: the bound ``L(mu)`` and ``mu_z - V mu``."""
    f = design @ mean
    log_cdf = log_ndtr(sign * f)
    # phi(f) / Phi(s f) through logs: the direct ratio is 0 / 0 far in the lower tail,
    # where it should be ~ |f|.
    mills = sign * jnp.exp(-0.5 * f**2 - _LOG_SQRT_2PI - log_cdf)
    bound = jnp.sum(log_cdf) - 0.5 * mean @ prior_precision @ mean - logdet_term
    return bound, mills


@functools.partial(jax.jit, static_argnames=("num_iters", "trace"))
def vbem(
    design: ArrayLike,
    y: ArrayLike,
    *,
    prior_precision: ArrayLike | None = None,
    num_iters: int = 1000,
    tol: float | None = None,
    trace: bool = False,
) -> Result:
    """Fits the VBEM approximation of Ormerod & Wand (2010) to a probit regression.

    Starts from the prior mean (zero), as every method in the paper's comparison does.

    Args:
      design: regressors ``v_i`` as rows, shape ``(N, M)``.
      y: binary responses in ``{0, 1}``, shape ``(N,)`` (not checked under ``jit``).
      prior_precision: ``P0``, shape ``(M, M)``; the identity by default.
      num_iters: with ``trace=False`` the most iterations run (a ``lax.while_loop`` that
        stops at convergence); with ``trace=True`` exactly this many (a ``lax.scan``).
      tol: converged means ``max |mu_t - mu_{t-1}| <= tol * (1 + max |mu_t|)``; by
        default ``10 * eps`` of the dtype. The tolerance sits near rounding because the
        distance to the fixed point is about ``step / (1 - rate)`` and EM's rate nears
        one when the data are close to separable (0.94 happens at the paper's sizes).
      trace: whether to record the mean and bound after every iteration.

    Returns:
      A :class:`Result`.
    """
    design = jnp.asarray(design)
    if not jnp.issubdtype(design.dtype, jnp.floating):
        design = design.astype(float)
    dtype = design.dtype
    if design.ndim != 2:
        raise ValueError(f"vbem: design must have shape (N, M), got {design.shape}.")
    n, m = design.shape
    y = jnp.asarray(y, dtype)
    if y.shape != (n,):
        raise ValueError(f"vbem: y must have shape ({n},) to match design, got {y.shape}.")
    if prior_precision is None:
        prior_precision = jnp.eye(m, dtype=dtype)
    prior_precision = jnp.asarray(prior_precision, dtype)
    tol = 10 * jnp.finfo(dtype).eps if tol is None else jnp.asarray(tol, dtype)

    precision = design.T @ design + prior_precision
    chol = jnp.linalg.cholesky(precision)
    cov = cho_solve((chol, True), jnp.eye(m, dtype=dtype))
    cov = 0.5 * (cov + cov.T)
    logdet_term = (
        jnp.sum(jnp.log(jnp.diagonal(chol))) - 0.5 * jnp.linalg.slogdet(prior_precision)[1]
    )
    sign = 2.0 * y - 1.0

    def step(state: _State) -> _State:
        mean_z = design @ state.mean + state.mills
        mean = cho_solve((chol, True), design.T @ mean_z)
        bound, mills = _pass(mean, design, sign, prior_precision, logdet_term)
        change = jnp.max(jnp.abs(mean - state.mean))
        converged = change <= tol * (1.0 + jnp.max(jnp.abs(mean)))
        return _State(state.iteration + 1, mean, converged, bound, mills)

    mean0 = jnp.zeros(m, dtype)
    bound0, mills0 = _pass(mean0, design, sign, prior_precision, logdet_term)
    state = _State(jnp.asarray(0), mean0, jnp.asarray(False), bound0, mills0)

    if trace:

        def scan_step(state, _):
            state = step(state)
            return state, (state.mean, state.lower_bound)

        state, (means, bounds) = lax.scan(scan_step, state, length=num_iters)
        history = Trace(
            jnp.concatenate([mean0[None], means]), jnp.concatenate([bound0[None], bounds])
        )
    else:
        state = lax.while_loop(
            lambda s: (s.iteration < num_iters) & ~s.converged, step, state
        )
        history = None

    return Result(
        q=Gaussian(state.mean, cov),
        lower_bound=state.lower_bound,
        num_iters=state.iteration,
        converged=state.converged,
        trace=history,
    )
