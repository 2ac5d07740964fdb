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

from jaxvb import diagnostics, families, io, kernel, methods
from jaxvb._version import __version__ as __version__
from jaxvb.batch import fit_batched
from jaxvb.core.fit import fit
from jaxvb.core.progress import Progress, ProgressInfo
from jaxvb.core.result import Result, Trace
from jaxvb.core.start import LaplaceInfo, init_mixture, laplace
from jaxvb.core.status import FitError, FitWarning, Status, check, explain
from jaxvb.core.summary import Summary, summary
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
from jaxvb.interop.arviz import to_arviz
from jaxvb.interop.io import load, save
from jaxvb.latent import LatentGaussian
from jaxvb.many import ManySummary, fit_many, load_many
from jaxvb.structure import Factors, Minibatch

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
    "ManySummary",
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
    "fit_many",
    "init_mixture",
    "io",
    "kernel",
    "laplace",
    "load",
    "load_many",
    "methods",
    "save",
    "summary",
    "to_arviz",
]
