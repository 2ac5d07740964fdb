"""The beta-binomial model for overdispersion (paper, section 6.2.1; Albert 2009, 5.4).

``y_j ~ BetaBinomial(n_j, K m, K (1 - m))`` with the improper prior
``p(m, K) ∝ 1 / (m (1 - m)) / (1 + K)^2``, in the unconstrained coordinates
``x = (logit m, log K)``:

    log p(x | y) = sum_j [lbeta(K m + y_j, K (1 - m) + n_j - y_j) - lbeta(K m, K (1 - m))]
                   + x2 - 2 log(1 + e^x2) + const.

The constant drops the binomial coefficients, which do not depend on ``x``.

Each ``lbeta`` difference is a sum of log rising factorials ``lgamma(c + k) - lgamma(c)``
(:func:`_log_rising`). Written as differences of ``lgamma`` (or of ``betaln``) they
cancel catastrophically for large ``K``: in float64 the log joint loses all its digits
by ``log K = 60`` (the ``lgamma`` values reach 1e26 there), which a draw in the tail of
a wide approximation reaches, and one such draw ruins the diagnostics' variance. Above ``c = 1e5`` the difference is taken from Stirling's series
in a form without cancellation; the log joint is then within 2e-9 of a 60-digit
reference for ``log K`` from -3 to 60 (``tests/diagnostics/test_mixture_diagnostics.py``). In
float32 the ``betaln`` form is kept (its float32 value is the more accurate below
``log K ~ 15``, which is where the posterior is).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln

from jaxvb import data
from jaxvb._special import betaln

#: The authors' single-Gaussian fit (their published code): mean and precision.
PAPER_GAUSSIAN_MEAN = (-6.8240, 7.8287)
PAPER_GAUSSIAN_PRECISION = ((18.1893, 1.7892), (1.7892, 1.0084))
#: The posterior mode quoted in the data notes.
PAPER_MODE = (-6.82, 7.58)


def _log_rising(c: jax.Array, k: jax.Array) -> jax.Array:
    """``log Gamma(c + k) - log Gamma(c)`` for ``c > 0``, ``k >= 0`` (float64), for any ``c``.

    Below ``c = 1e5`` the difference of ``gammaln``; above, Stirling's series
    ``lgamma(z) = (z - 1/2) log z - z + log(2 pi)/2 + 1/(12 z) - 1/(360 z^3) + ...``
    differenced term by term so that nothing large cancels:
    ``(c - 1/2) log1p(k/c) + k log(c + k) - k - k/(12 c (c + k)) + ...``, whose
    truncation error is below ``1/(1260 c^5)``. Both branches are smooth, so
    ``jax.hessian`` sees the right curvature on either side.
    """
    big = 1e5
    large = c >= big
    cs = jnp.where(large, c, big)  # the Stirling branch never sees a small c
    inv_c, inv_ck = 1.0 / cs, 1.0 / (cs + k)
    stirling = (
        (cs - 0.5) * jnp.log1p(k * inv_c)
        + k * jnp.log(cs + k)
        - k
        - k * inv_c * inv_ck / 12.0
        + (inv_c**3 - inv_ck**3) / 360.0
    )
    cl = jnp.where(large, 1.0, c)
    return jnp.where(large, stirling, gammaln(cl + k) - gammaln(cl))


def log_joint(x: jax.Array, y: jax.Array, n: jax.Array) -> jax.Array:
    """Unnormalised log posterior of ``x = (logit m, log K)``, shape ``(2,)`` -> scalar.

    Args:
      x: ``(logit m, log K)``.
      y: deaths per city, shape ``(J,)``.
      n: numbers at risk, shape ``(J,)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb import data
      >>> from jaxvb.models import beta_binomial
      >>> y, n = data.cancer_mortality()
      >>> x = jnp.array([-6.82, 7.58])   # the posterior mode
      >>> round(float(beta_binomial.log_joint(x, jnp.asarray(y, float), jnp.asarray(n, float))), 3)
      -571.376
    """
    logit_m, log_k = x[0], x[1]
    k = jnp.exp(log_k)
    # m and 1 - m from the logit directly, which stays accurate in the far tails.
    a = k * jax.nn.sigmoid(logit_m)
    b = k * jax.nn.sigmoid(-logit_m)
    # lbeta(a + y, b + n - y) - lbeta(a, b), as rising factorials (see the module note)
    if a.dtype == jnp.float64:
        lik = jnp.sum(_log_rising(a, y) + _log_rising(b, n - y) - _log_rising(a + b, n))
    else:
        lik = jnp.sum(betaln(a + y, b + n - y) - betaln(a, b))
    return lik + log_k - 2.0 * jax.nn.softplus(log_k)


def cancer_mortality_log_joint():
    """``log_joint(x)`` on the shipped cancer-mortality data (20 Missouri cities).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import beta_binomial
      >>> log_joint = beta_binomial.cancer_mortality_log_joint()
      >>> round(float(log_joint(jnp.array([-6.82, 7.58]))), 3)
      -571.376
    """
    y, n = data.cancer_mortality()
    y = jnp.asarray(y, float)
    n = jnp.asarray(n, float)

    def lj(x):
        return log_joint(x, y.astype(x.dtype), n.astype(x.dtype))

    return lj
