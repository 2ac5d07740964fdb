"""InverseGamma(concentration, scale): independent inverse-gamma distributions."""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import gammaln

from jaxvb._gamma import standard_gamma
from jaxvb.families._base import (
    Array,
    ScalarFamily,
    build,
    positive,
    register_family,
)


@register_family
class InverseGamma(ScalarFamily):
    r"""Inverse-gamma distribution with shape ``concentration`` and ``scale``.

    ``log q(x) = -(a + 1) log x - b / x + a log b - log Gamma(a)`` for ``x > 0``, with
    ``T(x) = (-log x, -1/x)``, ``eta = (a + 1, b)`` and ``U(eta) = log Gamma(a) - a log b``.
    A draw is ``scale / g`` with ``g ~ Gamma(a, 1)``, reparameterised
    (:func:`jaxvb._gamma.standard_gamma`).

    Args:
      concentration: shape parameter(s) ``a > 0``.
      scale: scale parameter(s) ``b > 0``, broadcast against ``concentration``.

    Example:
      >>> q = InverseGamma(concentration=3.0, scale=4.0)
      >>> float(q.mean)
      2.0
    """

    concentration: Array
    scale: Array

    def _natural_parts(self):
        return self.concentration + 1.0, self.scale

    def _from_natural_parts(self, e1, e2):
        return build(InverseGamma, concentration=e1 - 1.0, scale=e2)

    def _stats_parts(self, x):
        return -jnp.log(x), -1.0 / x

    def _log_normalizer_parts(self, e1, e2):
        a = e1 - 1.0
        return gammaln(a) - a * jnp.log(e2)

    def noise(self, key):
        return key

    def from_noise(self, noise):
        return positive(
            self.scale / standard_gamma(noise, jnp.asarray(self.concentration, self.dtype))
        )

    def in_support(self, x):
        return jnp.all(x > 0)

    def _support_point(self):
        return self.scale / (self.concentration + 1.0)  # the mode; the mean may not exist

    @property
    def mean(self):
        """``scale / (a - 1)``; infinite for ``a <= 1``."""
        a = self.concentration
        return jnp.where(a > 1, self.scale / (a - 1.0), jnp.inf)

    @property
    def variance(self):
        """``scale^2 / ((a - 1)^2 (a - 2))``; infinite for ``a <= 2``."""
        a = self.concentration
        return jnp.where(a > 2, self.scale**2 / ((a - 1.0) ** 2 * (a - 2.0)), jnp.inf)
