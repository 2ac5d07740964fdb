"""The Laplace approximation: a Gaussian at the mode with the curvature there.

Algorithm 2 started far from the posterior can diverge on real, ill-conditioned models;
started at the Laplace approximation it is accurate (paper, section 3: "choosing eta to
match the curvature of log p(x, y) at its mode"). ``jaxvb.fit`` starts here when given
a point ``x0`` instead of a family.

The mode search is Newton's method with Levenberg-Marquardt damping: every iteration
evaluates ``log p``, its gradient and its Hessian once, at a trial point, and takes the
point if ``log p`` rose by enough of what the quadratic model promised (else the
damping grows and the step shrinks towards a scaled gradient step). Newton's method is
invariant to linear changes of coordinates, so it reaches the mode of badly scaled
posteriors (a flat-prior regression on the raw Longley design, posterior condition
number ~1e19) where quasi-Newton methods stall, and the damping is applied to the
Jacobi-equilibrated Hessian so that it too ignores the units of ``x``. Positive
definiteness is decided by a Cholesky factorisation, which, unlike the eigenvalues,
does not depend on the scale of the coordinates.

Why one loop with one evaluation: the first call's cost is mostly compiling, and XLA
compiles every place a derivative of ``log_joint`` is traced. An L-BFGS search with its
line search followed by Newton steps traced the model's derivatives at seven places;
this loop traces ``log p``, gradient and Hessian at one (``value_grad_hessian``), and
the Hessian at the mode, the precision of the result, is the last one it evaluated.
The search is compiled with XLA's backend optimisation off (it runs a few dozen
evaluations, so compiling faster matters more than running faster).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve

from jaxvb import _static
from jaxvb._algebra import precision_factor
from jaxvb._platform import jit_once
from jaxvb.core.status import short_array
from jaxvb.families._base import build, is_concrete
from jaxvb.families.gaussian import Gaussian
from jaxvb.families.mixture import GaussianMixture
from jaxvb.methods._base import value_grad_hessian


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
      num_iter: iterations used, each one evaluation of ``log_joint`` with its
        gradient and Hessian.
      grad_norm: the gradient norm at the last point evaluated (the returned mode is
        one full Newton step from it when the search converged).
      log_joint: ``log_joint`` at that point.
      newton_decrement: ``sqrt(g' P^{-1} g)`` at that point (``inf`` where the
        precision ``P`` is not positive definite).
      num_newton: steps taken (iterations whose trial point was accepted).

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


def _precision_factor(precision):
    """Cholesky factor of ``precision`` and whether it is positive definite.

    Where it is not, the factor is that of the matrix with the eigenvalues of its
    Jacobi-equilibrated form replaced by their absolute values (floored at ``eps``
    times the largest): a positive definite stand-in of the same scale, used for the
    damped Newton step and for an improper Laplace approximation under ``jit``.
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


class _Search(NamedTuple):
    x: jax.Array  # the accepted point, with its value, gradient and precision
    value: jax.Array
    grad: jax.Array
    precision: jax.Array
    trial: jax.Array  # where the next evaluation happens
    predicted: jax.Array  # the quadratic model's gain for the step to ``trial``
    damping: jax.Array
    growth: jax.Array
    decrement: jax.Array
    num_iter: jax.Array
    num_accepted: jax.Array


def _newton_step(precision, grad, damping):
    """The damped Newton step, its promised gain and the Newton decrement.

    The step ``d`` solves ``(S M S + damping I) S^{-1} d = S g``, with ``M`` the
    precision (or, where it is not positive definite, its modified stand-in) and ``S``
    its Jacobi scaling; the quadratic model promises ``g'd - d' M d / 2`` for it.
    """
    chol, proper = _precision_factor(precision)
    lam2 = grad @ cho_solve((chol, True), grad)
    decrement = jnp.where(proper & jnp.isfinite(lam2), jnp.sqrt(jnp.abs(lam2)), jnp.inf)
    m = jnp.where(proper, precision, chol @ chol.T)
    diag = jnp.diagonal(m)
    s = 1.0 / jnp.sqrt(jnp.where(diag > 0, diag, 1.0))
    scaled = m * s[:, None] * s[None, :]
    eye = jnp.eye(grad.shape[0], dtype=grad.dtype)
    damped = jnp.linalg.cholesky(scaled + damping * eye)
    d_scaled = cho_solve((damped, True), s * grad)
    d = s * d_scaled
    # g'd = d_s'(S M S + damping I) d_s, so the gain is (g'd + damping |d_s|^2) / 2.
    predicted = 0.5 * (grad @ d + damping * (d_scaled @ d_scaled))
    return d, predicted, decrement


def _find_mode(log_joint, x0, max_iter, tol, vgh=None):
    """Damped Newton from ``x0``: one ``value_grad_hessian`` per iteration (or one
    call of ``vgh``, ``x -> (value, grad, hess)``, where given)."""
    vgh = value_grad_hessian(log_joint) if vgh is None else vgh
    dtype = x0.dtype
    d = x0.shape[0]
    big = jnp.asarray(jnp.finfo(dtype).max, dtype)

    def keep_going(s):
        converged = (s.decrement <= tol) | (jnp.linalg.norm(s.grad) <= tol)
        stuck = s.damping > 1e12  # no step, however short, raises log p
        return (s.num_iter < max_iter) & ~converged & ~stuck

    def body(s):
        value, grad, hess = vgh(s.trial)
        # log p's own rounding: that of the dtype it is computed in (float32 data in a
        # float64 session rounds it to float32)
        eps = jnp.finfo(working_dtype(dtype, jnp.result_type(value))).eps
        value = jnp.asarray(value, dtype)
        precision = -0.5 * (hess + hess.T).astype(dtype)
        finite = (
            jnp.isfinite(value)
            & jnp.all(jnp.isfinite(grad))
            & jnp.all(jnp.isfinite(precision))
        )
        gain = value - s.value
        ratio = gain / s.predicted
        # Near the mode the promised gain falls below the rounding of log p (soon in
        # float32): a step that keeps log p within that rounding is taken, and the
        # gradient, not log p, says whether it helped.
        rounding = 10.0 * eps * (1.0 + jnp.abs(s.value))
        flat = (s.predicted <= rounding) & (gain >= -rounding)
        # The first iteration evaluates x0 itself (value -inf before it).
        accept = finite & ((s.num_iter == 0) | (ratio >= 1e-4) | flat)
        # Nielsen's rule: shrink the damping after a good step, grow it geometrically
        # after each refusal.
        shrink = jnp.maximum(1.0 / 3.0, 1.0 - (2.0 * jnp.clip(ratio, 0.0, 1.0) - 1.0) ** 3)
        damping = jnp.where(accept, s.damping * shrink, s.damping * s.growth)
        growth = jnp.where(accept, 2.0, 2.0 * s.growth)
        x = jnp.where(accept, s.trial, s.x)
        value = jnp.where(accept, value, s.value)
        grad = jnp.where(accept, grad.astype(dtype), s.grad)
        precision = jnp.where(accept, precision, s.precision)
        step, predicted, decrement = _newton_step(precision, grad, damping)
        return _Search(
            x=x,
            value=value,
            grad=grad,
            precision=precision,
            trial=x + step,
            predicted=predicted,
            damping=damping,
            growth=growth,
            decrement=decrement,
            num_iter=s.num_iter + 1,
            num_accepted=s.num_accepted + accept.astype(jnp.int32),
        )

    start = _Search(
        x=x0,
        value=jnp.asarray(-jnp.inf, dtype),
        grad=jnp.full((d,), big, dtype),
        precision=jnp.eye(d, dtype=dtype),
        trial=x0,
        predicted=jnp.ones((), dtype),
        damping=jnp.asarray(1e-3, dtype),
        growth=jnp.asarray(2.0, dtype),
        decrement=jnp.asarray(jnp.inf, dtype),
        num_iter=jnp.zeros((), jnp.int32),
        num_accepted=jnp.zeros((), jnp.int32),
    )
    return jax.lax.while_loop(keep_going, body, start)


def default_tol(dtype) -> float:
    """``laplace``'s default ``tol``: ``1e-6``, or ``1e-3`` in single precision.

    A Newton decrement of 1e-3 (the mode off by a thousandth of a posterior standard
    deviation) is as close as float32's rounding of ``log p`` and its gradient lets
    the search come on ordinary models.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.core.start import default_tol
      >>> default_tol(jnp.float64), default_tol(jnp.float32)
      (1e-06, 0.001)
    """
    return 1e-6 if jnp.finfo(dtype).bits >= 64 else 1e-3


def working_dtype(x_dtype, out_dtype):
    """The coarser of the point's dtype and ``log p``'s: a float64 ``x0`` with float32
    data computes ``log p`` and its gradient in float32, whose rounding then bounds how
    close to the mode the search can come (float32's tolerance applies)."""
    if not jnp.issubdtype(out_dtype, jnp.floating):
        return x_dtype
    return out_dtype if jnp.finfo(out_dtype).bits < jnp.finfo(x_dtype).bits else x_dtype


def laplace(
    log_joint: Callable[[jax.Array], jax.Array],
    x0: jax.Array,
    *,
    max_iter: int = 200,
    tol: float | None = None,
    return_info: bool = False,
):
    """The Laplace approximation ``N(mode, (-hess log p(mode))^{-1})``.

    The mode is found by Newton's method from ``x0`` with Levenberg-Marquardt damping
    on the Jacobi-equilibrated Hessian (a trial step is taken when ``log p`` rises by at
    least 1e-4 of the quadratic model's promise; where the Hessian is not negative
    definite, its equilibrated eigenvalues are made negative). Each iteration evaluates
    ``log p``, its gradient and Hessian once (forward over reverse mode); the precision
    is minus the Hessian at the mode.

    Args:
      log_joint: unnormalised log posterior, ``x -> scalar``, twice differentiable. A
        pytree (e.g. ``jax.tree_util.Partial(fn, data)``) is passed to the compiled
        search as an argument: a second call with new data of the same shapes reuses it.
      x0: the starting point, shape ``(d,)``.
      max_iter: iterations at most (each one evaluation of value, gradient, Hessian).
      tol: the mode is found when the gradient norm, or the Newton decrement (the
        distance to the mode in standard deviations of the approximation), falls
        below this; ``None``: :func:`default_tol` of the coarser of ``x0``'s dtype and
        the dtype ``log_joint`` returns (float32 data in a float64 session: 1e-3).
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
    if tol is None:
        out = jax.eval_shape(log_joint, jax.ShapeDtypeStruct(x0.shape, x0.dtype))
        tol = default_tol(working_dtype(x0.dtype, getattr(out, "dtype", x0.dtype)))
    gaussian, info = _laplace(log_joint, x0, tol, max_iter=int(max_iter))
    if is_concrete(info.converged):
        raise_for(info, gaussian, tol, log_joint)
    return (gaussian, info) if return_info else gaussian


#: A search that stops this close to the mode (Newton decrement, in posterior sds)
#: without reaching ``tol`` has stalled on the rounding of ``log p``; as a start for
#: ``fit`` that is close enough.
NEAR_MODE = 1e-2


def near_mode(info) -> jax.Array:
    """Whether the search ended at (or, stalled by rounding, within ``NEAR_MODE`` sds
    of) a mode with a negative definite Hessian: good enough to start a fit."""
    near = info.converged | (
        jnp.isfinite(info.log_joint) & (info.newton_decrement <= NEAR_MODE)
    )
    return near & info.negative_definite


#: A search that did not converge and reached a coordinate this large (an unconstrained
#: log-scale of -20 is a scale of 2e-9) has run off along a direction in which
#: ``log_joint`` grows without bound.
RAN_OFF = 20.0


def raise_for(info, gaussian, tol, log_joint=None) -> None:
    """Raises ``ValueError`` naming why a concrete search failed (nothing if it did
    not); a coordinate by ``log_joint.coordinate_name(i)`` where it has one (a NumPyro
    model's site)."""
    mode = np.asarray(gaussian.mean)
    decrement = float(info.newton_decrement)
    reached = f"Point reached: {short_array(mode)}"
    if not bool(info.converged) and bool(near_mode(info)):
        raise ValueError(
            f"laplace: the mode search stopped {decrement:.3g} posterior sds from the "
            f"mode (tol {tol}): the rounding of log_joint (float32 data or float32 "
            "arithmetic inside it) hides the last steps' gains. Use a tol above that "
            "(1e-3 is float32's default; jaxvb.fit(..., laplace_tol=1e-3)), or compute "
            f"log_joint in float64. {reached}"
        )
    if not bool(info.converged):
        also = (
            ""
            if bool(info.negative_definite)
            else ", and the Hessian there is not negative definite"
        )
        far = int(np.argmax(np.abs(mode))) if mode.size else 0
        if mode.size and np.isfinite(float(info.log_joint)) and abs(mode[far]) >= RAN_OFF:
            # A density with no maximum: the search climbs along one coordinate for
            # ever. The common case is a centred hierarchy's funnel.
            named = getattr(log_joint, "coordinate_name", None)
            site = f" ({named(far)}, unconstrained)" if callable(named) else ""
            if mode[far] < 0:  # a log-scale heading for -inf: a funnel's mark
                cause = (
                    "This is the mark of a funnel: in a centred hierarchy (group "
                    "effects ~ Normal(mu, tau)) the density grows without limit as tau "
                    "-> 0 and the effects meet mu. Non-centre the model (effects = mu "
                    "+ tau * z, z ~ Normal(0, 1)), or fit the effects as a latent "
                    "Gaussian field (jaxvb.LatentGaussian; latent= in "
                    "jaxvb.numpyro.fit). If the model is not hierarchical, the "
                    "posterior is improper along it: add a prior, or a tighter one."
                )
            else:
                cause = (
                    "The posterior is improper along it: add a prior, or a tighter "
                    "one, on that parameter."
                )
            raise ValueError(
                f"laplace: log_joint has no maximum: it keeps rising along coordinate "
                f"{far}{site}, which reached {mode[far]:.3g} after "
                f"{int(info.num_iter)} iterations. {cause} {reached}"
            )
        raise ValueError(
            f"laplace: the mode search did not converge: after {int(info.num_iter)} "
            f"iterations ({int(info.num_newton)} steps taken) the gradient norm is "
            f"{float(info.grad_norm):.3g} and the Newton decrement "
            f"{decrement:.3g} (tol {tol}){also}. Check that log_joint has a finite "
            "maximum (a proper posterior), start closer to the mode, or increase "
            f"max_iter. {reached}"
        )
    if not bool(info.negative_definite):
        raise ValueError(
            "laplace: the Hessian of log_joint at the mode found is not negative "
            "definite (a saddle point, a flat direction or an improper posterior), so "
            "there is no Laplace approximation there. Check that the posterior is "
            "proper (add a prior on unidentified parameters), or start fit from a "
            f"jaxvb.Gaussian instead of a point. Mode found: {short_array(mode)}"
        )


def _laplace(log_joint, x0, tol, *, max_iter):
    arrays, static = _static.partition(log_joint)
    return _laplace_compiled(arrays, static, x0, tol, max_iter=max_iter)


# Backend optimisation off: the search runs a few dozen iterations, where compiling
# at the default level costs seconds and running it at level 0 is ~20% slower.
@jit_once(static_argnames=("static", "max_iter"))
def _laplace_compiled(arrays, static, x0, tol, *, max_iter):
    return laplace_traced(_static.combine(arrays, static), x0, tol, max_iter=max_iter)


def laplace_traced(log_joint, x0, tol, *, max_iter, vgh=None):
    """``(Gaussian, LaplaceInfo)``, traced into the caller's program (no checks, no
    raising); ``vgh`` replaces forward-over-reverse derivatives where given (e.g.
    differences of the gradient, for a ``log_joint`` whose Hessian pass is costly)."""
    tol = jnp.asarray(tol, x0.dtype)
    s = _find_mode(log_joint, x0, max_iter, tol, vgh)
    chol, negative_definite = _precision_factor(s.precision)
    negative_definite = negative_definite & jnp.all(jnp.isfinite(s.precision))
    # The Gaussian keeps the precision's factor: no inverse. Where the Hessian is not
    # negative definite, that of its modified stand-in.
    precision = jnp.where(negative_definite, s.precision, chol @ chol.T)
    factor = precision_factor(0.5 * (precision + precision.T))
    # One last full Newton step from the last point evaluated, with its Hessian: the
    # search stops within tol (in standard deviations) of the mode, where log p is
    # quadratic to that order, so this step squares the remaining error (and makes the
    # mode of a Gaussian target exact) without another evaluation.
    polish = negative_definite & (s.decrement <= tol)
    mode = s.x + jnp.where(polish, cho_solve((chol, True), s.grad), 0.0)
    grad_norm = jnp.linalg.norm(s.grad)
    info = LaplaceInfo(
        converged=jnp.isfinite(s.value) & ((grad_norm <= tol) | (s.decrement <= tol)),
        negative_definite=negative_definite,
        num_iter=s.num_iter,
        grad_norm=grad_norm,
        log_joint=s.value,
        newton_decrement=s.decrement,
        num_newton=s.num_accepted,
    )
    return build(Gaussian, mean=mode, precision_factor=factor), info


def init_mixture(
    log_joint: Callable[[jax.Array], jax.Array],
    x0: jax.Array,
    num_components: int,
    *,
    spread: float = 0.5,
) -> GaussianMixture:
    """A deterministic start for a mixture fit: components spread around the Laplace fit.

    Finds the mode and the curvature there with :func:`jaxvb.laplace` (L-BFGS from
    ``x0``, then Newton steps) and returns :meth:`GaussianMixture.around` of that
    Gaussian: ``num_components`` equal weights, means ``spread`` standard deviations
    from the mode along fixed (Halton) directions, covariances ``(1 - spread^2)`` times
    the Laplace covariance. No randomness: the same arguments give the same start.

    Args:
      log_joint: unnormalised log posterior, ``x -> scalar``, twice differentiable.
      x0: where the mode search starts, shape ``(d,)``.
      num_components: ``K >= 1``.
      spread: in ``[0, 1)``; see :meth:`GaussianMixture.around`.

    Returns:
      A :class:`~jaxvb.GaussianMixture` for ``jaxvb.fit(log_joint, q0, key, ...)``.
      Raises ``ValueError`` where :func:`jaxvb.laplace` does (no mode found, or a
      Hessian there that is not negative definite).

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.init_mixture(lambda x: -0.5 * jnp.sum((x - 1.0) ** 2),
      ...                         jnp.zeros(2), 3)
      >>> q0.num_components, q0.mean.round(6).tolist()
      (3, [1.0, 1.0])
    """
    return GaussianMixture.around(laplace(log_joint, x0), num_components, spread=spread)


__all__ = ["LaplaceInfo", "init_mixture", "laplace"]
