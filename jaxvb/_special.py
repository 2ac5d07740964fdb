"""Special functions whose JAX derivatives need care.

``jax.scipy.special.betaln`` (JAX 0.10) has a correct value and first derivative, but
its second derivative is wrong for small arguments: at ``(1, 1)`` its Hessian is
``0.1775 * ones((2, 2))`` instead of ``[[1, -0.645], [-0.645, 1]]`` (checked against
``gammaln(a) + gammaln(b) - gammaln(a + b)``). The Beta family's Fisher information
and Algorithm 2 on the beta-binomial model both differentiate it twice, so ``betaln``
here keeps JAX's value and defines the derivative through ``digamma``, which
differentiates correctly to any order.

Its value is also off in float64: by 1.2e-6 at ``(8, 4)`` and 4e-8 at ``(20, 1.5)``
against SciPy, where ``gammaln(a) + gammaln(b) - gammaln(a + b)`` is within 1e-14 (and
within 1e-12 of mpmath up to arguments of 1e3; it loses digits to cancellation beyond,
1e-10 relative at ``(1, 1e6)``). So in float64 the value is that sum, below 1e7.
From 1e7 on the sum cancels (``log B(1, b) = -log b`` is a difference of two
``gammaln`` near ``b log b``), and the value is ``gammaln`` of the smaller argument plus
Stirling's series of the other two terms, written with ``log1p``: within 2e-15
relative of mpmath over arguments from 1e-6 to 1e18, and a sixth of the operations of
JAX's own ``betaln``, which matters because the Beta family's programs call it dozens
of times. In float32 the sum cancels badly for large arguments (3e-3 relative at
``(1e5, 3)``) and JAX's value is kept.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import betaln as _betaln
from jax.scipy.special import digamma, gammaln


@jax.custom_jvp
def betaln(a, b):
    """``log B(a, b)``, with derivatives that are right at every order.

    Example:
      >>> import jax.numpy as jnp
      >>> round(float(betaln(jnp.float64(8.0), jnp.float64(4.0))), 12)   # log(1 / 1320)
      -7.18538701558
    """
    a, b = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b))
    if jnp.result_type(a, b) != jnp.float64:
        return _betaln(a, b)
    by_gammaln = gammaln(a) + gammaln(b) - gammaln(a + b)
    return jnp.where(jnp.maximum(a, b) < 1e7, by_gammaln, _betaln_large(a, b))


def _betaln_large(a, b):
    """``log B(a, b)`` for ``max(a, b) >= 1e7`` in float64: with ``s <= l`` the two
    arguments, ``gammaln(s) + [gammaln(l) - gammaln(s + l)]``, the bracket from
    Stirling's series, whose next term (``1 / (360 l^3)``) is below 1e-23 there."""
    s, l = jnp.minimum(a, b), jnp.maximum(a, b)
    bracket = -s * jnp.log(l) + s - (s + l - 0.5) * jnp.log1p(s / l)
    return gammaln(s) + bracket + (1.0 / l - 1.0 / (s + l)) / 12.0


@betaln.defjvp
def _betaln_jvp(primals, tangents):
    a, b = primals
    da, db = tangents
    a, b = jnp.broadcast_arrays(a, b)
    psi_ab = digamma(a + b)
    return betaln(a, b), (digamma(a) - psi_ab) * da + (digamma(b) - psi_ab) * db
