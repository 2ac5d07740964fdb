"""Section 5.1: factor structure -- one small regression per likelihood site.

For a :class:`jaxvb.Factors` log joint, ``log p(x) = log N(x; m0, P0^{-1}) +
sum_i log phi_i(f_i)`` with ``f_i = v_i' x``, the KL-optimal Gaussian ``q(x)`` is the
prior times one Gaussian term in each ``f_i`` (the site ``exp(h_i f_i - p_i f_i^2 / 2)``):
``log phi_i`` has zero partial correlation with every statistic of ``q(x)`` once those
of the marginal ``q(f_i) = N(mu_i, s_i^2)`` are controlled for. So instead of one
regression of dimension ``1 + M(M+3)/2`` the method runs ``N`` regressions of dimension
3 (vmapped), and assembles

    P = P0 + V' diag(p) V,    P m = P0 m0 + V' h.

The prior is conjugate and enters exactly. Three estimators of the site parameters:

- ``"regression"`` ("Factor" in the paper's figure): Algorithm 1 per site, regressing
  ``log phi_i(f_i*)`` on ``(1, f_i*, -f_i*^2 / 2)`` with ``C`` and ``g`` from the same
  draw.
- ``"gradient"`` ("FactorGradient", sec. 5.2): per site ``g^ = ds/deta log phi_i'(f*)``
  and ``C^ = ds/deta dT/df (f*)`` with ``s(eta, z) = mu + s z`` differentiated in the
  natural parameters ``eta = (mu / s^2, 1 / s^2)`` of ``q(f_i)`` (the paper's
  equations); a 2-dimensional regression, without intercept.
- ``"hessian"`` (sec. 5.3, Algorithm 2 per site): ``a_i = E[log phi_i'(f)]``,
  ``p_i = -E[log phi_i''(f)]``, ``z_i = E[f_i]``, and ``h_i = a_i + p_i z_i``. It is
  Algorithm 2 on ``x`` with the Hessian ``V' diag(log phi'') V`` assembled from ``N``
  scalar second derivatives instead of ``jax.hessian`` of the whole log joint.

Draws are of ``x`` (``f = V x``, the sites' draws correlated as in the paper's default);
the sites start flat, so the first iterate is the prior whatever ``q0`` is -- ``q0``
supplies only the first draw (the paper starts every method from the prior).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from jaxvb._algebra import precision_factor, solve_equilibrated, solve_gram, solve_precision
from jaxvb.families._base import build
from jaxvb.families.gaussian import Gaussian
from jaxvb.methods._base import Method
from jaxvb.methods._registry import register
from jaxvb.structure import Factors

ESTIMATORS = ("regression", "gradient", "hessian")


class SiteStats(NamedTuple):
    """Per-site statistics, leading axis ``N``.

    ``"regression"``: ``C`` ``(N, 3, 3)`` and ``g`` ``(N, 3)`` (intercept first);
    ``"gradient"``: ``C`` ``(N, 2, 2)`` and ``g`` ``(N, 2)``;
    ``"hessian"``: ``C`` is ``p`` ``(N,)``, ``g`` is ``(a, z)`` ``(N, 2)``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jax.scipy.special import log_ndtr
      >>> design, y = jnp.array([[1.0, 0.5], [1.0, -1.0], [1.0, 2.0]]), jnp.array([1.0, 0.0, 1.0])
      >>> model = jaxvb.Factors(jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
      ...                       lambda f, y_i: log_ndtr((2 * y_i - 1) * f), design, y)
      >>> method = jaxvb.methods.sites("gradient")
      >>> stats = method.init(jax.random.key(0), model.prior, model)
      >>> stats.C.shape, stats.g.shape   # one 2-d regression per site
      ((3, 2, 2), (3, 2))
      >>> method.solve(stats, model.prior, model)   # the sites start flat: q is the prior
      Gaussian(mean=[0.0, 0.0], cov=[[1.0, 0.0], [0.0, 1.0]])
    """

    C: jax.Array
    g: jax.Array


def _marginals(model: Factors, q: Gaussian) -> tuple[jax.Array, jax.Array]:
    """Mean and variance of each ``f_i = v_i' x`` under ``q``."""
    v = model.design
    # v_i' cov v_i = |U^{-1} v_i|^2 for the precision factor U: one triangular solve
    # with the N rows as right-hand sides, no covariance.
    w = solve_triangular(q.precision_factor, v.T, lower=False)
    return v @ q.mean, jnp.sum(w**2, axis=0)


def _assemble(model: Factors, h: jax.Array, p: jax.Array) -> Gaussian:
    """``q(x)`` from the site parameters: prior times ``exp(h f - p f^2 / 2)`` per site."""
    v, prior = model.design, model.prior
    p0 = prior.precision
    precision = p0 + (v.T * p) @ v
    linear = p0 @ prior.mean + v.T @ h
    factor = precision_factor(precision)
    return build(Gaussian, mean=solve_precision(factor, linear), precision_factor=factor)


def _factors(model) -> Factors:
    if not isinstance(model, Factors):
        raise TypeError(
            f"method='sites' needs the log joint as a jaxvb.Factors (a Gaussian prior "
            f"and sites in f_i = v_i' x), got {type(model).__name__}; wrap the model as "
            "jaxvb.Factors(prior, site_log_lik, design, data), or use method='hessian'."
        )
    return model


def _site_derivatives(model: Factors, f: jax.Array) -> tuple[jax.Array, jax.Array]:
    """First and second derivatives of each site's log likelihood at ``f``."""
    d1 = jax.vmap(jax.grad(model.site_log_lik))(f, model.data)
    d2 = jax.vmap(jax.grad(jax.grad(model.site_log_lik)))(f, model.data)
    return d1, d2


def _init(key, q0, log_joint, estimator: str) -> SiteStats:
    """The sites' statistics at ``q0``, the sites flat (``h = p = 0``)."""
    model = _factors(log_joint)
    if not isinstance(q0, Gaussian) or q0.dim != model.prior.dim:
        raise TypeError(
            f"method='sites' fits a jaxvb.Gaussian of the prior's dimension "
            f"{model.prior.dim}, got q0 = {type(q0).__name__}"
        )
    mu, s2 = _marginals(model, q0)
    if estimator == "regression":
        # E_q0[t t'] for t = (1, f, -f^2/2), from the Gaussian moments of f.
        e2 = mu**2 + s2
        e3 = mu**3 + 3 * mu * s2
        e4 = mu**4 + 6 * mu**2 * s2 + 3 * s2**2
        one = jnp.ones_like(mu)
        c = jnp.stack(
            [
                jnp.stack([one, mu, -e2 / 2], -1),
                jnp.stack([mu, e2, -e3 / 2], -1),
                jnp.stack([-e2 / 2, -e3 / 2, e4 / 4], -1),
            ],
            -2,
        )
        # Flat sites (h = p = 0) with the intercept estimated as E_q0[log phi_i], so
        # that the first regressions are not spent absorbing it (cf. Algorithm 1).
        x = q0.sample(key, (8,))
        vals = jax.vmap(lambda xi: model.site_values(model.design @ xi))(x)
        ok = jnp.isfinite(vals)
        eta0 = jnp.sum(jnp.where(ok, vals, 0.0), 0) / jnp.maximum(jnp.sum(ok, 0), 1)
        return SiteStats(C=c, g=c[:, :, 0] * eta0[:, None])
    if estimator == "gradient":
        # Cov_q0[T, T] for T = (f, -f^2/2), and g = C eta with flat sites (eta = 0).
        c = jnp.stack(
            [
                jnp.stack([s2, -mu * s2], -1),
                jnp.stack([-mu * s2, mu**2 * s2 + s2**2 / 2], -1),
            ],
            -2,
        )
        return SiteStats(C=c, g=jnp.zeros_like(c[..., 0]))
    return SiteStats(C=jnp.zeros_like(mu), g=jnp.stack([jnp.zeros_like(mu), mu], -1))


def _site_stats(model: Factors, q: Gaussian, f, vals, bad, estimator: str) -> SiteStats:
    """One draw's statistics of every site, from ``f = V x``, the sites' log
    likelihoods ``vals`` there and ``bad`` (NaN where ``vals`` is not finite, else 0)."""
    if estimator == "regression":
        t = jnp.stack([jnp.ones_like(f), f, -0.5 * f**2], -1)
        return SiteStats(C=t[:, :, None] * t[:, None, :], g=t * (vals + bad)[:, None])
    if estimator == "gradient":
        mu, s2 = _marginals(model, q)
        s = jnp.sqrt(s2)
        z = (f - mu) / s
        ds = jnp.stack([s2, -s2 * (mu + 0.5 * s * z)], -1)  # ds / d(eta1, eta2)
        dt = jnp.stack([jnp.ones_like(f), -f], -1)  # dT / df for T = (f, -f^2/2)
        return SiteStats(
            C=ds[:, :, None] * dt[:, None, :],
            g=ds * (_site_derivatives(model, f)[0] + bad)[:, None],
        )
    d1, d2 = _site_derivatives(model, f)
    a = d1 + bad
    p = -d2
    return SiteStats(C=p, g=jnp.stack([a, f], -1))


@functools.cache
def sites(estimator: str = "regression") -> Method:
    """Factor structure (section 5.1) for a :class:`jaxvb.Factors` log joint.

    Args:
      estimator: ``"regression"`` (Algorithm 1 per site, 3-dimensional), ``"gradient"``
        (the site gradient estimator of section 5.2, 2-dimensional) or ``"hessian"``
        (Algorithm 2 per site); see :mod:`jaxvb.methods.sites`.

    Returns:
      A :class:`~jaxvb.methods.Method` for :func:`jaxvb.fit`; it reads the factors of
      the ``log_joint`` given to ``fit``, which must be a :class:`jaxvb.Factors`. The
      fit is a :class:`~jaxvb.Gaussian`. ``method="sites"`` is ``sites("regression")``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jax.scipy.special import log_ndtr
      >>> design = jnp.array([[1.0, 0.5], [-0.3, 1.0], [0.8, -1.2]])
      >>> y = jnp.array([1.0, 0.0, 1.0])
      >>> probit = lambda f, yi: log_ndtr((2 * yi - 1) * f)
      >>> model = jaxvb.Factors(jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)), probit, design, y)
      >>> res = jaxvb.fit(model, model.prior, jax.random.key(0), num_steps=1000,
      ...                 method=jaxvb.methods.sites("gradient"))
      >>> res.q.mean.round(1).tolist(), bool(res.r_squared > 0.95)
      ([0.9, -0.5], True)
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")

    def init_fn(key, q0, log_joint):
        return _init(key, q0, log_joint, estimator)

    def noise_fn(key, q):
        return q.noise(key)

    def estimate_fn(noise, q, log_joint):
        model = _factors(log_joint)
        x = q.from_noise(noise)
        f = model.design @ x
        vals = model.site_values(f)
        log_p = model.prior.log_prob(x) + jnp.sum(vals)
        # A site whose log likelihood is not finite makes the draw's statistics
        # non-finite, so that fit leaves the draw out and flags it.
        bad = jnp.where(jnp.isfinite(vals), 0.0, jnp.nan)
        stats = _site_stats(model, q, f, vals, bad, estimator)
        return stats, x, log_p

    def solve_fn(stats, q, log_joint):
        del q
        model = _factors(log_joint)
        if estimator == "regression":
            eta = jax.vmap(solve_gram)(stats.C, stats.g)
            h, p = eta[:, 1], eta[:, 2]
        elif estimator == "gradient":
            eta = jax.vmap(solve_equilibrated)(stats.C, stats.g)
            h, p = eta[:, 0], eta[:, 1]
        else:
            p = stats.C
            h = stats.g[:, 0] + p * stats.g[:, 1]
        return _assemble(model, h, p)

    min_draws = {"regression": 3, "gradient": 2, "hessian": 1}[estimator]
    return Method(
        name=f"sites({estimator})",
        init=init_fn,
        noise=noise_fn,
        estimate=estimate_fn,
        solve=solve_fn,
        min_draws=lambda q: min_draws,
    )


register("sites", sites)
