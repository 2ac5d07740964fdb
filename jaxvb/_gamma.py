r"""Standard gamma draws with implicit reparameterisation gradients, vectorised.

Why not ``jax.random.gamma``: on CPU (jax 0.10) it loops over the elements with
``lax.map``, once to sample and once more for the derivative, and that derivative
(``lax.random_gamma_grad``) runs a series and a continued fraction in ``while`` loops
whose length grows like ``sqrt(a)``: in a fit that draws many gammas (the
stochastic-volatility model) a large share of its time. Here both are branch-free array
code over all elements at once.

Draws: Marsaglia & Tsang (2000), ``num_candidates`` proposals per element drawn at once
and the first accepted one kept; the rare element with none accepted (probability
below ``0.05 ** num_candidates`` for ``a >= 1``) draws again in a ``while`` loop, so the
draws are exact. The loop stops after ``_MAX_ROUNDS`` rounds whatever the input (an
element still without a draw, which needs a shape that is not finite and positive or a
chance below ``0.05 ** (num_candidates * _MAX_ROUNDS)``, gets NaN): every loop of a
compiled fit has a bound. ``a < 1`` is boosted: ``G(a) = G(a + 1) U^(1/a)``, in log space.

Derivative: the paper's section 5.2 remark -- any sampler will do, and the draw is then
differentiated *as if* by inverse transform (Figurnov et al. 2018's implicit
reparameterisation): ``dx/da = -dP(a, x)/da / p(x; a)``. With ``t = a e^w`` and
``phi(w) = a (w - e^w)`` the density of ``w`` is ``exp(phi(w) + const)``, so

    d log x / d a = -int_{-inf}^{w_x} (log a - psi(a) + w) exp(phi(w) - phi(w_x)) dw
                  = +int_{w_x}^{inf}  (same integrand) dw        (the integrand's total is 0).

The side away from the mode is integrated by 48-point Gauss--Legendre over a range
that holds all but ``e^-40`` of it; for ``x < a < 10``, where the left tail is long in
``w``, the series of ``P(a, x)`` (64 terms, as ``jax.lax`` does but unrolled) is used
instead. Relative error against ``mpmath`` is below ``1e-10`` for ``a`` in
``[0.05, 1e6]`` at every quantile tested (``tests/families/test_families.py``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import digamma

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(48)
_NODES = (_NODES + 1.0) / 2.0  # on [0, 1]
_WEIGHTS = _WEIGHTS / 2.0
_SERIES_TERMS = 64
_SERIES_BELOW = 10.0  # x < a < this: the series, else quadrature


def _log_a_minus_digamma(a):
    """``log a - psi(a)``; its asymptotic series where the difference cancels."""
    big = jnp.maximum(a, _SERIES_BELOW)
    r = 1.0 / (big * big)
    series = 0.5 / big + r * (
        1.0 / 12.0 - r * (1.0 / 120.0 - r * (1.0 / 252.0 - r * (1.0 / 240.0 - r / 132.0)))
    )
    small = jnp.minimum(a, _SERIES_BELOW)
    return jnp.where(a >= _SERIES_BELOW, series, jnp.log(small) - digamma(small))


def _quadrature(a, w_x, lo, hi):
    """``int_lo^hi (log a - psi(a) + w) exp(phi(w) - phi(w_x)) dw``, elementwise."""
    nodes = jnp.asarray(_NODES, a.dtype)
    weights = jnp.asarray(_WEIGHTS, a.dtype)
    w = lo[..., None] + (hi - lo)[..., None] * nodes
    d = w - w_x[..., None]
    # phi(w) - phi(w_x) = a (d - e^{w_x} (e^d - 1)), without cancellation near d = 0.
    expo = a[..., None] * (d - jnp.exp(w_x)[..., None] * jnp.expm1(d))
    f = _log_a_minus_digamma(a)[..., None] + w
    return jnp.sum(weights * f * jnp.exp(expo), axis=-1) * (hi - lo)


def _series(a, log_x):
    """``d log x / d a`` from the series of ``P(a, x)`` (for ``x < a < 10``)."""
    k = jnp.arange(1, _SERIES_TERMS, dtype=a.dtype)
    log_ratio = log_x[..., None] - jnp.log(a[..., None] + k)  # log(x / (a + k))
    c = jnp.exp(jnp.cumsum(log_ratio, axis=-1))  # c_n = prod_{k <= n} x / (a + k)
    dc = -c * jnp.cumsum(1.0 / (a[..., None] + k), axis=-1)  # d c_n / d a
    ans = 1.0 + jnp.sum(c, axis=-1)
    dans = jnp.sum(dc, axis=-1)
    # P(a, x) = x^a e^-x / Gamma(a + 1) * ans, and p(x; a) = x^(a-1) e^-x / Gamma(a).
    return -(dans + ans * (log_x - digamma(a + 1.0))) / a


def log_sample_derivative(a, log_x):
    """``d log x / d a`` for a standard gamma draw ``x`` of shape ``a`` (implicit)."""
    a = jnp.asarray(a)
    log_x = jnp.asarray(log_x, a.dtype)
    a, log_x = jnp.broadcast_arrays(a, log_x)
    w_x = log_x - jnp.log(a)
    sqrt_a = jnp.sqrt(a)
    below = w_x < 0.0
    # Ranges outside which the exponent E(d) = a d - x (e^d - 1), d = w - w_x, is below
    # about -45 (E is concave with its maximum on the other side, so it only falls).
    # Left (x < a, a >= 10 here): Gaussian of sd 1/sqrt(a) near the mode, exponential of
    # rate a - x beyond. Right (x >= a): E <= -x d^2 / 2 gives sqrt(100 / x), and
    # E <= -x (e^d - 1 - d) the logarithmic bound that is shorter when x is small.
    x = jnp.exp(log_x)
    left = -jnp.maximum(10.0 / sqrt_a, 45.0 / a)
    right = jnp.minimum(jnp.sqrt(100.0 / x), 1.1 * jnp.log1p(60.0 / x) + 1.0)
    w_safe = jnp.where(below, w_x, 0.0)
    left_part = -_quadrature(a, w_safe, w_safe + left, w_safe)
    w_right = jnp.where(below, 0.0, w_x)
    right_part = _quadrature(a, w_right, w_right, w_right + right)
    use_series = below & (a < _SERIES_BELOW)
    series = _series(jnp.where(use_series, a, 1.0), jnp.where(use_series, log_x, -1.0))
    return jnp.where(below, jnp.where(use_series, series, left_part), right_part)


@jax.custom_jvp
def _reparameterised(a, log_x):
    """``log_x`` (a draw at ``a``), with the implicit derivative in ``a``."""
    return log_x


@_reparameterised.defjvp
def _reparameterised_jvp(primals, tangents):
    a, log_x = primals
    a_dot, _ = tangents  # log_x is a draw: no tangent of its own
    return log_x, log_sample_derivative(a, log_x) * a_dot


#: Rounds of ``num_candidates`` proposals at most (the first one included).
_MAX_ROUNDS = 64


def _uniforms(key, a, num_candidates):
    """All the randomness of one round, from one call of the generator.

    ``num_candidates`` standard normals and log-uniforms for Marsaglia--Tsang, and one
    uniform for the boost of shapes below 1. One ``uniform`` call instead of five
    (splits, ``normal``, ``uniform``): inside a fit's loop each call is a chain of
    small steps of its own (hashing, copies of keys), a visible share of the SV fit.
    """
    u = jax.random.uniform(key, (2 * num_candidates + 1,) + a.shape, a.dtype)
    # The normals as jax.random.normal makes them: sqrt(2) erfinv(w), w in (-1, 1).
    lo = jnp.nextafter(jnp.asarray(-1.0, a.dtype), jnp.asarray(0.0, a.dtype))
    w = jnp.maximum(2.0 * u[:num_candidates] - 1.0, lo)
    z = math.sqrt(2.0) * jax.lax.erf_inv(w)
    return z, jnp.log(u[num_candidates:-1]), u[-1]


def _marsaglia_tsang(z, log_u, a):
    """Log draws of ``Gamma(a)`` for ``a >= 1`` and whether each was accepted."""
    d = a - 1.0 / 3.0
    c = 1.0 / jnp.sqrt(9.0 * d)
    v = 1.0 + c * z  # the draw is d v^3, for v > 0
    log_v = jnp.log(jnp.where(v > 0, v, 1.0))
    ok = (v > 0) & (log_u < 0.5 * z * z + d - d * v**3 + 3.0 * d * log_v)
    index = jax.lax.broadcasted_iota(jnp.int32, ok.shape, 0)
    found, _, picked = jax.lax.reduce(
        (ok, index, log_v),
        (
            jnp.array(False),
            jnp.array(np.iinfo(np.int32).max, jnp.int32),
            jnp.zeros((), log_v.dtype),
        ),
        _first_accepted,
        (0,),
    )
    return jnp.log(d) + 3.0 * picked, found


def _first_accepted(x, y):
    """The reduction of :func:`_marsaglia_tsang`: of two candidates ``(accepted,
    index, log v)`` the accepted one, the earlier if both or neither are.

    One reduction gives the first accepted candidate and whether there is one
    (``jnp.argmax``, a gather and ``jnp.any`` are three, and XLA copies the candidates'
    computation, an inverse error function of a few hundred operations, into each).
    """
    ok_x, i_x, v_x = x
    ok_y, i_y, v_y = y
    take_x = (ok_x & ~ok_y) | ((ok_x == ok_y) & (i_x < i_y))
    return ok_x | ok_y, jnp.where(take_x, i_x, i_y), jnp.where(take_x, v_x, v_y)


def log_standard_gamma(key, a, num_candidates: int = 4):
    """``log`` of draws of ``Gamma(a, 1)``, shape of ``a``, reparameterised in ``a``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxvb._gamma import log_standard_gamma
      >>> a = jnp.array([0.5, 3.0, 300.0])
      >>> log_x = log_standard_gamma(jax.random.key(0), a)
      >>> log_x.shape, bool(jnp.all(jnp.isfinite(log_x)))
      ((3,), True)
      >>> d = jax.grad(lambda a: log_standard_gamma(jax.random.key(0), a).sum())(a)
      >>> bool(jnp.all(d > 0))   # larger shapes, larger draws
      True
    """
    a = jnp.asarray(a)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(float)
    alpha = jax.lax.stop_gradient(a)
    boost = alpha < 1.0
    a1 = jnp.where(boost, alpha + 1.0, alpha)
    z, log_u, u_boost = _uniforms(key, a1, num_candidates)
    log_x, found = _marsaglia_tsang(z, log_u, a1)
    # A shape that is not positive and finite (NaN, inf) is never accepted (at inf the
    # acceptance test is inf - inf): mark it done, so the retry loop ends, and give it
    # a NaN draw.
    valid = (alpha > 0) & jnp.isfinite(alpha)
    found = found | ~valid

    def more(carry):
        i, log_x, found = carry
        z, log_u, _ = _uniforms(jax.random.fold_in(key, i), a1, num_candidates)
        new, new_found = _marsaglia_tsang(z, log_u, a1)
        take = ~found & new_found
        return i + 1, jnp.where(take, new, log_x), found | new_found

    _, log_x, found = jax.lax.while_loop(
        lambda carry: (carry[0] < _MAX_ROUNDS) & ~jnp.all(carry[2]),
        more,
        (jnp.ones((), jnp.uint32), log_x, found),
    )
    # Gamma(a) = Gamma(a + 1) U^(1/a); log U = log1p(-U') keeps U > 0.
    log_x = jnp.where(boost, log_x + jnp.log1p(-u_boost) / alpha, log_x)
    log_x = jnp.where(valid & found, log_x, jnp.nan)
    return _reparameterised(a, jax.lax.stop_gradient(log_x))


def standard_gamma(key, a, num_candidates: int = 4):
    """Draws of ``Gamma(a, 1)``, reparameterised in ``a``; ``exp`` of the log draws.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxvb._gamma import standard_gamma
      >>> x = standard_gamma(jax.random.key(0), jnp.full((20000,), 4.0))
      >>> abs(float(x.mean()) - 4.0) < 0.05   # mean a, sd sqrt(a / 20000) = 0.014
      True
    """
    return jnp.exp(log_standard_gamma(key, a, num_candidates))
