"""Wider bands by blocks: the factor, the solves and the selected inverse of a banded
matrix seen as block tridiagonal.

With dense ``b x b`` blocks, ``b = max(w, 8) >= w``, a block row couples to the one
before it only, and each ``lax.scan`` step is a small dense Cholesky, triangular solve
or product: ``T / b`` steps instead of ``T``. Per-step overhead, not arithmetic, is what
a scan over rows costs on XLA:CPU, so for wide bands this is the faster path;
:mod:`jaxvb.linalg.banded` chooses between them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.linalg import solve_triangular

Array = jax.Array

_BLOCK_MIN_SIZE = 8  # smallest block


def _block_size(w: int) -> int:
    return max(w, _BLOCK_MIN_SIZE)


@functools.lru_cache(maxsize=64)
def _block_index(w: int, t: int, b: int, symmetric: bool):
    """Gather indices into a flat ``(w + 1) * T`` band form for the diagonal blocks
    and the sub-diagonal blocks (block ``i``'s rows against block ``i - 1``'s
    columns), their masks, and where the padding's diagonal is (``T`` rounded up to
    whole blocks; the padding is an identity)."""
    nb = -(-t // b)
    rows = np.arange(nb)[:, None, None] * b + np.arange(b)[None, :, None]

    def index(cols):
        d = rows - cols
        inside = (rows < t) & (cols >= 0) & (cols < t)
        lower = inside & (d >= 0) & (d <= w)
        flat = np.where(lower, d * t + cols, 0)
        if symmetric:  # the upper triangle from the lower band
            upper = inside & (d < 0) & (-d <= w)
            flat = np.where(upper, -d * t + rows, flat)
            lower = lower | upper
        return flat, lower

    cols = np.arange(nb)[:, None, None] * b + np.arange(b)[None, None, :]
    padding = (rows == cols) & (rows >= t)
    return index(cols), index(cols - b), padding


def _to_blocks(ab: Array, *, symmetric: bool) -> tuple[Array, Array]:
    """``(diag, sub)``, each ``(T / b, b, b)``: the diagonal blocks (the padding's an
    identity) and the blocks below them (``sub[0] = 0``) of the symmetric matrix
    (``symmetric``) or of the lower-triangular factor in band form ``ab``."""
    w, t = ab.shape[0] - 1, ab.shape[1]
    (di, dm), (si, sm), padding = _block_index(w, t, _block_size(w), symmetric)
    flat = ab.reshape(-1)
    zero = jnp.zeros((), ab.dtype)
    diag = jnp.where(dm, flat[di], zero) + jnp.asarray(padding, ab.dtype)
    return diag, jnp.where(sm, flat[si], zero)


def _from_blocks(diag: Array, sub: Array, w: int, t: int) -> Array:
    """The lower band form ``(w + 1, T)`` of the block matrix ``(diag, sub)``."""
    b = diag.shape[1]
    rows = np.arange(w + 1)[:, None] + np.arange(t)[None, :]
    cols = np.broadcast_to(np.arange(t)[None, :], rows.shape)
    inside = rows < t
    rows = np.where(inside, rows, 0)
    same = rows // b == cols // b
    block_row = (rows // b, rows % b, cols % b)
    value = jnp.where(same, diag[block_row], sub[block_row])
    return jnp.where(inside, value, jnp.zeros((), diag.dtype))


def _cholesky_blocks(ab: Array) -> Array:
    """``L`` by blocks: ``M_i = C_i L_{i-1}^{-T}``, ``L_i = chol(D_i - M_i M_i')``."""
    diag, sub = _to_blocks(ab, symmetric=True)

    def step(l_prev, blocks):
        d, c = blocks
        m = solve_triangular(l_prev, c.T, lower=True).T
        l_i = jnp.linalg.cholesky(d - m @ m.T)
        return l_i, (l_i, m)

    eye = jnp.eye(diag.shape[1], dtype=ab.dtype)
    _, (l, m) = lax.scan(step, eye, (diag, sub))
    return _from_blocks(l, m, ab.shape[0] - 1, ab.shape[1])


def _padded_blocks(x: Array, nb: int, b: int) -> Array:
    """``(T, m)`` as ``(T / b, b, m)``, zero rows after ``T``."""
    pad = jnp.zeros((nb * b - x.shape[0],) + x.shape[1:], x.dtype)
    return jnp.concatenate([x, pad]).reshape((nb, b) + x.shape[1:])


def _forward_blocks(chol: Array, rhs: Array) -> Array:
    """``L^{-1} rhs`` by blocks: ``y_i = L_i^{-1} (rhs_i - M_i y_{i-1})``."""
    l, m = _to_blocks(chol, symmetric=False)
    nb, b = l.shape[:2]

    def step(y_prev, inputs):
        l_i, m_i, r_i = inputs
        y = solve_triangular(l_i, r_i - m_i @ y_prev, lower=True)
        return y, y

    init = jnp.zeros((b,) + rhs.shape[1:], rhs.dtype)
    y = lax.scan(step, init, (l, m, _padded_blocks(rhs, nb, b)))[1]
    return y.reshape((nb * b,) + rhs.shape[1:])[: rhs.shape[0]]


def _backward_blocks(chol: Array, y: Array) -> Array:
    """``L'^{-1} y`` by blocks, the last first: ``x_i = L_i^{-T} (y_i - M_{i+1}' x_{i+1})``."""
    l, m = _to_blocks(chol, symmetric=False)
    nb, b = l.shape[:2]
    m_next = jnp.concatenate([m[1:], jnp.zeros_like(m[:1])])

    def step(x_next, inputs):
        l_i, m_n, y_i = inputs
        x = solve_triangular(l_i, y_i - m_n.T @ x_next, lower=True, trans=1)
        return x, x

    init = jnp.zeros((b,) + y.shape[1:], y.dtype)
    x = lax.scan(step, init, (l, m_next, _padded_blocks(y, nb, b)), reverse=True)[1]
    return x.reshape((nb * b,) + y.shape[1:])[: y.shape[0]]


def _selected_inverse_blocks(chol: Array) -> Array:
    """Takahashi by blocks, the last first: with ``S = Sigma_{i+1, i+1}``,
    ``Sigma_{i+1, i} = -S M_{i+1} L_i^{-1}`` and ``Sigma_{i, i} = L_i^{-T} L_i^{-1} -
    Sigma_{i+1, i}' M_{i+1} L_i^{-1}``."""
    l, m = _to_blocks(chol, symmetric=False)
    m_next = jnp.concatenate([m[1:], jnp.zeros_like(m[:1])])
    eye = jnp.eye(l.shape[1], dtype=chol.dtype)

    def step(s_next, inputs):
        l_i, m_n = inputs
        l_inv = solve_triangular(l_i, eye, lower=True)
        cov = -(s_next @ m_n) @ l_inv
        s = l_inv.T @ l_inv - cov.T @ m_n @ l_inv
        return s, (s, cov)

    _, (s, cov) = lax.scan(step, jnp.zeros_like(eye), (l, m_next), reverse=True)
    # block i's rows against block i - 1's columns: Sigma_{i, i-1} = cov[i - 1]
    below = jnp.concatenate([jnp.zeros_like(cov[:1]), cov[:-1]])
    return _from_blocks(s, below, chol.shape[0] - 1, chol.shape[1])
