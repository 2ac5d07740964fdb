r"""Latent Gaussian models: hyperparameters ``theta`` and a Gaussian field ``f`` given them.

``log p(theta, f, y) = log p(theta) + log N(f | m(theta), Q(theta)^{-1}) + sum_t log
p(y_t | f_t)``, approximated by ``q(theta) q(f | theta)``: a Gaussian over the
hyperparameters and, given them, the exact prior times Gaussian sites (the paper's
section 6.1). ``jaxvb.fit(model, theta0, key, num_steps=...)`` fits it.

What lives where:

- :mod:`~jaxvb.latent.model`: :class:`LatentGaussian`, the model, its pieces as the
  engine calls them, and its validation.
- :mod:`~jaxvb.latent.start`: the start, a Laplace approximation in one compiled
  program (Newton's method for the sites, :func:`jaxvb.laplace` for ``q(theta)``).
- :mod:`~jaxvb.latent.approximation`: :class:`LatentGaussianApproximation`, the fitted
  ``q``, with its draws, densities and importance resampling
  (:class:`LatentImportance`).
- :mod:`~jaxvb.latent.method`: :func:`latent_gaussian`, the method ``jaxvb.fit`` runs,
  and its ways of forming ``q(theta)``'s precision.
- :mod:`~jaxvb.latent.target`: ``q(f | theta)`` given the sites and the
  hyperparameters' target ``L(theta)``, shared by the start, the method and the
  hierarchical blocks.
- :mod:`~jaxvb.latent._field`: the algebra of ``q(f | theta)`` for dense, banded and
  arrowhead precisions.
- :mod:`~jaxvb.latent.hierarchical` and :mod:`~jaxvb.latent.blocks`: the same model
  with the paper's exponential-family ``q(theta)`` (section 6.1's hierarchical blocks,
  public as :mod:`jaxvb.composite`).
"""

from jaxvb.latent.approximation import LatentGaussianApproximation, LatentImportance
from jaxvb.latent.method import latent_gaussian
from jaxvb.latent.model import LatentGaussian

__all__ = [
    "LatentGaussian",
    "LatentGaussianApproximation",
    "LatentImportance",
    "latent_gaussian",
]
