"""Real posteriors from posteriordb, written as JAX log joints on the real line.

Four models of the posterior database (Magnusson et al., "posteriordb: testing,
benchmarking and developing Bayesian inference algorithms", 2024;
https://github.com/stan-dev/posteriordb), each with the data set posteriordb pairs it
with, shipped in :mod:`jaxvb.data` (provenance in ``jaxvb/data/posteriordb.md``):

* ``arma-arma11``: an ARMA(1, 1) time series, ``x = (mu, phi, theta, log sigma)``;
* ``GLM_Poisson_Data-GLM_Poisson_model``: a cubic Poisson regression of 40 yearly
  counts, ``x = (logit-scaled alpha, beta1, beta2, beta3)`` (Stan's bounded
  parameters, flat priors);
* ``M0_data-M0_model``: the capture-recapture model M0 with data augmentation (237
  individuals, 3 occasions), the latent inclusion indicator summed out,
  ``x = (logit omega, logit p)``;
* ``eight_schools-eight_schools_noncentered``: :mod:`jaxvb.models.eight_schools`,
  ``x = (mu, log tau, eta_1..8)``.

Every log joint is the Stan model's ``target`` (constants dropped) plus the log
Jacobian of Stan's transform of each constrained parameter, so ``x`` is what Stan and
NumPyro sample. Each is returned as ``jax.tree_util.Partial(fn, *data)``: a pytree
whose leaves are the data, so that a second fit with new data of the same shapes can
reuse the compiled program.

Example:
  >>> import jax.numpy as jnp
  >>> from jaxvb.models import posteriors
  >>> sorted(posteriors.POSTERIORS)
  ['arma11', 'eight_schools_noncentered', 'glm_poisson', 'm0']
  >>> log_joint = posteriors.arma11()
  >>> round(float(log_joint(jnp.zeros(4))), 3)
  -30.804
"""

from __future__ import annotations

import csv
from importlib import resources

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import Partial
from jax.typing import ArrayLike

from jaxvb.models import eight_schools

__all__ = [
    "POSTERIORS",
    "arma11",
    "arma11_log_joint",
    "arma_data",
    "eight_schools_noncentered",
    "glm_poisson",
    "glm_poisson_constrained",
    "glm_poisson_data",
    "glm_poisson_log_joint",
    "m0",
    "m0_data",
    "m0_log_joint",
]


def _rows(name: str) -> list[dict[str, str]]:
    with resources.files("jaxvb.data").joinpath(name).open(newline="") as f:
        return list(csv.DictReader(f))


def _normal_logpdf(v, scale):
    # Without the constant -log(2 pi) / 2: Stan's ``~`` drops it too.
    return -0.5 * (v / scale) ** 2 - jnp.log(scale)


def _log_sigmoid_jacobian(u):
    """``log d/du sigmoid(u) = log sigmoid(u) + log sigmoid(-u)``."""
    return jax.nn.log_sigmoid(u) + jax.nn.log_sigmoid(-u)


# ARMA(1, 1) ---------------------------------------------------------------------------


def arma_data() -> np.ndarray:
    """The 200 observations of posteriordb's ``arma`` data set, shape ``(200,)``.

    Example:
      >>> from jaxvb.models import posteriors
      >>> y = posteriors.arma_data()
      >>> y.shape, round(float(y[0]), 6)
      ((200,), 0.731977)
    """
    return np.array([float(r["y"]) for r in _rows("arma.csv")])


def arma11_log_joint(x: ArrayLike, y: ArrayLike) -> jax.Array:
    """posteriordb's ``arma11``: ``x = (mu, phi, theta, log sigma)``, data ``y``.

    ``err_1 = y_1 - (mu + phi mu)``, ``err_t = y_t - (mu + phi y_{t-1} + theta
    err_{t-1})``, ``err ~ N(0, sigma)``; ``mu ~ N(0, 10)``, ``phi, theta ~ N(0, 2)``,
    ``sigma ~ HalfCauchy(2.5)``; plus ``log sigma`` for the transform.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import posteriors
      >>> y = jnp.array([0.5, 0.2, -0.1])
      >>> round(float(posteriors.arma11_log_joint(jnp.zeros(4), y)), 4)
      -3.9873
    """
    x = jnp.asarray(x)
    y = jnp.asarray(y, x.dtype)
    mu, phi, theta, log_sigma = x[0], x[1], x[2], x[3]
    sigma = jnp.exp(log_sigma)
    err1 = y[0] - (mu + phi * mu)

    def step(err, ys):
        y_prev, y_t = ys
        err = y_t - (mu + phi * y_prev + theta * err)
        return err, err

    _, errs = jax.lax.scan(step, err1, (y[:-1], y[1:]))
    err = jnp.concatenate([err1[None], errs])
    lp = jnp.sum(_normal_logpdf(err, sigma))
    lp += _normal_logpdf(mu, 10.0) + _normal_logpdf(phi, 2.0) + _normal_logpdf(theta, 2.0)
    lp += -jnp.log1p((sigma / 2.5) ** 2) + log_sigma
    return lp


def arma11(y: ArrayLike | None = None) -> Partial:
    """The ``arma11`` log joint on ``y`` (posteriordb's data by default), shape ``(4,)``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jaxvb.models import posteriors
      >>> q = jaxvb.laplace(posteriors.arma11(), jnp.zeros(4))
      >>> q.mean.round(2).tolist()   # mu, phi, theta, log sigma at the mode
      [0.01, 0.96, -0.04, -1.8]
    """
    y = arma_data() if y is None else y
    return Partial(arma11_log_joint, y=jnp.asarray(y))


# Poisson GLM --------------------------------------------------------------------------

#: Stan's bounds of ``alpha, beta1, beta2, beta3`` (``real<lower=-b, upper=b>``).
GLM_POISSON_BOUNDS = (20.0, 10.0, 10.0, 10.0)


def glm_poisson_data() -> tuple[np.ndarray, np.ndarray]:
    """``(year, count)`` of posteriordb's ``GLM_Poisson_Data``, each of shape ``(40,)``.

    ``year`` is standardised (mean 0, sd 1) as in posteriordb.

    Example:
      >>> from jaxvb.models import posteriors
      >>> year, count = posteriors.glm_poisson_data()
      >>> year.shape, int(count.sum())
      ((40,), 4378)
    """
    rows = _rows("glm_poisson.csv")
    return (
        np.array([float(r["year"]) for r in rows]),
        np.array([int(r["C"]) for r in rows]),
    )


def glm_poisson_constrained(x: ArrayLike) -> jax.Array:
    """``(alpha, beta1, beta2, beta3)`` from ``x``: ``b (2 sigmoid(x) - 1)`` per bound.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import posteriors
      >>> posteriors.glm_poisson_constrained(jnp.zeros(4)).tolist()
      [0.0, 0.0, 0.0, 0.0]
    """
    bounds = jnp.asarray(GLM_POISSON_BOUNDS, jnp.asarray(x).dtype)
    return bounds * (2.0 * jax.nn.sigmoid(x) - 1.0)


def glm_poisson_log_joint(x: ArrayLike, year: ArrayLike, count: ArrayLike) -> jax.Array:
    """posteriordb's ``GLM_Poisson_model``: ``count ~ Poisson(exp(cubic in year))``.

    Flat priors on the bounded coefficients, with the log Jacobian of Stan's map
    ``b (2 sigmoid(x) - 1)`` (up to a constant).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import posteriors
      >>> year, count = jnp.array([-1.0, 1.0]), jnp.array([2, 5])
      >>> round(float(posteriors.glm_poisson_log_joint(jnp.zeros(4), year, count)), 4)
      -7.5452
    """
    x = jnp.asarray(x)
    year = jnp.asarray(year, x.dtype)
    count = jnp.asarray(count, x.dtype)
    alpha, b1, b2, b3 = glm_poisson_constrained(x)
    log_lambda = alpha + b1 * year + b2 * year**2 + b3 * year**3
    return jnp.sum(count * log_lambda - jnp.exp(log_lambda)) + jnp.sum(
        _log_sigmoid_jacobian(x)
    )


def glm_poisson(year: ArrayLike | None = None, count: ArrayLike | None = None) -> Partial:
    """The ``GLM_Poisson_model`` log joint (posteriordb's data by default), shape ``(4,)``.

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.models import posteriors
      >>> q = jaxvb.laplace(posteriors.glm_poisson(), jnp.zeros(4))
      >>> posteriors.glm_poisson_constrained(q.mean).round(2).tolist()
      [4.28, 1.25, 0.07, -0.23]
    """
    if year is None or count is None:
        year, count = glm_poisson_data()
    return Partial(glm_poisson_log_joint, year=jnp.asarray(year), count=jnp.asarray(count))


# Capture-recapture M0 -----------------------------------------------------------------


def m0_data() -> np.ndarray:
    """posteriordb's ``M0_data``: capture histories, shape ``(237, 3)`` of 0/1.

    The 87 animals seen at least once, then 150 all-zero rows (data augmentation).

    Example:
      >>> from jaxvb.models import posteriors
      >>> y = posteriors.m0_data()
      >>> y.shape, int((y.sum(1) > 0).sum()), int(y.sum())
      ((237, 3), 87, 149)
    """
    rows = _rows("m0_capture_histories.csv")
    return np.array([[int(r[f"occasion{j}"]) for j in (1, 2, 3)] for r in rows])


def m0_log_joint(x: ArrayLike, captures: ArrayLike, num_occasions: int = 3) -> jax.Array:
    """posteriordb's ``M0_model``: ``x = (logit omega, logit p)``, uniform priors.

    ``captures`` holds each individual's number of captures (the row sums of
    :func:`m0_data`). Seen individuals contribute ``log omega + Binomial(s | T, p)``,
    never-seen ones ``log(omega (1 - p)^T + 1 - omega)`` (``z_i`` summed out).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import posteriors
      >>> round(float(posteriors.m0_log_joint(jnp.zeros(2), jnp.array([0, 1, 3]))), 4)
      -8.8931
    """
    x = jnp.asarray(x)
    s = jnp.asarray(captures, x.dtype)
    log_omega, log1m_omega = jax.nn.log_sigmoid(x[0]), jax.nn.log_sigmoid(-x[0])
    log_p, log1m_p = jax.nn.log_sigmoid(x[1]), jax.nn.log_sigmoid(-x[1])
    seen = s > 0
    # The binomial coefficient is a constant of the data; Stan's _lpmf keeps it.
    log_seen = log_omega + s * log_p + (num_occasions - s) * log1m_p
    log_unseen = jnp.logaddexp(log_omega + num_occasions * log1m_p, log1m_omega)
    lp = jnp.sum(jnp.where(seen, log_seen, log_unseen))
    return lp + jnp.sum(_log_sigmoid_jacobian(x))


def m0(captures: ArrayLike | None = None) -> Partial:
    """The ``M0_model`` log joint on capture counts (posteriordb's by default), ``(2,)``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jaxvb.models import posteriors
      >>> q = jaxvb.laplace(posteriors.m0(), jnp.zeros(2))
      >>> jax.nn.sigmoid(q.mean).round(3).tolist()   # omega, p at the mode
      [0.421, 0.499]
    """
    captures = m0_data().sum(axis=1) if captures is None else captures
    return Partial(m0_log_joint, captures=jnp.asarray(captures))


# Eight schools ------------------------------------------------------------------------


def eight_schools_noncentered() -> Partial:
    """:func:`jaxvb.models.eight_schools.log_joint_noncentered`, shape ``(10,)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import posteriors
      >>> round(float(posteriors.eight_schools_noncentered()(jnp.zeros(10))), 4)
      -43.4356
    """
    return Partial(eight_schools.log_joint_noncentered)


#: name -> (log joint factory, dimension, parameter names of x).
POSTERIORS = {
    "arma11": (arma11, 4, ("mu", "phi", "theta", "log_sigma")),
    "glm_poisson": (glm_poisson, 4, ("x_alpha", "x_beta1", "x_beta2", "x_beta3")),
    "m0": (m0, 2, ("logit_omega", "logit_p")),
    "eight_schools_noncentered": (
        eight_schools_noncentered,
        10,
        ("mu", "log_tau") + tuple(f"eta_{j}" for j in range(1, 9)),
    ),
}
