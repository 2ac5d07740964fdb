r"""Cholesky, triangular inverse and linear solves for matrices of order <= 4, unrolled.

Why not ``jnp.linalg``: on the CPU each ``jnp.linalg`` call is a LAPACK custom call,
a separate step of XLA's runtime with a fixed cost per call (a ``3 x 3`` ``solve`` is an
LU, two triangular solves and a permutation), while the same arithmetic written out
elementwise fuses with its neighbours into one kernel. Inside a fit's ``lax.scan`` the
small solves of every step (the scalar blocks' ``C^{-1} g``, the ``k x k`` Schur
complement of an arrowhead precision) add up to a visible share of a fit such as the
stochastic-volatility model's. Larger orders fall back to ``jnp.linalg``.

The results agree with LAPACK's to rounding: the same algorithms (Cholesky-
Banachiewicz; Gaussian elimination with partial pivoting, the row of largest
magnitude first). As there, a matrix that is not positive definite gives NaN in
``cholesky``, and a singular one inf or NaN in ``solve``.

Example:
  >>> import jax.numpy as jnp
  >>> from jaxvb.linalg import _small as small
  >>> a = jnp.array([[4.0, 2.0], [2.0, 3.0]])
  >>> small.cholesky(a).tolist()
  [[2.0, 0.0], [1.0, 1.4142135623730951]]
  >>> small.solve(a, jnp.array([6.0, 5.0])).tolist()
  [1.0, 1.0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

Array = jax.Array

#: Largest order written out; above it the ``jnp.linalg`` routines are used.
MAX_ORDER = 4

__all__ = ["MAX_ORDER", "cholesky", "eigvalsh", "inv_lower", "solve"]


def cholesky(a: Array) -> Array:
    """The lower Cholesky factor of the symmetric part ``(a + a') / 2`` of ``(n, n)`` ``a``.

    As ``jnp.linalg.cholesky``: NaN where it is not positive definite, and the input
    symmetrised first (so a gradient splits evenly between ``a[i, j]`` and ``a[j, i]``).
    """
    n = a.shape[-1]
    if n > MAX_ORDER or a.ndim != 2:
        return jnp.linalg.cholesky(a)
    a = 0.5 * (a + a.T)
    rows = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = a[i, j] - sum((rows[i][k] * rows[j][k] for k in range(j)), 0.0)
            rows[i][j] = jnp.sqrt(s) if i == j else s / rows[j][j]
    zero = jnp.zeros((), a.dtype)
    return jnp.stack(
        [jnp.stack([rows[i][j] if j <= i else zero for j in range(n)]) for i in range(n)]
    )


def eigvalsh(a: Array) -> Array:
    """Eigenvalues of the symmetric part of ``(n, n)`` ``a``; order 1 without LAPACK."""
    if a.ndim == 2 and a.shape[-1] == 1:
        return a[0]
    return jnp.linalg.eigvalsh(0.5 * (a + jnp.swapaxes(a, -1, -2)))


def inv_lower(l: Array) -> Array:  # noqa: E741 (the usual name of a Cholesky factor)
    """``L^{-1}`` of a lower-triangular ``(n, n)`` matrix, by forward substitution."""
    n = l.shape[-1]
    if n > MAX_ORDER or l.ndim != 2:
        return solve_triangular(l, jnp.eye(n, dtype=l.dtype), lower=True)
    inv = [[None] * n for _ in range(n)]
    for j in range(n):
        for i in range(n):
            if i < j:
                inv[i][j] = jnp.zeros((), l.dtype)
                continue
            s = (1.0 if i == j else 0.0) - sum(
                (l[i, k] * inv[k][j] for k in range(j, i)), 0.0
            )
            inv[i][j] = s / l[i, i]
    return jnp.stack([jnp.stack(row) for row in inv])


def solve(a: Array, b: Array) -> Array:
    """``a^{-1} b`` for a square ``(n, n)`` ``a``, ``b`` of shape ``(n,)`` or ``(n, m)``.

    Gaussian elimination with partial pivoting on the augmented matrix ``[a | b]``;
    the row swaps are ``where``s, so the whole solve is elementwise.
    """
    n = a.shape[-1]
    if n > MAX_ORDER or a.ndim != 2:
        return jnp.linalg.solve(a, b)
    vector = b.ndim == 1
    m = jnp.concatenate([a, b[:, None] if vector else b], axis=1)
    rows = jnp.arange(n)[:, None]
    for j in range(n - 1):
        # The pivot: the first row of largest |m[i, j]|, i >= j, by comparisons (an
        # argmax and a gather would be separate, unfused steps).
        p, row_p, size = j, m[j], jnp.abs(m[j, j])
        for i in range(j + 1, n):
            larger = jnp.abs(m[i, j]) > size
            p = jnp.where(larger, i, p)
            row_p = jnp.where(larger, m[i], row_p)
            size = jnp.where(larger, jnp.abs(m[i, j]), size)
        m = jnp.where(rows == j, row_p, jnp.where(rows == p, m[j], m))
        factors = m[j + 1 :, j] / m[j, j]
        m = m.at[j + 1 :].add(-factors[:, None] * m[j][None, :])
    x = [None] * n
    for i in reversed(range(n)):
        s = m[i, n:] - sum((m[i, k] * x[k] for k in range(i + 1, n)), 0.0)
        x[i] = s / m[i, i]
    x = jnp.stack(x)
    return x[:, 0] if vector else x
