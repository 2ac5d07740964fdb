"""Conjugate models whose posterior and marginal likelihood are known in closed form.

Each builder returns a :class:`Conjugate` with the full log joint (all normalising
constants included, so ``log p(y)`` is the true log marginal likelihood), the exact
posterior as a jaxvb family and that log marginal likelihood. They are the exact
cases against which the engine is tested and demonstrated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln

from jaxvb._special import betaln
from jaxvb.families import Beta, Gamma, Gaussian


class Conjugate(NamedTuple):
    """A model with a closed-form answer.

    Attributes:
      log_joint: ``x -> log p(x, y)`` including every constant.
      posterior: the exact posterior ``p(x | y)``, a jaxvb family.
      log_evidence: ``log p(y)``.

    Example:
      ``log p(x, y) - log p(x | y) = log p(y)`` at every ``x``:

      >>> import jax.numpy as jnp
      >>> from jaxvb.models import conjugate
      >>> model = conjugate.beta_binomial(successes=7, trials=10)
      >>> x = jnp.array([0.3])
      >>> gap = model.log_joint(x) - model.posterior.log_prob(x)
      >>> round(float(gap), 10), round(float(model.log_evidence), 10)   # log(1 / 11)
      (-2.3978952728, -2.3978952728)
    """

    log_joint: Callable[[jax.Array], jax.Array]
    posterior: Any
    log_evidence: jax.Array


def gamma_poisson(counts, concentration: float = 2.0, rate: float = 1.0) -> Conjugate:
    """Poisson counts with a ``Gamma(concentration, rate)`` prior on the rate ``lam``.

    ``x`` has shape ``(1,)``; the posterior is ``Gamma(a + sum y, b + n)``.

    Example:
      >>> from jaxvb.models import conjugate
      >>> model = conjugate.gamma_poisson([3, 0, 5, 2, 4, 1])
      >>> model.posterior, round(float(model.log_evidence), 4)
      (Gamma(concentration=[17.0], rate=[7.0]), -12.8591)
    """
    y = jnp.asarray(counts, float)
    a, b = concentration, rate
    a_n, b_n = a + jnp.sum(y), b + y.shape[0]
    const = -jnp.sum(gammaln(y + 1.0))

    def log_joint(x):
        lam = x[0]
        prior = a * jnp.log(b) - gammaln(a) + (a - 1.0) * jnp.log(lam) - b * lam
        return prior + jnp.sum(y) * jnp.log(lam) - y.shape[0] * lam + const

    evidence = a * math.log(b) - gammaln(a) + gammaln(a_n) - a_n * jnp.log(b_n) + const
    return Conjugate(log_joint, Gamma(jnp.atleast_1d(a_n), jnp.atleast_1d(b_n)), evidence)


def beta_binomial(successes: int, trials: int, a: float = 1.0, b: float = 1.0) -> Conjugate:
    """``successes ~ Binomial(trials, theta)`` with a ``Beta(a, b)`` prior on ``theta``.

    ``x`` has shape ``(1,)``; the posterior is ``Beta(a + s, b + n - s)``.

    Example:
      >>> from jaxvb.models import conjugate
      >>> model = conjugate.beta_binomial(successes=7, trials=10)
      >>> model.posterior, round(float(model.log_evidence), 4)   # log(1/11)
      (Beta(concentration1=[8.0], concentration0=[4.0]), -2.3979)
    """
    s, n = float(successes), float(trials)
    log_choose = gammaln(n + 1.0) - gammaln(s + 1.0) - gammaln(n - s + 1.0)

    def log_joint(x):
        theta = x[0]
        prior = (a - 1.0) * jnp.log(theta) + (b - 1.0) * jnp.log1p(-theta) - betaln(a, b)
        return prior + log_choose + s * jnp.log(theta) + (n - s) * jnp.log1p(-theta)

    evidence = log_choose + betaln(a + s, b + n - s) - betaln(a, b)
    posterior = Beta(jnp.array([a + s]), jnp.array([b + n - s]))
    return Conjugate(log_joint, posterior, evidence)


def gaussian_linear(design, targets, noise_sd: float = 1.0, prior_sd: float = 1.0):
    """Bayesian linear regression ``y ~ N(X w, noise_sd^2 I)``, ``w ~ N(0, prior_sd^2 I)``.

    ``x = w`` has shape ``(d,)``; the posterior is Gaussian.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import conjugate
      >>> design = jnp.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
      >>> model = conjugate.gaussian_linear(design, jnp.array([1.0, 2.0, 2.5]))
      >>> model.posterior.mean.round(4).tolist(), round(float(model.log_evidence), 4)
      ([0.8, 0.7667], -4.8525)
    """
    X = jnp.asarray(design, float)
    y = jnp.asarray(targets, float)
    n, d = X.shape
    s2, t2 = noise_sd**2, prior_sd**2

    def log_joint(w):
        prior = -0.5 * jnp.sum(w**2) / t2 - 0.5 * d * math.log(2 * math.pi * t2)
        r = y - X @ w
        lik = -0.5 * jnp.sum(r**2) / s2 - 0.5 * n * math.log(2 * math.pi * s2)
        return prior + lik

    precision = X.T @ X / s2 + jnp.eye(d) / t2
    cov = jnp.linalg.inv(precision)
    cov = 0.5 * (cov + cov.T)
    mean = cov @ X.T @ y / s2
    marginal_cov = s2 * jnp.eye(n) + t2 * X @ X.T
    evidence = jax.scipy.stats.multivariate_normal.logpdf(y, jnp.zeros(n), marginal_cov)
    return Conjugate(log_joint, Gaussian(mean, cov), evidence)
