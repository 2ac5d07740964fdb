"""The lower band form of a symmetric banded matrix: checks, shifts and row form.

``ab`` of shape ``(w + 1, T)`` holds ``A[j + r, j]`` at ``ab[r, j]`` (row ``r`` the
``r``-th subdiagonal, left-aligned, its last ``r`` entries padding), as described in
:mod:`jaxvb.linalg.banded`; these helpers are shared by the banded and the arrowhead
algebra.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

Array = jax.Array


def _as_float(x: ArrayLike) -> Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.result_type(float))
    return x


def _as_band(ab: ArrayLike, name: str = "ab") -> Array:
    ab = _as_float(ab)
    if ab.ndim != 2 or ab.shape[0] < 1 or ab.shape[1] < 1:
        raise ValueError(
            f"{name} must have shape (w + 1, T) with w >= 0 and T >= 1 (lower band form, "
            f"row r the r-th subdiagonal), got {ab.shape}; use jax.vmap for a batch."
        )
    return ab


def _shift(x: Array, r: int) -> Array:
    """``y[i] = x[i - r]`` (zero where ``i - r < 0``) along the first axis."""
    n = x.shape[0]
    r = min(r, n)
    pad = jnp.zeros((r, *x.shape[1:]), x.dtype)
    return jnp.concatenate([pad, x[: n - r]])


def _unshift(x: Array, r: int) -> Array:
    """``y[i] = x[i + r]`` (zero where ``i + r >= T``) along the first axis."""
    n = x.shape[0]
    r = min(r, n)
    pad = jnp.zeros((r, *x.shape[1:]), x.dtype)
    return jnp.concatenate([x[r:], pad])


def _zero_padding(ab: Array) -> Array:
    """``ab`` with its padding entries ``ab[r, T - r:]`` set to zero."""
    w1, t = ab.shape
    valid = jnp.arange(t)[None, :] < t - jnp.arange(w1)[:, None]
    return jnp.where(valid, ab, jnp.zeros((), ab.dtype))


def _to_rows(ab: Array) -> Array:
    """Row form, shape ``(T, w + 1)``: ``rows[i, w - r] = A[i, i - r]`` (zero if ``i < r``).

    Row ``i`` of the lower triangle, ending with its diagonal entry.
    """
    w = ab.shape[0] - 1
    return jnp.stack([_shift(ab[r], r) for r in range(w, -1, -1)], axis=1)


def _from_rows(rows: Array) -> Array:
    """The inverse of ``_to_rows``, with zero padding."""
    w = rows.shape[1] - 1
    return jnp.stack([_unshift(rows[:, w - r], r) for r in range(w + 1)])


def _rhs(b: ArrayLike, t: int, dtype) -> tuple[Array, bool]:
    b = jnp.asarray(b, dtype=jnp.result_type(dtype, jnp.asarray(b).dtype))
    if b.ndim not in (1, 2) or b.shape[0] != t:
        raise ValueError(
            f"right-hand side must have shape ({t},) or ({t}, m), got {b.shape}."
        )
    return (b[:, None], True) if b.ndim == 1 else (b, False)
