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
  with the exact Gaussian prior ``p(f | theta)`` (arrowhead precision, zero mean) and a
  Gaussian approximate likelihood ``q(y | f) = exp(eta7' f - f' eta6 f / 2)`` whose
  precision ``eta6`` has a diagonal-plus-border pattern. Its statistics are those of
  Algorithm 2 (``a = E grad log p(y|f)``, ``eta6 = -E hess log p(y|f)``, ``z = E f``),
  Rao-Blackwellised: the model gives the expectations under ``q(f | theta)``
  analytically from the mean and the selected inverse (:class:`LatentGaussianModel`).
  Its algebra (``P = Q + eta6``, ``log q(y | theta)``, ``E log q(y | f)``, the shift
  from the statistics) is :mod:`jaxvb._field`'s, the same as :class:`jaxvb.LatentGaussian`'s.
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

from jaxvb import _field
from jaxvb._algebra import solve_equilibrated
from jaxvb.families._base import (
    Array,
    ExponentialFamily,
    Family,
    build,
    register_dataclass,
    register_family,
)
from jaxvb.linalg import (
    Arrowhead,
    cholesky_arrowhead,
    cholesky_forward_arrowhead,
    logdet_arrowhead,
    matvec_arrowhead,
    matvec_triangular_arrowhead,
    solve_arrowhead,
    solve_triangular_arrowhead,
)
from jaxvb.linalg import _small as small
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


class LatentGaussianModel(NamedTuple):
    """What a model gives the Gaussian block ``f`` (length ``T + k``, border last).

    ``log p(theta, f, y) = log_prior(theta) + log N(f | 0, Q(theta)^{-1}) + log p(y | f)``,
    with ``Q`` an arrowhead precision that may be singular on the border (a flat prior).

    Attributes:
      log_prior: ``theta (n,) -> log p(theta)``.
      prior_precision: ``theta -> (Q: Arrowhead, logdet)``, ``logdet`` the log
        pseudo-determinant of ``Q`` (over its proper part; flat directions count 1).
      expected_log_lik: ``(mean, cov: Arrowhead) -> E log p(y | f)`` under
        ``N(mean, Sigma)``, with ``cov`` the selected inverse (band, border, corner).
      expected_derivatives: ``(mean, cov) -> (E grad, E(-hess))``, the gradient
        ``(T + k,)`` and minus the Hessian of ``log p(y | f)`` as an ``Arrowhead`` with a
        diagonal band ``(1, T)``.

    Example:
      The stochastic-volatility model's (:mod:`jaxvb.models.stochastic_volatility`),
      with ``theta = ((phi + 1) / 2, s2)`` and ``f = (v_1..v_T, log beta)``:

      >>> import jax.numpy as jnp
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> model = sv.model_structure(jnp.array([0.5, -1.2, 0.3, 2.0, -0.7]))
      >>> Q, logdet = model.prior_precision(jnp.array([0.975, 0.05]))
      >>> Q.band.shape, Q.border.shape, Q.corner.shape   # tridiagonal AR(1), flat log beta
      ((2, 5), (5, 1), (1, 1))
    """

    log_prior: Callable
    prior_precision: Callable
    expected_log_lik: Callable
    expected_derivatives: Callable


@register_dataclass
class GaussianSitesBlock:
    """``q(f | theta) ∝ p(f | theta) exp(shift' f - f' sites f / 2)``.

    The Gaussian part of a :class:`Hierarchical` family (not a family of its own).

    Attributes:
      sites: ``eta6`` as an ``Arrowhead`` with diagonal band ``(1, T)``, border
        ``(T, k)`` and corner ``(k, k)``.
      shift: ``eta7``, shape ``(T + k,)``.
      prior: static ``theta -> (Q: Arrowhead, logdet)``.

    Example:
      The stochastic-volatility model's start (``T = 5``, so ``f`` has 6 elements):

      >>> import jax.numpy as jnp
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> block = sv.initial_q(jnp.array([0.5, -1.2, 0.3, 2.0, -0.7])).gaussian
      >>> block.sites.band.shape, block.sites.border.shape, block.shift.shape
      ((1, 5), (5, 1), (6,))
      >>> bool(block.is_proper)
      True
    """

    sites: Arrowhead
    shift: Array
    prior: Callable = dataclasses.field(default=None, metadata=_STATIC)
    __repr__ = Family.__repr__

    @property
    def event_shape(self):
        return self.shift.shape

    @property
    def natural_params(self):
        s = self.sites
        return jnp.concatenate(
            [s.band.ravel(), s.border.ravel(), s.corner.ravel(), self.shift]
        )

    def precision(self, theta: Array) -> Arrowhead:
        q, _ = self.prior(theta)
        return _field.Arrowhead.add_sites(q, self.sites)

    def posterior(self, theta: Array):
        """``(mean, Cholesky factor)`` of ``q(f | theta)``."""
        factor = cholesky_arrowhead(self.precision(theta))
        return solve_arrowhead(factor, self.shift), factor

    def log_marginal(self, theta: Array, factor=None) -> Array:
        """``log q(y | theta) = log ∫ p(f | theta) q(y | f) df`` (up to a constant)."""
        _, logdet_prior = self.prior(theta)
        if factor is None:
            factor = cholesky_arrowhead(self.precision(theta))
        mean = solve_arrowhead(factor, self.shift)
        return _field.log_normaliser(
            _field.Arrowhead, logdet_prior, factor, self.shift, mean
        )

    def log_site(self, mean: Array, cov: Arrowhead) -> Array:
        """``E log q(y | f) = shift' m - (m' eta6 m + tr(eta6 Sigma)) / 2`` (selected)."""
        return _field.expected_log_site(_field.Arrowhead, self.sites, self.shift, mean, cov)

    def log_prob_given(self, f: Array, theta: Array) -> Array:
        """``log q(f | theta)``, one scan: ``log|L| - |L'f - L^{-1} eta7|^2 / 2 - ...``."""
        factor, y = cholesky_forward_arrowhead(self.precision(theta), self.shift)
        r = matvec_triangular_arrowhead(factor, f, transpose=True) - y
        n = f.shape[0]
        return 0.5 * (logdet_arrowhead(factor) - r @ r - n * math.log(2 * math.pi))

    @property
    def is_proper(self):
        # eta6 positive semi-definite (with the diagonal positive) makes q(f | theta)
        # proper for every theta whose prior is PD on the non-border part (and on the
        # border, or the likelihood informs it: SV's flat log beta). ">=": sites that
        # leave the border to a proper prior have a Schur complement of exactly 0, and
        # -1e-8 * tiny rounds to -0.0 (found with the eight schools' mu).
        h, b, c = self.sites.band[0], self.sites.border, self.sites.corner
        ok_h = jnp.all(h > 0)
        safe = jnp.where(h > 0, h, 1.0)
        schur = c - (b / safe[:, None]).T @ b
        scale = jnp.maximum(jnp.max(jnp.abs(c)), jnp.finfo(c.dtype).tiny)
        eig = small.eigvalsh(schur)  # SV's 1 x 1 (log beta): no LAPACK call
        finite = jnp.all(jnp.isfinite(self.shift)) & jnp.all(jnp.isfinite(b))
        return ok_h & finite & jnp.all(eig >= -1e-8 * scale)


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
        return (self.num_scalars + self.gaussian.shift.shape[0],)

    @property
    def dtype(self):
        return self.gaussian.shift.dtype

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

        ``f = L'^{-1} (L^{-1} eta7 + z)`` for ``P(theta) = L L'``, so ``log q(f | theta) =
        log|L| - z'z / 2 - n log(2 pi) / 2`` needs no second solve: two scans per draw
        (the factor with ``L^{-1} eta7``, then the back substitution).
        """
        n = math.prod(sample_shape)
        g = self.gaussian
        dim = g.shift.shape[0]

        def one(k):
            k_theta, k_f = jax.random.split(k)
            theta = self.draw_scalars(jax.random.split(k_theta, self.num_scalars))
            factor, y = cholesky_forward_arrowhead(g.precision(theta), g.shift)
            z = jax.random.normal(k_f, (dim,), self.dtype)
            f = solve_triangular_arrowhead(factor, y + z, transpose=True)
            log_q_f = 0.5 * (logdet_arrowhead(factor) - z @ z - dim * math.log(2 * math.pi))
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
    """Per scalar block ``C_i, g_i`` (eq. grad); Algorithm 2's ``a, eta6, z`` for ``f``.

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
      >>> stats.a.shape, stats.sites.band.shape, stats.z.shape
      ((6,), (1, 5), (6,))
    """

    scalars: tuple
    a: Array
    sites: Arrowhead
    z: Array


def _conditional(q: Hierarchical, theta: Array):
    """``q(f | theta)``: mean, selected inverse and factor of its precision."""
    g = q.gaussian
    factor, mean, cov = _field.Arrowhead.moments(g.precision(theta), g.shift)
    return mean, cov, factor


def _direct_gradient(model: LatentGaussianModel, q: Hierarchical, theta: Array):
    """``dH/dtheta`` with ``q(f | theta)`` held fixed in the last term (eq. svapprox).

    Only the prior precision ``Q(theta)`` depends on ``theta``, so with ``P = Q +
    eta6`` and ``m = P^{-1} eta7``

        d log q(y | theta) = (d log|Q| - tr(P^{-1} dQ) - m' dQ m) / 2,

    where ``tr(P^{-1} dQ)`` needs only the selected inverse (``dQ`` has the arrowhead
    pattern). ``dQ`` comes from ``jacfwd`` of the elementwise prior, so nothing is
    differentiated through the ``O(T)`` scans of the factorisation.
    """
    mean, cov, _ = _conditional(q, theta)

    def along(direction):
        _, (d_q, d_logdet) = jax.jvp(q.gaussian.prior, (theta,), (direction,))
        trace = _field.Arrowhead.inner(cov, d_q)
        quad = mean @ matvec_arrowhead(d_q, mean)
        return 0.5 * (d_logdet - trace - quad)

    eye = jnp.eye(theta.shape[0], dtype=theta.dtype)
    grad = jax.vmap(along)(eye) + jax.grad(model.log_prior)(theta)
    return grad, (mean, cov)


def hierarchical(
    model: LatentGaussianModel,
    *,
    indirect_effects: bool = False,
    max_step_kl: float | None = 1.0,
) -> Method:
    """Eq. hierarchicalupdate for a :class:`Hierarchical` ``q``, one draw per step.

    Each step draws ``theta = (x_1..x_n)`` by reparameterisation, solves the Gaussian
    block at ``theta`` in ``O(T)`` (arrowhead Cholesky, mean, selected inverse) and
    forms, without sampling ``f``:

    * per scalar block, ``C_i^ = d/deta_i T_i(x_i)`` and ``g_i^ = d/deta_i G_i`` (see the
      module docstring; ``indirect_effects`` chooses eq. sv2 or svapprox);
    * for ``f``, ``a^ = E grad log p(y|f)``, ``eta6^ = -E hess log p(y|f)``,
      ``z^ = E f`` under ``q(f | theta)``, from ``model.expected_derivatives``;

    and ``solve`` gives ``eta_i = C_i^{-1} g_i``, ``eta7 = a + eta6 z``.

    The ``log_joint`` given to ``fit`` is used only for the diagnostics and for the
    value reported per step (at ``f`` = its conditional mean).

    Args:
      model: the structure of the log joint, :class:`LatentGaussianModel`.
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

    def expensive(q: Hierarchical, theta: Array):
        """``H(theta) = log p(theta) + log q(y|theta) + E(log p(y|f) - log q(y|f))``."""
        g = q.gaussian
        _, logdet_prior = g.prior(theta)
        mean, cov, factor = _conditional(q, theta)
        log_marg = _field.log_normaliser(
            _field.Arrowhead, logdet_prior, factor, g.shift, mean
        )
        extra = model.expected_log_lik(mean, cov) - g.log_site(mean, cov)
        value = model.log_prior(theta) + log_marg + extra
        aux = (
            jax.lax.stop_gradient(mean),
            jax.tree_util.tree_map(jax.lax.stop_gradient, cov),
        )
        return value, aux

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
        return HierarchicalStats(tuple(scalars), g.shift, g.sites, jnp.zeros_like(g.shift))

    def noise_fn(key, q):
        return jax.random.split(key, q.num_scalars)

    def estimate_fn(noise, q, log_joint):
        theta, jacobians = q.draw_scalars_and_jacobians(noise, total=indirect_effects)
        if indirect_effects:
            dh, (mean, cov) = jax.grad(expensive, argnums=1, has_aux=True)(q, theta)
        else:
            dh, (mean, cov) = _direct_gradient(model, q, theta)
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
        grad, neg_hess = model.expected_derivatives(mean, cov)
        x = jnp.concatenate([theta, mean])
        log_p = log_joint(x)
        stats = HierarchicalStats(tuple(scalars), grad, neg_hess, mean)
        return stats, x, log_p

    def solve_fn(stats, q, log_joint=None):
        del log_joint
        scalars = tuple(
            b.from_natural(solve_equilibrated(s.C, s.g))
            for b, s in zip(q.scalars, stats.scalars, strict=True)
        )
        shift = _field.site_shift(_field.Arrowhead, stats.sites, stats.a, stats.z)
        gaussian = build(
            GaussianSitesBlock, sites=stats.sites, shift=shift, prior=q.gaussian.prior
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
    "LatentGaussianModel",
    "hierarchical",
]
