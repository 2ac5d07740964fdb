r"""Hierarchical approximations ``q(x1) q(x2 | x1) ... q(f | x1, ..., xn)`` (section 6.1).

Each block is an exponential family whose natural parameters may depend on the earlier
blocks. For block ``i`` with statistics ``T_i`` and parameters ``eta_i`` the KL-optimal
parameters solve (eq. hierarchicalupdate)

    eta_i = C_i^{-1} g_i,
    C_i = E_{q(x_<i)} Var_{q(x_i | x_<i)}[T_i],
    g_i = E_{q(x_<i)} Cov_{q(x_>=i | x_<i)}[T_i, r_{-i}],
    r_{-i} = log p(x, y) - log q(x) + log q(x_i | x_<i),

and ``fit``'s loop runs one regression per block at every step.

What is here: :func:`hierarchical`, the :class:`~jaxvb.methods.Method` that
``jaxvb.fit`` runs, and its statistics (:class:`HierarchicalStats`). The blocks are
:mod:`jaxvb.latent.blocks`' (re-exported here):

* :class:`ConditionalBlock`: a scalar block ``q(x_i | x_<i)`` = a standard family (Beta,
  InverseGamma, ...) with natural parameters ``A(x_<i) eta_i``, i.e. statistics
  ``T_i(x_i; x_<i) = A(x_<i)' T(x_i)``. Its ``C_i, g_i`` are the gradient statistics
  of section 5.2 (eq. grad) from one reparameterised draw.
* :class:`GaussianSitesBlock`: the last block, ``q(f | theta) ∝ p(f | theta) q(y | f)``
  with the exact Gaussian prior ``p(f | theta)`` of a :class:`jaxvb.LatentGaussian`
  model (dense, banded or arrowhead precision; fixed effects in the field) and diagonal
  Gaussian sites ``q(y | f) = prod_t exp(b_t eta_t - a_t eta_t^2 / 2)`` on its linear
  predictor ``eta``. Its statistics are those of Algorithm 2 (``E d log p(y_t|eta_t)``,
  ``E[-d^2 ...]``, ``E eta_t``), Rao-Blackwellised: the model's
  :meth:`~jaxvb.LatentGaussian.site_expectations` under ``q(f | theta)``. The model, the
  conditional ``q(f | theta)`` and the target are :class:`jaxvb.LatentGaussian`'s (one
  implementation): this module adds the paper's exponential-family ``q(theta)``.
* :class:`Hierarchical`: the joint ``q`` as a pytree (``sample``, ``log_prob``,
  ``is_proper``).

Indirect effects (eqs. sv2 vs svapprox). With ``f`` integrated out, the target of a
scalar block is ``G_i(theta) = log p(theta) + log q(y | theta) - sum_{j != i} log
q_j(theta_j | theta_<j) + E_{q(f|theta)}[log p(y|f) - log q(y|f)]`` and
``g_i = d theta / d eta_i . dG_i/dtheta``. With ``indirect_effects=True`` the derivative
is total: it follows the later draws ``theta_{>i} = s(eta, z, theta_<=i)`` and the
dependence of ``q(f | theta)`` on ``theta`` (eq. sv2). With ``False`` (the paper's choice,
eq. svapprox) the later draws and ``f`` are held fixed, which drops the last term and
the paths through later blocks.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxvb._algebra import solve_equilibrated
from jaxvb.families._base import Array, build
from jaxvb.latent import _field
from jaxvb.latent.blocks import ConditionalBlock, GaussianSitesBlock, Hierarchical
from jaxvb.latent.model import LatentGaussian
from jaxvb.latent.target import _prior_log_norm, _target
from jaxvb.methods._base import Method, trust_region
from jaxvb.methods.gradient import GradientStats

__all__ = [
    "ConditionalBlock",
    "GaussianSitesBlock",
    "Hierarchical",
    "HierarchicalStats",
    "hierarchical",
]


class HierarchicalStats(NamedTuple):
    """Per scalar block ``C_i, g_i`` (eq. grad); Algorithm 2's statistics of the sites
    on ``eta``: ``a = E d/deta_t log p(y_t | eta_t)``, ``sites = E[-d^2/deta_t^2 ...]``
    and ``z = E eta_t`` under ``q(f | theta)``, each ``(n,)``.

    Example:
      Their shapes for the stochastic-volatility model with ``T = 5``:

      >>> import jax, jax.numpy as jnp
      >>> from functools import partial
      >>> from jaxvb.composite import hierarchical
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> y = jnp.array([0.5, -1.2, 0.3, 2.0, -0.7])
      >>> method, q0 = hierarchical(sv.model_structure(y)), sv.initial_q(y)
      >>> stats = jax.eval_shape(
      ...     lambda key: method.init(key, q0, partial(sv.log_joint, y=y)), jax.random.key(0))
      >>> [(s.C.shape, s.g.shape) for s in stats.scalars]   # (u) and (s2 | phi)
      [((2, 2), (2,)), ((3, 3), (3,))]
      >>> stats.a.shape, stats.sites.shape, stats.z.shape
      ((5,), (5,), (5,))
    """

    scalars: tuple
    a: Array
    sites: Array
    z: Array


def _conditional(q: Hierarchical, theta: Array):
    """``q(f | theta)``: mean, covariance on the prior's pattern
    (:func:`jaxvb.latent._field.covariance`) and factor of its precision."""
    mu, chol, ops = q.gaussian.conditional(theta)
    return mu, _field.covariance(ops, chol), chol


def _direct_gradient(q: Hierarchical, theta: Array):
    """``dH/dtheta`` with ``q(f | theta)`` held fixed in the last term (eq. svapprox),
    and ``q(f | theta)``'s ``(eta mean, eta variances, mean)``.

    Only the prior ``N(m(theta), Q(theta)^{-1})`` depends on ``theta``, so with ``P =
    Q + L'diag(a)L``, ``mu = P^{-1}(Q m + L'b)`` and ``d = mu - m``

        d log q(y | theta) = d log_norm - (tr(P^{-1} dQ) + d' dQ d) / 2 + d' Q dm,

    where ``tr(P^{-1} dQ)`` needs only the covariance on the prior's pattern (the
    selected inverse). ``(dm, dQ, d log_norm)`` come from ``jax.jvp`` of the prior, so
    nothing is differentiated through the factorisation's scans.
    """
    g = q.gaussian
    model, a = g.model, g.site_precision
    n = a.shape[-1]
    m, precision, _ = model.prior_of_field(theta)
    ops, p, c = g.precision_and_shift(theta)
    _, mu, cov = _field.moments_with_covariance(ops, p, c)
    d = mu - m
    q_d = ops.matvec(precision, d)

    def prior(th):
        mean, prec, log_norm = model.prior_of_field(th)
        return (
            mean,
            prec,
            _prior_log_norm(_field.ops(prec), prec, log_norm, mean.shape[-1]),
        )

    def along(direction):
        _, (d_m, d_q, d_log_norm) = jax.jvp(prior, (theta,), (direction,))
        trace = _field.trace_product(ops, cov, d_q)
        quad = d @ ops.matvec(d_q, d)
        return d_log_norm - 0.5 * (trace + quad) + q_d @ d_m

    eye = jnp.eye(theta.shape[0], dtype=theta.dtype)
    grad = jax.vmap(along)(eye) + jax.grad(model.prior_log_density)(theta)
    eta = _field.project(mu, model.design, n)
    var = _field.linear_variances(ops, cov, model.design, n)
    return grad, (eta, var, mu)


def hierarchical(
    model: LatentGaussian,
    *,
    indirect_effects: bool = False,
    max_step_kl: float | None = 1.0,
) -> Method:
    """Eq. hierarchicalupdate for a :class:`Hierarchical` ``q``, one draw per step.

    Each step draws ``theta = (x_1..x_n)`` by reparameterisation, solves the Gaussian
    block at ``theta`` (the prior's structure: ``O(T)`` for an arrowhead; mean and
    selected inverse) and forms, without sampling ``f``:

    * per scalar block, ``C_i^ = d/deta_i T_i(x_i)`` and ``g_i^ = d/deta_i G_i`` (see the
      module docstring; ``indirect_effects`` chooses eq. sv2 or svapprox);
    * for the sites on ``eta``, ``a^ = E d log p(y_t|eta_t)``, ``sites^ = E[-d^2 log
      p(y_t|eta_t)]``, ``z^ = E eta_t`` under ``q(f | theta)``, from the model's
      :meth:`~jaxvb.LatentGaussian.site_expectations` (Gauss-Hermite, or the model's
      closed form);

    and ``solve`` gives ``eta_i = C_i^{-1} g_i`` and the sites ``(sites, a + sites
    z)``.

    The ``log_joint`` given to ``fit`` is used only for the diagnostics and for the
    value reported per step (at ``f`` = its conditional mean).

    Args:
      model: the :class:`jaxvb.LatentGaussian`, bound
        (:meth:`~jaxvb.LatentGaussian.bind`) to the scalar blocks' ``theta``.
      indirect_effects: keep the paths through later blocks (eq. sv2) or not (eq.
        svapprox, the default as in the paper).
      max_step_kl: a trust region for the scalar blocks: an update with
        ``KL(q_new(x_i | .) || q(x_i | .)) > max_step_kl`` for some block ``i`` (at the
        conditional modes of ``q``) has its step halved by ``fit``'s step control
        (:func:`jaxvb.methods.trust_region`). One draw per step makes the estimates
        heavy-tailed: early on, a draw far in the tail of a briefly flat block can
        move ``q`` by many nats, to a block far too narrow that the running
        statistics take long to forget, while the steps of a settled fit move ``q``
        by a fraction of a nat. ``None`` turns it off (the paper's plain iteration).

    Returns:
      A :class:`~jaxvb.methods.Method` for :func:`jaxvb.fit`.

    Example:
      What :func:`jaxvb.models.stochastic_volatility.fit` runs (the fit itself, slow
      to compile, is not run here):

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from functools import partial
      >>> from jaxvb.composite import hierarchical
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> y = jnp.array([0.5, -1.2, 0.3, 2.0, -0.7])
      >>> method = hierarchical(sv.model_structure(y))
      >>> method.name
      'hierarchical(svapprox)'
      >>> res = jaxvb.fit(partial(sv.log_joint, y=y), sv.initial_q(y), jax.random.key(0),
      ...                 num_steps=250, method=method)  # doctest: +SKIP
    """
    if not isinstance(model, LatentGaussian) or model.num_hyper is None:
        raise TypeError(
            "hierarchical: model must be a jaxvb.LatentGaussian bound to the scalar "
            "blocks' theta (model.bind(theta0)), got "
            + (
                "an unbound LatentGaussian"
                if isinstance(model, LatentGaussian)
                else type(model).__name__
            )
        )

    label = "sv2" if indirect_effects else "svapprox"
    method = Method(
        name=f"hierarchical({label})",
        init=_init,
        noise=_noise,
        estimate=functools.partial(_estimate, indirect_effects),
        solve=_solve,
        min_draws=_min_draws,
    )
    if max_step_kl is None:
        return method
    return trust_region(method, _largest_block_kl, max_step_kl)._replace(name=method.name)


def _target_of_theta(theta: Array, q: Hierarchical):
    """``H(theta) = log p(theta) + log q(y|theta) + E(log p(y|f) - log q(y|f))``:
    :class:`jaxvb.LatentGaussian`'s target."""
    g = q.gaussian
    value, (eta, var, mu, *_) = _target(g.model, g.site_precision, g.site_shift, theta)
    return value, (eta, var, mu)


def _init(key, q0, log_joint):
    """Each scalar block's ``C_i`` from the Fisher information averaged over 64 draws
    of its parents, ``g_i = C_i eta_i``; the sites' statistics from ``q0``'s sites."""
    del log_joint
    if not isinstance(q0, Hierarchical):
        raise TypeError(
            f"the hierarchical method needs a jaxvb.composite.Hierarchical q0, got "
            f"{type(q0).__name__}"
        )
    n = q0.num_scalars
    num = 64
    keys = jax.random.split(key, (num, n))
    thetas = jax.vmap(lambda k: q0.draw_scalars(k))(keys)
    scalars = []
    for i, b in enumerate(q0.scalars):

        def fisher(theta, b=b, i=i):
            a = b.matrix(theta[:i])
            return a.T @ b.base.from_natural(a @ b.eta).fisher_information @ a

        c = jnp.mean(jax.vmap(fisher)(thetas), axis=0)
        scalars.append(GradientStats(C=c, g=c @ b.eta))
    g = q0.gaussian
    # a + sites z = the start's shift, with z = 0
    return HierarchicalStats(
        tuple(scalars), g.site_shift, g.site_precision, jnp.zeros_like(g.site_shift)
    )


def _noise(key, q):
    return jax.random.split(key, q.num_scalars)


def _estimate(indirect_effects: bool, noise, q, log_joint):
    """One draw's statistics (see :func:`hierarchical`), the draw ``(theta, f)`` at
    ``f`` = its conditional mean, and ``log_joint`` there."""
    theta, jacobians = q.draw_scalars_and_jacobians(noise, total=indirect_effects)
    if indirect_effects:
        dh, (eta, var, mean) = jax.grad(_target_of_theta, has_aux=True)(theta, q)
    else:
        dh, (eta, var, mean) = _direct_gradient(q, theta)
    lq_grad = jax.jacrev(q.log_q_scalars)(theta)  # (n blocks, n thetas)
    total = jnp.sum(lq_grad, axis=0)
    scalars = []
    for i, b in enumerate(q.scalars):
        # dG_i/dtheta = dH/dtheta - sum_{j != i} d log q_j / dtheta
        dg = dh - total + lq_grad[i]
        parents = theta[:i]
        d_stats = jax.jacfwd(b.stats)(theta[i], parents)  # dT_i / dx_i, (k_i,)
        dtheta = jacobians[i]  # (n, k_i)
        # C_i[a, b] = d T_ib / d eta_ia; theta_<i does not move with eta_i.
        scalars.append(GradientStats(C=jnp.outer(dtheta[i], d_stats), g=dtheta.T @ dg))
    _, d1, d2 = q.gaussian.model.site_expectations(eta, var, theta)
    x = jnp.concatenate([theta, mean])
    log_p = log_joint(x)
    stats = HierarchicalStats(tuple(scalars), d1, -d2, eta)
    return stats, x, log_p


def _solve(stats, q, log_joint=None):
    """``eta_i = C_i^{-1} g_i`` for each scalar block, and the sites ``(sites, a +
    sites z)``."""
    del log_joint
    scalars = tuple(
        b.from_natural(solve_equilibrated(s.C, s.g))
        for b, s in zip(q.scalars, stats.scalars, strict=True)
    )
    shift = _field.site_shift(_field.Dense, stats.sites, stats.a, stats.z)
    gaussian = build(
        GaussianSitesBlock,
        site_precision=stats.sites,
        site_shift=shift,
        model=q.gaussian.model,
    )
    return build(Hierarchical, scalars=scalars, gaussian=gaussian)


def _min_draws(q):
    return max(b.eta.shape[0] for b in q.scalars)


def _largest_block_kl(q_old: Hierarchical, q_new: Hierarchical) -> Array:
    """The largest ``KL(q_new(x_i | .) || q(x_i | .))`` over the scalar blocks, at the
    conditional modes of ``q``; NaN where an update is improper."""
    theta = q_old.draw_mode()
    kls = [
        new.given(theta[:i]).kl_divergence(old.given(theta[:i]))
        for i, (old, new) in enumerate(zip(q_old.scalars, q_new.scalars, strict=True))
    ]
    return jnp.max(jnp.stack(kls))
