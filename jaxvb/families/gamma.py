"""Gamma(concentration, rate): independent gamma distributions, one per element."""

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
class Gamma(ScalarFamily):
    r"""Gamma distribution with shape ``concentration`` and inverse scale ``rate``.

    ``log q(x) = (a - 1) log x - b x + a log b - log Gamma(a)`` for ``x > 0``, with
    ``T(x) = (log x, -x)``, ``eta = (a - 1, b)`` and ``U(eta) = log Gamma(a) - a log b``.
    Draws are reparameterised by implicit differentiation
    (:func:`jaxvb._gamma.standard_gamma`).

    Args:
      concentration: shape parameter(s) ``a > 0``.
      rate: rate parameter(s) ``b > 0``, broadcast against ``concentration``.

    Example:
      >>> q = Gamma(concentration=3.0, rate=2.0)
      >>> float(q.mean), float(q.variance)
      (1.5, 0.75)
    """

    concentration: Array
    rate: Array

    def _natural_parts(self):
        return self.concentration - 1.0, self.rate

    def _from_natural_parts(self, e1, e2):
        return build(Gamma, concentration=e1 + 1.0, rate=e2)

    def _stats_parts(self, x):
        return jnp.log(x), -x

    def _log_normalizer_parts(self, e1, e2):
        a = e1 + 1.0
        return gammaln(a) - a * jnp.log(e2)

    def noise(self, key):
        return key

    def from_noise(self, noise):
        return positive(
            standard_gamma(noise, jnp.asarray(self.concentration, self.dtype)) / self.rate
        )

    def in_support(self, x):
        return jnp.all(x > 0)

    @property
    def mean(self):
        return self.concentration / self.rate

    @property
    def variance(self):
        return self.concentration / self.rate**2
