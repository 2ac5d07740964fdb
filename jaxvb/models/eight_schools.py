"""The eight schools: a hierarchical normal model with a half-Cauchy scale (Rubin 1981).

Estimated effects ``y_j`` of coaching programmes in eight schools, with known standard
errors ``sigma_j`` (Rubin 1981; Gelman et al., *Bayesian Data Analysis*, section 5.5):

    y_j ~ N(theta_j, sigma_j^2),  theta_j ~ N(mu, tau^2),
    mu ~ N(0, 5^2),  tau ~ HalfCauchy(5),

the priors of the posteriordb / Stan versions of the model (``eight_schools_centered``,
``eight_schools_noncentered``). Two parameterisations, both on the real line with
``log tau`` (the log Jacobian ``log tau`` included), shape ``(10,)``:

* centred, ``x = (mu, log tau, theta_1..8)``: the funnel. As ``tau -> 0`` with every
  ``theta_j = mu`` the density grows without bound (like ``tau^-7``), so there is no
  mode and no Laplace approximation, and the Gaussian that minimises ``KL(q || p)`` sits
  in the neck of the funnel;
* non-centred, ``x = (mu, log tau, eta_1..8)`` with ``theta_j = mu + tau eta_j``: the
  same posterior, well behaved.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

#: Estimated treatment effects and their standard errors (Rubin 1981, table 2).
Y = (28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0)
SIGMA = (15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0)
#: Prior scales: ``mu ~ N(0, MU_SCALE^2)``, ``tau ~ HalfCauchy(TAU_SCALE)``.
MU_SCALE = 5.0
TAU_SCALE = 5.0

_LOG_2PI = math.log(2.0 * math.pi)


def _normal_logpdf(v, loc, scale):
    z = (v - loc) / scale
    return -0.5 * z**2 - jnp.log(scale) - 0.5 * _LOG_2PI


def _log_prior_mu_log_tau(mu, log_tau):
    tau = jnp.exp(log_tau)
    log_half_cauchy = math.log(2.0 / (math.pi * TAU_SCALE)) - jnp.log1p(
        (tau / TAU_SCALE) ** 2
    )
    return _normal_logpdf(mu, 0.0, MU_SCALE) + log_half_cauchy + log_tau


def log_joint_centered(x: ArrayLike) -> jax.Array:
    """Normalised log joint of the centred ``x = (mu, log tau, theta_1..8)`` -> scalar.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import eight_schools
      >>> round(float(eight_schools.log_joint_centered(jnp.zeros(10))), 4)
      -43.4356
    """
    x = jnp.asarray(x)
    mu, log_tau, theta = x[0], x[1], x[2:]
    y = jnp.asarray(Y, x.dtype)
    sigma = jnp.asarray(SIGMA, x.dtype)
    return (
        _log_prior_mu_log_tau(mu, log_tau)
        + jnp.sum(_normal_logpdf(theta, mu, jnp.exp(log_tau)))
        + jnp.sum(_normal_logpdf(y, theta, sigma))
    )


def log_joint_noncentered(x: ArrayLike) -> jax.Array:
    """Normalised log joint of the non-centred ``x = (mu, log tau, eta_1..8)`` -> scalar.

    It differs from the centred density at the same point by the log Jacobian of
    :func:`to_centered`, ``8 log tau``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import eight_schools
      >>> x = jnp.array([1.0, jnp.log(2.0)] + [0.5] * 8)   # tau = 2
      >>> centred = eight_schools.to_centered(x)
      >>> lj = eight_schools.log_joint_noncentered(x) - eight_schools.log_joint_centered(centred)
      >>> round(float(lj), 6), round(8 * float(jnp.log(2.0)), 6)
      (5.545177, 5.545177)
    """
    x = jnp.asarray(x)
    mu, log_tau, eta = x[0], x[1], x[2:]
    y = jnp.asarray(Y, x.dtype)
    sigma = jnp.asarray(SIGMA, x.dtype)
    theta = mu + jnp.exp(log_tau) * eta
    return (
        _log_prior_mu_log_tau(mu, log_tau)
        + jnp.sum(_normal_logpdf(eta, 0.0, 1.0))
        + jnp.sum(_normal_logpdf(y, theta, sigma))
    )


def to_centered(x: ArrayLike) -> np.ndarray:
    """Non-centred draws ``(..., 10)`` to centred coordinates ``(mu, log tau, theta)``.

    Example:
      >>> import numpy as np
      >>> from jaxvb.models import eight_schools
      >>> x = np.array([1.0, np.log(2.0)] + [0.5] * 8)   # theta_j = 1 + 2 * 0.5
      >>> eight_schools.to_centered(x)[[0, 2, 9]].tolist()
      [1.0, 2.0, 2.0]
    """
    x = np.asarray(x)
    theta = x[..., :1] + np.exp(x[..., 1:2]) * x[..., 2:]
    return np.concatenate([x[..., :2], theta], axis=-1)
