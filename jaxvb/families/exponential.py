"""Exponential(rate): independent exponential distributions, one per element."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxvb.families._base import (
    Array,
    ScalarFamily,
    build,
    positive,
    register_family,
)


@register_family
class Exponential(ScalarFamily):
    r"""Exponential distribution, ``q(x) = rate * exp(-rate * x)`` for ``x > 0``.

    Sufficient statistic ``T(x) = -x`` and natural parameter ``eta = rate``, so that
    ``U(eta) = -log(eta)`` (the parametrisation of the paper's toy example, section 3.1).
    An array ``rate`` describes independent components; the event shape is its shape.

    Args:
      rate: positive rate(s), any shape.

    Example:
      >>> q = Exponential(rate=2.0)
      >>> float(q.mean)
      0.5
    """

    rate: Array

    def _natural_parts(self):
        return (self.rate,)

    def _from_natural_parts(self, rate):
        return build(Exponential, rate=rate)

    def _stats_parts(self, x):
        return (-x,)

    def _log_normalizer_parts(self, rate):
        return -jnp.log(rate)

    def noise(self, key):
        return jax.random.exponential(key, self.event_shape, self.dtype)

    def from_noise(self, noise):
        return positive(noise / self.rate)

    def antithetic(self, noise):
        # The standard exponential at the reflected uniform: F(e') = 1 - F(e). A noise of
        # exactly 0 (probability 2^-23 in float32) would map to inf: clamp it.
        noise = jnp.maximum(noise, jnp.finfo(noise.dtype).tiny)
        return -jnp.log(-jnp.expm1(-noise))

    def in_support(self, x):
        return jnp.all(x >= 0)

    @property
    def mean(self):
        return 1.0 / self.rate

    @property
    def variance(self):
        return 1.0 / self.rate**2
