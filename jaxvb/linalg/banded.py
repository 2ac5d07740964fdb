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
over the ``T`` rows carrying a ``w x w`` window for ``w < 4`` (here; scalar recurrences
for ``w = 1``, in :mod:`jaxvb.linalg._tridiagonal`), over blocks of ``b = max(w, 8)``
rows with dense ``b x b`` blocks for wider bands (:mod:`jaxvb.linalg._blocks`: ``T / b``
steps, since a scan's per-step cost, not its arithmetic, is what a row recurrence
spends on XLA:CPU). On an accelerator, where every scan step is a kernel launch, ``w =
1`` runs as log-depth prefix compositions instead (``log2 T`` rounds over the whole
array, ``O(T log T)`` work; the same results to rounding):
``JAXVB_TRIDIAGONAL=parallel|sequential`` picks one by hand, "auto" (the default) by
the backend when a function is traced. Time is
``O(T w^2)`` either way and memory ``O(T w)`` (``O(T w^2)`` for reverse-mode gradients);
nothing ``T x T`` is formed (except by ``to_dense``, which is for tests). All functions
work under ``jit``, ``vmap`` and ``grad`` and keep the input's floating dtype; ``T`` and
``w`` are read off the shapes.

**Not positive definite.** ``cholesky_banded`` does not raise (it cannot, under ``jit``).
A negative pivot ``A[i, i] - sum_k L[i, k]^2`` puts NaN on the diagonal of row ``i`` (of
every row of its block, for ``w >= 4``) and, for ``w >= 1``, in every later row (each row
is solved against the ones before it); a zero pivot gives a zero diagonal and inf or NaN
after it (NaN from its block on, for ``w >= 4``; NaN from it on, for ``w = 1`` by prefix
compositions). Either way ``logdet_banded`` is NaN or -inf, never a plausible number,
and ``is_pd_banded(chol)`` turns it into a boolean for callers to flag.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike

from jaxvb.linalg._band_form import (
    _as_band,
    _as_float,
    _from_rows,
    _rhs,
    _shift,
    _to_rows,
    _unshift,
    _zero_padding,
)
from jaxvb.linalg._blocks import (
    _backward_blocks,
    _cholesky_blocks,
    _forward_blocks,
    _selected_inverse_blocks,
)
from jaxvb.linalg._tridiagonal import (
    _backward_bidiagonal,
    _backward_bidiagonal_parallel,
    _cholesky_tridiagonal,
    _cholesky_tridiagonal_parallel,
    _forward_bidiagonal,
    _forward_bidiagonal_parallel,
    _parallel_tridiagonal,
    _selected_inverse_tridiagonal,
    _selected_inverse_tridiagonal_parallel,
)

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


_BLOCK_MIN_W = 4  # narrowest band factored in blocks (jaxvb.linalg._blocks)


def _blocked(w: int) -> bool:
    """Whether a band of width ``w`` goes by blocks: the narrow bands keep the row
    recurrences, which are cheaper there: a scalar step costs less than a small block's."""
    return w >= _BLOCK_MIN_W


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
