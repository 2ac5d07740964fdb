r"""The start of a latent Gaussian fit: a Laplace approximation, in one compiled program.

Newton's method for ``f`` at ``theta`` (the mode of ``p(f | theta, y)``) gives the
sites (``_newton_sites``, in :mod:`jaxvb.latent.target`); :func:`jaxvb.laplace`'s
search on the hyperparameters' target ``L`` (:mod:`jaxvb.latent.target`) gives
``q(theta)``; in rounds, each from where the last moved to, the sites refreshed
(:func:`_start_traced`, :data:`ROUND_STEPS`). :meth:`jaxvb.LatentGaussian.start`
validates ``theta0`` and calls it.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from jaxvb import _static
from jaxvb._platform import jit_fast, jit_once
from jaxvb.core.start import default_tol, laplace_traced, near_mode
from jaxvb.families._base import Array, build
from jaxvb.latent import _field
from jaxvb.latent.approximation import LatentGaussianApproximation
from jaxvb.latent.target import (
    _newton_sites,
    _prior_log_norm,
    _target,
    _value_grad_hessian_differences,
)

if TYPE_CHECKING:
    from jaxvb.latent.model import LatentGaussian


def _name_the_prior(model: LatentGaussian, theta0: Array) -> None:
    """Where a start failed because ``p(f | theta0)`` has no normalising constant from
    its precision (no Cholesky factor), a warning that names it: the fit's own flags
    (``LAPLACE_FAILED``, non-finite diagnostics) cannot say why."""
    m, precision, log_norm = model.prior_of_field(theta0)
    if log_norm is not None:
        return
    if bool(
        jnp.isfinite(_prior_log_norm(_field.ops(precision), precision, None, m.shape[-1]))
    ):
        return
    warnings.warn(
        "LatentGaussian: the prior precision Q(theta0) has no Cholesky factor (it is "
        "not positive definite), so log p(f | theta0) has no normalising constant and "
        "the start failed. A prior flat in some direction (a zero corner for a flat "
        "intercept) is fine if prior returns (mean, precision, log_norm) with the "
        "density's log constant; otherwise Q(theta) must be positive definite.",
        RuntimeWarning,
        stacklevel=4,
    )


#: How far each round of the start but the last may move a hyperparameter
#: (unconstrained units), and how many rounds whose search's mode was within that
#: bound settle the start (the rest are skipped). A round takes the sites at ``theta``
#: and searches the target they give. A search with sites from a poor ``theta0`` (a
#: scale far from its posterior) can run off to a collapsed scale: the sites' mismatch
#: costs the bound less where the field's prior pins it down (a group sd -> 0), and
#: there the target is too flat and too rounded for the search to come back. Bounded
#: moves with the sites refreshed between them follow the posterior instead; the last
#: round moves freely. From a good ``theta0`` two rounds settle it, as before.
ROUND_STEPS = (2.0, 2.0, 2.0, 2.0, math.inf)
SETTLED_ROUNDS = 2


# One compiled program for the whole start (eagerly, its loops and searches would be
# traced again at every call).
def _start_traced(arrays, static, theta0):
    model = _static.combine(arrays, static)

    def search(theta):
        a, b = _newton_sites(model, theta)
        target = functools.partial(_target, model, a, b)

        def vgh(th):
            # Hessians by differences of the exact gradient (forward over reverse
            # through the factorisation's scans costs many gradients on XLA:CPU);
            # steps relative to the point's size
            value, grad, hess, _ = _value_grad_hessian_differences(
                target, th, jnp.maximum(1.0, jnp.abs(th)), central=False
            )
            return value, grad, hess

        # the search itself (jaxvb.laplace raises where it fails; here a failure is
        # the fit's LAPLACE_FAILED flag)
        return laplace_traced(
            lambda th: target(th)[0],
            theta,
            default_tol(theta.dtype),
            max_iter=200,
            vgh=vgh,
        )

    def round_(carry, max_move):
        theta, calm, _ = carry

        def run(_):
            theta_q, info = search(theta)
            move = theta_q.mean - theta
            within = jnp.all(jnp.abs(move) <= max_move)
            bounded = theta + jnp.clip(move, -max_move, max_move)
            nxt = jnp.where(within, theta_q.mean, bounded)
            return nxt, jnp.where(within, calm + 1, 0), (theta_q, info)

        return jax.lax.cond(calm >= SETTLED_ROUNDS, lambda _: carry, run, None), None

    # the rounds as a loop: the sites' search and the mode search compile once
    shapes = jax.eval_shape(search, theta0)
    empty = jax.tree_util.tree_map(lambda v: jnp.zeros(v.shape, v.dtype), shapes)
    steps = jnp.asarray(ROUND_STEPS, theta0.dtype)
    (theta, _, (theta_q, info)), _ = jax.lax.scan(round_, (theta0, 0, empty), steps)
    a, b = _newton_sites(model, theta)
    q0 = build(
        LatentGaussianApproximation,
        theta=theta_q,
        site_precision=a,
        site_shift=b,
        model=model,
        theta_centre=theta_q.mean,
        theta_frame=_frame_of(theta_q.cov),
    )
    return q0, near_mode(info) & q0.is_proper


ROUNDS = 2
_start = jit_once(_start_traced, static_argnames=("static",))
_start_optimised = jit_fast(_start_traced, static_argnames=("static",))


def _frame_of(cov: Array) -> Array:
    """The Cholesky factor of ``cov``, or the identity where it has none (a failed
    start, already flagged ``LAPLACE_FAILED``): the frame only conditions the
    statistics, any fixed invertible one gives the same fit in exact arithmetic."""
    chol = jnp.linalg.cholesky(cov)
    ok = jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.diagonal(chol) > 0)
    return jnp.where(ok, chol, jnp.eye(cov.shape[-1], dtype=cov.dtype))
