"""Gaussian(mean, cov): a multivariate normal with a dense covariance."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from jaxvb import _random
from jaxvb._algebra import precision_factor, solve_precision  # noqa: F401  (re-exported)
from jaxvb.families._base import (
    Array,
    ExponentialFamily,
    as_float_arrays,
    build,
    is_concrete,
    register_family,
)


def _triu(d: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(d)


def _coef(d: int, dtype) -> Array:
    """-1/2 for the squares x_i^2 and -1 for the products x_i x_j (i < j), in ``dtype``."""
    i, j = _triu(d)
    return jnp.asarray(np.where(i == j, -0.5, -1.0), dtype)


def _unpack_precision(eta2: Array, d: int) -> Array:
    """The symmetric precision P from its upper triangle (row-major order)."""
    i, j = _triu(d)
    upper = jnp.zeros((d, d), eta2.dtype).at[i, j].set(eta2)
    return upper + jnp.triu(upper, 1).T


def _factor_from_cov(cov: Array) -> Array:
    """``U = chol(cov)^{-T}``: a Cholesky and a triangular inverse (batched)."""
    chol = jnp.linalg.cholesky(cov)
    eye = jnp.broadcast_to(jnp.eye(cov.shape[-1], dtype=cov.dtype), cov.shape)
    return jnp.swapaxes(solve_triangular(chol, eye, lower=True), -1, -2)


def _check_symmetric(name: str, value: Array) -> None:
    v = np.asarray(value)
    if not np.all(np.isfinite(v)) or not np.allclose(v, v.T, rtol=1e-6, atol=0):
        raise ValueError(f"Gaussian: {name} must be finite and symmetric.")


@register_family
class Gaussian(ExponentialFamily):
    r"""Multivariate normal ``N(mean, cov)`` with a dense covariance.

    Natural parameters are ``(P m, P)`` with precision ``P = cov^{-1}``. To keep the
    regression of the paper non-singular the statistics are minimal: with ``d`` the
    dimension,

    ``T(x) = (x, -x_i^2 / 2 for i, -x_i x_j for i < j)``,
    ``eta = (P m, P_ii, P_ij for i < j)``,

    so ``T(x) . eta = x' P m - x' P x / 2`` and ``k = d + d (d + 1) / 2``;
    ``U(eta) = m' P m / 2 - log|P| / 2 + d log(2 pi) / 2``.

    It is stored as ``mean`` and the upper-triangular factor ``U`` of the precision,
    ``P = U U'`` (:func:`precision_factor`), the form in which the methods produce it:
    a draw ``m + U^{-T} z``, ``log_prob`` and the entropy cost ``O(d^2)`` from it, with
    no further factorisation. ``cov``, ``precision`` and ``variance`` are computed when
    asked for (``O(d^3)``, once per access).

    Args:
      mean: shape ``(d,)``.
      cov: shape ``(d, d)``, symmetric positive definite.

    Example:
      >>> import jax.numpy as jnp
      >>> q = Gaussian(mean=jnp.zeros(2), cov=jnp.array([[4.0, 2.0], [2.0, 2.0]]))
      >>> q.precision.tolist(), q.variance.tolist()
      ([[0.5, -0.5], [-0.5, 1.0]], [4.0, 2.0])
      >>> q.precision_factor.tolist()   # upper triangular, U U' = precision
      [[0.5, -0.5], [0.0, 1.0]]
    """

    mean: Array
    #: ``(d, d)`` upper triangular with a positive diagonal; ``precision = U U'``.
    precision_factor: Array

    def __init__(self, mean: Array, cov: Array):
        mean, cov = as_float_arrays(mean, cov)
        if mean.ndim != 1:
            raise ValueError(
                f"Gaussian: mean must have shape (d,), got {mean.shape}; "
                "for a scalar use jnp.array([m]) and a (1, 1) cov."
            )
        d = mean.shape[0]
        if cov.shape != (d, d):
            raise ValueError(
                f"Gaussian: cov must have shape ({d}, {d}) to match mean {mean.shape}, "
                f"got {cov.shape}."
            )
        if is_concrete(cov):
            _check_symmetric("cov", cov)
            c = np.asarray(cov)
            if d and np.linalg.eigvalsh(c).min() <= 0:
                raise ValueError(
                    "Gaussian: cov must be positive definite (its smallest eigenvalue is "
                    f"{np.linalg.eigvalsh(c).min():.3g}); this is not a proper distribution."
                )
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "precision_factor", _factor_from_cov(cov))

    @classmethod
    def from_precision(cls, mean: Array, precision: Array) -> Gaussian:
        """``N(mean, precision^{-1})``: one Cholesky of ``precision``, no inverse.

        Example:
          >>> import jax.numpy as jnp
          >>> q = Gaussian.from_precision(jnp.zeros(2), jnp.array([[2.0, 0.0], [0.0, 4.0]]))
          >>> q.cov.round(6).tolist()
          [[0.5, 0.0], [0.0, 0.25]]
        """
        mean, precision = as_float_arrays(mean, precision)
        d = mean.shape[-1] if mean.ndim == 1 else None
        if mean.ndim != 1 or precision.shape != (d, d):
            raise ValueError(
                "Gaussian.from_precision: mean must have shape (d,) and precision "
                f"(d, d), got {mean.shape} and {precision.shape}."
            )
        factor = precision_factor(precision)
        if is_concrete(precision):
            _check_symmetric("precision", precision)
            if not np.all(np.isfinite(np.asarray(factor))):
                raise ValueError(
                    "Gaussian: precision must be positive definite; this is not a "
                    "proper distribution."
                )
        return build(cls, mean=mean, precision_factor=factor)

    @property
    def event_shape(self) -> tuple[int, ...]:
        return (self.mean.shape[-1],)

    @property
    def dim(self) -> int:
        return self.mean.shape[-1]

    @property
    def scale_tril(self) -> Array:
        """The lower Cholesky factor of ``cov``, ``U^{-T}`` (a triangular inverse)."""
        u = self.precision_factor
        eye = jnp.broadcast_to(jnp.eye(self.dim, dtype=u.dtype), u.shape)
        return solve_triangular(u, eye, lower=False, trans="T")

    @property
    def cov(self) -> Array:
        """The covariance ``U^{-T} U^{-1}``, formed on each access (``O(d^3)``)."""
        s = self.scale_tril
        c = s @ jnp.swapaxes(s, -1, -2)
        return 0.5 * (c + jnp.swapaxes(c, -1, -2))

    @cov.setter
    def cov(self, value: Array) -> None:
        # Reached only through ``build(Gaussian, mean=..., cov=...)`` (the dataclass is
        # frozen): code that builds an unchecked Gaussian from a covariance keeps
        # working, at the price of a factorisation.
        object.__setattr__(self, "precision_factor", _factor_from_cov(value))

    @property
    def precision(self) -> Array:
        u = self.precision_factor
        return u @ jnp.swapaxes(u, -1, -2)

    @property
    def variance(self) -> Array:
        """The marginal variances, ``diag(cov)``."""
        return jnp.sum(self.scale_tril**2, axis=-1)

    def sufficient_stats(self, x):
        i, j = _triu(self.dim)
        return jnp.concatenate([x, _coef(self.dim, x.dtype) * x[i] * x[j]])

    @property
    def natural_params(self):
        u = self.precision_factor
        p = self.precision
        i, j = _triu(self.dim)
        return jnp.concatenate([u @ (u.T @ self.mean), p[i, j]])

    def from_natural(self, eta):
        d = self.dim
        factor = precision_factor(_unpack_precision(eta[d:], d))
        return build(
            Gaussian, mean=solve_precision(factor, eta[:d]), precision_factor=factor
        )

    @property
    def mean_sufficient_stats(self):
        # Closed forms (Isserlis' theorem) instead of differentiating U through a
        # Cholesky factorisation: the same numbers, a fraction of the compile time.
        i, j = _triu(self.dim)
        coef = _coef(self.dim, self.dtype)
        m, s = self.mean, self.cov
        return jnp.concatenate([m, coef * (s[i, j] + m[i] * m[j])])

    @property
    def fisher_information(self):
        i, j = _triu(self.dim)
        coef = _coef(self.dim, self.dtype)
        m, s = self.mean, self.cov
        # Cov(x_a, x_i x_j) = m_i S_aj + m_j S_ai
        cross = (m[i] * s[:, j] + m[j] * s[:, i]) * coef
        # Cov(x_i x_j, x_k x_l) = S_ik S_jl + S_il S_jk + m_i m_k S_jl + m_i m_l S_jk
        #                        + m_j m_k S_il + m_j m_l S_ik
        I, J, K, L = i[:, None], j[:, None], i[None, :], j[None, :]
        quad = (
            s[I, K] * s[J, L]
            + s[I, L] * s[J, K]
            + m[I] * m[K] * s[J, L]
            + m[I] * m[L] * s[J, K]
            + m[J] * m[K] * s[I, L]
            + m[J] * m[L] * s[I, K]
        ) * jnp.outer(coef, coef)
        return jnp.block([[s, cross], [cross.T, quad]])

    def _log_normalizer(self, eta):
        d = self.dim
        chol = jnp.linalg.cholesky(_unpack_precision(eta[d:], d))
        half = solve_triangular(chol, eta[:d], lower=True)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
        return 0.5 * half @ half - 0.5 * logdet + 0.5 * d * math.log(2 * math.pi)

    @property
    def is_proper(self):
        # A failed factorisation is NaN; a hand-built factor must also have a positive
        # diagonal to be the factor of a positive definite precision.
        u = self.precision_factor
        return (
            jnp.all(jnp.isfinite(u))
            & jnp.all(jnp.diagonal(u, axis1=-2, axis2=-1) > 0)
            & jnp.all(jnp.isfinite(self.mean))
        )

    def _log_det_precision(self) -> Array:
        return 2.0 * jnp.sum(
            jnp.log(jnp.diagonal(self.precision_factor, axis1=-2, axis2=-1)), -1
        )

    def noise(self, key):
        return _random.normal(key, self.event_shape, self.dtype)

    def from_noise(self, noise):
        # U^{-T} z = chol(cov) z: one triangular solve. Under vmap over draws the batch
        # joins the right-hand side of one solve.
        return self.mean + solve_triangular(
            self.precision_factor, noise, lower=False, trans="T"
        )

    def antithetic(self, noise):
        return -noise

    def log_prob(self, x):
        # Closed form: cheaper and better conditioned than T(x) . eta - U(eta).
        # r = U' (x - m), whose square norm is (x - m)' P (x - m): a matrix product
        # under vmap over draws.
        x = jnp.asarray(x, self.dtype)
        r = self.precision_factor.T @ (x - self.mean)
        logdet = -self._log_det_precision()
        return -0.5 * (r @ r + logdet + self.dim * math.log(2 * math.pi))

    @property
    def entropy(self):
        logdet = -self._log_det_precision()
        return 0.5 * (logdet + self.dim * (1.0 + math.log(2 * math.pi)))

    def __repr__(self) -> str:
        # Shown by mean and cov, the parameters users give (small values in full).
        concrete = is_concrete(self.mean) and is_concrete(self.precision_factor)
        mean = self.mean.shape
        cov = self.precision_factor.shape
        if concrete and self.mean.size <= 6:
            mean = np.asarray(self.mean).tolist()
        if concrete and self.precision_factor.size <= 6:
            cov = np.asarray(self.cov).tolist()
        return f"Gaussian(mean={mean}, cov={cov})"
