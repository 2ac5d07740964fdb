"""Special functions whose JAX derivatives need care.

``jax.scipy.special.betaln`` (JAX 0.10) has a correct value and first derivative, but
its second derivative is wrong for small arguments: at ``(1, 1)`` its Hessian is
``0.1775 * ones((2, 2))`` instead of ``[[1, -0.645], [-0.645, 1]]`` (checked against
``gammaln(a) + gammaln(b) - gammaln(a + b)``). The Beta family's Fisher information
and Algorithm 2 on the beta-binomial model both differentiate it twice, so ``betaln``
here keeps JAX's value and defines the derivative through ``digamma``, which
differentiates correctly to any order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import betaln as _betaln
from jax.scipy.special import digamma


@jax.custom_jvp
def betaln(a, b):
    """``log B(a, b)``, with derivatives that are right at every order."""
    return _betaln(a, b)


@betaln.defjvp
def _betaln_jvp(primals, tangents):
    a, b = primals
    da, db = tangents
    a, b = jnp.broadcast_arrays(a, b)
    psi_ab = digamma(a + b)
    return betaln(a, b), (digamma(a) - psi_ab) * da + (digamma(b) - psi_ab) * db
