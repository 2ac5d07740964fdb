"""The Laplace approximation: a Gaussian at the mode with the curvature there.

Algorithm 2 started far from the posterior can diverge on real, ill-conditioned models;
started at the Laplace approximation it is accurate (paper, section 3: "choosing eta to
match the curvature of log p(x, y) at its mode"). ``jaxvb.fit`` starts here when given
a point ``x0`` instead of a family.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxvb.families._base import build, is_concrete
from jaxvb.families.gaussian import Gaussian


class LaplaceInfo(NamedTuple):
    """How the mode search went.

    Attributes:
      converged: the gradient norm fell below ``tol`` within ``max_iter`` steps.
      negative_definite: the Hessian at the mode is negative definite (a proper
        Gaussian); where it is not, the precision returned has its eigenvalues
        replaced by their absolute values (floored), so the result is still proper.
      num_iter: L-BFGS iterations used.
      grad_norm: the gradient norm at the returned mode.
      log_joint: ``log_joint`` at the returned mode.
    """

    converged: jax.Array
    negative_definite: jax.Array
    num_iter: jax.Array
    grad_norm: jax.Array
    log_joint: jax.Array


def _find_mode(log_joint, x0, max_iter, tol):
    def loss(x):
        return -log_joint(x)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    def step(carry):
        x, state = carry
        value, grad = value_and_grad(x, state=state)
        updates, state = opt.update(grad, state, x, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(x, updates), state

    def keep_going(carry):
        _, state = carry
        count = optax.tree.get(state, "count")
        grad = optax.tree.get(state, "grad")
        return (count == 0) | ((count < max_iter) & (optax.tree.norm(grad) >= tol))

    x, state = jax.lax.while_loop(keep_going, step, (x0, opt.init(x0)))
    return x, optax.tree.get(state, "count")


def laplace(
    log_joint: Callable[[jax.Array], jax.Array],
    x0: jax.Array,
    *,
    max_iter: int = 500,
    tol: float = 1e-6,
    return_info: bool = False,
):
    """The Laplace approximation ``N(mode, (-hess log p(mode))^{-1})``.

    The mode is found by L-BFGS (``optax.lbfgs`` with its zoom line search) from ``x0``;
    the precision is minus the Hessian there (``jax.hessian``).

    Args:
      log_joint: unnormalised log posterior, ``x -> scalar``, twice differentiable.
      x0: the starting point, shape ``(d,)``.
      max_iter: L-BFGS iterations at most.
      tol: stop when the gradient norm falls below this.
      return_info: also return a :class:`LaplaceInfo`.

    Returns:
      A :class:`~jaxvb.Gaussian` (and the info if asked). Called outside ``jit``, a
      Hessian at the mode that is not negative definite, or a mode search that does not
      converge, raises ``ValueError`` naming the cause and what to do; under ``jit`` the
      info says so and the precision is made positive definite (absolute eigenvalues).

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> q = jaxvb.laplace(lambda x: -0.5 * jnp.sum((x - 2.0) ** 2) / 9.0, jnp.zeros(2))
      >>> q.mean.round(5).tolist(), q.cov.round(5).tolist()
      ([2.0, 2.0], [[9.0, 0.0], [0.0, 9.0]])
    """
    x0 = jnp.asarray(x0)
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        x0 = x0.astype(jnp.result_type(float))
    if x0.ndim != 1:
        raise ValueError(f"laplace: x0 must have shape (d,), got {x0.shape}")
    gaussian, info = _laplace(log_joint, x0, max_iter=max_iter, tol=tol)
    if is_concrete(info.converged):
        if not bool(info.negative_definite):
            raise ValueError(
                "laplace: the Hessian of log_joint at the mode found is not negative "
                "definite (a saddle point, a flat direction or an improper posterior), so "
                "there is no Laplace approximation there. Check that the posterior is "
                "proper (add a prior on unidentified parameters), or start fit from a "
                f"jaxvb.Gaussian instead of a point. Mode found: {np.asarray(gaussian.mean)}"
            )
        if not bool(info.converged):
            raise ValueError(
                f"laplace: L-BFGS did not reach a gradient norm below {tol} in {max_iter} "
                f"iterations (it reached {float(info.grad_norm):.3g}). Increase max_iter, "
                "start closer to the mode, or check that log_joint has a finite maximum."
            )
    return (gaussian, info) if return_info else gaussian


@jax.jit(static_argnames=("log_joint", "max_iter"))
def _laplace(log_joint, x0, *, max_iter, tol):
    mode, count = _find_mode(log_joint, x0, max_iter, tol)
    value, grad = jax.value_and_grad(log_joint)(mode)
    precision = -jax.hessian(log_joint)(mode)
    precision = 0.5 * (precision + precision.T)
    evals, evecs = jnp.linalg.eigh(precision)
    negative_definite = jnp.all(evals > 0) & jnp.all(jnp.isfinite(evals))
    # Under jit an improper curvature cannot raise: keep the result proper and say so.
    floor = jnp.finfo(evals.dtype).eps * jnp.maximum(jnp.max(jnp.abs(evals)), 1.0)
    safe = jnp.maximum(jnp.abs(evals), floor)
    cov = (evecs / safe) @ evecs.T
    cov = 0.5 * (cov + cov.T)
    grad_norm = jnp.linalg.norm(grad)
    info = LaplaceInfo(
        converged=grad_norm < tol,
        negative_definite=negative_definite,
        num_iter=count,
        grad_norm=grad_norm,
        log_joint=value,
    )
    return build(Gaussian, mean=mode, cov=cov), info
