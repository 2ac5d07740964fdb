"""Gaussian linear regression with flat priors, on the Longley data (NIST StRD).

``y ~ N(X beta, sigma^2 I)`` with ``p(beta, log sigma) ∝ 1`` (flat on the coefficients and
on ``log sigma``, i.e. ``p(sigma) ∝ 1/sigma``), in the unconstrained coordinates
``x = (beta, log sigma)``, shape ``(p + 1,)``:

    log p(x | y) = -n log sigma - ||y - X beta||^2 / (2 sigma^2) + const.

The posterior is proper when ``n > p`` and ``X`` has full rank. Its Gaussian
approximation that minimises ``KL(q || p)`` (the fixed point of Algorithm 2:
``E_q[grad log p] = 0``, ``cov^{-1} = -E_q[hess log p]``) is known in closed form. With
``beta_hat`` the least-squares coefficients, ``s^2 = RSS / (n - p)`` the residual variance
and ``se_j`` the usual standard errors (the square roots of the diagonal of
``s^2 (X'X)^{-1}``), it is

    beta ~ N(beta_hat, s^2 (X'X)^{-1}),   log sigma ~ N(log s + 1/(2n), 1/(2n)),

independent of each other. (The exact posterior of ``beta`` is a multivariate t with
``n - p`` degrees of freedom, whose standard deviations are larger by
``sqrt((n - p) / (n - p - 2))``.) So NIST's certified values for the Longley data --
coefficients, standard deviations and residual standard deviation, computed by NIST
in 500-digit arithmetic -- give this optimal Gaussian's means and standard deviations
exactly: :func:`longley_reference`.

The Longley design is used raw, in the units of the NIST file, intercept included:
its condition number is 4.9e9, so the posterior covariance has condition number
about 2e19 (1e9 after scaling the coordinates to unit variance). Nothing is
standardised: that ill-conditioning is the point.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from jaxvb import data

#: NIST StRD certified values for Longley: the coefficients ``B0`` (intercept) .. ``B6``,
#: their standard deviations and the residual standard deviation (16 observations,
#: 9 residual degrees of freedom).
LONGLEY_CERTIFIED_COEF = (
    -3482258.63459582,
    15.0618722713733,
    -0.358191792925910e-01,
    -2.02022980381683,
    -1.03322686717359,
    -0.511041056535807e-01,
    1829.15146461355,
)
LONGLEY_CERTIFIED_SD = (
    890420.383607373,
    84.9149257747669,
    0.334910077722432e-01,
    0.488399681651699,
    0.214274163161675,
    0.226073200069370,
    455.478499142212,
)
LONGLEY_CERTIFIED_RESIDUAL_SD = 304.854073561965


def log_joint(x: ArrayLike, design: ArrayLike, y: ArrayLike) -> jax.Array:
    """Unnormalised log posterior of ``x = (beta, log sigma)``, shape ``(p + 1,)`` -> scalar.

    Args:
      x: the coefficients ``beta`` (shape ``(p,)``) followed by ``log sigma``.
      design: ``X``, shape ``(n, p)``.
      y: responses, shape ``(n,)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import flat_regression
      >>> design = jnp.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
      >>> x = jnp.array([1.0, 1.0, 0.0])   # beta = (1, 1), sigma = 1
      >>> float(flat_regression.log_joint(x, design, jnp.array([1.0, 2.0, 3.5])))
      -0.125
    """
    x = jnp.asarray(x)
    beta, log_sigma = x[:-1], x[-1]
    resid = jnp.asarray(y, x.dtype) - jnp.asarray(design, x.dtype) @ beta
    n = resid.shape[0]
    return -n * log_sigma - 0.5 * jnp.sum(resid**2) * jnp.exp(-2.0 * log_sigma)


def longley_design() -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of the NIST Longley problem: an intercept column and the six regressors.

    Example:
      >>> from jaxvb.models import flat_regression
      >>> design, y = flat_regression.longley_design()
      >>> design.shape, design[0, :2].tolist(), y.shape
      ((16, 7), [1.0, 83.0], (16,))
    """
    y, x = data.longley()
    return np.column_stack([np.ones(len(y)), x]), y


def longley_log_joint():
    """``log_joint(x)`` on the shipped Longley data; ``x`` has shape ``(8,)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import flat_regression
      >>> log_joint = flat_regression.longley_log_joint()
      >>> x = jnp.asarray(flat_regression.longley_reference().mean)
      >>> round(float(log_joint(x)), 3)
      -96.245
    """
    design, y = longley_design()

    def lj(x):
        return log_joint(x, design, y)

    return lj


class GaussianMoments(NamedTuple):
    """Means and standard deviations of a Gaussian, each of shape ``(d,)``.

    Example:
      >>> from jaxvb.models import flat_regression
      >>> ref = flat_regression.longley_reference()   # a GaussianMoments
      >>> ref.mean.shape, ref.sd.shape
      ((8,), (8,))
    """

    mean: np.ndarray
    sd: np.ndarray


def longley_reference() -> GaussianMoments:
    """The KL-optimal Gaussian for :func:`longley_log_joint`, from NIST's certified values.

    See the module docstring: ``beta ~ N(B, SD^2)`` marginally, and ``log sigma`` has
    mean ``log s + 1/(2n)`` and variance ``1/(2n)``, with ``n = 16``.

    Example:
      >>> from jaxvb.models import flat_regression
      >>> ref = flat_regression.longley_reference()
      >>> round(float(ref.mean[1]), 4), round(float(ref.sd[1]), 4)   # GNP deflator
      (15.0619, 84.9149)
      >>> round(float(ref.mean[-1]), 4), round(float(ref.sd[-1]), 4)   # log sigma
      (5.7511, 0.1768)
    """
    n = 16
    mean = np.array(
        [*LONGLEY_CERTIFIED_COEF, math.log(LONGLEY_CERTIFIED_RESIDUAL_SD) + 0.5 / n]
    )
    sd = np.array([*LONGLEY_CERTIFIED_SD, math.sqrt(0.5 / n)])
    return GaussianMoments(mean=mean, sd=sd)
