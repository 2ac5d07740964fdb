"""A latent Gaussian process: the log rate of British coal-mining disasters, 1851-1962.

Yearly disaster counts (:func:`jaxvb.data.coal_mining_disasters`, 112 years, 191
disasters) as a log-Gaussian Cox process (Moller, Syversveen & Waagepetersen 1998)
binned by year, i.e. Poisson counts with a Gaussian-process log rate:

    y_i ~ Poisson(exp(f_i)),   f ~ GP(m, k),   k(t, t') = a^2 exp(-(t - t')^2 / (2 l^2)),

with fixed hyperparameters: the constant mean ``m = log(191 / 112)`` (the average
yearly count), amplitude ``a = 1`` and length scale ``l = 10`` years, within half a nat
of the best Laplace-approximate marginal likelihood on the grid ``a in {0.5, 1, 2}``,
``l in {5, 10, 20, 40}`` (a jitter of ``1e-6 a^2`` on the diagonal keeps the Gram
matrix numerically positive definite). The
parameter is the latent log rate itself, ``x = f``, shape ``(112,)`` -- centred, as a
user writes ``MultivariateNormal(m, K)``. The squared-exponential Gram matrix of 112
yearly points is nearly singular, so the prior precision ``K^{-1}`` has condition
number 2.4e7 (with the jitter; eigenvalues from 0.04 to 1e6); :func:`whiten` and :func:`unwhiten` map to the
non-centred coordinates ``v = L^{-1} (f - m)`` that an MCMC reference samples in.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import gammaln
from jax.typing import ArrayLike

from jaxvb import data

#: Fixed hyperparameters (see the module docstring).
LENGTH_SCALE = 10.0
AMPLITUDE = 1.0
JITTER = 1e-6


def gram_cholesky(
    years: ArrayLike,
    length_scale: float = LENGTH_SCALE,
    amplitude: float = AMPLITUDE,
    jitter: float = JITTER,
) -> np.ndarray:
    """Lower Cholesky factor ``L`` of ``K + jitter a^2 I`` on ``years``, shape ``(n, n)``.

    Example:
      >>> import numpy as np
      >>> from jaxvb.models import latent_gp
      >>> chol = latent_gp.gram_cholesky(np.arange(3.0), length_scale=1.0)
      >>> (chol @ chol.T)[0].round(4).tolist()   # exp(-d^2 / 2), plus the jitter
      [1.0, 0.6065, 0.1353]
    """
    t = np.asarray(years, float)
    gram = amplitude**2 * np.exp(-0.5 * ((t[:, None] - t[None, :]) / length_scale) ** 2)
    gram += jitter * amplitude**2 * np.eye(len(t))
    return np.linalg.cholesky(gram)


def log_joint(x: ArrayLike, counts: ArrayLike, chol: ArrayLike, mean: float) -> jax.Array:
    """Normalised log joint of the latent log rates ``x = f``, shape ``(n,)`` -> scalar.

    Args:
      x: log rates, shape ``(n,)``.
      counts: yearly counts, shape ``(n,)``.
      chol: lower Cholesky factor of the prior covariance, shape ``(n, n)``.
      mean: the constant prior mean of ``f``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import latent_gp
      >>> counts, chol, mean = latent_gp.coal_mining()
      >>> round(float(latent_gp.log_joint(jnp.full(112, mean), counts, chol, mean)), 3)
      333.884
    """
    x = jnp.asarray(x)
    chol = jnp.asarray(chol, x.dtype)
    counts = jnp.asarray(counts, x.dtype)
    v = solve_triangular(chol, x - mean, lower=True)
    n = x.shape[0]
    log_prior = (
        -0.5 * (v @ v)
        - jnp.sum(jnp.log(jnp.diagonal(chol)))
        - 0.5 * n * math.log(2.0 * math.pi)
    )
    log_lik = jnp.sum(counts * x - jnp.exp(x) - gammaln(counts + 1.0))
    return log_prior + log_lik


def coal_mining() -> tuple[np.ndarray, np.ndarray, float]:
    """``(counts, chol, mean)`` for the shipped coal-mining data and fixed hyperparameters.

    Example:
      >>> from jaxvb.models import latent_gp
      >>> counts, chol, mean = latent_gp.coal_mining()
      >>> counts.shape, chol.shape, round(mean, 4)   # mean = log(191 / 112)
      ((112,), (112, 112), 0.5338)
    """
    years, counts = data.coal_mining_disasters()
    mean = math.log(counts.sum() / len(counts))
    return counts.astype(float), gram_cholesky(years), mean


def coal_mining_log_joint():
    """``log_joint(x)`` on the shipped coal-mining data; ``x`` has shape ``(112,)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import latent_gp
      >>> log_joint = latent_gp.coal_mining_log_joint()
      >>> round(float(log_joint(jnp.full(112, jnp.log(191 / 112)))), 3)
      333.884
    """
    counts, chol, mean = coal_mining()

    def lj(x):
        return log_joint(x, counts, chol, mean)

    return lj


def whiten(f: ArrayLike, chol: ArrayLike, mean: float) -> np.ndarray:
    """``v = L^{-1} (f - m)`` for ``f`` of shape ``(..., n)``.

    Example:
      >>> import numpy as np
      >>> from jaxvb.models import latent_gp
      >>> chol = latent_gp.gram_cholesky(np.arange(3.0), length_scale=1.0)
      >>> v = latent_gp.whiten(1.0 + chol[:, 1], chol, 1.0)   # f - m = L e_2
      >>> np.allclose(v, [0.0, 1.0, 0.0])
      True
    """
    f = np.asarray(f) - mean
    return np.linalg.solve(np.asarray(chol), f.T).T


def unwhiten(v: ArrayLike, chol: ArrayLike, mean: float) -> np.ndarray:
    """``f = m + L v`` for ``v`` of shape ``(..., n)``.

    Example:
      >>> import numpy as np
      >>> from jaxvb.models import latent_gp
      >>> chol = latent_gp.gram_cholesky(np.arange(3.0), length_scale=1.0)
      >>> f = latent_gp.unwhiten(np.array([0.0, 1.0, 0.0]), chol, 1.0)
      >>> np.allclose(f, 1.0 + chol[:, 1]), np.allclose(latent_gp.whiten(f, chol, 1.0), [0, 1, 0])
      (True, True)
    """
    return mean + np.asarray(v) @ np.asarray(chol).T
