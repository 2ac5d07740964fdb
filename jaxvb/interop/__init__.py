"""jaxvb and the tools around it: NumPyro models, ArviZ, files.

- :mod:`~jaxvb.interop.numpyro`: a NumPyro model as a log joint, and ``fit`` for it
  (public as :mod:`jaxvb.numpyro`). A package, imported only on request (it needs
  NumPyro): ``_sites`` reads the model's trace and refuses what jaxvb cannot fit,
  ``_log_joint`` holds ``LogJoint``, ``MinibatchLogJoint`` and ``log_joint``,
  ``_latent`` the ``latent=`` route (the model as a ``LatentGaussian``), ``_result``
  ``NumPyroResult`` (draws on the model's scale, predictive, log-likelihood, ArviZ)
  and ``_fit`` ``fit``.
- :mod:`~jaxvb.interop.arviz`: a result's draws as an ``arviz.InferenceData``.
- :mod:`~jaxvb.interop.io`: ``save`` and ``load`` (public as :mod:`jaxvb.io`); a file
  records a class by its public path (``jaxvb.numpyro.NumPyroResult``), not by the
  module that defines it.
"""
