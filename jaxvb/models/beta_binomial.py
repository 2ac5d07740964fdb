"""The beta-binomial model for overdispersion (paper, section 6.2.1; Albert 2009, 5.4).

``y_j ~ BetaBinomial(n_j, K m, K (1 - m))`` with the improper prior
``p(m, K) ∝ 1 / (m (1 - m)) / (1 + K)^2``, in the unconstrained coordinates
``x = (logit m, log K)``:

    log p(x | y) = sum_j [lbeta(K m + y_j, K (1 - m) + n_j - y_j) - lbeta(K m, K (1 - m))]
                   + x2 - 2 log(1 + e^x2) + const.

The constant drops the binomial coefficients, which do not depend on ``x``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxvb import data
from jaxvb._special import betaln

#: The authors' single-Gaussian fit (their published code): mean and precision.
PAPER_GAUSSIAN_MEAN = (-6.8240, 7.8287)
PAPER_GAUSSIAN_PRECISION = ((18.1893, 1.7892), (1.7892, 1.0084))
#: The posterior mode quoted in the data notes.
PAPER_MODE = (-6.82, 7.58)


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
