"""Algebra shared by the engine, the families, the methods and the diagnostics (one home
for it): masked sums over draws, pytree selects, and the linear solves of the updates."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jax.scipy.linalg import solve_triangular

from jaxvb.linalg import _small as small


def finite_rows(tree: Any) -> jax.Array:
    """Per row (leading axis) of every leaf: whether all its entries are finite.

    Example:
      >>> import jax.numpy as jnp
      >>> finite_rows({"a": jnp.array([[1.0, 2.0], [jnp.nan, 0.0]]),
      ...              "b": jnp.array([0.0, 1.0])}).tolist()
      [True, False]
    """
    finite = jax.tree_util.tree_map(
        lambda v: jnp.all(jnp.isfinite(v.reshape(v.shape[0], -1)), axis=1), tree
    )
    return jnp.all(jnp.stack(jax.tree_util.tree_leaves(finite)), axis=0)


def masked_sum(tree: Any, mask: jax.Array) -> Any:
    """The sum over rows (leading axis) where ``mask`` holds, leaf by leaf.

    Rows left out contribute an exact zero, so a NaN in them does not spread.

    Example:
      >>> import jax.numpy as jnp
      >>> masked_sum(jnp.array([[1.0, 2.0], [jnp.nan, 5.0]]), jnp.array([True, False])).tolist()
      [1.0, 2.0]
    """
    return jax.tree_util.tree_map(
        lambda v: jnp.sum(jnp.where(mask.reshape((-1,) + (1,) * (v.ndim - 1)), v, 0), 0),
        tree,
    )


def masked_mean(tree: Any, mask: jax.Array) -> Any:
    """The mean over rows where ``mask`` holds (zero where none does)."""
    n = jnp.maximum(jnp.sum(mask), 1)
    return jax.tree_util.tree_map(lambda v: v / n.astype(v.dtype), masked_sum(tree, mask))


def where_tree(pred: jax.Array, a: Any, b: Any) -> Any:
    """``a`` where ``pred`` holds, else ``b``, for two pytrees of one structure."""
    return jax.tree_util.tree_map(lambda u, v: jnp.where(pred, u, v), a, b)


def cast_tree(tree: Any, dtype) -> Any:
    """Every floating leaf of ``tree`` in ``dtype``."""
    return jax.tree_util.tree_map(
        lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v, tree
    )


# Linear solves ------------------------------------------------------------------------


def precision_factor(precision: Array) -> Array:
    """The upper-triangular ``U`` with ``U U' = precision`` and a positive diagonal.

    The "reversed" Cholesky factor ``U = J chol(J P J) J`` (``J`` the exchange matrix):
    one Cholesky of the precision. Its inverse transpose ``U^{-T}`` is lower triangular
    with a positive diagonal and ``U^{-T} U^{-1} = P^{-1}``, so it *is* the Cholesky
    factor of the covariance (which is unique): draws ``m + U^{-T} z`` are the draws
    ``m + chol(cov) z`` without forming ``cov``. NaN where ``precision`` is not positive
    definite. Leading axes are batch axes.

    Example:
      >>> import jax.numpy as jnp
      >>> p = jnp.array([[2.0, 0.5], [0.5, 1.0]])
      >>> u = precision_factor(p)
      >>> float(u[1, 0]), bool(jnp.allclose(u @ u.T, p))
      (0.0, True)
    """
    flipped = jnp.flip(precision, (-2, -1))
    return jnp.flip(jnp.linalg.cholesky(flipped), (-2, -1))


def solve_precision(factor: Array, b: Array) -> Array:
    """``P^{-1} b`` for ``P = U U'`` from its factor ``U`` (:func:`precision_factor`).

    Two triangular solves, ``O(d^2)`` per right-hand side ``b`` of shape ``(d,)``.

    Example:
      >>> import jax.numpy as jnp
      >>> p = jnp.array([[2.0, 0.5], [0.5, 1.0]])
      >>> x = solve_precision(precision_factor(p), jnp.array([1.0, 2.0]))
      >>> bool(jnp.allclose(p @ x, jnp.array([1.0, 2.0])))
      True
    """
    y = solve_triangular(factor, b, lower=False)
    return solve_triangular(factor, y, lower=False, trans="T")


def solve_gram(c: jax.Array, g: jax.Array) -> jax.Array:
    """``C^{-1} g`` for a Gram matrix ``C`` (positive definite, here ``E[T~' T~]``).

    Cholesky after Jacobi scaling, since the statistics can differ in scale by orders
    of magnitude. A singular ``C`` gives NaN, which ``fit`` flags as an improper update.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb._algebra import solve_gram
      >>> c = jnp.array([[1.0, -0.5], [-0.5, 0.5]])
      >>> [round(v, 12) for v in solve_gram(c, c @ jnp.array([1.0, 2.0])).tolist()]
      [1.0, 2.0]
    """
    scale = jax.lax.rsqrt(jnp.diagonal(c))
    chol = jnp.linalg.cholesky(c * scale[:, None] * scale[None, :])
    return scale * jax.scipy.linalg.cho_solve((chol, True), g * scale)


def solve_equilibrated(c: jax.Array, g: jax.Array) -> jax.Array:
    """``C^{-1} g`` for a square, non-symmetric ``C``: LU after equilibration.

    The rows and columns of ``C`` can differ in scale by orders of magnitude (a mean
    and a precision, say), so both are scaled to unit largest entry first. A singular
    ``C`` gives inf or NaN, which ``fit`` flags as an improper update.

    Example:
      >>> import jax.numpy as jnp
      >>> c = jnp.array([[1e6, 2.0], [3.0, 1e-4]])
      >>> x = solve_equilibrated(c, c @ jnp.array([1.0, 2.0]))
      >>> bool(jnp.allclose(x, jnp.array([1.0, 2.0])))
      True
    """
    row = 1.0 / jnp.max(jnp.abs(c), axis=1)
    c = c * row[:, None]
    col = 1.0 / jnp.max(jnp.abs(c), axis=0)
    return col * small.solve(c * col[None, :], g * row)
