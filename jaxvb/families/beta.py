"""Beta(concentration1, concentration0): independent beta distributions."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxvb._gamma import log_standard_gamma
from jaxvb._special import betaln
from jaxvb.families._base import (
    Array,
    ScalarFamily,
    build,
    register_family,
)


@register_family
class Beta(ScalarFamily):
    r"""Beta distribution on ``(0, 1)`` (names as in NumPyro).

    ``log q(x) = (a - 1) log x + (b - 1) log(1 - x) - log B(a, b)``, with
    ``T(x) = (log x, log(1 - x))``, ``eta = (a - 1, b - 1)`` and ``U(eta) = log B(a, b)``.
    A draw is ``g_a / (g_a + g_b)`` for reparameterised ``g ~ Gamma(a), Gamma(b)``
    (:func:`jaxvb._gamma.log_standard_gamma`, both at once, in log space).

    Args:
      concentration1: ``a > 0``, the exponent of ``x``.
      concentration0: ``b > 0``, the exponent of ``1 - x``.

    Example:
      >>> q = Beta(concentration1=2.0, concentration0=6.0)
      >>> float(q.mean)
      0.25
    """

    concentration1: Array
    concentration0: Array

    def _natural_parts(self):
        return self.concentration1 - 1.0, self.concentration0 - 1.0

    def _from_natural_parts(self, e1, e0):
        return build(Beta, concentration1=e1 + 1.0, concentration0=e0 + 1.0)

    def _stats_parts(self, x):
        return jnp.log(x), jnp.log1p(-x)

    def _log_normalizer_parts(self, e1, e0):
        return betaln(e1 + 1.0, e0 + 1.0)

    def noise(self, key):
        return key

    def from_noise(self, noise):
        a, b = jnp.broadcast_arrays(
            jnp.asarray(self.concentration1, self.dtype),
            jnp.asarray(self.concentration0, self.dtype),
        )
        log_g = log_standard_gamma(noise, jnp.stack([a, b]))
        x = jax.nn.sigmoid(log_g[0] - log_g[1])
        # Draws within eps of 0 or 1 round to exactly 0 or 1 (as Beta(20, 1.5)'s now
        # and then do in float64), where log x or log(1 - x) is -inf. Keep them in the
        # open interval.
        eps = jnp.finfo(x.dtype).eps
        return jnp.clip(x, jnp.finfo(x.dtype).tiny, 1.0 - eps / 2)

    def in_support(self, x):
        return jnp.all((x > 0) & (x < 1))

    @property
    def mean(self):
        return self.concentration1 / (self.concentration1 + self.concentration0)

    @property
    def variance(self):
        a, b = self.concentration1, self.concentration0
        return a * b / ((a + b) ** 2 * (a + b + 1.0))
