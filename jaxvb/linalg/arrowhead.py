r"""Arrowhead SPD matrices ``[[A, B], [B', C]]`` with ``A`` banded, in ``O(T (w^2 + k^2))``.

The precision of a state-space posterior with a few global parameters coupled to every
time step -- in the paper's stochastic-volatility model (sec. 6.1) ``T`` log-volatilities
with a tridiagonal AR(1) prior plus Gaussian sites, and ``log beta`` in every
likelihood term -- is

    ``P = [[A, B], [B', C]]``,  ``A``: ``T x T`` banded (bandwidth ``w``),
    ``B``: ``T x k`` dense,  ``C``: ``k x k`` dense,  ``k`` small.

The dense variables go *last*: then the Cholesky factor has no fill-in,

    ``L = [[L_A, 0], [W', L_S]]``,  ``L_A L_A' = A``,  ``W = L_A^{-1} B``,
    ``L_S L_S' = S = C - B' A^{-1} B`` (the Schur complement),

so every operation is one or two banded scans (``jaxvb.linalg.banded``) plus ``k x k``
dense algebra. Vectors are laid out the same way: ``x = (x_A, x_C)`` of length ``T + k``.
(The paper orders ``f = (log beta, v)``; permute to ``(v, log beta)`` first.)

Not positive definite: as for ``cholesky_banded``, the factor then holds NaN (in
``band`` if ``A`` is not PD, in ``corner`` if only ``S`` is not) and
``is_pd_arrowhead`` says so.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from jaxvb.linalg import _small as small
from jaxvb.linalg._band_form import (
    _as_band,
    _as_float,
    _rhs,
    _shift,
    _unshift,
    _zero_padding,
)
from jaxvb.linalg._tridiagonal import _parallel_tridiagonal
from jaxvb.linalg.banded import (
    _backward,
    _forward,
    cholesky_banded,
    from_dense,
    is_pd_banded,
    logdet_banded,
    matvec_banded,
    selected_inverse_banded,
    to_dense,
)

Array = jax.Array

__all__ = [
    "Arrowhead",
    "ArrowheadCholesky",
    "cholesky_arrowhead",
    "cholesky_forward_arrowhead",
    "from_dense_arrowhead",
    "is_pd_arrowhead",
    "logdet_arrowhead",
    "matvec_arrowhead",
    "matvec_triangular_arrowhead",
    "sample_arrowhead",
    "selected_inverse_arrowhead",
    "solve_arrowhead",
    "to_dense_arrowhead",
]


class Arrowhead(NamedTuple):
    """A symmetric arrowhead matrix ``[[A, B], [B', C]]`` (a pytree).

    Also what ``selected_inverse_arrowhead`` returns: the blocks of the inverse on the
    same pattern. Functions taking one cast ``border`` and ``corner`` to ``band``'s dtype.

    Attributes:
      band: ``A`` in lower band form (``jaxvb.linalg.banded``), shape ``(w + 1, T)``.
      border: ``B``, shape ``(T, k)``.
      corner: ``C``, shape ``(k, k)``, symmetric.

    Example:
      ``T = 3`` with a tridiagonal ``A`` (bandwidth 1) and one border column ``k = 1``:

      >>> import jax.numpy as jnp
      >>> from jaxvb.linalg import Arrowhead, to_dense_arrowhead
      >>> p = Arrowhead(band=jnp.array([[2.0, 2.0, 2.0], [-1.0, -1.0, 0.0]]),
      ...               border=jnp.ones((3, 1)), corner=jnp.array([[4.0]]))
      >>> to_dense_arrowhead(p).tolist()
      [[2.0, -1.0, 0.0, 1.0], [-1.0, 2.0, -1.0, 1.0], [0.0, -1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 4.0]]
    """

    band: Array
    border: Array
    corner: Array


class ArrowheadCholesky(NamedTuple):
    """The Cholesky factor ``L = [[L_A, 0], [W', L_S]]`` of an arrowhead (a pytree).

    Attributes:
      band: ``L_A`` (``A = L_A L_A'``) in lower band form, shape ``(w + 1, T)``.
      border: ``W = L_A^{-1} B``, shape ``(T, k)``; ``W'`` is the factor's bottom-left block.
      corner: ``L_S``, lower triangular, shape ``(k, k)``, with
        ``L_S L_S' = C - B' A^{-1} B``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.linalg import Arrowhead, cholesky_arrowhead
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> factor = cholesky_arrowhead(p)   # an ArrowheadCholesky
      >>> factor.band.tolist(), factor.border.tolist(), factor.corner.tolist()
      ([[2.0, 2.0]], [[1.0], [1.0]], [[1.0]])
    """

    band: Array
    border: Array
    corner: Array


def _check(band: Array, border: Array, corner: Array) -> tuple[int, int]:
    t = band.shape[1]
    if border.ndim != 2 or border.shape[0] != t:
        raise ValueError(
            f"border must have shape ({t}, k) to match band, got {border.shape}."
        )
    k = border.shape[1]
    if corner.shape != (k, k):
        raise ValueError(
            f"corner must have shape ({k}, {k}) to match border, got {corner.shape}."
        )
    return t, k


def _as_arrowhead(p, cls):
    band, border, corner = p
    band = _as_band(band, "band")
    dtype = band.dtype
    border = jnp.asarray(_as_float(border), dtype)
    corner = jnp.asarray(_as_float(corner), dtype)
    _check(band, border, corner)
    return cls(band, border, corner)


def from_dense_arrowhead(a: ArrayLike, bandwidth: int, k: int) -> Arrowhead:
    """The ``Arrowhead`` of a dense ``(T + k) x (T + k)`` matrix (for tests).

    Entries of the ``A`` block outside the band are dropped, not checked.

    Example:
      >>> import jax.numpy as jnp
      >>> p = from_dense_arrowhead(jnp.array([[2.0, 0.0, 1.0],
      ...                                     [0.0, 2.0, 1.0],
      ...                                     [1.0, 1.0, 3.0]]), bandwidth=0, k=1)
      >>> p.band.tolist(), p.border.tolist(), p.corner.tolist()
      ([[2.0, 2.0]], [[1.0], [1.0]], [[3.0]])
    """
    a = _as_float(a)
    n = a.shape[0] if a.ndim == 2 and a.shape[0] == a.shape[1] else -1
    if not 0 < k < n:
        raise ValueError(
            f"from_dense_arrowhead: a must be square (T + k, T + k) with 0 < k < T + k, "
            f"got shape {a.shape} and k = {k}."
        )
    t = n - k
    return Arrowhead(from_dense(a[:t, :t], bandwidth), a[:t, t:], a[t:, t:])


def to_dense_arrowhead(p: Arrowhead) -> Array:
    """The dense ``(T + k) x (T + k)`` matrix of an ``Arrowhead`` (for tests).

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[2.0, 2.0]]), jnp.ones((2, 1)), jnp.array([[3.0]]))
      >>> to_dense_arrowhead(p).tolist()
      [[2.0, 0.0, 1.0], [0.0, 2.0, 1.0], [1.0, 1.0, 3.0]]
    """
    band, border, corner = _as_arrowhead(p, Arrowhead)
    top = jnp.concatenate([to_dense(band), border], axis=1)
    return jnp.concatenate([top, jnp.concatenate([border.T, corner], axis=1)])


def cholesky_arrowhead(p: Arrowhead) -> ArrowheadCholesky:
    r"""The Cholesky factor of ``P = [[A, B], [B', C]]`` via the Schur complement.

    ``L_A = chol(A)`` (banded scan), ``W = L_A^{-1} B`` (one forward scan with ``k``
    right-hand sides), ``L_S = chol(C - W'W)``; ``O(T (w^2 + w k + k^2) + k^3)``.

    Args:
      p: an ``Arrowhead`` (or a ``(band, border, corner)`` tuple).

    Returns:
      an ``ArrowheadCholesky``; NaN where ``P`` is not positive definite
      (``is_pd_arrowhead``).

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> f = cholesky_arrowhead(p)
      >>> f.band.tolist(), f.border.tolist(), f.corner.tolist()
      ([[2.0, 2.0]], [[1.0], [1.0]], [[1.0]])
    """
    band, border, corner = _as_arrowhead(p, Arrowhead)
    chol_a = cholesky_banded(band)
    w = _forward(chol_a, border)
    schur = corner - w.T @ w
    return ArrowheadCholesky(chol_a, w, small.cholesky(schur))


def is_pd_arrowhead(factor: ArrowheadCholesky) -> Array:
    """Whether a factor from ``cholesky_arrowhead`` is valid (the matrix was PD).

    A boolean scalar array; works under ``jit`` and ``vmap``.

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[1.0, 1.0]]), jnp.ones((2, 1)), jnp.array([[1.0]]))
      >>> bool(is_pd_arrowhead(cholesky_arrowhead(p)))   # C - B'A^{-1}B = -1
      False
    """
    band, border, corner = _as_arrowhead(factor, ArrowheadCholesky)
    return (
        is_pd_banded(band)
        & jnp.all(jnp.isfinite(border))
        & jnp.all(jnp.isfinite(corner))
        & jnp.all(jnp.diagonal(corner) > 0)
    )


def logdet_arrowhead(factor: ArrowheadCholesky) -> Array:
    """``log |P| = log |A| + log |C - B' A^{-1} B|`` from the factor.

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> round(float(logdet_arrowhead(cholesky_arrowhead(p))), 6)   # log 16
      2.772589
    """
    band, border, corner = _as_arrowhead(factor, ArrowheadCholesky)
    return logdet_banded(band) + 2.0 * jnp.sum(jnp.log(jnp.diagonal(corner)))


def _split(factor: ArrowheadCholesky, b: ArrayLike):
    band, border, corner = _as_arrowhead(factor, ArrowheadCholesky)
    t, k = _check(band, border, corner)
    b, squeeze = _rhs(b, t + k, band.dtype)
    return (band, border, corner), b[:t], b[t:], squeeze


def _tri_inv(corner: Array) -> Array:
    """``L_S^{-1}`` (``k x k``), to be applied as a matmul.

    With ``k`` small, one ``k x k`` inverse and a matmul beat a triangular solve with
    ``T`` (or one per draw) right-hand sides, by more the larger ``T`` is.
    """
    return small.inv_lower(corner)


def _forward_substitute(factor, b1: Array, b2: Array) -> tuple[Array, Array]:
    """``L^{-1} b`` with ``L = [[L_A, 0], [W', L_S]]``, as its two blocks ``(T, m), (k, m)``."""
    band, border, corner = factor
    y1 = _forward(band, b1)
    return y1, _tri_inv(corner) @ (b2 - border.T @ y1)


def _back_substitute(factor, z1: Array, z2: Array) -> Array:
    """``L'^{-1} z`` with ``L' = [[L_A', W], [0, L_S']]``, ``z = (z1, z2)`` as ``(n, m)``."""
    band, border, corner = factor
    x2 = _tri_inv(corner).T @ z2
    x1 = _backward(band, z1 - border @ x2)
    return jnp.concatenate([x1, x2])


def solve_arrowhead(factor: ArrowheadCholesky, b: ArrayLike) -> Array:
    """``P^{-1} b`` from the factor: one forward and one back substitution.

    Args:
      factor: from ``cholesky_arrowhead``.
      b: shape ``(T + k,)`` or ``(T + k, m)``, the banded part first.

    Returns:
      ``x`` with ``P x = b``, shape of ``b``.

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> solve_arrowhead(cholesky_arrowhead(p), jnp.array([6.0, 6.0, 7.0])).tolist()
      [1.0, 1.0, 1.0]
    """
    factor, b1, b2, squeeze = _split(factor, b)
    y1, y2 = _forward_substitute(factor, b1, b2)
    x = _back_substitute(factor, y1, y2)
    return x[:, 0] if squeeze else x


def solve_triangular_arrowhead(
    factor: ArrowheadCholesky, b: ArrayLike, *, transpose: bool = False
) -> Array:
    """``L^{-1} b``, or ``L'^{-1} b`` with ``transpose``, for the factor ``P = L L'``.

    Draws of ``N(P^{-1} h, P^{-1})`` are ``L'^{-1} (L^{-1} h + z)``: one forward and one
    back substitution give the mean and the noise together.

    Args:
      factor: from ``cholesky_arrowhead``.
      b: shape ``(T + k,)`` or ``(T + k, m)``.
      transpose: solve with ``L'`` instead of ``L``.

    Returns:
      the solution, shape of ``b``.

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> f = cholesky_arrowhead(p)
      >>> y = solve_triangular_arrowhead(f, jnp.array([6.0, 6.0, 7.0]))
      >>> solve_triangular_arrowhead(f, y, transpose=True).tolist()
      [1.0, 1.0, 1.0]
    """
    factor, b1, b2, squeeze = _split(factor, b)
    if transpose:
        x = _back_substitute(factor, b1, b2)
    else:
        x = jnp.concatenate(_forward_substitute(factor, b1, b2))
    return x[:, 0] if squeeze else x


def matvec_arrowhead(p: Arrowhead, x: ArrayLike) -> Array:
    """``P x = (A x_A + B x_C, B' x_A + C x_C)``.

    Args:
      p: an ``Arrowhead``.
      x: shape ``(T + k,)`` or ``(T + k, m)``.

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> matvec_arrowhead(p, jnp.ones(3)).tolist()
      [6.0, 6.0, 7.0]
    """
    band, border, corner = _as_arrowhead(p, Arrowhead)
    t, k = _check(band, border, corner)
    x, squeeze = _rhs(x, t + k, band.dtype)
    x1, x2 = x[:t], x[t:]
    y = jnp.concatenate(
        [matvec_banded(band, x1) + border @ x2, border.T @ x1 + corner @ x2]
    )
    return y[:, 0] if squeeze else y


def selected_inverse_arrowhead(factor: ArrowheadCholesky) -> Arrowhead:
    r"""The blocks of ``Sigma = P^{-1}`` on the arrowhead pattern.

    With ``U = A^{-1} B = L_A'^{-1} W`` and ``S = L_S L_S'``, block inversion gives

    ``Sigma_CC = S^{-1}``,  ``Sigma_AC = -U S^{-1}``,
    ``Sigma_AA = A^{-1} + U S^{-1} U'``,

    of which only the band of ``Sigma_AA`` is formed: the band of ``A^{-1}`` by the
    Takahashi recursion (``selected_inverse_banded``) plus ``V[i] . V[j]`` for
    ``V = U L_S'^{-1}``. ``O(T (w^2 + w k + k^2))``.

    Args:
      factor: from ``cholesky_arrowhead``.

    Returns:
      an ``Arrowhead`` of ``Sigma``'s blocks: ``band`` the band of ``Sigma_AA`` (lower
      band form, ``band[0]`` the marginal variances of ``x_A``), ``border`` the full
      ``Sigma_AC`` (``T x k``), ``corner`` the full ``Sigma_CC`` (``k x k``).

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> s = selected_inverse_arrowhead(cholesky_arrowhead(p))
      >>> s.band.tolist(), s.border.tolist(), s.corner.tolist()
      ([[0.5, 0.5]], [[-0.5], [-0.5]], [[1.0]])
    """
    band, border, corner = _as_arrowhead(factor, ArrowheadCholesky)
    w = band.shape[0] - 1
    u = _backward(band, border)
    inv = _tri_inv(corner)
    v = u @ inv.T
    cross = -(v @ inv)
    corner_inv = inv.T @ inv
    low_rank = jnp.stack([jnp.sum(_unshift(v, r) * v, axis=1) for r in range(w + 1)])
    band_inv = selected_inverse_banded(band) + _zero_padding(low_rank)
    return Arrowhead(band_inv, cross, corner_inv)


def sample_arrowhead(
    key: jax.Array,
    factor: ArrowheadCholesky,
    mean: ArrayLike | None = None,
    sample_shape: tuple[int, ...] = (),
) -> Array:
    """Draws from ``N(mean, P^{-1})`` given the factor: ``mean + L'^{-1} z``.

    Args:
      key: a JAX PRNG key.
      factor: from ``cholesky_arrowhead``.
      mean: shape ``(T + k,)``; zero if ``None``.
      sample_shape: leading shape of the draws.

    Returns:
      shape ``sample_shape + (T + k,)``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> sample_arrowhead(jax.random.key(0), cholesky_arrowhead(p), None, (5,)).shape
      (5, 3)
    """
    factor = _as_arrowhead(factor, ArrowheadCholesky)
    band, border, corner = factor
    t, k = _check(band, border, corner)
    n = 1
    for d in sample_shape:
        n *= d
    z = jax.random.normal(key, (t + k, n), band.dtype)
    x = _back_substitute(factor, z[:t], z[t:]).T.reshape(*sample_shape, t + k)
    if mean is not None:
        x = x + jnp.asarray(mean, band.dtype)
    return x


def cholesky_forward_arrowhead(
    p: Arrowhead, h: ArrayLike
) -> tuple[ArrowheadCholesky, Array]:
    r"""The factor ``L`` of ``P = L L'`` and ``L^{-1} h``, for bandwidth 1 in one scan.

    What a Gaussian ``N(P^{-1} h, P^{-1})`` needs for its density and its draws:
    ``log N(f) = log|L| - |L'f - L^{-1}h|^2 / 2 - n log(2 pi) / 2`` (with
    ``matvec_triangular_arrowhead``, no second scan) and ``f = L'^{-1}(L^{-1}h + z)``.
    The same as ``cholesky_arrowhead(p)`` and ``solve_triangular_arrowhead(factor, h)``;
    for bandwidth 1 the factorisation and both forward substitutions (of the border and
    of ``h``) share one scan over ``T``: inside an iteration a scan's per-row overhead,
    not its arithmetic, is the cost.

    Args:
      p: an ``Arrowhead`` precision.
      h: shape ``(T + k,)``.

    Returns:
      ``(factor, y)``: an ``ArrowheadCholesky`` and ``y = L^{-1} h``, shape ``(T + k,)``.

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0], [1.0, 0.0]]),
      ...               jnp.array([[2.0], [2.0]]), jnp.array([[3.0]]))
      >>> factor, y = cholesky_forward_arrowhead(p, jnp.array([7.0, 7.0, 7.0]))
      >>> solve_triangular_arrowhead(factor, y, transpose=True).round(6).tolist()
      [1.0, 1.0, 1.0]
    """
    band, border, corner = _as_arrowhead(p, Arrowhead)
    t, k = _check(band, border, corner)
    h = jnp.asarray(h, band.dtype)
    if h.shape != (t + k,):
        raise ValueError(f"h must have shape ({t + k},) to match p, got {h.shape}.")
    if band.shape[0] != 2 or _parallel_tridiagonal():  # no fused row scans there
        factor = cholesky_arrowhead(p)
        return factor, solve_triangular_arrowhead(factor, h)
    c, l, w, y1 = _forward_tridiagonal(band, border, h[:t])
    chol_s = small.cholesky(corner - w.T @ w)
    y2 = _tri_inv(chol_s) @ (h[t:] - w.T @ y1)
    factor = ArrowheadCholesky(_zero_padding(jnp.stack([c, l])), w, chol_s)
    return factor, jnp.concatenate([y1, y2])


def _forward_tridiagonal(band: Array, border: Array, h1: Array):
    """One scan: ``L_A`` (diagonal ``c``, subdiagonal ``l``), ``L_A^{-1} B``, ``L_A^{-1} h1``."""
    sub = _zero_padding(band)[1]
    k = border.shape[1]

    def forward(carry, inputs):
        l_prev, z_prev = carry
        a, b, rhs = inputs
        c = jnp.sqrt(a - l_prev * l_prev)
        z = (rhs - l_prev * z_prev) / c
        l_i = b / c
        return (l_i, z), (c, l_i, z)

    rhs = jnp.concatenate([border, h1[:, None]], axis=1)
    init = (jnp.zeros((), band.dtype), jnp.zeros((k + 1,), band.dtype))
    _, (c, l, z) = jax.lax.scan(forward, init, (band[0], sub, rhs))
    return c, l, z[:, :k], z[:, k]


def matvec_triangular_arrowhead(
    factor: ArrowheadCholesky, x: ArrayLike, *, transpose: bool = False
) -> Array:
    """``L x``, or ``L' x`` with ``transpose``, for the factor ``P = L L'``; no scan.

    Args:
      factor: from ``cholesky_arrowhead`` or ``cholesky_forward_arrowhead``.
      x: shape ``(T + k,)`` or ``(T + k, m)``.
      transpose: multiply by ``L'`` instead of ``L``.

    Returns:
      the product, shape of ``x``.

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0]]), jnp.array([[2.0], [2.0]]),
      ...               jnp.array([[3.0]]))
      >>> f = cholesky_arrowhead(p)   # L = [[2, 0, 0], [0, 2, 0], [1, 1, 1]]
      >>> matvec_triangular_arrowhead(f, jnp.ones(3)).tolist()
      [2.0, 2.0, 3.0]
      >>> matvec_triangular_arrowhead(f, jnp.ones(3), transpose=True).tolist()
      [3.0, 3.0, 1.0]
    """
    (band, border, corner), x1, x2, squeeze = _split(factor, x)
    band = _zero_padding(band)
    y1 = band[0][:, None] * x1
    if transpose:  # L' = [[L_A', W], [0, L_S']]
        for r in range(1, band.shape[0]):
            y1 = y1 + band[r][:, None] * _unshift(x1, r)  # L_A[i + r, i] x[i + r]
        y = jnp.concatenate([y1 + border @ x2, corner.T @ x2])
    else:  # L = [[L_A, 0], [W', L_S]]
        for r in range(1, band.shape[0]):
            y1 = y1 + _shift(band[r][:, None] * x1, r)  # L_A[i, i - r] x[i - r]
        y = jnp.concatenate([y1, border.T @ x1 + corner @ x2])
    return y[:, 0] if squeeze else y


def gaussian_arrowhead(
    p: Arrowhead, shift: ArrayLike
) -> tuple[ArrowheadCholesky, Array, Arrowhead]:
    r"""Everything about ``N(P^{-1} h, P^{-1})``: the factor, the mean and the selected inverse.

    The same as ``cholesky_arrowhead(p)``, ``solve_arrowhead(factor, h)`` and
    ``selected_inverse_arrowhead(factor)``, but for bandwidth 1 (AR(1) and random-walk
    precisions) in two scans over ``T`` instead of six: the factorisation runs with the
    forward substitutions of the border and of ``h``, and the back substitutions run
    with the Takahashi recursion. Inside an iteration the scans' per-row overhead, not
    their arithmetic, is the cost, so fewer scans are what saves time there.

    Args:
      p: an ``Arrowhead`` precision.
      shift: ``h``, shape ``(T + k,)``.

    Returns:
      ``(factor, mean, cov)``: an ``ArrowheadCholesky``, the mean ``(T + k,)`` and the
      selected inverse as an ``Arrowhead``.

    Example:
      >>> import jax.numpy as jnp
      >>> p = Arrowhead(jnp.array([[4.0, 4.0], [1.0, 0.0]]),
      ...               jnp.array([[2.0], [2.0]]), jnp.array([[3.0]]))
      >>> factor, mean, cov = gaussian_arrowhead(p, jnp.array([7.0, 7.0, 7.0]))
      >>> mean.round(6).tolist()
      [1.0, 1.0, 1.0]
    """
    band, border, corner = _as_arrowhead(p, Arrowhead)
    t, k = _check(band, border, corner)
    h = jnp.asarray(shift, band.dtype)
    if band.shape[0] != 2 or _parallel_tridiagonal():  # no fused row scans there
        factor = cholesky_arrowhead(p)
        return factor, solve_arrowhead(factor, h), selected_inverse_arrowhead(factor)
    c, l, w, y1 = _forward_tridiagonal(band, border, h[:t])
    chol_s = small.cholesky(corner - w.T @ w)
    inv = _tri_inv(chol_s)
    y2 = inv @ (h[t:] - w.T @ y1)
    x2 = inv.T @ y2

    def backward(carry, inputs):
        x_next, s_next = carry
        c_i, l_i, rhs_i = inputs
        x = (rhs_i - l_i * x_next) / c_i
        r = l_i / c_i
        cov = -r * s_next
        var = 1.0 / (c_i * c_i) - r * cov
        return (x, var), (x, var, cov)

    rhs = jnp.concatenate([(y1 - w @ x2)[:, None], w], axis=1)
    init = (jnp.zeros((k + 1,), band.dtype), jnp.zeros((), band.dtype))
    _, (x, var, cov) = jax.lax.scan(backward, init, (c, l, rhs), reverse=True)
    x1, u = x[:, 0], x[:, 1:]
    v = u @ inv.T
    low_rank = jnp.stack([jnp.sum(v * v, axis=1), jnp.sum(_unshift(v, 1) * v, axis=1)])
    band_inv = _zero_padding(jnp.stack([var, cov]) + low_rank)
    factor = ArrowheadCholesky(_zero_padding(jnp.stack([c, l])), w, chol_s)
    sigma = Arrowhead(band_inv, -(v @ inv), inv.T @ inv)
    return factor, jnp.concatenate([x1, x2]), sigma
