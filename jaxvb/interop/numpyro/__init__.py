"""NumPyro models in: fit the posterior of a NumPyro model with jaxvb.

A NumPyro model is turned into a log joint over one flat vector ``x``: the model's
latent sample sites, each mapped to the real line by NumPyro's own bijections
(``biject_to(site.support)``), raveled with ``jax.flatten_util.ravel_pytree`` in the
order of their names. The log density is NumPyro's ``potential_energy`` (with the
log-Jacobians of those bijections), so ``x`` is what NumPyro's HMC samples and
:func:`fit` fits a Gaussian to it, by Algorithm 2 unless told otherwise. Draws of that
Gaussian are mapped back through the same bijections: :meth:`NumPyroResult.sample`
gives the constrained values of every latent and deterministic site, keyed by the
model's site names, importance-resampled by ``p / q`` where the weights' Pareto k-hat
allows it (:meth:`NumPyroResult.importance`).

A model whose plates have a ``subsample_size`` is fitted on minibatches (section 5.5):
every step evaluates the model once with fresh subsample indices from NumPyro's own
``plate``, which scales the likelihood by ``size / subsample_size``; calling the log
joint gives the full-data density (every plate given all its indices), which the
starting point and the diagnostics use.

Compiling: the log joint is a pytree whose leaves are the model's array arguments, so
:func:`fit` compiles once per model structure; a second call with the same model and
new data of the same shapes and dtypes (and a new key) runs the compiled program at
once. To keep compiled programs across processes, turn on JAX's persistent cache
before the first fit::

    jax.config.update("jax_compilation_cache_dir", "/path/to/cache")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

Where the code lives (public as :mod:`jaxvb.numpyro`):

- :mod:`~jaxvb.interop.numpyro._sites`: running the model once to read its sites,
  and the checks that say which models jaxvb cannot fit.
- :mod:`~jaxvb.interop.numpyro._log_joint`: :class:`LogJoint` and
  :class:`MinibatchLogJoint` (the model as a function of ``x``, a pytree) and
  :func:`log_joint`.
- :mod:`~jaxvb.interop.numpyro._latent`: the ``latent=`` route, the model as a
  :class:`jaxvb.LatentGaussian`.
- :mod:`~jaxvb.interop.numpyro._result`: :class:`NumPyroResult`: draws on the model's
  scale, posterior predictive, pointwise log-likelihood, ArviZ, batches of fits.
- :mod:`~jaxvb.interop.numpyro._fit`: :func:`fit`, its checks and its start.

NumPyro is an optional dependency: ``import jaxvb`` does not import it, and importing
this package without it installed raises an ``ImportError`` saying how to install it.
"""

try:
    import numpyro  # noqa: F401  (the error below names the package)
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "jaxvb.numpyro needs NumPyro, which is not installed: pip install numpyro "
        "(or pip install 'jaxvb[numpyro]')"
    ) from e

from jaxvb.interop.numpyro._fit import RouteWarning, fit
from jaxvb.interop.numpyro._log_joint import LogJoint, MinibatchLogJoint, log_joint
from jaxvb.interop.numpyro._result import Importance, NumPyroResult

__all__ = [
    "Importance",
    "LogJoint",
    "MinibatchLogJoint",
    "NumPyroResult",
    "RouteWarning",
    "fit",
    "log_joint",
]
