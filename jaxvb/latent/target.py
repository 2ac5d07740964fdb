r"""``q(f | theta)`` given the sites, and the hyperparameters' target ``L(theta)``.

Given the sites ``(a, b)``, ``q(f | theta)`` is the Gaussian with precision ``P(theta) =
Q(theta) + L' diag(a) L`` and mean ``P^{-1} (Q m + L' b)`` (``L`` the sites' linear
predictor, :func:`jaxvb.latent._field.project`): :func:`_conditional`. Its normaliser
``log Z(theta)`` (:func:`_log_z`) and the sites' expectations under it give the
hyperparameters' target

    L(theta) = log p(theta) + log Z(theta) + sum_t E_{q(f_t|theta)}[log p(y_t|f_t)
               - b_t f_t + a_t f_t^2 / 2],

the ELBO with ``f`` integrated out, or expectation propagation's approximation of ``log
p(y, theta)`` with each site's Jensen gap added (:func:`_target`). The start and the
method both need its value, gradient and Hessian: :func:`_value_grad_hessian_differences`
and :func:`_value_grad_hessian_aux`. The field algebra itself is
:mod:`jaxvb.latent._field`'s.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from jaxvb._platform import after
from jaxvb.latent import _field

if TYPE_CHECKING:
    from jaxvb.latent.model import LatentGaussian

_LOG_2PI = math.log(2.0 * math.pi)


def _prior_log_norm(ops, precision, log_norm, num_field: int):
    """``log_norm`` of ``p(f | theta) = exp(log_norm - (f - m)'Q(f - m) / 2)``: as
    given, else ``(log|Q| - N log 2 pi) / 2`` from ``Q``'s factor."""
    if log_norm is not None:
        return log_norm
    return 0.5 * (ops.logdet(ops.chol(precision)) - num_field * _LOG_2PI)


def _conditional(model: LatentGaussian, a, b, theta):
    """``q(f | theta)``: ``(mean, chol, ops, prior mean, prior precision, c,
    log_norm)``, with ``chol`` the factor of ``P = Q + L' diag(a) L`` (``L`` the
    sites' linear predictor, :func:`jaxvb.latent._field.project`) and ``c = Q m + L' b``
    (``mean = P^{-1} c``)."""
    m, precision, log_norm = model.prior_of_field(theta)
    ops = _field.ops(precision)
    n = a.shape[-1]
    p = _field.add_linear_sites(ops, precision, a, model.design, n)
    chol = ops.chol(p)
    c = ops.matvec(precision, m) + _field.lift(b, model.design, m.shape[-1])
    mu = ops.solve(chol, c)
    return mu, chol, ops, m, precision, c, log_norm


def _log_z(model: LatentGaussian, a, b, theta):
    """``log Z(theta)`` of :mod:`jaxvb.latent._field` and ``q(f | theta)``'s ``(mean, factor,
    ops)``: ``log|Q|`` read off the prior's normalising constant, so that an improper
    prior, flat in some directions, counts its own constant."""
    mu, chol, ops, m, precision, c, log_norm = _conditional(model, a, b, theta)
    num_field = mu.shape[-1]
    # the prior's factor after q(f | theta)'s, not beside it (_platform.after)
    prior = after(precision, chol)
    logdet_prior = 2.0 * _prior_log_norm(ops, prior, log_norm, num_field) + (
        num_field * _LOG_2PI
    )
    log_z = _field.log_normaliser(
        ops, logdet_prior, chol, c, mu, jnp.dot(m, ops.matvec(precision, m))
    )
    return log_z, (mu, chol, ops)


def _target(model: LatentGaussian, a, b, theta, ep: bool = False):
    """``L(theta)`` (the ELBO with ``f`` integrated out, given the sites; the algebra of
    :mod:`jaxvb.latent._field`; with ``ep``, each site's Jensen gap added:
    :meth:`LatentGaussian.site_gaps`) and, as aux, ``q(f | theta)``'s ``(mean and
    variances of the sites' linear predictor, mean, factor of the precision)`` and the
    sites' expected first and second derivatives ``E d/df_t, E d^2/df_t^2`` (from the
    same pass over the quadrature nodes; a model's own ``site_expectations`` where
    it has one)."""
    log_z, (mu, chol, ops) = _log_z(model, a, b, theta)
    n = a.shape[-1]
    eta = _field.project(mu, model.design, n)
    var = _field.site_variances(ops, chol, model.design, n)
    if ep:  # E log p(y_t | f_t) by quadrature, from the gaps' pass over the nodes
        ell, gaps, d1, d2 = model._expected_and_gaps(eta, var, a, b, theta)
        ell = ell + gaps
    else:
        ell, d1, d2 = model.site_expectations(eta, var, theta)
    # the sites are diagonal on eta: their expected log is that of diagonal sites
    site_terms = jnp.sum(ell) - _field.expected_log_site(_field.Dense, a, b, eta, var)
    value = model.prior_log_density(theta) + log_z + site_terms
    # q(f | theta)'s marginals and factor, held constant: the sites' statistics are
    # computed from them once, at the draw (not at the points of the differences)
    if ep and model._own_expectations():  # its closed forms, not the quadrature's
        _, d1, d2 = model.site_expectations(eta, var, theta)
    aux = (eta, var, mu, chol, d1, d2)
    return value, tuple(jax.lax.stop_gradient(v) for v in aux)


def _value_grad_hessian_differences(fn, x, scale, *, central: bool):
    """``(value, grad, hess, aux)`` of ``fn: x -> (value, aux)``: the value, gradient
    and aux at ``x`` and the Hessian by differences of the exact gradient along each
    coordinate, steps ``scale`` times ``eps^(1/3)`` (central) or ``sqrt(eps)``
    (forward); ``lax.map``: one gradient pass after another (vmapped, the scans'
    bodies would grow past what XLA:CPU compiles as one loop)."""
    k = x.shape[0]
    eps = jnp.finfo(x.dtype).eps
    h = (eps ** (1.0 / 3.0) if central else jnp.sqrt(eps)) * scale
    steps = jnp.diag(h)
    points = [x[None], x + steps] + ([x - steps] if central else [])
    (values, aux), grads = jax.lax.map(
        jax.value_and_grad(fn, has_aux=True), jnp.concatenate(points)
    )
    if central:
        hess = (grads[1 : k + 1] - grads[k + 1 :]) / (2.0 * h[:, None])
    else:
        hess = (grads[1:] - grads[0]) / h[:, None]
    hess = 0.5 * (hess + hess.T)
    return values[0], grads[0], hess, jax.tree_util.tree_map(lambda v: v[0], aux)


def _value_grad_hessian_aux(fn):
    """``x -> (value, grad, hess, aux)`` of ``fn: x -> (value, aux)`` in one
    forward-over-reverse pass (``aux`` carried out as a primal)."""

    def value_and_grad(x):
        (value, aux), grad = jax.value_and_grad(fn, has_aux=True)(x)
        return grad, (value, grad, aux)

    def out(x):
        hess, (value, grad, aux) = jax.jacfwd(value_and_grad, has_aux=True)(x)
        return value, grad, hess, aux

    return out


def _newton_sites(model: LatentGaussian, theta, num_iter: int = 30):
    """Sites ``(a, b)`` at the mode of ``p(f | theta, y)``, by Newton's method (at most
    ``num_iter`` iterations: every loop of the compiled program has a bound; it stops
    sooner once converged), each step halved until ``log p(f | theta, y)`` does not
    decrease (at most 30 times): from the prior mean a full step can overshoot far (a
    Poisson count with a small exposure has a curvature ``exposure * exp(f)`` that is
    tiny there, and the step is its inverse) and ``exp`` then overflows."""
    m, precision, _ = model.prior_of_field(theta)
    ops = _field.ops(precision)
    qm = ops.matvec(precision, m)
    num_field = m.shape[-1]
    n = model.num_sites(precision, num_field)
    total = lambda eta: jnp.sum(model.site_log_lik(eta, theta))  # noqa: E731

    def objective(f):
        d = f - m
        value = total(_field.project(f, model.design, n)) - 0.5 * jnp.dot(
            d, ops.matvec(precision, d)
        )
        return jnp.where(jnp.isfinite(value), value, -jnp.inf)

    def sites(f):
        eta = _field.project(f, model.design, n)
        d1, d2 = jax.jvp(jax.grad(total), (eta,), (jnp.ones_like(eta),))
        a = jnp.maximum(-d2, 0.0)
        return a, d1 + a * eta

    def body(state):
        i, f, _ = state
        a, b = sites(f)
        p = _field.add_linear_sites(ops, precision, a, model.design, n)
        new = ops.solve(ops.chol(p), qm + _field.lift(b, model.design, num_field))
        full = jnp.where(jnp.all(jnp.isfinite(new)), new - f, jnp.zeros_like(f))
        current = objective(f)

        def worse(state):
            step, tries = state
            return (objective(f + step) < current) & (tries < 30)

        step, _ = jax.lax.while_loop(
            worse, lambda state: (0.5 * state[0], state[1] + 1), (full, 0)
        )
        f_next = jnp.where(objective(f + step) >= current, f + step, f)
        # done once the full Newton step is below eps^(3/4) of f's scale (the next
        # would square it: nothing left to gain) or f stops moving (it then never
        # would: the iteration is deterministic)
        small = jnp.max(jnp.abs(full)) <= tiny * (1.0 + jnp.max(jnp.abs(f)))
        return i + 1, f_next, small | jnp.all(f_next == f)

    tiny = jnp.finfo(m.dtype).eps ** 0.75
    _, f, _ = jax.lax.while_loop(
        lambda state: (state[0] < num_iter) & ~state[2], body, (0, m, False)
    )
    return sites(f)
