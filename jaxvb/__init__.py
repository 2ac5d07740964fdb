"""jaxvb: fixed-form variational posterior approximation by stochastic linear regression.

Salimans & Knowles (2013), "Fixed-Form Variational Posterior Approximation through
Stochastic Linear Regression", Bayesian Analysis 8(4), in JAX.

Example:
  >>> import jax, jax.numpy as jnp, jaxvb
  >>> log_joint = lambda x: -0.5 * jnp.sum((x - 1.0) ** 2)
  >>> res = jaxvb.fit(log_joint, jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
  ...                 jax.random.key(0), num_steps=100)
  >>> res.q.mean.round(6).tolist()
  [1.0, 1.0]
"""

from jaxvb import diagnostics, families, kernel, methods
from jaxvb._arviz import to_arviz
from jaxvb._fit import fit
from jaxvb._laplace import LaplaceInfo, laplace
from jaxvb._progress import Progress, ProgressInfo
from jaxvb._result import FitError, FitWarning, Result, Status, Trace, check, explain
from jaxvb._summary import Summary, summary
from jaxvb.batch import fit_batched
from jaxvb.families import (
    Beta,
    Exponential,
    ExponentialFamily,
    Family,
    Gamma,
    Gaussian,
    GaussianMixture,
    InverseGamma,
)
from jaxvb.io import load, save
from jaxvb.latent import LatentGaussian
from jaxvb.methods.mixture import init_mixture
from jaxvb.structure import Factors, Minibatch

__version__ = "0.1.0"

__all__ = [
    "Beta",
    "Exponential",
    "ExponentialFamily",
    "Family",
    "Factors",
    "FitError",
    "FitWarning",
    "Gamma",
    "Gaussian",
    "GaussianMixture",
    "InverseGamma",
    "LaplaceInfo",
    "LatentGaussian",
    "Minibatch",
    "Progress",
    "ProgressInfo",
    "Result",
    "Status",
    "Summary",
    "Trace",
    "check",
    "diagnostics",
    "explain",
    "families",
    "fit",
    "fit_batched",
    "init_mixture",
    "io",
    "kernel",
    "laplace",
    "load",
    "methods",
    "save",
    "summary",
    "to_arviz",
]
