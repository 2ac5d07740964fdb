"""jaxvb and the tools around it: NumPyro models, ArviZ, files.

- :mod:`~jaxvb.interop.numpyro`: a NumPyro model as a log joint, and ``fit`` for it
  (public as :mod:`jaxvb.numpyro`).
- :mod:`~jaxvb.interop.arviz`: a result's draws as an ``arviz.InferenceData``.
- :mod:`~jaxvb.interop.io`: ``save`` and ``load`` (public as :mod:`jaxvb.io`).
"""
