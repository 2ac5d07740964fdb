"""Bayesian binary probit regression (paper, section 5.1.1, "Binary probit regression").

``N`` pairs ``(y_i in {0, 1}, v_i in R^M)`` with ``P(y_i = 1 | v_i, x) = Phi(v_i' x)`` and
the prior ``x ~ N(0, I)``:

    log p(x, y) = log N(x; 0, I) + sum_i [y_i log Phi(v_i' x) + (1 - y_i) log Phi(-v_i' x)].

The likelihood touches ``x`` only through the projections ``f_i = v_i' x`` (paper,
section 5.2): :func:`factor_structure` describes the model that way, as a Gaussian prior
precision, the design whose rows are the ``v_i`` and the per-site log likelihood
:func:`site_log_lik` of one ``f_i``.

:func:`simulate` draws the paper's synthetic data sets (settings from the authors' code,
see ``jaxvb/data/README.md``); :func:`rmse` and :func:`log_score` are the two accuracy
measures of the paper's comparison.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import log_ndtr
from jax.typing import ArrayLike

#: The paper's settings: data sets, observations and regressors.
PAPER_NUM_DATASETS = 500
PAPER_NUM_OBS = 100
PAPER_NUM_FEATURES = 5


def site_log_lik(f: ArrayLike, y: ArrayLike) -> jax.Array:
    """``log p(y_i | f_i)`` with ``f_i = v_i' x``: ``log Phi(f)`` if ``y = 1``, else ``log Phi(-f)``.

    ``log Phi((2 y - 1) f)`` through ``log_ndtr``, which stays accurate far in the lower
    tail (``log Phi(-40) ~ -804``) where ``log(ndtr(.))`` would give ``-inf``.
    Broadcasts over ``f`` and ``y``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import probit
      >>> lp = probit.site_log_lik(jnp.array([0.0, 2.0, -40.0]), jnp.array([1.0, 0.0, 1.0]))
      >>> [round(v, 4) for v in lp.tolist()]   # log 1/2, log Phi(-2), log Phi(-40)
      [-0.6931, -3.7832, -804.6084]
    """
    f = jnp.asarray(f)
    return log_ndtr((2.0 * jnp.asarray(y, f.dtype) - 1.0) * f)


def log_joint(x: ArrayLike, design: ArrayLike, y: ArrayLike) -> jax.Array:
    """Normalised log joint ``log p(x, y)`` of the probit model, shape ``(M,)`` -> scalar.

    Args:
      x: regression coefficients, shape ``(M,)``.
      design: regressors ``v_i`` as rows, shape ``(N, M)``.
      y: binary responses, shape ``(N,)``.

    Example:
      At ``x = 0`` each of the 10 sites is ``log 1/2`` and the prior ``-log(2 pi)``:

      >>> import jax.numpy as jnp
      >>> from jaxvb.models import probit
      >>> design, y = jnp.ones((10, 2)), jnp.array([0.0, 1.0] * 5)
      >>> round(float(probit.log_joint(jnp.zeros(2), design, y)), 4)
      -8.7693
    """
    x = jnp.asarray(x)
    prior = -0.5 * (x @ x) - 0.5 * x.shape[-1] * math.log(2.0 * math.pi)
    return prior + jnp.sum(site_log_lik(jnp.asarray(design, x.dtype) @ x, y))


class FactorStructure(NamedTuple):
    """The probit model as a Gaussian prior times likelihood sites in ``f = design @ x``.

    ``log p(x, y) = log N(x; 0, prior_precision^{-1}) + sum_i site_log_lik(f_i, y_i)``.
    Arrays only, so a batch of data sets is one pytree for ``jax.vmap``.

    Attributes:
      prior_precision: shape ``(M, M)``; the identity in the paper.
      design: shape ``(N, M)``; row ``i`` is ``v_i``.
      y: shape ``(N,)``, the responses the sites condition on.

    Example:
      A batch of data sets is one ``FactorStructure`` with a leading axis:

      >>> import jax
      >>> from jaxvb.models import probit
      >>> _, design, y = probit.simulate(jax.random.key(0), 3, num_obs=10, num_features=2)
      >>> batch = jax.vmap(probit.factor_structure)(design, y)
      >>> batch.prior_precision.shape, batch.design.shape, batch.y.shape
      ((3, 2, 2), (3, 10, 2), (3, 10))
    """

    prior_precision: jax.Array
    design: jax.Array
    y: jax.Array


def factor_structure(design: ArrayLike, y: ArrayLike) -> FactorStructure:
    """The paper's model (prior ``N(0, I)``) in factor form; see :class:`FactorStructure`.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import probit
      >>> fs = probit.factor_structure(jnp.ones((4, 2)), jnp.array([0, 1, 1, 0]))
      >>> fs.prior_precision.tolist(), fs.design.shape, fs.y.tolist()
      ([[1.0, 0.0], [0.0, 1.0]], (4, 2), [0.0, 1.0, 1.0, 0.0])
    """
    design = jnp.asarray(design)
    if not jnp.issubdtype(design.dtype, jnp.floating):
        design = design.astype(float)
    eye = jnp.eye(design.shape[-1], dtype=design.dtype)
    return FactorStructure(eye, design, jnp.asarray(y, design.dtype))


def simulate(
    key: jax.Array,
    num_datasets: int = PAPER_NUM_DATASETS,
    num_obs: int = PAPER_NUM_OBS,
    num_features: int = PAPER_NUM_FEATURES,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draws the paper's synthetic data sets.

    ``beta ~ N(0, I)``, regressors ``v_ij ~ N(0, 3 / M)`` (the authors'
    ``randn / sqrt(M / 3)``, so that ``Var(v_i' beta) = 3``), and
    ``y_i = 1[v_i' beta + e_i > 0]`` with ``e_i ~ N(0, 1)``.

    Args:
      key: a JAX PRNG key.
      num_datasets: ``D``.
      num_obs: ``N``.
      num_features: ``M``.

    Returns:
      ``(beta_true, design, y)`` of shapes ``(D, M)``, ``(D, N, M)``, ``(D, N)``;
      ``y`` holds 0.0 and 1.0 in the default float dtype.

    Example:
      >>> import jax
      >>> from jaxvb.models import probit
      >>> beta, design, y = probit.simulate(jax.random.key(0), num_datasets=3)
      >>> beta.shape, design.shape, y.shape, sorted(set(y.ravel().tolist()))
      ((3, 5), (3, 100, 5), (3, 100), [0.0, 1.0])
    """
    d, n, m = num_datasets, num_obs, num_features
    k_beta, k_design, k_noise = jax.random.split(key, 3)
    beta = jax.random.normal(k_beta, (d, m))
    design = jax.random.normal(k_design, (d, n, m)) / math.sqrt(m / 3.0)
    noise = jax.random.normal(k_noise, (d, n))
    latent = jnp.einsum("dnm,dm->dn", design, beta) + noise
    return beta, design, (latent > 0).astype(design.dtype)


def rmse(mean: ArrayLike, beta_true: ArrayLike) -> jax.Array:
    """Root mean squared error over the ``M`` coefficients, ``(..., M) -> (...)``.

    One number per data set; the paper reports its average over data sets.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import probit
      >>> probit.rmse(jnp.array([[1.0, 2.0], [0.0, 0.0]]), jnp.array([1.0, 0.0])).tolist()
      [1.4142135623730951, 0.7071067811865476]
    """
    err = jnp.asarray(mean) - jnp.asarray(beta_true)
    return jnp.sqrt(jnp.mean(err**2, axis=-1))


def log_score(mean: ArrayLike, cov: ArrayLike, beta_true: ArrayLike) -> jax.Array:
    """``log N(beta_true | mean, cov)``, ``(..., M), (..., M, M), (..., M) -> (...)``.

    The paper's log score: the log density of the true coefficients under the
    approximation, which rewards a good variance as well as a good mean.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import probit
      >>> round(float(probit.log_score(jnp.zeros(2), jnp.eye(2), jnp.zeros(2))), 4)   # -log 2 pi
      -1.8379
    """
    mean, cov, beta_true = jnp.asarray(mean), jnp.asarray(cov), jnp.asarray(beta_true)
    m = mean.shape[-1]
    batch = jnp.broadcast_shapes(mean.shape[:-1], cov.shape[:-2], beta_true.shape[:-1])
    chol = jnp.broadcast_to(jnp.linalg.cholesky(cov), (*batch, m, m))
    diff = jnp.broadcast_to(beta_true - mean, (*batch, m))
    r = solve_triangular(chol, diff[..., None], lower=True)[..., 0]
    logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
    return -0.5 * (jnp.sum(r**2, axis=-1) + logdet + m * math.log(2.0 * math.pi))
