r"""GaussianMixture(weights, means, covs): a finite mixture of multivariate normals.

``q(x) = sum_i w_i N(x | m_i, S_i)`` is not an exponential family in ``x``, but with the
auxiliary component label ``u`` (paper, section 6.2) the joint

    q(x, u = i) = w_i N(x | m_i, S_i)

is one, with statistics ``delta(u = i)`` and ``delta(u = i) T(x)``: this is what
:func:`jaxvb.methods.mixture` fits. Every density here is evaluated in the log domain
(log-sum-exp over components), so far-apart components and tiny weights stay finite in
float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtri

from jaxvb import _random
from jaxvb.families._base import (
    Array,
    Family,
    as_float_arrays,
    build,
    is_concrete,
    register_family,
)
from jaxvb.families.gaussian import Gaussian


def _halton(n: int, d: int) -> np.ndarray:
    """The points ``1..n`` of the Halton sequence in ``[0, 1)^d`` (no scrambling;
    vectorised over ``n``)."""
    primes: list[int] = []
    candidate = 2
    while len(primes) < d:
        if all(candidate % p for p in primes):
            primes.append(candidate)
        candidate += 1
    out = np.zeros((n, d))
    index = np.arange(1, n + 1)
    for j, base in enumerate(primes):
        k, f = index.copy(), 1.0
        while np.any(k > 0):
            f /= base
            out[:, j] += f * (k % base)
            k //= base
    return out


@register_family
class GaussianMixture(Family):
    r"""Mixture ``q(x) = sum_i w_i N(x | m_i, S_i)`` of ``K`` multivariate normals.

    The number of components ``K`` and the dimension ``d`` are read off the shapes; the
    three arrays are the pytree's leaves, so families with batched leaves (``vmap``)
    work as for :class:`~jaxvb.Gaussian`.

    Args:
      weights: shape ``(K,)``, non-negative, summing to one. A zero weight is allowed
        (the component is then never drawn and never updated).
      means: shape ``(K, d)``.
      covs: shape ``(K, d, d)``, each symmetric positive definite.

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> q = jaxvb.GaussianMixture(
      ...     weights=jnp.array([0.3, 0.7]),
      ...     means=jnp.array([[-2.0], [1.0]]),
      ...     covs=jnp.array([[[1.0]], [[0.5]]]))
      >>> q.num_components, q.event_shape, round(float(q.mean[0]), 6)
      (2, (1,), 0.1)
    """

    weights: Array
    means: Array
    covs: Array

    def __post_init__(self):
        weights, means, covs = as_float_arrays(self.weights, self.means, self.covs)
        if weights.ndim != 1 or weights.shape[0] < 1:
            raise ValueError(
                "GaussianMixture: weights must have shape (K,) with K >= 1 components, "
                f"got {weights.shape}."
            )
        k = weights.shape[0]
        if means.ndim != 2 or means.shape[0] != k:
            raise ValueError(
                f"GaussianMixture: means must have shape (K, d) = ({k}, d) to match the "
                f"{k} weights, got {means.shape}. For one component use means[None]."
            )
        d = means.shape[1]
        if covs.shape != (k, d, d):
            raise ValueError(
                f"GaussianMixture: covs must have shape (K, d, d) = ({k}, {d}, {d}) to "
                f"match weights {weights.shape} and means {means.shape}, got {covs.shape}."
            )
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "covs", covs)
        if is_concrete(weights):
            w = np.asarray(weights, dtype=np.float64)
            if not np.all(np.isfinite(w)) or np.any(w < 0):
                raise ValueError(
                    f"GaussianMixture: weights must be finite and non-negative, got {w}."
                )
            # Loose enough for weights rounded to their dtype, tight enough to catch
            # unnormalised ones.
            tol = math.sqrt(float(jnp.finfo(weights.dtype).eps))
            if abs(w.sum() - 1.0) > tol:
                raise ValueError(
                    f"GaussianMixture: weights must sum to one, got sum {w.sum():.10g} "
                    f"({w}). Normalise them, e.g. weights / weights.sum()."
                )
        if is_concrete(means) and not np.all(np.isfinite(np.asarray(means))):
            raise ValueError("GaussianMixture: means must be finite.")
        if is_concrete(covs):
            for i in range(k):
                try:
                    Gaussian(means[i], covs[i])
                except ValueError as e:
                    raise ValueError(
                        f"GaussianMixture: component {i}: {e}".replace("Gaussian: ", "")
                    ) from None

    @classmethod
    def around(
        cls, gaussian: Gaussian, num_components: int, *, spread: float = 0.5
    ) -> GaussianMixture:
        r"""A deterministic start: ``num_components`` equal-weight copies of ``gaussian``.

        With ``gaussian = N(m, S)`` and ``S = L L'``, component ``i`` is
        ``N(m + spread * L u_i, (1 - spread^2) S)``, where ``u_1..u_K`` are the first
        ``K`` points of the Halton sequence mapped to normal quantiles, centred and
        scaled to unit mean square per coordinate. The mixture then has mean ``m`` and,
        where the ``u_i`` span every direction, about covariance ``S``: it starts where
        the Gaussian is and lets the fit pull the components apart (the paper's
        section 6.2 leaves the start open; this is the same every time, no key).

        Args:
          gaussian: the Gaussian to spread, e.g. :func:`jaxvb.laplace` or a Gaussian fit.
          num_components: ``K >= 1``; ``K = 1`` gives ``gaussian`` itself.
          spread: in ``[0, 1)``, how far the means move, in standard deviations.

        Returns:
          A :class:`GaussianMixture` of the dtype of ``gaussian``.

        Example:
          >>> import jax.numpy as jnp, jaxvb
          >>> g = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
          >>> q = jaxvb.GaussianMixture.around(g, 4)
          >>> q.weights.tolist(), q.mean.round(12).tolist(), q.covs[0].tolist()
          ([0.25, 0.25, 0.25, 0.25], [0.0, 0.0], [[0.75, 0.0], [0.0, 0.75]])
        """
        if not isinstance(gaussian, Gaussian):
            raise TypeError(
                "GaussianMixture.around needs a jaxvb.Gaussian, got "
                f"{type(gaussian).__name__}"
            )
        if not isinstance(num_components, (int, np.integer)) or num_components < 1:
            raise ValueError(
                f"num_components must be an integer >= 1, got {num_components!r}"
            )
        if not 0.0 <= spread < 1.0:
            raise ValueError(f"spread must lie in [0, 1), got {spread}")
        k, d, dtype = int(num_components), gaussian.dim, gaussian.dtype
        if k == 1:
            spread = 0.0
        u = np.asarray(ndtri(jnp.asarray(_halton(k, d))), np.float64)
        u = u - u.mean(axis=0)
        rms = np.sqrt(np.mean(u**2, axis=0))
        u = np.where(rms > 0, u / np.where(rms > 0, rms, 1.0), 0.0)
        chol = jnp.linalg.cholesky(gaussian.cov)
        means = gaussian.mean + spread * jnp.asarray(u, dtype) @ chol.T
        covs = jnp.broadcast_to((1.0 - spread**2) * gaussian.cov, (k, d, d))
        return cls(jnp.full((k,), 1.0 / k, dtype), means, covs)

    # --- shapes and components -----------------------------------------------------

    @property
    def num_components(self) -> int:
        return self.weights.shape[-1]

    @property
    def dim(self) -> int:
        return self.means.shape[-1]

    @property
    def event_shape(self) -> tuple[int, ...]:
        return (self.dim,)

    @property
    def components(self) -> Gaussian:
        """The ``K`` Gaussians as one :class:`~jaxvb.Gaussian` with batched leaves."""
        return build(Gaussian, mean=self.means, cov=self.covs)

    @property
    def log_weights(self) -> Array:
        """``log w_i``, shape ``(K,)`` (``-inf`` for a zero weight)."""
        return jnp.log(self.weights)

    @property
    def precisions(self) -> Array:
        """``S_i^{-1}``, shape ``(K, d, d)``."""
        return jax.vmap(lambda c: c.precision)(self.components)

    # --- densities -------------------------------------------------------------------

    def joint_log_probs(self, x: Array) -> Array:
        """``log q(x, u = i) = log w_i + log N(x | m_i, S_i)``, shape ``(K,)``."""
        x = jnp.asarray(x, self.dtype)
        return self.log_weights + jax.vmap(lambda c: c.log_prob(x))(self.components)

    def log_prob(self, x: Array) -> Array:
        """``log q(x)``, the log-sum-exp of :meth:`joint_log_probs`."""
        return jax.nn.logsumexp(self.joint_log_probs(x))

    def log_responsibilities(self, x: Array) -> Array:
        """``log q(u = i | x)``, shape ``(K,)``."""
        joint = self.joint_log_probs(x)
        return joint - jax.nn.logsumexp(joint)

    @property
    def is_proper(self) -> Array:
        w = self.weights
        chol = jnp.linalg.cholesky(self.covs)
        return (
            jnp.all(jnp.isfinite(w) & (w >= 0))
            & (jnp.sum(w) > 0)
            & jnp.all(jnp.isfinite(chol))
            & jnp.all(jnp.isfinite(self.means))
        )

    # --- moments ---------------------------------------------------------------------

    @property
    def mean(self) -> Array:
        """``E_q[x] = sum_i w_i m_i``, shape ``(d,)``."""
        return self.weights @ self.means

    @property
    def cov(self) -> Array:
        """``Cov_q[x] = sum_i w_i (S_i + m_i m_i') - E[x] E[x]'``, shape ``(d, d)``."""
        dev = self.means - self.mean
        spread = jnp.einsum("k,ki,kj->ij", self.weights, dev, dev)
        return jnp.einsum("k,kij->ij", self.weights, self.covs) + spread

    @property
    def variance(self) -> Array:
        return jnp.diagonal(self.cov)

    # --- sampling -------------------------------------------------------------------
    # The noise of one draw is d + 1 standard normals from one call: d for the
    # component's Gaussian and one, z, for the label by the inverse CDF of the weights at
    # u = 2 Phi(|z|) - 1 (uniform on (0, 1)). Since u does not change with the sign of
    # z, the antithetic noise -noise mirrors the draw within the same component. The
    # first d normals are those Gaussian.noise draws from the same key (JAX fills an
    # array of normals by position), so one component draws exactly as a Gaussian does.

    def noise(self, key: Array) -> Array:
        return _random.normal(key, (self.dim + 1,), self.dtype)

    def _label(self, z: Array) -> Array:
        u = jax.scipy.special.erf(jnp.abs(z) / math.sqrt(2.0))
        cdf = jnp.cumsum(self.weights)
        # cdf / cdf[-1] ends at exactly 1 > u, so a trailing zero weight is never drawn.
        return jnp.minimum(jnp.sum(cdf / cdf[-1] <= u), self.num_components - 1)

    def label(self, noise: Array) -> Array:
        """The component ``u`` that ``noise`` (from :meth:`noise`) draws."""
        return self._label(noise[-1])

    def from_noise(self, noise: Array) -> Array:
        i = self.label(noise)
        chol = jnp.linalg.cholesky(self.covs[i])
        return self.means[i] + chol @ noise[: self.dim]

    def antithetic(self, noise: Array) -> Array:
        return -noise

    def noise_from_uniforms(self, u: Array) -> Array:
        """The :meth:`noise` whose draw is that of the ``d + 1`` uniforms ``u``.

        ``u[0]`` picks the label by the inverse CDF of the weights, ``u[1:]`` are the
        component's normals by their quantiles: so that stratified or quasi-random
        uniforms (:func:`jaxvb.diagnostics.mixture_evidence`) give draws of ``q``.
        """
        u = jnp.asarray(u, self.dtype)
        return jnp.concatenate([ndtri(u[1:]), ndtri(0.5 + 0.5 * u[:1])])

    def widened(self, share: float = 0.5, scale: float = 2.5) -> GaussianMixture:
        """The defensive mixture ``(1 - share) q + share q_scale``, ``2K`` components.

        ``q_scale`` is ``q`` with every covariance times ``scale^2``. As an importance
        sampling proposal for ``p`` its ratios ``q / proposal`` are at most
        ``1 / (1 - share)``, and ``p / proposal`` stays moderate where ``p``'s tails
        are heavier than ``q``'s (Hesterberg 1995, defensive importance sampling).

        Example:
          >>> import jax.numpy as jnp, jaxvb
          >>> q = jaxvb.GaussianMixture(jnp.ones(1), jnp.zeros((1, 1)), jnp.ones((1, 1, 1)))
          >>> w = q.widened(0.5, 2.0)
          >>> w.weights.tolist(), w.covs.ravel().tolist()
          ([0.5, 0.5], [1.0, 4.0])
        """
        weights = jnp.concatenate([(1.0 - share) * self.weights, share * self.weights])
        means = jnp.concatenate([self.means, self.means])
        covs = jnp.concatenate([self.covs, scale**2 * self.covs])
        return build(GaussianMixture, weights=weights, means=means, covs=covs)

    def component_noise(self, key: Array) -> Array:
        """Noise for one draw of every component: ``K d + 1`` standard normals.

        The first ``d`` are those of ``noise(key)`` (so that one component draws
        exactly as a :class:`~jaxvb.Gaussian` does with ``key``); the last is a label.
        """
        return _random.normal(key, (self.num_components * self.dim + 1,), self.dtype)

    def component_draws(self, noise: Array) -> Array:
        """One draw from every component, shape ``(K, d)``, from :meth:`component_noise`."""
        normal = noise[:-1].reshape(self.num_components, self.dim)
        chol = jnp.linalg.cholesky(self.covs)
        return self.means + jnp.einsum("kij,kj->ki", chol, normal)

    def component_label(self, noise: Array) -> Array:
        """A label drawn from the weights by :meth:`component_noise`'s last normal."""
        return self._label(noise[-1])

    # --- the joint q(x, u), an exponential family ------------------------------------

    @property
    def natural_params(self) -> Array:
        """``(log w, eta_1, ..., eta_K)``: the joint's, with ``eta_i`` component ``i``'s."""
        etas = jax.vmap(lambda c: c.natural_params)(self.components)
        return jnp.concatenate([self.log_weights, etas.ravel()])

    @property
    def entropy(self):
        raise NotImplementedError(
            "GaussianMixture: the entropy of a mixture has no closed form; estimate it "
            "as -mean(log_prob(x)) over draws x (jaxvb.diagnostics does)."
        )

    def __repr__(self) -> str:
        if is_concrete(self.weights) and self.weights.ndim == 1:
            w = np.round(np.asarray(self.weights), 4).tolist()
            return f"GaussianMixture(K={self.num_components}, d={self.dim}, weights={w})"
        return f"GaussianMixture(weights={self.weights.shape}, means={self.means.shape})"
