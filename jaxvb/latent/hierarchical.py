r"""Hierarchical approximations ``q(x1) q(x2 | x1) ... q(f | x1, ..., xn)`` (section 6.1).

Each block is an exponential family whose natural parameters may depend on the earlier
blocks. For block ``i`` with statistics ``T_i`` and parameters ``eta_i`` the KL-optimal
parameters solve (eq. hierarchicalupdate)

    eta_i = C_i^{-1} g_i,
    C_i = E_{q(x_<i)} Var_{q(x_i | x_<i)}[T_i],
    g_i = E_{q(x_<i)} Cov_{q(x_>=i | x_<i)}[T_i, r_{-i}],
    r_{-i} = log p(x, y) - log q(x) + log q(x_i | x_<i),

and ``fit``'s loop runs one regression per block at every step.

What is here:

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
  ``is_proper``), and :func:`hierarchical`, the :class:`~jaxvb.methods.Method` that
  ``jaxvb.fit`` runs.

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

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxvb import _random
from jaxvb._algebra import solve_equilibrated
from jaxvb.families._base import (
    Array,
    ExponentialFamily,
    Family,
    build,
    register_dataclass,
    register_family,
)
from jaxvb.latent import _field
from jaxvb.latent import target as latent_target
from jaxvb.latent.model import LatentGaussian
from jaxvb.methods._base import Method, trust_region
from jaxvb.methods.gradient import GradientStats

_STATIC = {"static": True}


def _identity_design(parents: Array, k: int) -> Array:
    del parents
    return jnp.eye(k)


@register_dataclass
class ConditionalBlock:
    """A scalar block ``q(x_i | x_<i)``: ``base`` with natural parameters ``A(x_<i) eta``.

    A part of a :class:`Hierarchical` family, not a family of its own: ``given`` turns
    it into one for a value of its parents.

    Attributes:
      eta: the block's natural parameters, shape ``(k_i,)``.
      base: an instance of the standard family (scalar event shape); only its type and
        shape are used.
      design: static ``parents (i,) -> A (k_base, k_i)``; ``None`` for the identity.
      proper: static ``eta -> bool``, whether ``eta`` is proper for every parent value;
        ``None``: ``base`` at ``eta`` (only for the identity design).

    Example:
      A first block without parents (identity design): a Beta with natural parameters
      ``eta = (a - 1, b - 1)``; and a second, ``Inv-Gamma(eta_1 - 1, eta_2 + eta_3 u^2)``
      given the first block's draw ``u``:

      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.composite import ConditionalBlock
      >>> q_u = ConditionalBlock(eta=jnp.array([19.0, 0.5]), base=jaxvb.Beta(1.0, 1.0))
      >>> q_u.given(jnp.zeros(0))
      Beta(concentration1=20.0, concentration0=1.5)
      >>> q_s = ConditionalBlock(
      ...     eta=jnp.array([6.0, 0.25, 1.0]), base=jaxvb.InverseGamma(1.0, 1.0),
      ...     design=lambda u: jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, u[0] ** 2]]),
      ...     proper=lambda eta: (eta[0] > 1) & (eta[1] > 0) & (eta[2] >= 0))
      >>> q_s.given(jnp.array([0.5]))
      InverseGamma(concentration=5.0, scale=0.5)
    """

    eta: Array
    base: ExponentialFamily
    design: Callable | None = dataclasses.field(default=None, metadata=_STATIC)
    proper: Callable | None = dataclasses.field(default=None, metadata=_STATIC)
    __repr__ = Family.__repr__

    @property
    def event_shape(self):
        return ()

    @property
    def natural_params(self):
        return self.eta

    def from_natural(self, eta):
        return dataclasses.replace(self, eta=eta)

    def matrix(self, parents: Array) -> Array:
        k = self.eta.shape[0]
        if self.design is None:
            return _identity_design(parents, k).astype(self.eta.dtype)
        return jnp.asarray(self.design(parents), self.eta.dtype)

    def given(self, parents: Array, eta: Array | None = None) -> ExponentialFamily:
        """The standard family ``q(x_i | parents)``."""
        eta = self.eta if eta is None else eta
        return self.base.from_natural(self.matrix(parents) @ eta)

    def stats(self, x: Array, parents: Array) -> Array:
        """``T_i(x; parents) = A(parents)' T(x)``, shape ``(k_i,)``."""
        return self.matrix(parents).T @ self.base.sufficient_stats(x)

    @property
    def is_proper(self):
        if self.proper is not None:
            return jnp.asarray(self.proper(self.eta))
        return self.base.from_natural(self.eta).is_proper


@register_dataclass
class GaussianSitesBlock:
    """``q(f | theta) ∝ p(f | theta) prod_t exp(b_t eta_t - a_t eta_t^2 / 2)``.

    The Gaussian part of a :class:`Hierarchical` family (not a family of its own): the
    exact prior of a :class:`jaxvb.LatentGaussian` times diagonal Gaussian sites on its
    linear predictor ``eta = f[:n] + design @ f[n:]`` -- the same ``q(f | theta)`` as
    :class:`jaxvb.latent.LatentGaussianApproximation`'s, from the same code.

    Attributes:
      site_precision: ``a``, shape ``(n,)``.
      site_shift: ``b``, shape ``(n,)``.
      model: the :class:`jaxvb.LatentGaussian`, bound
        (:meth:`jaxvb.LatentGaussian.bind`).

    Example:
      The stochastic-volatility model's start (``T = 5``: the sites see ``v_t + 2 log
      beta``, and ``f = (v, log beta)`` has 6 elements):

      >>> import jax.numpy as jnp
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> block = sv.initial_q(jnp.array([0.5, -1.2, 0.3, 2.0, -0.7])).gaussian
      >>> block.site_precision.shape, block.event_shape
      ((5,), (6,))
      >>> bool(block.is_proper)
      True
    """

    site_precision: Array
    site_shift: Array
    model: LatentGaussian
    __repr__ = Family.__repr__

    @property
    def event_shape(self):
        return (self.model.num_field,)

    @property
    def natural_params(self):
        return jnp.concatenate([self.site_precision, self.site_shift])

    def precision_and_shift(self, theta: Array):
        """``(ops, P, c)``: ``q(f | theta) = N(P^{-1} c, P^{-1})``, ``P = Q +
        L'diag(a)L`` in the prior's structure, ``c = Q m + L'b``."""
        m, precision, _ = self.model.prior_of_field(theta)
        ops = _field.ops(precision)
        a, design = self.site_precision, self.model.design
        p = _field.add_linear_sites(ops, precision, a, design, a.shape[-1])
        c = ops.matvec(precision, m) + _field.lift(self.site_shift, design, m.shape[-1])
        return ops, p, c

    def conditional(self, theta: Array):
        """``(mean, factor, ops)`` of ``q(f | theta)``."""
        mu, chol, ops, *_ = latent_target._conditional(
            self.model, self.site_precision, self.site_shift, theta
        )
        return mu, chol, ops

    def log_marginal(self, theta: Array) -> Array:
        """``log q(y | theta) = log ∫ p(f | theta) q(y | f) df``."""
        return latent_target._log_z(
            self.model, self.site_precision, self.site_shift, theta
        )[0]

    def log_prob_given(self, f: Array, theta: Array) -> Array:
        """``log q(f | theta)``."""
        return _field.log_density(*self.precision_and_shift(theta), f)

    @property
    def is_proper(self):
        # a >= 0 with a positive somewhere keeps P = Q + L'diag(a)L positive definite
        # for every theta whose prior is PD on its proper part (and on flat directions
        # the sites inform: SV's log beta); a > 0, as the paper's sites are.
        a, b = self.site_precision, self.site_shift
        return jnp.all(a > 0) & jnp.all(jnp.isfinite(a)) & jnp.all(jnp.isfinite(b))


def _linearised_draw(block: ConditionalBlock, noise, parents: Array, dtype, wrt_parents):
    """``x = s(A(parents) eta, z)``, ``dx/deta`` ``(k,)`` and ``dx/dparents`` ``(i,)``.

    Without ``wrt_parents`` the second derivative is not computed (zeros).
    """
    k = block.eta.shape[0]

    def draw(inputs):
        eta, prev = inputs[:k], inputs[k:]
        return block.given(prev, eta).from_noise(noise).astype(dtype)

    point = jnp.concatenate([block.eta, parents])
    tangents = jnp.eye(point.shape[0] if wrt_parents else k, point.shape[0], dtype=dtype)
    # vmap over tangents only: the primal (the sampler) runs once.
    x, dx = jax.vmap(lambda t: jax.jvp(draw, (point,), (t,)))(tangents)
    if not wrt_parents:
        return x[0], dx, jnp.zeros(parents.shape, dtype)
    return x[0], dx[:k], dx[k:]


@register_family
class Hierarchical(Family):
    """``q(x) = q_1(x_1) q_2(x_2 | x_1) ... q_n(x_n | x_<n) q(f | x_1..x_n)``.

    ``x`` is flat: the ``n`` scalar blocks first, then ``f``. A pytree whose leaves are
    the blocks' parameters; ``jaxvb.fit`` runs it with :func:`hierarchical`.

    Attributes:
      scalars: tuple of :class:`ConditionalBlock`.
      gaussian: the :class:`GaussianSitesBlock`.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> q = sv.initial_q(jnp.array([0.5, -1.2, 0.3, 2.0, -0.7]))
      >>> q.num_scalars, q.event_shape, bool(q.is_proper)   # x = (u, s2, v_1..v_5, log beta)
      (2, (8,), True)
      >>> q.scalars[0].given(jnp.zeros(0))   # q(u), the prior of (phi + 1) / 2
      Beta(concentration1=20.0, concentration0=1.5)
    """

    scalars: tuple
    gaussian: GaussianSitesBlock

    @property
    def num_scalars(self) -> int:
        return len(self.scalars)

    @property
    def event_shape(self):
        return (self.num_scalars + self.gaussian.model.num_field,)

    @property
    def dtype(self):
        return self.gaussian.site_shift.dtype

    @property
    def natural_params(self):
        return jnp.concatenate(
            [b.eta for b in self.scalars] + [self.gaussian.natural_params]
        )

    @property
    def is_proper(self):
        ok = self.gaussian.is_proper
        for b in self.scalars:
            ok = ok & b.is_proper
        return ok

    def draw_scalars(self, keys):
        """The scalar draws ``theta`` from per-block noise."""
        theta = jnp.zeros((0,), self.dtype)
        for i, b in enumerate(self.scalars):
            x = b.given(theta).from_noise(keys[i]).astype(self.dtype)
            theta = jnp.concatenate([theta, x[None]])
        return theta

    def draw_scalars_and_jacobians(self, noise, total: bool = False):
        """The scalar draws ``theta`` and, per block ``i``, ``d theta / d eta_i`` ``(n, k_i)``.

        One pass: block ``i``'s reparameterised draw ``x_i = s(A(theta_<i) eta_i, z_i)``
        is linearised once in ``(eta_i, theta_<i)`` (``jax.jvp`` batched over the
        tangents, so the sampler's primal -- a rejection loop for Gamma and Beta -- runs
        once per block and step). With ``total`` the derivative follows the later draws
        through their parents (eq. sv2); without it only row ``i`` is kept (svapprox).
        """
        theta = jnp.zeros((0,), self.dtype)
        direct, parents = [], []
        for i, b in enumerate(self.scalars):
            x, d_eta, d_prev = _linearised_draw(b, noise[i], theta, self.dtype, total)
            theta = jnp.concatenate([theta, x[None]])
            direct.append(d_eta)
            parents.append(d_prev)
        n = self.num_scalars
        jacobians = []
        for i, b in enumerate(self.scalars):
            jac = jnp.zeros((n, b.eta.shape[0]), self.dtype).at[i].set(direct[i])
            if total:
                for j in range(i + 1, n):  # later draws move with their parents
                    jac = jac.at[j].set(parents[j] @ jac[:j])
            jacobians.append(jac)
        return theta, tuple(jacobians)

    def log_q_scalars(self, theta: Array) -> Array:
        """``log q_i(theta_i | theta_<i)`` for each block, shape ``(n,)``."""
        return jnp.stack(
            [b.given(theta[:i]).log_prob(theta[i]) for i, b in enumerate(self.scalars)]
        )

    def noise(self, key):
        # The draw needs one factorisation per theta; a key is its randomness.
        return key

    def from_noise(self, noise):
        return self.sample_and_log_prob(noise)[0]

    def sample(self, key, sample_shape=()):
        return self.sample_and_log_prob(key, sample_shape)[0]

    def sample_and_log_prob(self, key, sample_shape=()):
        """Draws and their ``log q``, one factorisation of ``q(f | theta)`` per draw.

        ``f = mu + L'^{-1} z`` for ``P(theta) = L L'``, so ``log q(f | theta) = log|L|
        - z'z / 2 - N log(2 pi) / 2`` needs no second solve.
        """
        n = math.prod(sample_shape)
        g = self.gaussian
        dim = g.model.num_field

        def one(k):
            k_theta, k_f = jax.random.split(k)
            theta = self.draw_scalars(jax.random.split(k_theta, self.num_scalars))
            z = _random.normal(k_f, (dim,), self.dtype)
            f, logdet = _field.draw(*g.precision_and_shift(theta), z)
            log_q_f = 0.5 * (logdet - z @ z - dim * math.log(2 * math.pi))
            log_q = jnp.sum(self.log_q_scalars(theta)) + log_q_f
            return jnp.concatenate([theta, f]), log_q

        if sample_shape == ():
            return one(key)
        x, log_q = jax.vmap(one)(jax.random.split(key, n))
        return x.reshape(tuple(sample_shape) + self.event_shape), log_q.reshape(
            sample_shape
        )

    def log_prob(self, x):
        x = jnp.asarray(x, self.dtype)
        n = self.num_scalars
        theta, f = x[:n], x[n:]
        lq = jnp.sum(self.log_q_scalars(theta))
        safe = jnp.where(jnp.isfinite(lq), theta, self.draw_mode())
        return lq + self.gaussian.log_prob_given(f, safe)

    def draw_mode(self):
        # A point inside every scalar support, to keep masked branches finite.
        theta = jnp.zeros((0,), self.dtype)
        for b in self.scalars:
            q = b.given(theta)
            theta = jnp.concatenate(
                [theta, jnp.asarray(q._support_point(), self.dtype)[None]]
            )
        return theta


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
            latent_target._prior_log_norm(_field.ops(prec), prec, log_norm, mean.shape[-1]),
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
        (:func:`jaxvb.methods.trust_region`). One draw per step makes the estimates heavy-tailed: on the
        SV series about one fit in ten met, in its first 20 steps, a draw of ``s2`` far
        in the tail of a briefly flat ``q(s2 | phi)`` whose single estimate moved
        ``q`` by a KL of 5--30 nats, to a ``q(s2 | phi)`` ten times too narrow that the
        running statistics then took ~200 steps to forget. Steps of a settled fit
        move ``q`` by < 0.1 nats, early ones by < 1. ``None`` turns it off (the paper's
        plain iteration).

    Returns:
      A :class:`~jaxvb.methods.Method` for :func:`jaxvb.fit`.

    Example:
      What :func:`jaxvb.models.stochastic_volatility.fit` runs (the fit itself, ~10 s
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

    def expensive(theta: Array, q: Hierarchical):
        """``H(theta) = log p(theta) + log q(y|theta) + E(log p(y|f) - log q(y|f))``:
        :class:`jaxvb.LatentGaussian`'s target."""
        g = q.gaussian
        value, (eta, var, mu, *_) = latent_target._target(
            g.model, g.site_precision, g.site_shift, theta
        )
        return value, (eta, var, mu)

    def init_fn(key, q0, log_joint):
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

    def noise_fn(key, q):
        return jax.random.split(key, q.num_scalars)

    def estimate_fn(noise, q, log_joint):
        theta, jacobians = q.draw_scalars_and_jacobians(noise, total=indirect_effects)
        if indirect_effects:
            dh, (eta, var, mean) = jax.grad(expensive, has_aux=True)(theta, q)
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

    def solve_fn(stats, q, log_joint=None):
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

    def min_draws(q):
        return max(b.eta.shape[0] for b in q.scalars)

    label = "sv2" if indirect_effects else "svapprox"
    method = Method(
        name=f"hierarchical({label})",
        init=init_fn,
        noise=noise_fn,
        estimate=estimate_fn,
        solve=solve_fn,
        min_draws=min_draws,
    )
    if max_step_kl is None:
        return method
    return trust_region(method, _largest_block_kl, max_step_kl)._replace(name=method.name)


def _largest_block_kl(q_old: Hierarchical, q_new: Hierarchical) -> Array:
    """The largest ``KL(q_new(x_i | .) || q(x_i | .))`` over the scalar blocks, at the
    conditional modes of ``q``; NaN where an update is improper."""
    theta = q_old.draw_mode()
    kls = [
        new.given(theta[:i]).kl_divergence(old.given(theta[:i]))
        for i, (old, new) in enumerate(zip(q_old.scalars, q_new.scalars, strict=True))
    ]
    return jnp.max(jnp.stack(kls))


__all__ = [
    "ConditionalBlock",
    "GaussianSitesBlock",
    "Hierarchical",
    "HierarchicalStats",
    "hierarchical",
]
