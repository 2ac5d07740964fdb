r"""Symmetric positive-definite banded matrices in O(T w^2): Cholesky, solves,
log-determinant, selected inverse and sampling.

**Lower band form.** A symmetric ``T x T`` matrix ``A`` with lower bandwidth ``w``
(``A[i, j] = 0`` for ``|i - j| > w``) is stored as an array ``ab`` of shape ``(w + 1, T)``
with

    ``ab[r, j] = A[j + r, j]``  for ``0 <= r <= w`` and ``0 <= j < T - r``:

row 0 is the diagonal, row ``r`` the ``r``-th subdiagonal, left-aligned. The last ``r``
entries of row ``r`` (``ab[r, T - r:]``) are padding: ignored on input, zero on output.
This is the layout of ``scipy.linalg.cholesky_banded(ab, lower=True)``, and a Cholesky
factor ``L`` (lower triangular, ``A = L L'``, same bandwidth) is stored the same way,
``chol[r, j] = L[j + r, j]``. A tridiagonal AR(1) precision is ``w = 1``, a diagonal one
``w = 0``.

The factor, the solves, the selected inverse and sampling are each one ``lax.scan``:
over the ``T`` rows carrying a ``w x w`` window for ``w < 4``, over blocks of ``b =
max(w, 8)`` rows with dense ``b x b`` blocks for wider bands (``T / b`` steps: a scan's
per-step cost, not its arithmetic, is what a row recurrence spends on XLA:CPU). On an
accelerator, where every scan step is a kernel launch, ``w = 1`` runs as log-depth
prefix compositions instead (``log2 T`` rounds over the whole array, ``O(T log T)``
work; the same results to rounding): ``JAXVB_TRIDIAGONAL=parallel|sequential`` picks
one by hand, "auto" (the default) by the backend when a function is traced. Time is
``O(T w^2)`` either way and memory ``O(T w)`` (``O(T w^2)`` for reverse-mode gradients);
nothing ``T x T`` is formed (except by ``to_dense``, which is for tests). All functions
work under ``jit``, ``vmap`` and ``grad`` and keep the input's floating dtype; ``T`` and
``w`` are read off the shapes.

**Not positive definite.** ``cholesky_banded`` does not raise (it cannot, under ``jit``).
A negative pivot ``A[i, i] - sum_k L[i, k]^2`` puts NaN on the diagonal of row ``i`` (of
every row of its block, for ``w >= 4``) and, for ``w >= 1``, in every later row (each row
is solved against the ones before it); a zero pivot gives a zero diagonal and inf or NaN
after it (NaN from its block on, for ``w >= 4``; NaN from it on, for ``w = 1`` by prefix
compositions). Either way ``logdet_banded`` is
NaN or -inf, never a plausible number, and ``is_pd_banded(chol)`` turns it into a
boolean for callers to flag.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike

Array = jax.Array

_UNROLL_MAX = 8  # widest band whose window solve is unrolled

__all__ = [
    "Banded",
    "cholesky_banded",
    "from_dense",
    "is_pd_banded",
    "logdet_banded",
    "matvec_banded",
    "sample_banded",
    "selected_inverse_banded",
    "solve_banded",
    "solve_triangular_banded",
    "to_dense",
]


class Banded(NamedTuple):
    """A symmetric banded matrix held in lower band form: a marker for APIs that take
    a dense array or a banded one (:class:`jaxvb.LatentGaussian`'s prior precision).

    Attributes:
      ab: shape ``(w + 1, T)``, ``ab[r, j] = A[j + r, j]`` (see the module docstring).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.linalg import Banded, to_dense
      >>> q = Banded(jnp.array([[2.0, 2.0, 2.0], [-1.0, -1.0, 0.0]]))   # tridiagonal
      >>> q.size, q.bandwidth
      (3, 1)
      >>> to_dense(q.ab).tolist()
      [[2.0, -1.0, 0.0], [-1.0, 2.0, -1.0], [0.0, -1.0, 2.0]]
    """

    ab: Array

    @property
    def size(self) -> int:
        """``T``, the number of rows."""
        return self.ab.shape[-1]

    @property
    def bandwidth(self) -> int:
        """``w``, the number of subdiagonals."""
        return self.ab.shape[-2] - 1


# --------------------------------------------------------------------------- helpers


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


def _forward_window(lwin: Array, a: Array) -> Array:
    """``lwin^{-1} a`` for a small lower-triangular ``lwin`` (``w x w``).

    Unrolled multiply-adds for the small ``w`` of state-space models: cheaper inside a
    scan body than a ``triangular_solve`` call, but the graph grows as ``w^2``, so wide
    bands use the library solve.
    """
    w = a.shape[0]
    if w > _UNROLL_MAX:
        return solve_triangular(lwin, a, lower=True)
    out = []
    for j in range(w):
        acc = a[j]
        for k in range(j):
            acc = acc - lwin[j, k] * out[k]
        out.append(acc / lwin[j, j])
    return jnp.stack(out) if out else a


# Bandwidth 1 (AR(1) and random-walk precisions, the common case) gets its own scalar
# recurrences: the generic window code carries (w, w) arrays through concatenations,
# which costs ~5x more per row, and ~50x more when vmapped over draws.


def _cholesky_tridiagonal(ab: Array) -> Array:
    """``L`` of a tridiagonal SPD matrix: ``c_i = sqrt(a_i - l_{i-1}^2)``, ``l_i = b_i / c_i``."""
    sub = _zero_padding(ab)[1]

    def step(l_prev, row):
        a, b = row
        c = jnp.sqrt(a - l_prev * l_prev)
        l_i = b / c
        return l_i, (c, l_i)

    _, (c, l) = lax.scan(step, jnp.zeros((), ab.dtype), (ab[0], sub))
    return jnp.stack([c, l])


def _forward_bidiagonal(chol: Array, b: Array) -> Array:
    """``L^{-1} b``: ``y_i = (b_i - l_{i-1} y_{i-1}) / c_i``, ``b`` of shape ``(T, m)``."""
    sub_prev = _shift(chol[1], 1)  # l_{i-1}, zero for i = 0

    def step(y_prev, inputs):
        c, l_prev, bi = inputs
        y = (bi - l_prev * y_prev) / c
        return y, y

    return lax.scan(step, jnp.zeros(b.shape[1:], b.dtype), (chol[0], sub_prev, b))[1]


def _backward_bidiagonal(chol: Array, y: Array) -> Array:
    """``L'^{-1} y``: ``x_i = (y_i - l_i x_{i+1}) / c_i``, from the last row up."""
    sub = _zero_padding(chol)[1]

    def step(x_next, inputs):
        c, l_i, yi = inputs
        x = (yi - l_i * x_next) / c
        return x, x

    init = jnp.zeros(y.shape[1:], y.dtype)
    return lax.scan(step, init, (chol[0], sub, y), reverse=True)[1]


def _selected_inverse_tridiagonal(chol: Array) -> Array:
    """Takahashi for ``w = 1``: with ``r_i = l_i / c_i`` and ``s = Sigma[i+1, i+1]``,
    ``Sigma[i+1, i] = -r_i s`` and ``Sigma[i, i] = 1 / c_i^2 + r_i^2 s``."""
    chol = _zero_padding(chol)

    def step(s_next, col):
        c, l_i = col
        r = l_i / c
        cov = -r * s_next
        var = 1.0 / (c * c) - r * cov
        return var, (var, cov)

    _, (var, cov) = lax.scan(
        step, jnp.zeros((), chol.dtype), (chol[0], chol[1]), reverse=True
    )
    return _zero_padding(jnp.stack([var, cov]))


# On an accelerator a scan over rows is a chain of T small kernels whatever their work:
# an SV fit of T = 945 took 4.1 s on an H200 against 0.03 s on 2 CPU cores
# (benchmarks/results/gpu.json). There, w = 1 goes through associative scans instead:
# log2(T) levels of O(T) elementwise work, the same arithmetic in another order. The
# pivots d_i = a_i - b_{i-1}^2 / d_{i-1} are a continued fraction, the ratio of a
# product of 2 x 2 matrices (rescaled as they are multiplied: the ratio does not see
# the scale); the solves and the selected inverse are affine recurrences. "auto" picks
# it where the default backend is not the CPU; JAXVB_TRIDIAGONAL=parallel|sequential
# forces one (read when a function is traced).

_TRIDIAGONAL_MODES = ("auto", "parallel", "sequential")


def _parallel_tridiagonal() -> bool:
    mode = os.environ.get("JAXVB_TRIDIAGONAL", "auto")
    if mode not in _TRIDIAGONAL_MODES:
        raise ValueError(
            f"JAXVB_TRIDIAGONAL must be one of {_TRIDIAGONAL_MODES}, got {mode!r}"
        )
    return mode == "parallel" or (mode == "auto" and jax.default_backend() != "cpu")


def _affine(earlier, later):
    """``x -> a x + b`` maps composed, ``later`` after ``earlier`` (associative)."""
    a1, b1 = earlier
    a2, b2 = later
    return a2 * a1, a2 * b1 + b2


def _moebius(earlier, later):
    """2 x 2 matrices (four ``(T,)`` arrays) multiplied ``later @ earlier`` and rescaled
    to a largest entry of 1 (a continued fraction is the ratio of two entries)."""
    p = (
        later[0] * earlier[0] + later[1] * earlier[2],
        later[0] * earlier[1] + later[1] * earlier[3],
        later[2] * earlier[0] + later[3] * earlier[2],
        later[2] * earlier[1] + later[3] * earlier[3],
    )
    scale = lax.stop_gradient(functools.reduce(jnp.maximum, [jnp.abs(e) for e in p]))
    scale = jnp.where(scale > 0, scale, 1.0)
    return tuple(e / scale for e in p)


def _prefix(combine, identity, elems, *, reverse: bool = False):
    """Inclusive prefix compositions of ``elems`` (a tuple of ``(T, ...)`` arrays) along
    the first axis: Hillis-Steele, ``ceil(log2 T)`` rounds of ``x_j <- combine(x_{j-s},
    x_j)``, ``s = 1, 2, 4, ...``, each round the whole array at once.

    ``O(T log T)`` work in ``log T`` steps of one loop: one small program to compile
    (``lax.associative_scan`` unrolls its levels: 6-13 s to compile a factor, solve and
    selected inverse with their gradients on XLA:CPU, against well under a second).
    ``identity``: the neutral element, a tuple of scalars.
    """
    if reverse:
        flipped = _prefix(combine, identity, tuple(e[::-1] for e in elems))
        return tuple(e[::-1] for e in flipped)
    t = elems[0].shape[0]
    rounds = max(1, (t - 1).bit_length())
    index = jnp.arange(t)

    def one_round(i, x):
        s = 2**i
        keep = index >= s  # x_{j-s} exists; else the neutral element

        def before(e, neutral):
            mask = keep.reshape((t,) + (1,) * (e.ndim - 1))
            return jnp.where(mask, jnp.roll(e, s, axis=0), jnp.asarray(neutral, e.dtype))

        return combine(tuple(map(before, x, identity)), x)

    return lax.fori_loop(0, rounds, one_round, tuple(elems))


def _cholesky_tridiagonal_parallel(ab: Array) -> Array:
    """The pivots ``d_i = a_i - b_{i-1}^2 / d_{i-1}`` as ``P_i[0, 0] / P_i[1, 0]``, ``P_i =
    M_i ... M_0``, ``M_i = [[a_i, -b_{i-1}^2], [1, 0]]``; NaN from a pivot <= 0 on."""
    sub = _zero_padding(ab)[1]
    b2 = _shift(sub * sub, 1)
    one = jnp.ones_like(b2)
    p00, _, p10, _ = _prefix(
        _moebius, (1.0, 0.0, 0.0, 1.0), (ab[0], -b2, one, jnp.zeros_like(one))
    )
    d = p00 / p10
    bad = jnp.cumsum(~(d > 0)) > 0  # a scan over rows would carry the NaN on
    c = jnp.where(bad, jnp.nan, jnp.sqrt(jnp.where(bad, 1.0, d)))
    return jnp.stack([c, sub / c])


def _forward_bidiagonal_parallel(chol: Array, b: Array) -> Array:
    c = chol[0][:, None]
    a = -_shift(chol[1], 1)[:, None] / c
    return _prefix(_affine, (1.0, 0.0), (a, b / c))[1]


def _backward_bidiagonal_parallel(chol: Array, y: Array) -> Array:
    c = chol[0][:, None]
    a = -_zero_padding(chol)[1][:, None] / c
    return _prefix(_affine, (1.0, 0.0), (a, y / c), reverse=True)[1]


def _selected_inverse_tridiagonal_parallel(chol: Array) -> Array:
    chol = _zero_padding(chol)
    c, l = chol
    r = l / c
    var = _prefix(_affine, (1.0, 0.0), (r * r, 1.0 / (c * c)), reverse=True)[1]
    return _zero_padding(jnp.stack([var, -r * _unshift(var, 1)]))


# Wider bands go through blocks: the matrix as block tridiagonal with dense b x b blocks
# (b = max(w, 8) >= w, so a block row couples to the one before it only), each scan
# step a small dense Cholesky, triangular solve or product. T / b steps instead of T:
# per-step overhead, not arithmetic, is what a scan over rows costs on XLA:CPU (at T =
# 400, w = 40 a gradient through the factor, a solve and the selected inverse takes
# half the time and half the compile time of the row scans). The narrow bands keep the
# row recurrences, which are cheaper there (w = 2: 2 ms against 40 ms at T = 10^4).

_BLOCK_MIN_W = 4  # narrowest band factored in blocks
_BLOCK_MIN_SIZE = 8  # smallest block


def _blocked(w: int) -> bool:
    return w >= _BLOCK_MIN_W


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


# --------------------------------------------------------------------------- public


def from_dense(a: ArrayLike, bandwidth: int) -> Array:
    """The lower band form ``(w + 1, T)`` of a dense symmetric matrix (for tests).

    Entries outside the band are dropped, not checked.

    Args:
      a: shape ``(T, T)``.
      bandwidth: ``w >= 0``.

    Returns:
      ``ab`` of shape ``(w + 1, T)`` with ``ab[r, j] = a[j + r, j]``, zero padding.

    Example:
      >>> import jax.numpy as jnp
      >>> a = jnp.array([[4.0, 1.0, 0.0], [1.0, 4.0, 2.0], [0.0, 2.0, 4.0]])
      >>> from_dense(a, 1).tolist()
      [[4.0, 4.0, 4.0], [1.0, 2.0, 0.0]]
    """
    a = _as_float(a)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"from_dense: a must be square (T, T), got {a.shape}.")
    if bandwidth < 0:
        raise ValueError(f"from_dense: bandwidth must be >= 0, got {bandwidth}.")
    t = a.shape[0]
    rows = []
    for r in range(bandwidth + 1):
        sub = jnp.diagonal(a, -r)  # length max(T - r, 0), then padding
        rows.append(jnp.concatenate([sub, jnp.zeros(min(r, t), a.dtype)]))
    return jnp.stack(rows)


def to_dense(ab: ArrayLike, *, symmetric: bool = True) -> Array:
    """The dense ``T x T`` matrix of a lower band form (for tests; ``O(T^2)`` memory).

    Args:
      ab: shape ``(w + 1, T)``.
      symmetric: fill the upper triangle by symmetry (a matrix ``A``); ``False`` gives the
        lower-triangular matrix (a Cholesky factor ``L``).

    Returns:
      shape ``(T, T)``.

    Example:
      >>> import jax.numpy as jnp
      >>> to_dense(jnp.array([[4.0, 4.0, 4.0], [1.0, 2.0, 0.0]])).tolist()
      [[4.0, 1.0, 0.0], [1.0, 4.0, 2.0], [0.0, 2.0, 4.0]]
    """
    ab = _zero_padding(_as_band(ab))
    w1, t = ab.shape
    lower = jnp.zeros((t, t), ab.dtype)
    for r in range(min(w1, t)):
        lower = lower + jnp.diag(ab[r, : t - r], k=-r)
    if not symmetric:
        return lower
    return lower + jnp.tril(lower, -1).T


def cholesky_banded(ab: ArrayLike) -> Array:
    r"""The Cholesky factor ``L`` (``A = L L'``) of a banded SPD matrix, in ``O(T w^2)``.

    Row ``i`` of ``L`` solves a ``w x w`` triangular system with the previous ``w`` rows:
    ``L[i, i-w:i] = L[i-w:i, i-w:i]^{-1} A[i, i-w:i]`` and
    ``L[i, i] = sqrt(A[i, i] - |L[i, i-w:i]|^2)``.

    Args:
      ab: ``A`` in lower band form, shape ``(w + 1, T)``.

    Returns:
      ``L`` in lower band form, shape ``(w + 1, T)``, zero padding. If ``A`` is not
      positive definite it holds NaN at the first negative pivot (from its block's
      first row, for ``w >= 4``) and, for ``w >= 1``, after it (see the module
      docstring and ``is_pd_banded``).

    Example:
      >>> import jax.numpy as jnp
      >>> ab = jnp.array([[4.0, 5.0, 5.0], [2.0, 2.0, 0.0]])   # tridiagonal
      >>> cholesky_banded(ab).tolist()
      [[2.0, 2.0, 2.0], [1.0, 1.0, 0.0]]
    """
    ab = _as_band(ab)
    w = ab.shape[0] - 1
    if w == 0:
        return jnp.sqrt(ab)
    if w == 1:
        if _parallel_tridiagonal():
            return _cholesky_tridiagonal_parallel(ab)
        return _cholesky_tridiagonal(ab)
    if _blocked(w):
        return _cholesky_blocks(ab)
    rows = _to_rows(ab)

    def step(lwin, row):
        off = _forward_window(lwin, row[:w])
        diag = jnp.sqrt(row[w] - jnp.sum(off * off))
        new_row = jnp.concatenate([off, diag[None]])
        # The window moves down one row: L[i-w:i+1, i-w:i+1] without its first row/column.
        upper = jnp.concatenate([lwin, jnp.zeros((w, 1), lwin.dtype)], axis=1)
        lwin = jnp.concatenate([upper, new_row[None]])[1:, 1:]
        return lwin, new_row

    # Rows before the first one see an identity window and zero couplings.
    lwin0 = jnp.eye(w, dtype=ab.dtype)
    _, lrows = lax.scan(step, lwin0, rows)
    return _from_rows(lrows)


def is_pd_banded(chol: ArrayLike) -> Array:
    """Whether a factor from ``cholesky_banded`` is valid (the matrix was PD).

    Works under ``jit`` and ``vmap``; a boolean scalar array.

    Example:
      >>> import jax.numpy as jnp
      >>> bool(is_pd_banded(cholesky_banded(jnp.array([[1.0, 1.0], [2.0, 0.0]]))))
      False
    """
    chol = _as_band(chol, "chol")
    return jnp.all(jnp.isfinite(chol)) & jnp.all(chol[0] > 0)


def logdet_banded(chol: ArrayLike) -> Array:
    """``log |A| = 2 sum_i log L[i, i]`` from the factor.

    Example:
      >>> import jax.numpy as jnp
      >>> ab = jnp.array([[4.0, 5.0, 5.0], [2.0, 2.0, 0.0]])
      >>> round(float(logdet_banded(cholesky_banded(ab))), 6)   # log 64
      4.158883
    """
    chol = _as_band(chol, "chol")
    return 2.0 * jnp.sum(jnp.log(chol[0]))


def _rhs(b: ArrayLike, t: int, dtype) -> tuple[Array, bool]:
    b = jnp.asarray(b, dtype=jnp.result_type(dtype, jnp.asarray(b).dtype))
    if b.ndim not in (1, 2) or b.shape[0] != t:
        raise ValueError(
            f"right-hand side must have shape ({t},) or ({t}, m), got {b.shape}."
        )
    return (b[:, None], True) if b.ndim == 1 else (b, False)


def _forward(chol: Array, b: Array) -> Array:
    """``L^{-1} b`` for ``b`` of shape ``(T, m)``."""
    w = chol.shape[0] - 1
    if w == 0:
        return b / chol[0][:, None]
    if w == 1:
        if _parallel_tridiagonal():
            return _forward_bidiagonal_parallel(chol, b)
        return _forward_bidiagonal(chol, b)
    if _blocked(w):
        return _forward_blocks(chol, b)
    lrows = _to_rows(chol)

    def step(prev, inputs):
        row, bi = inputs
        # prev: the last w solutions, oldest first, shape (w, m).
        yi = (bi - row[:w] @ prev) / row[w]
        return jnp.concatenate([prev, yi[None]])[1:], yi

    prev0 = jnp.zeros((w, b.shape[1]), b.dtype)
    return lax.scan(step, prev0, (lrows, b))[1]


def _backward(chol: Array, y: Array) -> Array:
    """``L'^{-1} y`` for ``y`` of shape ``(T, m)``."""
    w = chol.shape[0] - 1
    if w == 0:
        return y / chol[0][:, None]
    if w == 1:
        if _parallel_tridiagonal():
            return _backward_bidiagonal_parallel(chol, y)
        return _backward_bidiagonal(chol, y)
    if _blocked(w):
        return _backward_blocks(chol, y)
    cols = _zero_padding(chol).T  # cols[i, r] = L[i + r, i]

    def step(nxt, inputs):
        col, yi = inputs
        # nxt: the next w solutions x[i+1], ..., x[i+w], shape (w, m).
        xi = (yi - col[1:] @ nxt) / col[0]
        return jnp.concatenate([xi[None], nxt])[:w], xi

    nxt0 = jnp.zeros((w, y.shape[1]), y.dtype)
    return lax.scan(step, nxt0, (cols, y), reverse=True)[1]


def solve_triangular_banded(
    chol: ArrayLike, b: ArrayLike, *, transpose: bool = False
) -> Array:
    """``L^{-1} b`` (forward substitution) or, with ``transpose``, ``L'^{-1} b`` (back).

    Args:
      chol: ``L`` in lower band form, shape ``(w + 1, T)``.
      b: shape ``(T,)`` or ``(T, m)``.
      transpose: solve with ``L'`` instead of ``L``.

    Returns:
      the solution, shape of ``b``.

    Example:
      >>> import jax.numpy as jnp
      >>> chol = jnp.array([[2.0, 2.0, 2.0], [1.0, 1.0, 0.0]])
      >>> solve_triangular_banded(chol, jnp.array([2.0, 3.0, 3.0])).tolist()
      [1.0, 1.0, 1.0]
    """
    chol = _as_band(chol, "chol")
    b, squeeze = _rhs(b, chol.shape[1], chol.dtype)
    x = _backward(chol, b) if transpose else _forward(chol, b)
    return x[:, 0] if squeeze else x


def solve_banded(chol: ArrayLike, b: ArrayLike) -> Array:
    """``A^{-1} b`` from the factor ``A = L L'``: forward then back substitution.

    Args:
      chol: ``L`` from ``cholesky_banded``, shape ``(w + 1, T)``.
      b: shape ``(T,)`` or ``(T, m)``.

    Returns:
      ``x`` with ``A x = b``, shape of ``b``.

    Example:
      >>> import jax.numpy as jnp
      >>> ab = jnp.array([[4.0, 5.0, 5.0], [2.0, 2.0, 0.0]])
      >>> solve_banded(cholesky_banded(ab), jnp.array([6.0, 9.0, 7.0])).tolist()
      [1.0, 1.0, 1.0]
    """
    chol = _as_band(chol, "chol")
    b, squeeze = _rhs(b, chol.shape[1], chol.dtype)
    x = _backward(chol, _forward(chol, b))
    return x[:, 0] if squeeze else x


def matvec_banded(ab: ArrayLike, x: ArrayLike) -> Array:
    """``A x`` for a symmetric ``A`` in lower band form, without a scan.

    Args:
      ab: shape ``(w + 1, T)``.
      x: shape ``(T,)`` or ``(T, m)``.

    Returns:
      ``A x``, shape of ``x``.

    Example:
      >>> import jax.numpy as jnp
      >>> ab = jnp.array([[4.0, 5.0, 5.0], [2.0, 2.0, 0.0]])
      >>> matvec_banded(ab, jnp.ones(3)).tolist()
      [6.0, 9.0, 7.0]
    """
    ab = _zero_padding(_as_band(ab))
    x, squeeze = _rhs(x, ab.shape[1], ab.dtype)
    y = ab[0][:, None] * x
    for r in range(1, ab.shape[0]):
        band = ab[r][:, None]
        y = y + _shift(band * x, r)  # A[i, i - r] x[i - r]
        y = y + band * _unshift(x, r)  # A[i, i + r] x[i + r]
    return y[:, 0] if squeeze else y


def selected_inverse_banded(chol: ArrayLike) -> Array:
    r"""The band of ``Sigma = A^{-1}``: marginal variances and neighbour covariances.

    The Takahashi recursion (Takahashi, Fagan & Chen 1973; Rue & Held 2005, ch. 2), from ``i = T - 1`` down to 0,
    with ``l = L[i+1:i+w+1, i] / L[i, i]`` and ``S = Sigma[i+1:i+w+1, i+1:i+w+1]``
    (already known):

    ``Sigma[i+1:i+w+1, i] = -S l``,   ``Sigma[i, i] = 1 / L[i, i]^2 + l' S l``.

    ``O(T w^2)`` time; only the entries of ``Sigma`` on the band are formed.

    Args:
      chol: ``L`` from ``cholesky_banded``, shape ``(w + 1, T)``.

    Returns:
      ``Sigma`` on the band, in lower band form ``(w + 1, T)``:
      ``out[r, j] = Sigma[j + r, j]``; ``out[0]`` are the marginal variances.

    Example:
      >>> import jax.numpy as jnp
      >>> ab = jnp.array([[2.0, 2.0], [1.0, 0.0]])   # [[2, 1], [1, 2]]
      >>> (3 * selected_inverse_banded(cholesky_banded(ab))).round(12).tolist()
      [[2.0, 2.0], [-1.0, 0.0]]
    """
    chol = _as_band(chol, "chol")
    w = chol.shape[0] - 1
    if w == 0:
        return 1.0 / chol**2
    if w == 1:
        if _parallel_tridiagonal():
            return _selected_inverse_tridiagonal_parallel(chol)
        return _selected_inverse_tridiagonal(chol)
    if _blocked(w):
        return _selected_inverse_blocks(chol)
    cols = _zero_padding(chol).T

    def step(s, col):
        l = col[1:] / col[0]
        cov = -(s @ l)
        var = 1.0 / col[0] ** 2 - jnp.dot(l, cov)
        out = jnp.concatenate([var[None], cov])
        # The window for row i - 1 is Sigma[i:i+w, i:i+w], the top left of this one.
        full = jnp.concatenate([out[None], jnp.concatenate([cov[:, None], s], axis=1)])
        return full[:w, :w], out

    s0 = jnp.zeros((w, w), chol.dtype)
    return _zero_padding(lax.scan(step, s0, cols, reverse=True)[1].T)


def sample_banded(
    key: Array,
    chol: ArrayLike,
    mean: ArrayLike | None = None,
    sample_shape: tuple[int, ...] = (),
) -> Array:
    """Draws from ``N(mean, A^{-1})`` given ``L`` (``A = L L'``): ``mean + L'^{-1} z``.

    Args:
      key: a JAX PRNG key.
      chol: ``L`` from ``cholesky_banded``, shape ``(w + 1, T)``.
      mean: shape ``(T,)``; zero if ``None``.
      sample_shape: leading shape of the draws.

    Returns:
      shape ``sample_shape + (T,)``, dtype of ``chol``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> chol = cholesky_banded(jnp.array([[4.0, 5.0, 5.0], [2.0, 2.0, 0.0]]))
      >>> sample_banded(jax.random.key(0), chol, jnp.zeros(3), (10,)).shape
      (10, 3)
    """
    chol = _as_band(chol, "chol")
    t = chol.shape[1]
    n = 1
    for d in sample_shape:
        n *= d
    z = jax.random.normal(key, (t, n), chol.dtype)
    x = _backward(chol, z).T.reshape(*sample_shape, t)
    if mean is not None:
        x = x + jnp.asarray(mean, chol.dtype)
    return x
