"""Algebra shared by the engine, the methods and the diagnostics (one home for it)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


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
