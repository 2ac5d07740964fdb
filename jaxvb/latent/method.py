r"""The latent Gaussian method: Algorithm 2 for both blocks, Rao-Blackwellised over ``f``.

Each step draws ``theta ~ q(theta)`` and, given the current sites, computes exactly (the
one-dimensional site expectations by Gauss-Hermite quadrature, no Monte Carlo):

* the hyperparameters' target, the ELBO with ``f`` integrated out,

      L(theta) = log p(theta) + log Z(theta) + sum_t E_{q(f_t|theta)}[log p(y_t|f_t)
                 - b_t f_t + a_t f_t^2 / 2],
      Z(theta) = ∫ N(f | m, Q^{-1}) exp(b'f - f' diag(a) f / 2) df   (closed form),

  so that ``ELBO = E_q(theta)[L(theta)] + H[q(theta)]`` (:mod:`jaxvb.latent.target`);
  its gradient (reverse mode through the factorisation), regressed on the draws of
  ``theta`` (the paper's gradient regression, sec. 5.2), gives ``q(theta)``; where the
  factorisation is costly, its values instead (the paper's Algorithm 1, no reverse
  pass), or the Hessian at each draw, as in Algorithm 2 (:func:`latent_gaussian`'s
  ``hessian``). By default each site's ``E[log r_t]`` (``r_t = p(y_t|f_t) / exp(b_t
  f_t - a_t f_t^2 / 2)``) is replaced by ``log E[r_t]``: expectation propagation's
  approximation of ``log p(y, theta)`` at these sites, not a bound, but without the
  ELBO's gap ``KL(q(f | theta) || p(f | theta, y))``, which varies with ``theta`` and
  pulls ``q(theta)`` towards small prior variances where the counts are small
  (:func:`latent_gaussian`'s ``target``; the paper's ELBO is ``target="elbo"``);
* the sites' statistics: ``E[d/df_t log p(y_t|f_t)]``, ``E[-d^2/df_t^2 ...]`` and
  ``E[f_t]`` under ``q(f_t | theta)``, from which ``a = -E hess`` and ``b = E grad + a
  E f`` (Algorithm 2 for the factor structure of section 5.1, averaged over ``theta``).

Both are averaged by ``jaxvb.fit``'s loop with the fixed step ``w = 1/sqrt(N)`` and the
second-half average, with its step control (an update whose ``q`` is not proper is
halved) and convergence check.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxvb._algebra import precision_factor, solve_gram, solve_precision
from jaxvb._platform import after
from jaxvb.families._base import Array, build
from jaxvb.families.gaussian import Gaussian, _unpack_precision
from jaxvb.latent import _field
from jaxvb.latent.approximation import LatentGaussianApproximation
from jaxvb.latent.target import (
    _target,
    _value_grad_hessian_aux,
    _value_grad_hessian_differences,
)
from jaxvb.methods._base import Method
from jaxvb.methods._registry import register

__all__ = ["latent_gaussian"]

#: The ways :func:`latent_gaussian` forms ``q(theta)``'s precision.
_HESSIAN_CHOICES = (None, "forward", "central", "autodiff", "regression", "values")


@functools.cache
def latent_gaussian(hessian: str | None = None, target: str = "ep") -> Method:
    """Stochastic linear regression for ``q(theta)`` and Algorithm 2 for the Gaussian
    sites of ``q(f | theta)``.

    The default method of :class:`LatentGaussianApproximation`. Each step draws one
    ``theta`` from ``q(theta)`` and computes, exactly for that draw (``f`` integrated
    out; each site's expectations by Gauss-Hermite quadrature), the target
    ``L(theta)`` (and its gradient, for the gradient-based ``hessian`` choices), and
    the sites' statistics ``A = -E d^2 log p(y_t | f_t)``, ``G = E d/df_t``, ``Z = E
    f_t``. The engine averages them (second half); the solve gives the sites ``a =
    A``, ``b = G + A Z`` and ``q(theta) = N(m, P^{-1})`` from the statistics of ``L``
    (below). The log density a draw reports is ``L(theta)``.

    Args:
      target: what ``q(theta)`` is fitted to. ``"ep"`` (default): expectation
        propagation's approximation of ``log p(y, theta)`` at the current sites,
        ``log p(theta) + log Z(theta) + sum_t log E[p(y_t|f_t) / s_t(f_t)]`` under
        ``q(f_t | theta)`` (:meth:`LatentGaussian.site_gaps`); ``"elbo"``: the paper's
        ``L(theta)``, the ELBO with ``f`` integrated out, ``E[log ...]`` in place of
        ``log E[...]``. The ELBO's gap ``KL(q(f | theta) || p(f | theta, y))`` grows
        with the field's prior variance where the likelihood is far from Gaussian
        (small counts), which pulls ``q(theta)`` towards small variances; ``"ep"`` has
        no such gap. Only ``q(theta)`` changes (the sites are Algorithm 2's either way;
        the result's ELBO is that of the fitted ``q``), at the cost of one more pass of
        the site likelihood over the quadrature nodes; for Gaussian observations the
        two agree (every gap is zero).
      hessian: how the precision ``P`` of ``q(theta)`` comes from ``L``. ``None``
        (default): ``"values"`` where each draw's factorisation of ``q(f | theta)``
        is a costly one (``factors_per_draw``: dense, or banded with ``w >= 4``, of
        ``1e5`` flops or more), else ``"regression"``.
        ``"regression"`` (section 5.2 with the gradient as the response): the
        averaged gradients are regressed on the draws, ``grad L ~ g + B (theta -
        z)``, ``P = -B`` (symmetrised), ``m = z + P^{-1} g``: one gradient per draw
        (reverse mode through the factorisation), exact to round-off where ``L`` is
        quadratic. ``"values"`` (the paper's Algorithm 1, section 3): no gradient;
        ``L`` at the draw and at ``q(theta)``'s mean (one vmapped pass, the same
        sites) and their difference regressed on the differences of the Gaussian's
        sufficient statistics ``(u, u_i u_j)`` of the whitened points ``u = F^{-1}
        (theta - c)`` (``c``, ``F`` fixed at the start: ``theta_centre``,
        ``theta_frame``), ``L(theta) - L(mean) ~ beta' du + sum beta_ij d(u_i u_j)``,
        ``P = -F^{-T} H F^{-1}``; also exact where ``L`` is quadratic. The
        difference, not the value, because ``L``'s level moves with the sites from
        step to step, by O(T) nats early on, against an O(1) quadratic over
        ``q(theta)``: the values alone, regressed with an intercept, give improper or
        far-off fits on long series. The other choices form the Hessian at each draw,
        ``P = -E hess L``, ``m = z + P^{-1} E grad L``: ``"forward"``: forward
        differences of the exact gradient along each hyperparameter, steps
        ``sqrt(eps)`` times its sd under ``q(theta)``, ``k + 1`` gradients (relative
        error about ``sqrt(eps)``); ``"central"``: central differences, ``2k + 1``
        gradients, error about ``eps^(2/3)``; ``"autodiff"``: forward over reverse
        mode, exact, but through the factorisation's scans far costlier than a
        gradient. The default is the cheaper of the two regressions for the prior's
        structure (two values of ``L`` cost less than a gradient through blocked
        scans, about the same as one where the prior is diagonal or tridiagonal);
        choose another to compare, or where one draw's curvature is worth ``k + 1``
        gradients a step.

    Example:
      >>> import jaxvb
      >>> jaxvb.methods.resolve("latent_gaussian", None).name
      'latent_gaussian'
    """
    if hessian not in _HESSIAN_CHOICES:
        raise ValueError(
            "hessian must be None, 'forward', 'central', 'autodiff', 'regression' or "
            f"'values', got {hessian!r}"
        )
    if target not in ("ep", "elbo"):
        raise ValueError(f"target must be 'ep' or 'elbo', got {target!r}")
    ep = target == "ep"

    def mode(q) -> str:
        # a static choice (the model's structure), the same in init, estimate and solve
        if hessian is not None:
            return hessian
        return "values" if q.factors_per_draw else "regression"

    def init(key, q0, log_joint):
        del key, log_joint
        return _init(mode(q0), q0)

    def noise(key, q):
        return q.noise(key)

    def estimate(noise, q, log_joint):
        del log_joint
        return _estimate(mode(q), ep, noise, q)

    def solve(stats, q, log_joint):
        del log_joint
        return _solve(mode(q), stats, q)

    return Method(
        name="latent_gaussian",
        init=init,
        noise=noise,
        estimate=estimate,
        solve=solve,
        min_draws=lambda q: 1,
    )


def _init(mode: str, q0: LatentGaussianApproximation) -> dict:
    """The statistics at the start: the sites' ``A, G, Z`` at ``q0``'s sites and those
    of ``L`` that ``mode``'s solve turns back into ``q0(theta)``."""
    theta = q0.theta
    mu, _, _ = q0.conditional(theta.mean)
    a = q0.site_precision
    eta = _field.project(mu, q0.model.design, a.shape[-1])
    sites = dict(A=a, G=q0.site_shift - a * eta, Z=eta)
    if mode == "values":
        return dict(**_value_init(q0), **sites)
    if mode == "regression":
        # q0's own pseudo-draws, about the fixed centre c (q0's mean): the gradient
        # of its quadratic, -P0 (theta - m0), gives E[g d'] = -P0 cov0 = -I
        z = theta.mean - q0.theta_centre
        eye = jnp.eye(z.shape[0], dtype=z.dtype)
        return dict(GX=-eye, XX=theta.cov + jnp.outer(z, z), g=0.0 * z, z=z, **sites)
    return dict(P=theta.precision, g=jnp.zeros_like(theta.mean), z=theta.mean, **sites)


def _estimate(mode: str, ep: bool, noise, q: LatentGaussianApproximation):
    """One draw's ``(statistics, x = (theta, f), L(theta))``: those of ``L`` that
    ``mode`` regresses, and the sites' ``A, G, Z`` under ``q(f | theta)``."""
    z_theta, z_f = noise
    theta = q.theta.from_noise(z_theta)
    model = q.model

    def target_fn(th):
        return _target(model, q.site_precision, q.site_shift, th, ep)

    if mode == "values":
        # L at the draw and at q(theta)'s mean, with the same sites: their
        # difference has no level, which moves with the sites from step to step
        # (by O(T) nats early on) and would swamp the O(1) quadratic
        points = jnp.stack([theta, q.theta.mean])
        both, aux = jax.vmap(target_fn)(points)
        value = both[0]
        aux = jax.tree_util.tree_map(lambda v: v[0], aux)
        t = jax.vmap(lambda th: q.theta.sufficient_stats(_whiten(q, th)))(points)
        t = t[0] - t[1]
        stats = dict(C=jnp.outer(t, t), gv=t * (both[0] - both[1]))
        last = both
    elif mode == "regression":
        (value, aux), grad = jax.value_and_grad(target_fn, has_aux=True)(theta)
        d = theta - q.theta_centre
        stats = dict(GX=jnp.outer(grad, d), XX=jnp.outer(d, d), g=grad, z=d)
        last = grad
    else:
        if mode == "autodiff":
            value, grad, hess, aux = _value_grad_hessian_aux(target_fn)(theta)
        else:
            sd = jnp.sqrt(jnp.diagonal(q.theta.cov))
            value, grad, hess, aux = _value_grad_hessian_differences(
                target_fn, theta, sd, central=mode == "central"
            )
        stats = dict(P=-hess, g=grad, z=theta)
        last = hess
    eta, var, mu, chol, d1, d2 = aux
    # the draw's back-solve after the derivatives (their solves): under vmap,
    # batched solves side by side can hang jaxlib 0.10 (_platform.after)
    f = mu + _field.ops(model.prior_of_field(theta)[1]).back(chol, after(z_f, last))
    stats.update(A=-d2, G=d1, Z=eta)
    return stats, jnp.concatenate([theta, f]), value


def _solve(mode: str, stats: dict, q: LatentGaussianApproximation):
    """The approximation the averaged statistics define: ``q(theta) = N(m, P^{-1})``
    by ``mode``'s regression and the sites ``a = A``, ``b = G + A Z``."""
    if mode == "values":
        precision, g = _fit_in_frame(stats["C"], stats["gv"], q.theta_frame)
        centre = q.theta_centre
        stats = dict(stats, g=g)
    elif mode == "regression":
        # the averaged gradients' least-squares fit g ~ g_bar + B (d - d_bar): the
        # precision is -B (symmetrised), the mean where the fit is zero
        z = stats["z"]
        cov = stats["XX"] - jnp.outer(z, z)
        cross = stats["GX"] - jnp.outer(stats["g"], z)
        b = jnp.linalg.solve(cov, cross.T).T
        precision = -0.5 * (b + b.T)
        centre = q.theta_centre + z
    else:
        precision = 0.5 * (stats["P"] + stats["P"].T)
        centre = stats["z"]
    factor = precision_factor(precision)
    mean = centre + solve_precision(factor, stats["g"])
    theta = build(Gaussian, mean=mean, precision_factor=factor)
    return build(
        LatentGaussianApproximation,
        theta=theta,
        site_precision=stats["A"],
        site_shift=_field.site_shift(_field.Dense, stats["A"], stats["G"], stats["Z"]),
        model=q.model,
        theta_centre=q.theta_centre,
        theta_frame=q.theta_frame,
    )


def _whiten(q: LatentGaussianApproximation, theta: Array) -> Array:
    """``u = theta_frame^{-1} (theta - theta_centre)``."""
    return jax.scipy.linalg.solve_triangular(
        q.theta_frame, theta - q.theta_centre, lower=True
    )


def _in_frame(q: LatentGaussianApproximation) -> Gaussian:
    """``q(theta)`` as a Gaussian over ``u = F^{-1} (theta - c)``: precision ``F' P F``,
    whose factor is ``F' U`` (both upper triangular, positive diagonals)."""
    theta = q.theta
    return build(
        Gaussian,
        mean=_whiten(q, theta.mean),
        precision_factor=q.theta_frame.T @ theta.precision_factor,
    )


def _fit_in_frame(c: Array, g: Array, frame: Array) -> tuple[Array, Array]:
    """``(P, P (m - c))`` in ``theta``'s coordinates of the Gaussian over ``u`` whose
    natural parameters ``eta = (P_u m_u, P_u's upper triangle)`` (those of
    :class:`jaxvb.Gaussian`) solve ``C eta = g``: ``P = F^{-T} P_u F^{-1}``, ``P (m -
    c) = F^{-T} P_u m_u``. NaN where ``C`` is singular (``fit`` flags it)."""
    k = frame.shape[-1]
    eta = solve_gram(c, g)

    def back(m):  # F^{-T} m
        return jax.scipy.linalg.solve_triangular(frame.T, m, lower=False)

    precision = back(back(_unpack_precision(eta[k:], k)).T)
    return 0.5 * (precision + precision.T), back(eta[:k])


def _value_init(q0: LatentGaussianApproximation) -> dict:
    """Algorithm 1's ``C_1 = E_q0[d d']`` and ``g_1 = C_1 eta_1`` for the differences
    ``d = T(u) - T(u_m)`` of the Gaussian's statistics from the mean's (``eta_1``
    ``q0``'s natural parameters over ``u``, since ``log q0(theta) - log q0(mean) =
    eta_1' d``), in closed form: ``C_1 = Cov[T] + (E T - T(u_m))(E T - T(u_m))'``."""
    q_u = _in_frame(q0)
    shift = q_u.mean_sufficient_stats - q_u.sufficient_stats(q_u.mean)
    c = q_u.fisher_information + jnp.outer(shift, shift)
    return dict(C=c, gv=c @ q_u.natural_params)


register("latent_gaussian", latent_gaussian, default_for=(LatentGaussianApproximation,))
