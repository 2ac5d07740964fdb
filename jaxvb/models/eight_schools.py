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

And the hierarchical approximation of section 6.1 (:mod:`jaxvb.composite`), in
``x = (tau, theta_1..8, mu)`` with ``tau > 0`` itself (:func:`hierarchical_log_joint`):
``q(tau) q(f | tau)`` with ``q(tau)`` a Gamma (which, like the posterior, can put a
finite density at ``tau -> 0``) and ``f = (theta, mu)`` Gaussian, ``q(f | tau) ∝ p(f |
tau) q(y | f)`` with the exact ``p(theta | mu, tau)`` as its prior (an arrowhead
precision, ``mu`` the border) and Gaussian sites for the likelihood and ``mu``'s prior.
Both are Gaussian, so the sites are exact and ``q(f | tau) = p(f | tau, y)``: the only
approximation is the Gamma for ``p(tau | y)`` (:func:`hierarchical_structure`,
:func:`hierarchical_initial_q`, :func:`fit_hierarchical`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

import jaxvb as _engine  # the public fit and Result
from jaxvb.families._base import build
from jaxvb.families.gamma import Gamma
from jaxvb.latent.hierarchical import (
    ConditionalBlock,
    GaussianSitesBlock,
    Hierarchical,
    hierarchical,
)
from jaxvb.linalg import Arrowhead

#: Estimated treatment effects and their standard errors (Rubin 1981, table 2).
Y = (28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0)
SIGMA = (15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0)
#: Prior scales: ``mu ~ N(0, MU_SCALE^2)``, ``tau ~ HalfCauchy(TAU_SCALE)``.
MU_SCALE = 5.0
TAU_SCALE = 5.0

#: How close to 0 ``q(f | tau)`` lets ``tau`` come (see :func:`hierarchical_structure`).
TAU_EDGE = 1e-6

_LOG_2PI = math.log(2.0 * math.pi)
_NUM_SCHOOLS = len(Y)


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


# --- the hierarchical approximation q(tau) q(theta, mu | tau) -------------------------


def _log_half_cauchy(tau):
    inside = tau > 0
    safe = jnp.where(inside, tau, 1.0)
    value = math.log(2.0 / (math.pi * TAU_SCALE)) - jnp.log1p((safe / TAU_SCALE) ** 2)
    return jnp.where(inside, value, -jnp.inf)


def hierarchical_log_joint(x: ArrayLike) -> jax.Array:
    """Normalised log joint of ``x = (tau, theta_1..8, mu)``; ``-inf`` for ``tau <= 0``.

    The density of :func:`log_joint_centered` in ``tau`` rather than ``log tau`` and
    with ``mu`` last (the order of the hierarchical approximation): the two differ by
    the log Jacobian ``log tau``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import eight_schools
      >>> x = jnp.concatenate([jnp.array([2.0]), jnp.full(8, 1.5), jnp.array([1.0])])
      >>> centred = jnp.concatenate([jnp.array([1.0, jnp.log(2.0)]), jnp.full(8, 1.5)])
      >>> lj = eight_schools.hierarchical_log_joint(x)
      >>> diff = lj - eight_schools.log_joint_centered(centred)   # -log tau
      >>> round(float(diff), 6), round(-float(jnp.log(2.0)), 6)
      (-0.693147, -0.693147)
      >>> float(eight_schools.hierarchical_log_joint(x.at[0].set(0.0)))
      -inf
    """
    x = jnp.asarray(x)
    tau, theta, mu = x[0], x[1:-1], x[-1]
    y = jnp.asarray(Y, x.dtype)
    sigma = jnp.asarray(SIGMA, x.dtype)
    inside = tau > 0
    safe = jnp.where(inside, tau, 1.0)
    value = (
        _log_half_cauchy(safe)
        + _normal_logpdf(mu, 0.0, MU_SCALE)
        + jnp.sum(_normal_logpdf(theta, mu, safe))
        + jnp.sum(_normal_logpdf(y, theta, sigma))
    )
    return jnp.where(inside, value, -jnp.inf)


def _log_prior(theta):
    return _log_half_cauchy(theta[0])


def _prior(theta):
    """``p(theta_1..8, mu | tau)``: ``theta_j ~ N(mu, tau^2)``, ``mu ~ N(0, MU_SCALE^2)``.

    On ``f = (theta_1..8, mu)`` the precision is the arrowhead ``[[I, -1], [-1', 8]] /
    tau^2 + diag(0, 1 / MU_SCALE^2)`` (a diagonal band, ``mu`` the border), with
    ``log|Q| = -16 log tau - log MU_SCALE^2``; the constant of the density is returned
    with it (its third value), so nothing factorises ``Q`` to find it.
    """
    tau = jnp.maximum(theta[0], TAU_EDGE)
    dtype = theta.dtype
    n = _NUM_SCHOOLS
    p = 1.0 / tau**2
    q = Arrowhead(
        jnp.full((1, n), p, dtype),
        jnp.full((n, 1), -p, dtype),
        jnp.reshape(n * p + 1.0 / MU_SCALE**2, (1, 1)).astype(dtype),
    )
    log_norm = -n * jnp.log(tau) - math.log(MU_SCALE) - 0.5 * (n + 1) * _LOG_2PI
    return jnp.zeros(n + 1, dtype), q, log_norm


def _log_lik(theta_j, data):
    """``log N(y_j | theta_j, sigma_j^2)``, one site per school."""
    y, sigma = data
    return _normal_logpdf(y, theta_j, sigma)


def hierarchical_structure(dtype=None) -> _engine.LatentGaussian:
    """The eight schools as a bound :class:`jaxvb.LatentGaussian`.

    ``theta = (tau,)`` with the half-Cauchy prior; ``f = (theta_1..8, mu)`` with the
    exact Gaussian prior ``p(f | tau)`` (an arrowhead: ``mu`` last, see ``_prior``),
    and one Gaussian site per school on ``theta_j`` (the band; ``mu`` enters through
    the prior only).

    ``tau`` is floored at :data:`TAU_EDGE` in the prior. The Schur complement of ``q(f |
    tau)``'s precision, ``8 / tau^2 + 1/25 - sum (1/tau^2)^2 / (1/tau^2 + 1/sigma_j^2)``,
    loses digits to cancellation as ``tau -> 0``: in float64 ``E[mu | tau]`` is off by
    4e-6 at ``tau = 1e-4``, 1e-2 at ``1e-6``, and NaN below ~1e-8. The floor keeps it
    finite; the fitted ``q(tau)`` puts 2e-8 of its mass below it (4e-6 below 1e-4).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import eight_schools
      >>> model = eight_schools.hierarchical_structure()
      >>> _, Q, log_norm = model.prior_of_field(jnp.array([2.0]))
      >>> Q.band.shape, Q.border.shape, Q.corner.tolist(), model.num_field
      ((1, 8), (8, 1), [[2.04]], 9)
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    data = (jnp.asarray(Y, dtype), jnp.asarray(SIGMA, dtype))
    model = _engine.LatentGaussian(
        log_prior=_log_prior, prior=_prior, log_lik=_log_lik, data=data
    )
    return model.bind(jnp.ones(1, dtype))


def hierarchical_initial_q(dtype=None) -> Hierarchical:
    """The start: ``q(tau) = Gamma(1, 1 / TAU_SCALE)``, and the exact sites.

    The exponential of mean ``TAU_SCALE`` has the half-Cauchy prior's scale and, like
    it, a finite density at 0. The sites are the Gaussian likelihood terms themselves,
    ``a = 1 / sigma^2``, ``b = y / sigma^2``, which the fit keeps.

    Args:
      dtype: the floating dtype (default: JAX's default float).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import eight_schools
      >>> q0 = eight_schools.hierarchical_initial_q()
      >>> q0.scalars[0].given(jnp.zeros(0))   # q(tau), no parents
      Gamma(concentration=1.0, rate=0.2)
      >>> q0.event_shape, bool(q0.is_proper)   # x = (tau, theta_1..8, mu)
      ((10,), True)
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    one = jnp.ones((), dtype)
    q_tau = ConditionalBlock(
        eta=jnp.array([0.0, 1.0 / TAU_SCALE], dtype),  # (a - 1, b)
        base=build(Gamma, concentration=one, rate=one),
    )
    s2 = jnp.asarray(SIGMA, dtype) ** 2
    gaussian = GaussianSitesBlock(
        site_precision=1.0 / s2,
        site_shift=jnp.asarray(Y, dtype) / s2,
        model=hierarchical_structure(dtype),
    )
    return Hierarchical(scalars=(q_tau,), gaussian=gaussian)


@functools.cache
def _method():
    # One Method object, so that jaxvb.fit's compiled loop is reused across calls.
    return hierarchical(hierarchical_structure())


def fit_hierarchical(
    key: jax.Array, *, num_steps: int = 2000, **fit_kwargs
) -> _engine.Result:
    """Fits ``q(tau) q(theta, mu | tau)`` (Gamma times exact Gaussian) with ``jaxvb.fit``.

    One draw of ``tau`` per step; ``f = (theta, mu)`` is Rao-Blackwellised. The draws
    of the result are ``x = (tau, theta_1..8, mu)`` (:func:`hierarchical_log_joint`).
    Eqs. sv2 and svapprox coincide here (the sites are exact, so ``E[log p(y | f) - log
    q(y | f)]`` does not depend on ``tau``): the method is the paper's default. The
    first call compiles the fit; later calls with the same settings reuse it.

    Args:
      key: a JAX random key.
      num_steps: iterations; the step size defaults to ``1 / sqrt(num_steps)``.
      **fit_kwargs: passed to :func:`jaxvb.fit` (``num_eval_draws``, ``on_failure``, ...).

    Returns:
      the :class:`jaxvb.Result`; ``.q`` is a :class:`~jaxvb.composite.Hierarchical`.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxvb.models import eight_schools
      >>> res = eight_schools.fit_hierarchical(jax.random.key(0))  # doctest: +SKIP
      >>> res.q.scalars[0].given(jnp.zeros(0))  # doctest: +SKIP
      Gamma(concentration=1.19..., rate=0.33...)
    """
    q0 = hierarchical_initial_q()
    fit_kwargs.setdefault("num_check_draws", 0)  # as in stochastic_volatility.fit
    return _engine.fit(
        hierarchical_log_joint,
        q0,
        key,
        num_steps=num_steps,
        method=_method(),
        **fit_kwargs,
    )
