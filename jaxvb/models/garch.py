"""GARCH(1,1) for daily GBP/USD returns (Bollerslev 1986; as in the Stan User's Guide).

``y_t = mu + e_t``, ``e_t ~ N(0, h_t)``, ``h_t = omega + alpha e_{t-1}^2 + beta h_{t-1}``
for ``t >= 2``, with ``h_1`` fixed at the sample variance of ``y``. Priors as in the
Stan User's Guide's GARCH(1,1) example: flat on ``mu`` and on ``omega > 0``, and
``(alpha, beta)`` uniform on the stationary triangle ``alpha, beta >= 0``,
``alpha + beta < 1`` (flat on ``alpha in (0, 1)`` and on ``beta in (0, 1 - alpha)``).

Unconstrained coordinates ``x = (mu, log omega, logit alpha, logit(beta / (1 - alpha)))``,
shape ``(4,)``; the log Jacobian of the map to ``(mu, omega, alpha, beta)`` is

    log omega + log alpha + 2 log(1 - alpha) + log u + log(1 - u),  u = beta / (1 - alpha).

The data are the paper's GBP/USD series (:func:`jaxvb.data.sv_gbpusd`, 945 daily
% log-returns, 1981-10-02 .. 1985-06-28).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from jaxvb import data


def constrained(x: ArrayLike) -> dict[str, jax.Array]:
    """``mu, omega, alpha, beta`` from the unconstrained ``x``, shape ``(..., 4)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import garch
      >>> p = garch.constrained(jnp.array([0.0, jnp.log(0.01), 0.0, 0.0]))
      >>> {name: round(float(v), 4) for name, v in p.items()}
      {'mu': 0.0, 'omega': 0.01, 'alpha': 0.5, 'beta': 0.25}
    """
    x = jnp.asarray(x)
    alpha = jax.nn.sigmoid(x[..., 2])
    beta = (1.0 - alpha) * jax.nn.sigmoid(x[..., 3])
    return {"mu": x[..., 0], "omega": jnp.exp(x[..., 1]), "alpha": alpha, "beta": beta}


def log_joint(x: ArrayLike, y: ArrayLike) -> jax.Array:
    """Unnormalised log posterior of the unconstrained ``x``, shape ``(4,)`` -> scalar.

    Args:
      x: ``(mu, log omega, logit alpha, logit(beta / (1 - alpha)))``.
      y: returns, shape ``(T,)``.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb import data
      >>> from jaxvb.models import garch
      >>> x = jnp.array([0.0, jnp.log(0.01), -2.0, 2.0])
      >>> round(float(garch.log_joint(x, data.sv_gbpusd())), 3)
      -1168.197
    """
    x = jnp.asarray(x)
    y = jnp.asarray(y, x.dtype)
    mu, log_omega, a, u = x[0], x[1], x[2], x[3]
    omega = jnp.exp(log_omega)
    alpha = jax.nn.sigmoid(a)
    beta = jax.nn.sigmoid(-a) * jax.nn.sigmoid(u)
    e = y - mu
    h1 = jnp.var(y)

    def step(h, e_prev):
        h_next = omega + alpha * e_prev**2 + beta * h
        return h_next, h_next

    _, h_rest = jax.lax.scan(step, h1, e[:-1])
    h = jnp.concatenate([h1[None], h_rest])
    lik = -0.5 * jnp.sum(jnp.log(h) + e**2 / h) - 0.5 * len(y) * math.log(2.0 * math.pi)
    # log |d(mu, omega, alpha, beta) / dx|, with log sigmoid for the tails.
    log_jac = (
        log_omega
        + jax.nn.log_sigmoid(a)
        + 2.0 * jax.nn.log_sigmoid(-a)
        + jax.nn.log_sigmoid(u)
        + jax.nn.log_sigmoid(-u)
    )
    return lik + log_jac


def gbpusd_log_joint():
    """``log_joint(x)`` on the shipped GBP/USD returns (the paper's series).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import garch
      >>> log_joint = garch.gbpusd_log_joint()
      >>> round(float(log_joint(jnp.array([0.0, jnp.log(0.01), -2.0, 2.0]))), 3)
      -1168.197
    """
    y = np.asarray(data.sv_gbpusd(), float)

    def lj(x):
        return log_joint(x, y)

    return lj
