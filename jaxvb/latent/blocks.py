r"""The blocks of a hierarchical approximation ``q(x1) q(x2 | x1) ... q(f | x1, ..., xn)``.

Section 6.1's families, which :func:`jaxvb.latent.hierarchical.hierarchical` fits (both
public in :mod:`jaxvb.composite`):

* :class:`ConditionalBlock`: a scalar block ``q(x_i | x_<i)`` = a standard family (Beta,
  InverseGamma, ...) with natural parameters ``A(x_<i) eta_i``, i.e. statistics
  ``T_i(x_i; x_<i) = A(x_<i)' T(x_i)``.
* :class:`GaussianSitesBlock`: the last block, ``q(f | theta) ∝ p(f | theta) q(y | f)``
  with the exact Gaussian prior ``p(f | theta)`` of a :class:`jaxvb.LatentGaussian`
  model and diagonal Gaussian sites on its linear predictor; its ``q(f | theta)`` is
  :mod:`jaxvb.latent.target`'s (one implementation).
* :class:`Hierarchical`: the joint ``q`` as a family (``sample``, ``log_prob``,
  ``is_proper``), with the scalar draws' reparameterisation and its Jacobians.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxvb import _random
from jaxvb.families._base import (
    Array,
    ExponentialFamily,
    Family,
    register_dataclass,
    register_family,
)
from jaxvb.latent import _field
from jaxvb.latent.model import LatentGaussian
from jaxvb.latent.target import _conditional, _log_z

__all__ = ["ConditionalBlock", "GaussianSitesBlock", "Hierarchical"]

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
        mu, chol, ops, *_ = _conditional(
            self.model, self.site_precision, self.site_shift, theta
        )
        return mu, chol, ops

    def log_marginal(self, theta: Array) -> Array:
        """``log q(y | theta) = log ∫ p(f | theta) q(y | f) df``."""
        return _log_z(self.model, self.site_precision, self.site_shift, theta)[0]

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
    the blocks' parameters; ``jaxvb.fit`` runs it with
    :func:`jaxvb.latent.hierarchical.hierarchical`.

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
