"""How good an approximation is, and what the posterior's normalising constant is.

- :mod:`~jaxvb.diagnostics.evaluation`: the paper's section 4, :func:`evaluate` and its
  :class:`Diagnostics`: the ELBO, ``KL(q || p) ~ s^2 / 2``, ``log p(y) ~ ELBO + s^2 / 2``
  and ``R^2`` from the residual ``log p - log q`` at draws of ``q``, with their Monte
  Carlo standard errors, k-hat, the family's reachable fit and a start's missed mass.
- :mod:`~jaxvb.diagnostics.pareto`: Pareto-smoothed importance sampling,
  :func:`psis` (smoothed weights and k-hat), :func:`khat_sd` (k-hat's Monte
  Carlo spread), :func:`psis_expectation` and
  :func:`psis_resample` (by :func:`resample_indices`).
- :mod:`~jaxvb.diagnostics.evidence`: :func:`mixture_evidence`, a mixture's log evidence
  and KL by defensive importance sampling, where ``s^2 / 2`` does not hold.

``fit`` calls :func:`evaluate` on its result; all of it also runs on its own, under
``jit`` and ``vmap``.
"""

from jaxvb.diagnostics.evaluation import Diagnostics, evaluate
from jaxvb.diagnostics.evidence import (
    EVIDENCE_SCALE,
    EVIDENCE_SHARE,
    MAX_QUASI_RANDOM_DIM,
    Evidence,
    mixture_evidence,
)
from jaxvb.diagnostics.pareto import (
    PSIS,
    khat_sd,
    psis,
    psis_expectation,
    psis_resample,
    resample_indices,
)

__all__ = [
    "EVIDENCE_SCALE",
    "EVIDENCE_SHARE",
    "MAX_QUASI_RANDOM_DIM",
    "PSIS",
    "Diagnostics",
    "Evidence",
    "evaluate",
    "khat_sd",
    "mixture_evidence",
    "psis",
    "psis_expectation",
    "psis_resample",
    "resample_indices",
]
