"""Gaussian(mean, cov): a multivariate normal with a dense covariance."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve

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

    Args:
      mean: shape ``(d,)``.
      cov: shape ``(d, d)``, symmetric positive definite.

    Example:
      >>> import jax.numpy as jnp
      >>> q = Gaussian(mean=jnp.zeros(2), cov=jnp.eye(2))
      >>> q.precision.shape
      (2, 2)
    """

    mean: Array
    cov: Array

    def __post_init__(self):
        mean, cov = as_float_arrays(self.mean, self.cov)
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
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "cov", cov)
        if is_concrete(cov):
            c = np.asarray(cov)
            if not np.all(np.isfinite(c)) or not np.allclose(c, c.T, rtol=1e-6, atol=0):
                raise ValueError("Gaussian: cov must be finite and symmetric.")
            if d and np.linalg.eigvalsh(c).min() <= 0:
                raise ValueError(
                    "Gaussian: cov must be positive definite (its smallest eigenvalue is "
                    f"{np.linalg.eigvalsh(c).min():.3g}); this is not a proper distribution."
                )

    @classmethod
    def from_precision(cls, mean: Array, precision: Array) -> Gaussian:
        """``N(mean, precision^{-1})``."""
        mean, precision = as_float_arrays(mean, precision)
        chol = jnp.linalg.cholesky(precision)
        eye = jnp.eye(precision.shape[-1], dtype=precision.dtype)
        return cls(mean=mean, cov=cho_solve((chol, True), eye))

    @property
    def event_shape(self) -> tuple[int, ...]:
        return (self.mean.shape[-1],)

    @property
    def dim(self) -> int:
        return self.mean.shape[-1]

    @property
    def precision(self) -> Array:
        eye = jnp.eye(self.dim, dtype=self.dtype)
        return cho_solve((jnp.linalg.cholesky(self.cov), True), eye)

    @property
    def variance(self) -> Array:
        """The marginal variances, ``diag(cov)``."""
        return jnp.diagonal(self.cov)

    def sufficient_stats(self, x):
        i, j = _triu(self.dim)
        return jnp.concatenate([x, _coef(self.dim, x.dtype) * x[i] * x[j]])

    @property
    def natural_params(self):
        p = self.precision
        i, j = _triu(self.dim)
        return jnp.concatenate([p @ self.mean, p[i, j]])

    def from_natural(self, eta):
        d = self.dim
        p = _unpack_precision(eta[d:], d)
        chol = jnp.linalg.cholesky(p)
        eye = jnp.eye(d, dtype=eta.dtype)
        return build(
            Gaussian,
            mean=cho_solve((chol, True), eta[:d]),
            cov=cho_solve((chol, True), eye),
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
        half = jax.scipy.linalg.solve_triangular(chol, eta[:d], lower=True)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
        return 0.5 * half @ half - 0.5 * logdet + 0.5 * d * math.log(2 * math.pi)

    @property
    def is_proper(self):
        chol = jnp.linalg.cholesky(self.cov)
        return jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.isfinite(self.mean))

    def noise(self, key):
        return jax.random.normal(key, self.event_shape, self.dtype)

    def from_noise(self, noise):
        return self.mean + jnp.linalg.cholesky(self.cov) @ noise

    def antithetic(self, noise):
        return -noise

    def log_prob(self, x):
        # Closed form: cheaper and better conditioned than T(x) . eta - U(eta).
        # r = L^{-1} (x - m) as a product with L^{-1}, which does not depend on x: under
        # vmap over draws it is formed once, and the draws meet a matrix product. (A
        # batched triangular solve is the same numbers but ~100x slower on XLA:CPU.)
        x = jnp.asarray(x, self.dtype)
        chol = jnp.linalg.cholesky(self.cov)
        eye = jnp.eye(self.dim, dtype=self.dtype)
        r = jax.scipy.linalg.solve_triangular(chol, eye, lower=True) @ (x - self.mean)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
        return -0.5 * (r @ r + logdet + self.dim * math.log(2 * math.pi))

    @property
    def entropy(self):
        chol = jnp.linalg.cholesky(self.cov)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))
        return 0.5 * (logdet + self.dim * (1.0 + math.log(2 * math.pi)))
