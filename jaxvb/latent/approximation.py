r"""The fitted approximation ``q(theta) q(f | theta)`` of a latent Gaussian model.

:class:`LatentGaussianApproximation` is a family (a registered pytree): a Gaussian
``q(theta)`` over the hyperparameters and Gaussian sites ``(a, b)`` that, with the
model's exact prior, define ``q(f | theta)`` (:func:`jaxvb.latent.target._conditional`).
Here are its draws (flat ``x = (theta, f)``, one factorisation of ``q(f | theta)`` each),
their densities, the pairs of draws that share ``theta`` for the diagnostics, and the
importance-resampled draws that correct ``q(theta)`` towards the posterior
(:class:`LatentImportance`).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb import _random, _static, linalg
from jaxvb._platform import after, jit_fast
from jaxvb.diagnostics import khat_sd, psis
from jaxvb.diagnostics.pareto import resample_indices
from jaxvb.families._base import Array, Family, build, is_concrete, register_family
from jaxvb.families.gaussian import Gaussian
from jaxvb.latent import _field
from jaxvb.latent.target import _LOG_2PI, _conditional, _newton_sites, _prior_log_norm

if TYPE_CHECKING:
    from jaxvb.latent.model import LatentGaussian


@_static.memo_by_signature
def _costly_factorisation(model: LatentGaussian, k: int, dtype) -> bool:
    """Whether ``q(f | theta)``'s factorisation is a costly one: dense or blocked banded
    (``w >= 4``), of at least :data:`_COSTLY_FLOPS` (``T^3 / 3`` dense, ``T w^2``
    banded). A smaller one costs less than the loop and dispatch around it: its draws
    vectorise and its start compiles quickly."""
    theta = jax.ShapeDtypeStruct((k,), dtype)
    _, precision, _ = jax.eval_shape(model.prior_of_field, theta)
    if isinstance(precision, (linalg.Banded, linalg.Arrowhead)):
        band = precision.ab if isinstance(precision, linalg.Banded) else precision.band
        w, t = band.shape[0] - 1, band.shape[1]
        return linalg.banded._blocked(w) and t * w * w >= _COSTLY_FLOPS
    t = precision.shape[-1]
    return t**3 / 3 >= _COSTLY_FLOPS  # dense


#: A factorisation this costly (flops) or more is worth a loop over draws on the CPU
#: and an optimised start (a dense field of T >= 67)
_COSTLY_FLOPS = 1e5


@register_family
class LatentGaussianApproximation(Family):
    """``q(theta) q(f | theta)``: a Gaussian over the hyperparameters and, given them,
    the prior of ``f`` times Gaussian sites.

    Draws are flat, ``x = (theta, f)`` of shape ``(k + T,)``; :meth:`unpack` splits
    them (``Result.sample`` returns ``(theta, f)``).

    Attributes:
      theta: ``q(theta)``, a :class:`jaxvb.Gaussian` over ``k`` hyperparameters.
      site_precision: ``a``, shape ``(T,)``.
      site_shift: ``b``, shape ``(T,)``.
      model: the :class:`LatentGaussian` (its ``prior`` defines ``q(f | theta)``).
      theta_centre: ``(k,)``, a fixed point near ``q(theta)`` (the start's mean), about
        which the method's statistics are kept (no cancellation in
        ``E[theta theta'] - E[theta] E[theta]'`` far from 0).
      theta_frame: ``(k, k)``, lower triangular, fixed with ``theta_centre`` (the
        Cholesky factor of the start's covariance): the ``"values"`` regression works
        in ``u = theta_frame^{-1} (theta - theta_centre)``, where its statistics (up to
        fourth moments) are of order one whatever the hyperparameters' scales.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> model = jaxvb.LatentGaussian(
      ...     log_prior=lambda th: -0.5 * jnp.sum(th**2),
      ...     prior=lambda th: (jnp.zeros(2), jnp.exp(th[0]) * jnp.eye(2)),
      ...     log_lik=lambda f, y: -0.5 * (y - f) ** 2, data=jnp.array([1.0, -1.0]))
      >>> _, q, _ = model.start(jnp.zeros(1))
      >>> theta, f = q.unpack(q.sample(jax.random.key(0), (3,)))
      >>> theta.shape, f.shape, q.site_precision.tolist()
      ((3, 1), (3, 2), [1.0, 1.0])
    """

    theta: Gaussian
    site_precision: Array
    site_shift: Array
    model: LatentGaussian
    theta_centre: Array
    theta_frame: Array

    @property
    def dtype(self):
        return self.theta.mean.dtype

    @property
    def num_hyper(self) -> int:
        return self.theta.mean.shape[-1]

    @property
    def num_latent(self) -> int:
        """``N``, the field's length (fixed effects included)."""
        return self.model.num_field

    @property
    def event_shape(self) -> tuple[int, ...]:
        return (self.num_hyper + self.num_latent,)

    def conditional(self, theta: Array):
        """``q(f | theta)`` as ``(mean, chol, ops)``: its mean and the Cholesky factor
        of its precision ``Q(theta) + diag(a)`` (dense or banded, per ``ops``)."""
        mu, chol, ops, *_ = _conditional(
            self.model, self.site_precision, self.site_shift, theta
        )
        return mu, chol, ops

    @property
    def factors_per_draw(self) -> bool:
        """Each draw factors ``Q(theta) + diag(a)``: True where that is a costly dense
        or blocked banded (``w >= 4``) factorisation (:func:`_costly_factorisation`),
        whose batches run slower than a loop over them on XLA:CPU; a small, diagonal
        or tridiagonal one vectorises."""
        return _costly_factorisation(self.model, self.theta.mean.shape[-1], self.dtype)

    @property
    def is_proper(self) -> Array:
        _, chol, ops = self.conditional(self.theta.mean)
        finite = jnp.all(jnp.isfinite(self.site_precision)) & jnp.all(
            jnp.isfinite(self.site_shift)
        )
        return self.theta.is_proper & ops.is_pd(chol) & finite

    @property
    def natural_params(self) -> Array:
        """``q(theta)``'s natural parameters, then the sites' ``(b, -a / 2)`` (the
        natural parameters of ``exp(b f - a f^2 / 2)``): what ``fit(...,
        trace=True)`` records per step."""
        return jnp.concatenate(
            [self.theta.natural_params, self.site_shift, -0.5 * self.site_precision]
        )

    def noise(self, key: Array):
        # one draw of k + T normals, split: one random-number program, not three (a
        # split key and two draws), each compiled again wherever a fit's program
        # draws (the step, the diagnostics' chunks, the check)
        z = _random.normal(key, (self.num_hyper + self.num_latent,), self.dtype)
        return z[: self.num_hyper], z[self.num_hyper :]

    def from_noise(self, noise) -> Array:
        z_theta, z_f = noise
        theta = self.theta.from_noise(z_theta)
        mu, chol, ops = self.conditional(theta)
        # the noise's back-solve after the mean's solve: under vmap (many draws) both
        # are batched triangular solves, and two at once can hang jaxlib 0.10
        # (_platform.after)
        return jnp.concatenate([theta, mu + ops.back(chol, after(z_f, mu))])

    def antithetic(self, noise):
        return jax.tree_util.tree_map(jnp.negative, noise)

    def log_prob(self, x: Array) -> Array:
        theta, f = self.unpack(x)
        a = self.site_precision
        mu, chol, ops, _, precision, *_ = _conditional(
            self.model, a, self.site_shift, theta
        )
        p = _field.add_linear_sites(ops, precision, a, self.model.design, a.shape[-1])
        d = f - mu
        log_q_f = 0.5 * (ops.logdet(chol) - d.shape[0] * _LOG_2PI) - 0.5 * jnp.dot(
            d, ops.matvec(p, d)
        )
        return self.theta.log_prob(theta) + log_q_f

    def sample_and_log_prob(self, key: Array, sample_shape: tuple[int, ...] = ()):
        """Draws and their ``log q``, one factorisation of ``q(f | theta)`` per draw:
        ``f = mu + L'^{-1} z`` has ``log q(f | theta) = log|L| - T/2 log 2 pi - z'z/2``
        (``log_prob`` of a given point factors again). The same draws as ``sample``."""
        if sample_shape != ():
            keys = jax.random.split(key, math.prod(sample_shape))
            x, log_q = jax.vmap(self.sample_and_log_prob)(keys)
            return (
                x.reshape(tuple(sample_shape) + self.event_shape),
                log_q.reshape(tuple(sample_shape)),
            )
        theta, mu, chol, ops, z_f, log_q_f = self._draw_theta(key)
        v = ops.back(chol, after(z_f, mu))  # the same bits, and order, as sample's
        # q(theta)'s density after the back-solve, not beside it: under vmap both are
        # batched LAPACK calls, and two at once can hang jaxlib 0.10 (_platform.after)
        log_q = self.theta.log_prob(after(theta, v)) + log_q_f
        return jnp.concatenate([theta, mu + v]), log_q

    def _draw_theta(self, key: Array):
        """A draw's ``theta`` and what ``q(f | theta)`` gives at it, before ``f``:
        ``(theta, mu, chol, ops, z_f, log q(f | theta))``, ``f = mu + L'^{-1} z_f``
        (:meth:`sample_and_log_prob` and :meth:`paired_draws`)."""
        z_theta, z_f = self.noise(key)
        theta = self.theta.from_noise(z_theta)
        mu, chol, ops = self.conditional(theta)
        log_q_f = 0.5 * (ops.logdet(chol) - z_f.shape[0] * _LOG_2PI) - 0.5 * jnp.dot(
            z_f, z_f
        )
        return theta, mu, chol, ops, z_f, log_q_f

    def paired_draws(self, key: Array, log_joint: Callable[[Array], Array]):
        """Two draws that share ``theta``, ``f = mu +- L'^{-1} z`` (antithetic given
        ``theta``), with ``log p`` and ``log q`` at each: ``(x (2, k + N), log_p (2,),
        log_q (2,))``. One factorisation of ``q(f | theta)`` for both (their ``log q``
        is the same), and one of the prior where ``log_joint`` has
        :meth:`LatentGaussian.log_joint_given`. The diagnostics evaluate these pairs
        (:func:`jaxvb.diagnostics.evaluate`): half the factorisations per draw, and
        the ``f``-linear part of ``log p - log q`` cancels within a pair, so that the
        pair's two values are negatively correlated and the ELBO's estimate from
        ``n`` pairs is less noisy than from ``2 n`` independent draws."""
        theta, mu, chol, ops, z_f, log_q_f = self._draw_theta(key)
        log_q = self.theta.log_prob(theta) + log_q_f
        v = ops.back(*after(after((chol, z_f), log_q), mu))
        # log_joint's own factorisation after q's, not beside it (_platform.after:
        # under vmap, two batched factorisations at once can hang jaxlib 0.10)
        theta, fs = after((theta, jnp.stack([mu + v, mu - v])), log_q)
        given = getattr(log_joint, "log_joint_given", None)
        x = jnp.concatenate([jnp.broadcast_to(theta, (2, theta.shape[0])), fs], axis=1)
        if callable(given):
            log_p = given(theta, fs)
        else:
            first = jnp.asarray(log_joint(x[0]))
            log_p = jnp.stack([first, jnp.asarray(log_joint(after(x[1], first)))])
        log_p = jnp.asarray(log_p).astype(self.dtype)
        return x, log_p, jnp.stack([log_q, log_q])

    def importance_resample(
        self,
        key: Array,
        n: int,
        *,
        num_theta: int = 2000,
        num_f: int = 32,
        widen: float = 1.0,
        warn: bool = True,
    ) -> LatentImportance:
        """``n`` draws of ``(theta, f)`` corrected towards the posterior by importance
        sampling: where ``p(f | theta, y)`` is far from Gaussian (small counts), the
        Gaussian ``q(f | theta)``'s gap varies with ``theta`` and biases ``q(theta)``.

        Draws ``num_theta`` hyperparameters from ``q(theta)`` widened (its covariance
        times ``widen^2``) and, for each, ``num_f`` fields: half of ``q(f | theta)``,
        half of the Laplace approximation of ``p(f | theta, y)`` at that ``theta``
        (whose sites follow ``theta`` where ``q``'s fixed sites do not). Each
        ``theta_i`` is weighted by ``w_i = mean_j p(y, theta_i, f_ij) / (r(theta_i)
        s(f_ij | theta_i))`` (``r`` the widened proposal, ``s`` the even mixture of the
        two Gaussians; an unbiased estimate of ``p(y, theta_i) / r(theta_i)``, the
        conditional gap integrated out), the
        weights Pareto-smoothed (:func:`jaxvb.diagnostics.psis`); each ``theta_i``
        keeps one of its fields, picked by its ratio, and the ``n`` draws resample
        the pairs by the smoothed weights (sampling importance resampling, two
        stages). The correction matters most for a ``q`` fitted to the ELBO
        (``target="elbo"``) on small counts, whose ``q(theta)`` is biased towards
        small prior variances; the default ``"ep"`` target leaves less to correct.

        Args:
          key: a JAX random key.
          n: the number of draws returned.
          num_theta: hyperparameter draws weighted; the estimate's noise falls as
            ``1 / sqrt(ess)``.
          num_f: fields per hyperparameter draw (``num_theta * num_f`` evaluations of
            the log joint, in chunks; per hyperparameter draw, a Newton search for
            the Laplace approximation and three factorisations). With ``num_f = 1``
            the one field is ``q(f | theta)``'s.
          widen: the proposal's scale against ``q(theta)``'s (``>= 1``). Wider
            proposals reach where ``q(theta)`` is too narrow, but there the fixed
            sites fit ``p(f | theta, y)`` worse and the inner ratios get noisier, which
            can raise k-hat: keep it at 1 unless ``q(theta)`` is known to be too
            narrow.
          warn: a ``RuntimeWarning`` where ``khat > 0.7`` (the weights' tail is too
            heavy for the correction to be trusted), or where it is NaN with an ESS
            under 25 (too few finite weights).

        Returns:
          :class:`LatentImportance`: ``theta (n, k)``, ``f (n, N)``, ``khat``, ``ess``
          and ``log_evidence`` (``log p(y)`` as the log mean of all weights).
        """
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if not isinstance(num_theta, (int, np.integer)) or num_theta < 25:
            raise ValueError(
                "num_theta must be an integer >= 25 (Pareto smoothing fits the tail of "
                f"at least 5 weights), got {num_theta!r}"
            )
        if not isinstance(num_f, (int, np.integer)) or num_f < 1:
            raise ValueError(f"num_f must be a positive integer, got {num_f!r}")
        if not float(widen) >= 1.0:
            raise ValueError(f"widen must be a number >= 1, got {widen!r}")
        out = _importance_resample(
            self,
            key,
            int(n),
            int(num_theta),
            int(num_f),
            jnp.asarray(widen, self.dtype),
        )
        # a NaN k-hat is either equal weights (no tail to fit: q is exact) or too few
        # finite ones; the ESS tells which
        if warn and is_concrete(out.khat):
            khat, ess = float(out.khat), float(out.ess)
            warn = khat > 0.7 or (math.isnan(khat) and not ess >= 25.0)
        if warn and is_concrete(out.khat):
            warnings.warn(
                f"importance_resample: the Pareto k-hat of the hyperparameters' weights "
                f"is {khat:.2f} (above 0.7, or NaN with an ESS of {ess:.0f}): "
                "q(theta) misses posterior mass "
                "the weights cannot restore, so the corrected draws are unreliable. More "
                "num_f, a longer fit, or a reparameterisation of theta may help.",
                RuntimeWarning,
                stacklevel=2,
            )
        return out

    def unpack(self, x: Array) -> tuple[Array, Array]:
        """``(theta, f)`` from flat draws ``(..., k + T)``."""
        k = self.num_hyper
        return x[..., :k], x[..., k:]

    def constrained(self, theta: Array) -> Array:
        """Hyperparameters ``theta (..., k)`` on their constrained scale, ``(..., k)``:
        the model's ``theta_transforms[i]`` applied to ``theta[..., i]`` (the identity
        where there is none, and for a model without transforms).

        Example:
          >>> import jax, jax.numpy as jnp, jaxvb
          >>> model = jaxvb.LatentGaussian(
          ...     log_prior=lambda th: -0.5 * jnp.sum(th**2),
          ...     prior=lambda th: (jnp.zeros(2), jnp.exp(th[0]) * jnp.eye(2)),
          ...     log_lik=lambda f, y: -0.5 * (y - f) ** 2, data=jnp.zeros(2),
          ...     theta_names=("tau", "nu"), theta_transforms={"tau": jnp.exp})
          >>> model.theta_transforms == (jnp.exp, None)   # in the names' order
          True
          >>> _, q, _ = model.start(jnp.zeros(2))
          >>> q.constrained(jnp.array([[0.0, -1.5], [1.0, 2.0]])).round(4).tolist()
          [[1.0, -1.5], [2.7183, 2.0]]
        """
        theta = jnp.asarray(theta)
        transforms = self.model.theta_transforms
        if transforms is None:
            return theta
        columns = [
            theta[..., i] if t is None else jnp.vectorize(t)(theta[..., i])
            for i, t in enumerate(transforms)
        ]
        return jnp.stack([jnp.asarray(c).astype(theta.dtype) for c in columns], -1)

    def __repr__(self) -> str:
        return (
            f"LatentGaussianApproximation(theta=N(mean={np.asarray(self.theta.mean)!r}), "
            f"T={self.num_latent})"
        )


class LatentImportance(NamedTuple):
    """Draws of :meth:`LatentGaussianApproximation.importance_resample`.

    Attributes:
      theta: ``(n, k)`` hyperparameters.
      f: ``(n, N)`` fields.
      khat: the Pareto k-hat of the hyperparameters' weights; above 0.7 the correction
        is unreliable.
      ess: the effective sample size of the smoothed weights (of ``num_theta``).
      log_evidence: ``log p(y)``, the log mean of the ``num_theta * num_f`` ratios.
      log_weight_variance: the variance of the hyperparameters' log weights (before
        smoothing): how far ``q(theta)`` is from ``p(theta | y)`` (about twice their KL
        for a close fit), which says whether a k-hat above 0.7 matters.
      khat_sd: the Monte Carlo standard deviation of ``khat``
        (:func:`jaxvb.diagnostics.khat_sd`).

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> model = jaxvb.LatentGaussian(
      ...     log_prior=lambda th: -0.5 * jnp.sum(th**2),
      ...     prior=lambda th: (jnp.zeros(2), jnp.exp(th[0]) * jnp.eye(2)),
      ...     log_lik=lambda f, y: y * f - jnp.exp(f), data=jnp.array([1.0, 3.0]))
      >>> res = jaxvb.fit(model, jnp.zeros(1), jax.random.key(0), num_steps=100)
      >>> out = res.q.importance_resample(jax.random.key(1), 500, warn=False)
      >>> out.theta.shape, out.f.shape, bool(out.khat < 0.7)
      ((500, 1), (500, 2), True)
    """

    theta: Array
    f: Array
    khat: Array
    ess: Array
    log_evidence: Array
    log_weight_variance: Array
    khat_sd: Array


# the log joint's evaluations held at once (chunk * num_f * N floats) by the chunks
_IMPORTANCE_HELD = 2**22


@functools.partial(jit_fast, static_argnames=("n", "num_theta", "num_f"))
def _importance_resample(q, key, n, num_theta, num_f, widen):
    model = q.model
    num_field = q.num_latent
    k_theta, k_f, k_pick = jax.random.split(key, 3)
    # the proposal: q(theta) widened (its covariance times widen^2), so that the
    # weights' tail is not that of a narrower q against a wider posterior
    proposal = build(
        Gaussian, mean=q.theta.mean, precision_factor=q.theta.precision_factor / widen
    )
    theta = proposal.sample(k_theta, (num_theta,))
    log_proposal = jax.vmap(proposal.log_prob)(theta)

    num_q = (num_f + 1) // 2  # fields of q(f | theta); the rest are Laplace's

    def at(th, key_i):
        """For one ``theta``: ``log p(y, theta, f_j) - log r(f_j | theta)`` over
        ``num_f`` fields (``r`` the mixture of ``q(f | theta)`` and the Laplace
        approximation), and one of the fields picked by its ratio."""
        k_z, k_j = jax.random.split(key_i)
        z = _random.normal(k_z, (num_field, num_f), q.dtype)
        f, log_r_of = _inner_fields(q, th, z, num_q)
        # the prior after the fields' draws, whose factor and triangular solves
        # are batched LAPACK kernels: a prior built from a covariance factors it (a
        # NumPyro MultivariateNormal), a precision's log-determinant factors it, and
        # two batched kernels scheduled at once can hang XLA:CPU (jaxvb._platform:
        # ordered_factorisations; the solves for q's mean beside the prior's factor
        # hung a 30-value dense field)
        m, precision, log_norm = model.prior_of_field(after(th, f))
        prior_ops = _field.ops(precision)
        precision = after(precision, f)  # factored after the fields' draws
        log_r = log_r_of(precision, prior_ops)
        log_norm = _prior_log_norm(prior_ops, precision, log_norm, num_field)
        n_sites = model.num_sites(precision, num_field)
        d = (f - m).T  # (N, num_f)
        quad = jnp.sum(d * prior_ops.matvec(precision, d), 0)
        eta = jax.vmap(lambda fj: _field.project(fj, model.design, n_sites))(f)
        lik = jax.vmap(lambda e: jnp.sum(model.site_log_lik(e, th)))(eta)
        ratio = model.prior_log_density(th) + log_norm - 0.5 * quad + lik - log_r
        ratio = jnp.where(jnp.isnan(ratio), -jnp.inf, ratio)
        return ratio, f[jax.random.categorical(k_j, ratio)]

    # equal chunks (as the diagnostics' draws are evaluated): lax.map would compute
    # the rows past its last whole chunk as a second vmapped batch, which XLA:CPU can
    # run beside the scan's, two batched factorisations at once (jaxvb._platform:
    # ordered_factorisations). The padding repeats the first rows, whose extra
    # results are dropped.
    most = max(1, min(num_theta, _IMPORTANCE_HELD // (num_f * num_field)))
    num_chunks = -(-num_theta // most)
    chunk = -(-num_theta // num_chunks)
    rows = jnp.arange(num_chunks * chunk) % num_theta
    inputs = (theta[rows], jax.random.split(k_f, num_theta)[rows])
    ratios, picked = jax.lax.map(lambda a: at(*a), inputs, batch_size=chunk)
    ratios, picked = ratios[:num_theta], picked[:num_theta]
    ratios = ratios - log_proposal[:, None]
    log_w = jax.nn.logsumexp(ratios, axis=1) - math.log(num_f)
    smoothed = psis(log_w)
    i = resample_indices(k_pick, smoothed.log_weights, n)
    weights = jnp.exp(smoothed.log_weights)
    return LatentImportance(
        theta=theta[i],
        f=picked[i],
        khat=smoothed.khat,
        ess=1.0 / jnp.sum(weights**2),
        log_evidence=jax.nn.logsumexp(ratios) - math.log(num_theta * num_f),
        log_weight_variance=jnp.nanvar(jnp.where(jnp.isfinite(log_w), log_w, jnp.nan)),
        khat_sd=khat_sd(jax.random.fold_in(key, 1), log_w),
    )


def _inner_fields(q, th, z, num_q: int):
    """For one ``theta``: fields ``(num_f, N)`` from the noise ``z`` ``(N, num_f)``,
    and ``log r(f_j | theta)`` as a function of the prior's precision and operations.

    q(f | theta)'s fixed sites fit p(f | theta, y) near q(theta)'s mean; where a
    hyperparameter draw lies far from it (a larger prior scale of a binary or count
    field) q(f | theta) can miss most of p(f | theta, y) while its ratios hardly vary,
    and then p(y | theta) is underestimated there, with no sign in the weights: the
    resampled hyperparameters stay as narrow as q(theta). So the first ``num_q``
    fields are q(f | theta)'s and the rest come from the Laplace approximation at
    ``theta`` (its sites at the mode of p(f | theta, y)), and each field is weighed
    against the mixture ``r`` of the two in those proportions (a defensive,
    deterministic-mixture estimate: unbiased, and never much worse than the better of
    the two at that ``theta``). With one field, it is q(f | theta)'s alone.
    """
    model, num_f = q.model, z.shape[1]
    f_q, mu_q, logdet_q = _fields(model, q.site_precision, q.site_shift, th, z[:, :num_q])
    if num_f == num_q:
        return f_q, lambda p, ops: _log_density(
            model, f_q, mu_q, logdet_q, q.site_precision, p, ops
        )
    a_l, b_l = _newton_sites(model, after(th, f_q))
    f_l, mu_l, logdet_l = _fields(model, a_l, b_l, th, z[:, num_q:])
    f = jnp.concatenate([f_q, f_l])

    def log_r(precision, ops):
        log_q = _log_density(model, f, mu_q, logdet_q, q.site_precision, precision, ops)
        log_l = _log_density(model, f, mu_l, logdet_l, a_l, precision, ops)
        shares = jnp.array([num_q / num_f, (num_f - num_q) / num_f], q.dtype)
        return jax.nn.logsumexp(jnp.stack([log_q, log_l]), axis=0, b=shares[:, None])

    return f, log_r


def _fields(model, a, b, th, z):
    """Fields ``(len(z), N)`` of ``N(mu, P^{-1})`` from the sites ``(a, b)``, with the
    mean and ``log|P|`` to weigh other fields against it."""
    mu, chol, ops, *_ = _conditional(model, a, b, th)
    f = (mu[:, None] + ops.back(chol, after(z, mu))).T
    return f, mu, ops.logdet(chol)


def _log_density(model, f, mu, logdet, a, precision, ops):
    """``log N(f_j; mu, P^{-1})`` of each field, ``P = Q(theta) + L' diag(a) L``."""
    p = _field.add_linear_sites(ops, precision, a, model.design, a.shape[-1])
    d = (f - mu).T
    quad = jnp.sum(d * ops.matvec(p, d), 0)
    return 0.5 * (logdet - f.shape[1] * _LOG_2PI) - 0.5 * quad
