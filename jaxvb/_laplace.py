"""The Laplace approximation: a Gaussian at the mode with the curvature there.

Algorithm 2 started far from the posterior can diverge on real, ill-conditioned models;
started at the Laplace approximation it is accurate (paper, section 3: "choosing eta to
match the curvature of log p(x, y) at its mode"). ``jaxvb.fit`` starts here when given
a point ``x0`` instead of a family.

The mode search is L-BFGS followed by Newton steps with the exact Hessian. L-BFGS alone
stalls on badly scaled posteriors (a flat-prior regression on the raw Longley design,
whose posterior covariance has condition number ~1e19, stops after 500 iterations
far from the mode); Newton's method is invariant to linear changes of coordinates, so
it converges there in a few steps, and it is cheap once L-BFGS is near the mode.
Positive definiteness is decided by a Cholesky factorisation, which, unlike the
eigenvalues, does not depend on the scale of the coordinates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.scipy.linalg import cho_solve

from jaxvb.families._base import build, is_concrete
from jaxvb.families.gaussian import Gaussian


class LaplaceInfo(NamedTuple):
    """How the mode search went.

    Attributes:
      converged: the gradient norm fell below ``tol``, or the Newton decrement
        ``sqrt(g' P^{-1} g)`` did (the distance to the mode measured in standard
        deviations of the Laplace approximation, which does not depend on the units of
        ``x``).
      negative_definite: the Hessian at the mode is negative definite (its Cholesky
        factorisation succeeds: a proper Gaussian); where it is not, the precision
        returned has the eigenvalues of its Jacobi-equilibrated form replaced by their
        absolute values (floored), so the result is still proper.
      num_iter: L-BFGS iterations used.
      grad_norm: the gradient norm at the returned mode.
      log_joint: ``log_joint`` at the returned mode.
      newton_decrement: ``sqrt(g' P^{-1} g)`` at the returned mode (``inf`` where the
        precision ``P`` is not positive definite).
      num_newton: Newton steps taken after L-BFGS.

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: 1.0 - 0.5 * jnp.sum((x - 2.0) ** 2)
      >>> q, info = jaxvb.laplace(log_joint, jnp.zeros(2), return_info=True)
      >>> bool(info.converged), bool(info.negative_definite), round(float(info.log_joint), 6)
      (True, True, 1.0)
    """

    converged: jax.Array
    negative_definite: jax.Array
    num_iter: jax.Array
    grad_norm: jax.Array
    log_joint: jax.Array
    newton_decrement: jax.Array
    num_newton: jax.Array


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
    # L-BFGS can end on a non-finite point (a line search into an overflow); Newton
    # then starts from x0 instead.
    x = jnp.where(jnp.isfinite(log_joint(x)), x, x0)
    return x, optax.tree.get(state, "count")


def _precision_factor(precision):
    """Cholesky factor of ``precision`` and whether it is positive definite.

    Where it is not, the factor is that of the matrix with the eigenvalues of its
    Jacobi-equilibrated form replaced by their absolute values (floored at ``eps``
    times the largest): a positive definite stand-in of the same scale, used for the
    modified Newton step and for an improper Laplace approximation under ``jit``.
    """
    chol = jnp.linalg.cholesky(precision)
    proper = jnp.all(jnp.isfinite(chol))

    def modified(_):
        diag = jnp.abs(jnp.diagonal(precision))
        s = jnp.where(diag > 0, 1.0 / jnp.sqrt(jnp.where(diag > 0, diag, 1.0)), 1.0)
        scaled = precision * s[:, None] * s[None, :]
        scaled = jnp.where(jnp.isfinite(scaled), scaled, 0.0)
        evals, evecs = jnp.linalg.eigh(scaled)
        floor = 1e3 * jnp.finfo(evals.dtype).eps * jnp.maximum(jnp.max(jnp.abs(evals)), 1.0)
        fixed = (evecs * jnp.maximum(jnp.abs(evals), floor)) @ evecs.T
        fixed = 0.5 * (fixed + fixed.T) / s[:, None] / s[None, :]
        return jnp.linalg.cholesky(fixed)

    chol = jax.lax.cond(proper, lambda _: chol, modified, None)
    return chol, proper


def _newton(log_joint, x, max_steps, tol):
    """Damped Newton steps from ``x`` until the Newton decrement is below ``tol``."""
    grad_fn = jax.grad(log_joint)
    hess_fn = jax.hessian(log_joint)

    def direction(x):
        g = grad_fn(x)
        h = hess_fn(x)
        chol, proper = _precision_factor(-0.5 * (h + h.T))
        d = cho_solve((chol, True), g)
        lam2 = g @ d  # > 0: d is an ascent direction
        lam = jnp.where(proper & jnp.isfinite(lam2), jnp.sqrt(jnp.abs(lam2)), jnp.inf)
        return d, lam2, lam

    def step_length(x, d, lam2):
        # Armijo backtracking on log_joint along d; 0 where no step length helps.
        f0 = log_joint(x)

        def too_long(t):
            f = log_joint(x + t * d)
            return ~(jnp.isfinite(f) & (f >= f0 + 1e-4 * t * lam2)) & (t > 1e-12)

        t = jax.lax.while_loop(too_long, lambda t: 0.5 * t, jnp.ones((), x.dtype))
        return jnp.where(t > 1e-12, t, 0.0)

    def keep_going(carry):
        _, _, _, lam, n, moved = carry
        return (n < max_steps) & ~(lam <= tol) & moved

    def step(carry):
        x, d, lam2, _, n, _ = carry
        t = step_length(x, d, lam2)
        x = x + t * d
        return (x, *direction(x), n + 1, t > 0)

    carry = (x, *direction(x), jnp.zeros((), jnp.int32), jnp.ones((), bool))
    x, _, _, _, n, _ = jax.lax.while_loop(keep_going, step, carry)
    return x, n


def laplace(
    log_joint: Callable[[jax.Array], jax.Array],
    x0: jax.Array,
    *,
    max_iter: int = 500,
    tol: float = 1e-6,
    max_newton: int = 50,
    return_info: bool = False,
):
    """The Laplace approximation ``N(mode, (-hess log p(mode))^{-1})``.

    The mode is found by L-BFGS (``optax.lbfgs`` with its zoom line search) from ``x0``,
    then refined by Newton steps with the exact Hessian (a backtracking line search;
    where the Hessian is not negative definite, its equilibrated eigenvalues are made
    negative). The precision is minus the Hessian at the mode (``jax.hessian``).

    Args:
      log_joint: unnormalised log posterior, ``x -> scalar``, twice differentiable.
      x0: the starting point, shape ``(d,)``.
      max_iter: L-BFGS iterations at most.
      tol: the mode is found when the gradient norm, or the Newton decrement (the
        distance to the mode in standard deviations of the approximation), falls
        below this.
      max_newton: Newton steps at most after L-BFGS (``0``: none).
      return_info: also return a :class:`LaplaceInfo`.

    Returns:
      A :class:`~jaxvb.Gaussian` (and the info if asked). Called outside ``jit``, a
      mode search that does not converge, or a Hessian at the mode that is not
      negative definite, raises ``ValueError`` naming the cause and what to do; under
      ``jit`` the info says so and the precision is made positive definite (absolute
      eigenvalues).

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
    gaussian, info = _laplace(
        log_joint, x0, max_iter=max_iter, tol=tol, max_newton=max_newton
    )
    if is_concrete(info.converged):
        mode = np.asarray(gaussian.mean)
        if not bool(info.converged):
            also = (
                ""
                if bool(info.negative_definite)
                else ", and the Hessian there is not negative definite"
            )
            raise ValueError(
                f"laplace: the mode search did not converge: after {int(info.num_iter)} "
                f"L-BFGS and {int(info.num_newton)} Newton steps the gradient norm is "
                f"{float(info.grad_norm):.3g} and the Newton decrement "
                f"{float(info.newton_decrement):.3g} (tol {tol}){also}. Check that "
                "log_joint has a finite maximum (a proper posterior), start closer to "
                "the mode, or increase max_iter / max_newton. Point reached: "
                f"{mode}"
            )
        if not bool(info.negative_definite):
            raise ValueError(
                "laplace: the Hessian of log_joint at the mode found is not negative "
                "definite (a saddle point, a flat direction or an improper posterior), so "
                "there is no Laplace approximation there. Check that the posterior is "
                "proper (add a prior on unidentified parameters), or start fit from a "
                f"jaxvb.Gaussian instead of a point. Mode found: {mode}"
            )
    return (gaussian, info) if return_info else gaussian


@jax.jit(static_argnames=("log_joint", "max_iter", "max_newton"))
def _laplace(log_joint, x0, *, max_iter, tol, max_newton):
    mode, count = _find_mode(log_joint, x0, max_iter, tol)
    if max_newton > 0:
        mode, num_newton = _newton(log_joint, mode, max_newton, tol)
    else:
        num_newton = jnp.zeros((), jnp.int32)
    value, grad = jax.value_and_grad(log_joint)(mode)
    hess = jax.hessian(log_joint)(mode)
    chol, negative_definite = _precision_factor(-0.5 * (hess + hess.T))
    negative_definite = negative_definite & jnp.all(jnp.isfinite(hess))
    eye = jnp.eye(mode.shape[0], dtype=mode.dtype)
    cov = cho_solve((chol, True), eye)
    cov = 0.5 * (cov + cov.T)
    lam2 = grad @ cho_solve((chol, True), grad)
    decrement = jnp.where(negative_definite, jnp.sqrt(jnp.abs(lam2)), jnp.inf)
    grad_norm = jnp.linalg.norm(grad)
    info = LaplaceInfo(
        converged=(grad_norm < tol) | (decrement < tol),
        negative_definite=negative_definite,
        num_iter=count,
        grad_norm=grad_norm,
        log_joint=value,
        newton_decrement=decrement,
        num_newton=num_newton,
    )
    return build(Gaussian, mean=mode, cov=cov), info
