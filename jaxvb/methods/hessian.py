"""Algorithm 2: Gaussian approximation from the gradient and Hessian of log p.

With ``q = N(m, V)`` and the mean/variance parametrisation (paper, section 5.4 and
appendix B) the regression statistics reduce to three running averages,

    a = E_q[grad log p(x)],    P = -E_q[hess log p(x)],    z = E_q[x],

and the solution is ``V = P^{-1}``, ``m = V a + z``. Storage and work are in the
dimension of ``x`` rather than its square (Algorithm 1 needs ``k = d + d(d+1)/2``).
The solution is kept as ``P``'s factor (:class:`~jaxvb.Gaussian` stores it): one
Cholesky per step, and ``O(d^2)`` solves for the mean and the next draw.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxvb._algebra import precision_factor, solve_precision
from jaxvb.families._base import build
from jaxvb.families.gaussian import Gaussian
from jaxvb.methods._base import Method, value_grad_hessian
from jaxvb.methods._registry import register


class HessianStats(NamedTuple):
    """``a`` (``(d,)``), ``P`` (``(d, d)``) and ``z`` (``(d,)``) of Algorithm 2.

    Example:
      The method starts from ``a = 0``, ``P`` the precision and ``z`` the mean of
      ``q0``, which solve back to ``q0``:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.Gaussian(jnp.array([1.0, 2.0]), jnp.diag(jnp.array([4.0, 0.25])))
      >>> stats = jaxvb.methods.hessian().init(jax.random.key(0), q0, None)
      >>> stats.a.tolist(), stats.P.tolist(), stats.z.tolist()
      ([0.0, 0.0], [[0.25, 0.0], [0.0, 4.0]], [1.0, 2.0])
    """

    a: jax.Array
    P: jax.Array
    z: jax.Array


@functools.cache
def hessian(grad_and_hessian: Callable | None = None) -> Method:
    """Algorithm 2 of the paper for a :class:`~jaxvb.Gaussian` approximation.

    Args:
      grad_and_hessian: optional ``x -> (grad, hess)`` of the log joint, e.g. analytic
        or built from Hessian-vector products; by default ``jax.grad`` and
        ``jax.hessian`` of the ``log_joint`` given to :func:`jaxvb.fit`.

    Returns:
      A :class:`~jaxvb.methods.Method` for :func:`jaxvb.fit` (requires a Gaussian
      ``q0``). Like every method it relies on ``fit``'s step control: an update whose
      precision is not positive definite is retried with half the step (up to
      ``max_backtracks`` times), which keeps the running precision positive definite
      from any start; see :func:`jaxvb.fit`. It does not make a far start converge:
      from ``Gaussian(0, I)`` on an ill-conditioned or heavy-tailed posterior (a
      regression on raw, collinear data; GARCH) the run often ends flagged, and can
      stop before the iteration has settled. Give ``fit`` a point ``x0`` instead: it
      then starts from the Laplace approximation there, from which Algorithm 2 is
      accurate on every model of ``benchmarks/robustness.py``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: -0.5 * jnp.sum((x - 3.0) ** 2 / 4.0)
      >>> res = jaxvb.fit(log_joint, jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
      ...                 jax.random.key(0), num_steps=20, method="hessian")
      >>> res.q.mean.round(8).tolist(), jnp.diag(res.q.cov).round(8).tolist()
      ([3.0, 3.0], [4.0, 4.0])
    """

    def init_fn(key, q0, log_joint):
        del key, log_joint
        if not isinstance(q0, Gaussian):
            raise TypeError(
                f"method='hessian' (Algorithm 2) needs a jaxvb.Gaussian q0, got "
                f"{type(q0).__name__}; use method='regression' or 'gradient' for it."
            )
        return HessianStats(a=jnp.zeros_like(q0.mean), P=q0.precision, z=q0.mean)

    def noise_fn(key, q):
        return q.noise(key)

    def estimate_fn(noise, q, log_joint):
        x = q.from_noise(noise)
        if grad_and_hessian is None:
            log_p, g, h = value_grad_hessian(log_joint)(x)
        else:
            g, h = grad_and_hessian(x)
            log_p = log_joint(x)
        h = 0.5 * (h + h.T)
        # A non-finite log density makes the draw's statistics non-finite too, so that
        # fit leaves the draw out and flags it.
        bad = ~jnp.isfinite(log_p)
        g = jnp.where(bad, jnp.nan, g)
        return HessianStats(a=g.astype(q.dtype), P=-h.astype(q.dtype), z=x), x, log_p

    def solve_fn(stats, q, log_joint=None):
        del log_joint
        # One Cholesky of P and two triangular solves: q stays in precision form, its
        # covariance is never formed inside the loop (a non-positive-definite P gives
        # a NaN factor, which is_proper reports).
        factor = precision_factor(stats.P)
        mean = solve_precision(factor, stats.a) + stats.z
        return build(Gaussian, mean=mean, precision_factor=factor)

    return Method(
        name="hessian",
        init=init_fn,
        noise=noise_fn,
        estimate=estimate_fn,
        solve=solve_fn,
        min_draws=lambda q: 1,
    )


register("hessian", hessian, default_for=(Gaussian,))
