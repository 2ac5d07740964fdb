"""Bandwidth 1 (AR(1) and random-walk precisions, the common case): the factor, the
solves and the selected inverse as scalar recurrences.

The generic window code of :mod:`jaxvb.linalg.banded` carries ``(w, w)`` arrays through
concatenations, which costs several times more per row, and far more when vmapped over
draws; here each row is a few scalar operations.

Two ways to run them. **Sequential** (the default on the CPU): one ``lax.scan`` over the
``T`` rows. **Parallel** (the default elsewhere): on an accelerator a scan over rows is
a chain of ``T`` small kernels whatever their work (``benchmarks/results/gpu.json``), so
``w = 1`` goes through log-depth prefix compositions instead: ``log2(T)`` levels of
``O(T)`` elementwise work, the same arithmetic in another order. The pivots ``d_i = a_i -
b_{i-1}^2 / d_{i-1}`` are a continued fraction, the ratio of a product of ``2 x 2``
matrices (rescaled as they are multiplied: the ratio does not see the scale); the solves
and the selected inverse are affine recurrences. ``JAXVB_TRIDIAGONAL=parallel|sequential``
forces one (read when a function is traced); "auto" picks by the default backend.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax import lax

from jaxvb.linalg._band_form import _shift, _unshift, _zero_padding

Array = jax.Array


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
    (``lax.associative_scan`` unrolls its levels, and a factor, a solve and a selected
    inverse with their gradients then take many times longer to compile).
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
