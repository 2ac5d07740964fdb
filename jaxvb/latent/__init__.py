r"""Latent Gaussian models: the paper's hierarchical approximation as a general tool.

A model with a few hyperparameters ``theta`` (``k`` of them, unconstrained) and a long
latent Gaussian field ``f`` (``T`` values), each observation seeing one value of it:

    log p(theta, f, y) = log p(theta) + log N(f | m(theta), Q(theta)^{-1})
                         + sum_t log p(y_t | f_t).

Stochastic volatility and other state-space models, Gaussian-process regression and
classification, log-Gaussian Cox processes, random effects. The posterior is a funnel in
``(theta, f)`` that no single Gaussian fits; the paper's construction (section 6.1) does:

    q(theta, f) = q(theta) q(f | theta),
    q(f | theta) ∝ p(f | theta) prod_t exp(b_t f_t - a_t f_t^2 / 2),

with ``q(theta)`` a Gaussian over the unconstrained hyperparameters and Gaussian *sites*
``(a_t, b_t)`` shared by every ``theta``: ``q(f | theta)`` is the Gaussian with precision
``P(theta) = Q(theta) + diag(a)`` and mean ``P^{-1} (Q m + b)``, the exact prior times
the sites. With the prior's precision banded (``jaxvb.linalg.Banded``, ``w``
subdiagonals) everything costs ``O(T w^2)`` per step; a dense one ``O(T^3)``. The
algebra of ``q(f | theta)`` (its moments, ``log Z`` and the sites' terms below) is
:mod:`jaxvb.latent._field`'s. Fixed effects go last in the field (``design``, an
:class:`jaxvb.linalg.Arrowhead` prior). :mod:`jaxvb.composite` fits the same model
and ``q(f | theta)`` with the paper's exponential-family ``q(theta)`` instead (the
stochastic-volatility model of :mod:`jaxvb.models.stochastic_volatility` and the eight
schools are ``LatentGaussian`` models fitted so).

**The iteration** (Algorithm 2 for both blocks, Rao-Blackwellised over ``f``). Each step
draws ``theta ~ q(theta)`` and, given the current sites, computes exactly (the
one-dimensional site expectations by Gauss-Hermite quadrature, no Monte Carlo):

* the hyperparameters' target, the ELBO with ``f`` integrated out,

      L(theta) = log p(theta) + log Z(theta) + sum_t E_{q(f_t|theta)}[log p(y_t|f_t)
                 - b_t f_t + a_t f_t^2 / 2],
      Z(theta) = ∫ N(f | m, Q^{-1}) exp(b'f - f' diag(a) f / 2) df   (closed form),

  so that ``ELBO = E_q(theta)[L(theta)] + H[q(theta)]``; its gradient (reverse mode
  through the factorisation), regressed on the draws of ``theta`` (the paper's
  gradient regression, sec. 5.2), gives ``q(theta)``; where the factorisation is
  costly, its values instead (the paper's Algorithm 1, no reverse pass), or the
  Hessian at each draw, as in Algorithm 2 (:func:`latent_gaussian`'s ``hessian``).
  By default each site's
  ``E[log r_t]`` (``r_t = p(y_t|f_t) / exp(b_t f_t - a_t f_t^2 / 2)``) is replaced by
  ``log E[r_t]``: expectation propagation's approximation of ``log p(y, theta)`` at
  these sites, not a bound, but without the ELBO's gap ``KL(q(f | theta) || p(f |
  theta, y))``, which varies with ``theta`` and pulls ``q(theta)`` towards small prior
  variances where the counts are small (:func:`latent_gaussian`'s ``target``; the
  paper's ELBO is ``target="elbo"``);
* the sites' statistics: ``E[d/df_t log p(y_t|f_t)]``, ``E[-d^2/df_t^2 ...]`` and
  ``E[f_t]`` under ``q(f_t | theta)``, from which ``a = -E hess`` and ``b = E grad + a
  E f`` (Algorithm 2 for the factor structure of section 5.1, averaged over ``theta``).

Both are averaged by ``jaxvb.fit``'s loop with the fixed step ``w = 1/sqrt(N)`` and the
second-half average, with its step control (an update whose ``q`` is not proper is
halved) and convergence check. The start (:meth:`LatentGaussian.start`) is a Laplace
approximation: Newton's method for ``f`` at ``theta0`` gives the sites, then
:func:`jaxvb.laplace`'s search on ``L`` gives ``q(theta)``, twice.

Example:
  A Gaussian field with Poisson counts, ``theta = log`` of the prior's precision
  scale:

  >>> import jax, jax.numpy as jnp, jaxvb
  >>> from jaxvb.linalg import Banded
  >>> y = jnp.array([0.0, 2.0, 1.0, 4.0, 3.0, 5.0])
  >>> T = y.shape[0]
  >>> rw = jnp.stack([jnp.full(T, 2.0).at[0].set(1.0).at[-1].set(1.0) + 0.1,
  ...                 jnp.full(T, -1.0).at[-1].set(0.0)])     # random walk + ridge
  >>> model = jaxvb.LatentGaussian(
  ...     log_prior=lambda th: -0.5 * jnp.sum(th**2),
  ...     prior=lambda th: (jnp.zeros(T), Banded(jnp.exp(th[0]) * rw)),
  ...     log_lik=lambda f, y: y * f - jnp.exp(f),
  ...     data=y)
  >>> res = jaxvb.fit(model, jnp.zeros(1), jax.random.key(0), num_steps=200)
  >>> theta, f = res.sample(jax.random.key(1), 500)
  >>> theta.shape, f.shape, res.q.theta.mean.shape
  ((500, 1), (500, 6), (1,))
  >>> bool(res.ok), round(float(res.r_squared), 1)
  (True, 1.0)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb import _random, _static, linalg
from jaxvb._algebra import cast_tree, precision_factor, solve_gram, solve_precision
from jaxvb._platform import after, jit_fast, jit_once
from jaxvb.core.start import default_tol, laplace_traced, near_mode
from jaxvb.diagnostics import psis
from jaxvb.families._base import (
    Array,
    Family,
    build,
    is_concrete,
    register_dataclass,
    register_family,
)
from jaxvb.families.gaussian import Gaussian, _unpack_precision
from jaxvb.latent import _field
from jaxvb.methods._base import Method
from jaxvb.methods._registry import register

__all__ = [
    "LatentGaussian",
    "LatentGaussianApproximation",
    "LatentImportance",
    "latent_gaussian",
]

_STATIC = {"static": True}
_LOG_2PI = math.log(2.0 * math.pi)


# ------------------------------------------------------------------- quadrature


def _gauss_hermite(n: int, dtype):
    """Nodes and weights of ``E_{N(0,1)}[g(z)] ≈ sum_j w_j g(x_j)`` (exact for
    polynomials of degree ``< 2n``)."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return jnp.asarray(x, dtype), jnp.asarray(w / w.sum(), dtype)


def _derivatives(log_lik: Callable, f: Array):
    """``(log_lik(f), d/df_t, d^2/df_t^2)``, each ``(T,)``: site ``t`` sees ``f_t``
    only, so the gradient of the sum is per site and the Hessian's diagonal is its
    derivative along the ones vector."""
    d1, d2 = jax.jvp(jax.grad(lambda v: jnp.sum(log_lik(v))), (f,), (jnp.ones_like(f),))
    return log_lik(f), d1, d2


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _site_derivatives(log_lik: Callable, f: Array):
    """:func:`_derivatives`, whose derivatives along ``f`` are the next ones along the
    diagonal: a target that differentiates ``log_lik(f)`` at the quadrature nodes
    reuses the first derivative computed there instead of a second pass through
    ``log_lik`` (a fifth of the GLMM step of ``benchmarks/latent_gaussian.py``)."""
    return _derivatives(log_lik, f)


@_site_derivatives.defjvp
def _site_derivatives_jvp(log_lik, primals, tangents):
    (f,), (df,) = primals, tangents
    ll, d1, d2 = _site_derivatives(log_lik, f)
    # the third derivative only where d2 is differentiated (else it is dead code)
    d3 = jax.jvp(lambda v: _derivatives(log_lik, v)[2], (f,), (jnp.ones_like(f),))[1]
    return (ll, d1, d2), (d1 * df, d2 * df, d3 * df)


# ----------------------------------------------------------------------- the model


@register_dataclass
class LatentGaussian:
    """A latent Gaussian model, ``jaxvb.fit(model, theta0, key, num_steps=...)``.

    ``log p(theta, f, y) = log_prior(theta) + log N(f | mean(theta), precision(theta)^{-1})
    + sum(log_lik(f, data))``.

    Attributes:
      log_prior: ``theta (k,) -> log p(theta)``, over unconstrained hyperparameters
        (the Jacobians of their transforms included).
      prior: ``theta -> (mean (T,), precision)``, the Gaussian prior ``p(f | theta)``:
        ``precision`` a dense positive-definite ``(T, T)`` array or a
        :class:`jaxvb.linalg.Banded` (lower band form ``(w + 1, T)``, ``O(T w^2)``).
      log_lik: ``(f (T,), data) -> (T,)``, ``log p(y_t | f_t)`` for every ``t``; site
        ``t`` must depend on ``f[t]`` only (its derivatives are read off the
        diagonal). Need not be log-concave.
      data: any pytree of arrays, passed to ``log_lik`` (traced: a new data set of the
        same shapes reuses the compiled fit).
      num_quadrature: Gauss-Hermite nodes for the site expectations (and the EP
        target's gaps). Every step evaluates ``log_lik`` and its two derivatives at
        ``num_quadrature x T`` points, much of a cheap step's cost: on the GLMM of
        ``benchmarks/latent_gaussian.py`` (322 sites, sd ~0.1), which sets 10, 10
        nodes give the default's fit to 4e-12 of a posterior sd (same keys) in
        two-thirds of the time (0.137 against 0.219 s after compile). The default,
        20, keeps wide sites exact too: on its LGCP (sites' sd up to ~1.4) the gaps'
        total is off by 2e-3 nats with 10 nodes, 9e-6 with 20, and the derivatives by
        1e-10 and 1e-15. Narrow sites (many observations each) can take fewer.
      log_lik_takes_theta: call ``log_lik(f, data, theta)``: observations that also
        depend on the hyperparameters (a noise scale, a dispersion).
      num_hyper: ``k``; set by :meth:`start` (``jaxvb.fit`` calls it), ``None`` before.

    Called on a flat ``x = (theta, f)`` of shape ``(k + T,)`` (once ``num_hyper`` is
    set), the model is the log joint density: what ``jaxvb.fit``'s diagnostics evaluate.

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> model = jaxvb.LatentGaussian(
      ...     log_prior=lambda th: -0.5 * jnp.sum(th**2),
      ...     prior=lambda th: (jnp.zeros(3), jnp.exp(th[0]) * jnp.eye(3)),
      ...     log_lik=lambda f, y: -0.5 * (y - f) ** 2,
      ...     data=jnp.array([0.5, -1.0, 2.0]))
      >>> bound, q0, ok = model.start(jnp.zeros(1))
      >>> bound.num_hyper, q0.event_shape, bool(ok)
      (1, (4,), True)
    """

    log_prior: Callable = dataclasses.field(metadata=_STATIC)
    prior: Callable = dataclasses.field(metadata=_STATIC)
    log_lik: Callable = dataclasses.field(metadata=_STATIC)
    data: Any = None
    design: Any = None
    num_quadrature: int = dataclasses.field(default=20, metadata=_STATIC)
    log_lik_takes_theta: bool = dataclasses.field(default=False, metadata=_STATIC)
    num_hyper: int | None = dataclasses.field(default=None, metadata=_STATIC)
    num_field: int | None = dataclasses.field(default=None, metadata=_STATIC)

    def __post_init__(self):
        for name in ("log_prior", "prior", "log_lik"):
            if not callable(getattr(self, name)):
                raise TypeError(
                    f"LatentGaussian: {name} must be a function, got "
                    f"{type(getattr(self, name)).__name__}"
                )
        if not isinstance(self.num_quadrature, int) or self.num_quadrature < 1:
            raise ValueError(
                f"LatentGaussian: num_quadrature must be a positive integer, got "
                f"{self.num_quadrature!r}"
            )

    # -- the pieces ------------------------------------------------------------------

    # The three pieces as the engine calls them (a subclass, such as jaxvb.numpyro's,
    # may compute them from its data instead of from the user's functions).

    def prior_log_density(self, theta: Array) -> Array:
        """``log p(theta)``, a scalar."""
        return jnp.asarray(self.log_prior(theta)).astype(theta.dtype)

    def prior_of_field(self, theta: Array):
        """``(mean, precision, log_norm)`` of ``p(f | theta)``: ``log_norm`` the
        prior's log normalising constant where ``prior`` gives it, else ``None``
        (computed from the precision's factor: :func:`_prior_log_norm`)."""
        out = self.prior(theta)
        if not (isinstance(out, tuple) and len(out) in (2, 3)):
            raise TypeError(
                "LatentGaussian: prior(theta) must return (mean, precision) or (mean, "
                f"precision, log_norm), got {type(out).__name__}"
                + (f" of length {len(out)}" if isinstance(out, tuple) else "")
            )
        mean, precision = out[0], out[1]
        log_norm = None if len(out) == 2 else jnp.asarray(out[2]).astype(theta.dtype)
        # in theta's dtype, both: a float64 precision (built from Python floats in an
        # x64 session) with a float32 theta otherwise promotes the field's loops
        return (
            jnp.asarray(mean).astype(theta.dtype),
            cast_tree(precision, theta.dtype),
            log_norm,
        )

    def num_sites(self, precision, num_field: int) -> int:
        """``n``: the sites see ``eta = f[:n] + design @ f[n:]``."""
        if self.design is not None:
            return self.design.shape[0]
        if isinstance(precision, linalg.Arrowhead):
            return precision.band.shape[1]
        return num_field

    def linear_predictor(self, f: Array) -> Array:
        """``eta = f[:n] + design @ f[n:]`` (``f`` itself without fixed effects)."""
        _, precision, _ = jax.eval_shape(
            self.prior_of_field, jax.ShapeDtypeStruct((self.num_hyper,), f.dtype)
        )
        return _field.project(f, self.design, self.num_sites(precision, f.shape[-1]))

    def site_log_lik(self, f: Array, theta: Array) -> Array:
        """``(T,)`` site log-likelihoods at ``f`` (and ``theta``)."""
        if self.log_lik_takes_theta:
            out = self.log_lik(f, self.data, theta)
        else:
            out = self.log_lik(f, self.data)
        return jnp.asarray(out).astype(f.dtype)

    def site_expectations(self, mean: Array, var: Array, theta: Array):
        """``E log p(y_t | f_t)``, ``E d/df_t`` and ``E d^2/df_t^2`` of it under
        ``f_t ~ N(mean_t, var_t)``, by Gauss-Hermite quadrature; each ``(T,)``."""
        x, w = _gauss_hermite(self.num_quadrature, mean.dtype)
        ll, d1, d2 = self._at_nodes(mean + jnp.sqrt(var) * x[:, None], theta)
        return w @ ll, w @ d1, w @ d2

    def _at_nodes(self, points: Array, theta: Array):
        """``(log p(y_t | f_t), d/df_t, d^2/df_t^2)`` at each row of ``points`` (``(J,
        T)``), in one pass of ``log_lik`` and its derivatives; differentiated along
        ``points``, the value's derivative is the ``d/df_t`` already computed
        (:func:`_site_derivatives`; where the sites see ``theta``, plain autodiff,
        which also follows ``theta``)."""
        if self.log_lik_takes_theta or (
            type(self).site_log_lik is not LatentGaussian.site_log_lik
        ):  # jaxvb.numpyro's sites read theta
            return jax.vmap(
                lambda f: _derivatives(lambda v: self.site_log_lik(v, theta), f)
            )(points)
        log_lik = functools.partial(self.site_log_lik, theta=None)  # theta unused
        return jax.vmap(lambda f: _site_derivatives(log_lik, f))(points)

    def site_gaps(self, mean: Array, var: Array, a: Array, b: Array, theta: Array):
        """Each site's Jensen gap ``log E[r_t] - E[log r_t] >= 0``, ``(T,)``, with
        ``r_t = p(y_t | f_t) / exp(b_t f_t - a_t f_t^2 / 2)`` and ``f_t ~ N(mean_t,
        var_t)``, the marginal of ``q(f | theta)``; by Gauss-Hermite quadrature.

        ``log Z(theta) + sum_t log E[r_t]`` is expectation propagation's approximation
        of ``log p(y | theta)`` at these sites (``q(f_t | theta)`` is the cavity times
        site ``t``, so ``E[r_t]`` is the tilted over the Gaussian normaliser); the ELBO
        has ``E[log r_t]`` instead. Zero for a Gaussian ``p(y_t | f_t)`` with its exact
        sites. The log ratios are formed relative to their mean (``a_t f_t^2`` is large
        where ``f_t`` is), so that the gap keeps its digits."""
        return self._expected_and_gaps(mean, var, a, b, theta)[1]

    def _expected_and_gaps(self, mean, var, a, b, theta):
        """``(E log p(y_t | f_t), site_gaps, E d/df_t, E d^2/df_t^2)`` from one pass
        of ``log_lik`` and its derivatives over the nodes (:meth:`_at_nodes`: under a
        gradient, the first derivatives it computed, not a backward pass)."""
        z, w = _gauss_hermite(self.num_quadrature, mean.dtype)
        sd = jnp.sqrt(var)
        ll, d1, d2 = self._at_nodes(mean + sd * z[:, None], theta)
        # log r at mean + sd z, less its mean: the site's part is linear and quadratic
        # in z (E z = 0 and E z^2 = 1 hold exactly at the nodes)
        u = (
            (ll - w @ ll)
            + z[:, None] * (sd * (a * mean - b))
            + (z**2 - 1.0)[:, None] * (0.5 * a * var)
        )
        gaps = jax.nn.logsumexp(u, axis=0, b=w[:, None])
        return w @ ll, gaps, w @ d1, w @ d2

    def _split(self, x):
        return x[..., : self.num_hyper], x[..., self.num_hyper :]

    def __call__(self, x: Array) -> Array:
        if self.num_hyper is None:
            raise ValueError(
                "LatentGaussian: the number of hyperparameters is not known yet; fit the "
                "model from a start point, jaxvb.fit(model, theta0, key, ...), or call "
                "model.start(theta0) first"
            )
        theta, f = self._split(x)
        return self._given(theta)(f)

    def log_joint_given(self, theta: Array, fs: Array) -> Array:
        """``log p(theta, f_j, y)`` at each row ``f_j`` of ``fs`` (``(m, N)`` to
        ``(m,)``), the prior's factorisation at ``theta`` done once for all of them
        (the diagnostics' pairs of draws that share ``theta``)."""
        return jax.vmap(self._given(theta))(fs)

    def _given(self, theta: Array) -> Callable[[Array], Array]:
        """``f -> log p(theta, f, y)``: what depends on ``theta`` alone (the prior's
        mean, precision and log normaliser) computed here, once."""
        mean, precision, log_norm = self.prior_of_field(theta)
        ops = _field.ops(precision)
        log_norm = _prior_log_norm(ops, precision, log_norm, mean.shape[-1])
        log_theta = self.prior_log_density(theta)
        n = self.num_sites(precision, mean.shape[-1])

        def at(f):
            d = f - mean
            log_prior_f = log_norm - 0.5 * jnp.dot(d, ops.matvec(precision, d))
            eta = _field.project(f, self.design, n)
            return log_theta + log_prior_f + jnp.sum(self.site_log_lik(eta, theta))

        return at

    # -- the start -------------------------------------------------------------------

    def check(self, theta0: Array) -> int:
        """``N``, the field's length, or a clear error about the shapes ``prior``,
        ``design`` and ``log_lik`` give."""
        return _checked(self, jax.ShapeDtypeStruct(theta0.shape, theta0.dtype))

    def _check(self, theta: jax.ShapeDtypeStruct) -> int:
        mean, precision, log_norm = jax.eval_shape(self.prior_of_field, theta)
        if len(mean.shape) != 1:
            raise ValueError(
                f"LatentGaussian: prior(theta)'s mean must have shape (N,), got {mean.shape}"
            )
        t = mean.shape[0]
        if log_norm is not None and log_norm.shape != ():
            raise ValueError(
                "LatentGaussian: prior(theta)'s log_norm (its third value) must be a "
                f"scalar, got shape {log_norm.shape}"
            )
        design = self.design
        if design is not None:
            shape = getattr(design, "shape", None)
            if shape is None or len(shape) != 2 or shape[0] + shape[1] != t:
                raise ValueError(
                    "LatentGaussian: design must be an (n, p) array, the sites seeing "
                    "eta = f[:n] + design @ f[n:] for a field f of N = n + p values "
                    f"(N = {t} from prior's mean); got "
                    f"{shape if shape is not None else type(design).__name__}"
                )
        if isinstance(precision, linalg.Banded):
            if design is not None:
                raise ValueError(
                    "LatentGaussian: a design (fixed effects in the field) needs a "
                    "jaxvb.linalg.Arrowhead precision (the band for f[:n], the fixed "
                    "effects last) or a dense one; got a Banded precision"
                )
            if len(precision.ab.shape) != 2 or precision.ab.shape[1] != t:
                raise ValueError(
                    "LatentGaussian: prior(theta)'s Banded precision must hold ab of shape "
                    f"(w + 1, N) = (w + 1, {t}), got {precision.ab.shape}"
                )
        elif isinstance(precision, linalg.Arrowhead):
            n = precision.band.shape[-1]
            p = precision.corner.shape[-1]
            if (
                len(precision.band.shape) != 2
                or precision.border.shape != (n, p)
                or precision.corner.shape != (p, p)
                or n + p != t
                or (design is not None and design.shape != (n, p))
            ):
                raise ValueError(
                    "LatentGaussian: prior(theta)'s Arrowhead precision must hold band "
                    "(w + 1, n), border (n, p) and corner (p, p) with n + p = N = "
                    f"{t} (from the mean) and design, if any, of shape (n, p); got band "
                    f"{precision.band.shape}, border {precision.border.shape}, corner "
                    f"{precision.corner.shape}"
                    + (f", design {design.shape}" if design is not None else "")
                )
        elif not hasattr(precision, "shape"):
            raise TypeError(
                "LatentGaussian: prior(theta)'s precision must be a (N, N) array, a "
                "jaxvb.linalg.Banded or a jaxvb.linalg.Arrowhead, got "
                f"{type(precision).__name__}"
            )
        elif tuple(precision.shape) != (t, t):
            raise ValueError(
                "LatentGaussian: prior(theta)'s precision must be a (N, N) array, a "
                f"jaxvb.linalg.Banded or a jaxvb.linalg.Arrowhead, with N = {t} from the "
                f"mean; got shape {precision.shape}"
            )
        n = self.num_sites(precision, t)
        eta = jax.ShapeDtypeStruct((n,), theta.dtype)
        try:
            sites = jax.eval_shape(self.site_log_lik, eta, theta)
        except (TypeError, ValueError) as err:
            where = (
                "f"
                if n == t
                else "the sites' linear predictor eta = f[:n] + design @ f[n:]"
                if design is not None
                else "f[:n], the band of the prior's Arrowhead precision"
            )
            raise type(err)(
                f"LatentGaussian: log_lik failed on an ({n},) array, {where} with n = "
                f"{n} of the field's N = {t} values: {err}"
            ) from err
        if getattr(sites, "shape", None) != (n,):
            what = (
                f"log p(y_t | f_t), T = {n}"
                if n == t
                else f"log p(y_t | eta_t), one per value of eta = f[:T] + design @ "
                f"f[T:], T = {n}"
            )
            raise ValueError(
                f"LatentGaussian: log_lik(f, data) must return the (T,) site "
                f"log-likelihoods {what}; got shape "
                f"{getattr(sites, 'shape', type(sites).__name__)}. Do not sum them."
            )
        lp = jax.eval_shape(self.prior_log_density, theta)
        if getattr(lp, "shape", None) != ():
            raise ValueError(
                "LatentGaussian: log_prior(theta) must return a scalar, got shape "
                f"{getattr(lp, 'shape', type(lp).__name__)}"
            )
        return t

    def bind(self, theta0: Array) -> LatentGaussian:
        """The model with ``num_hyper`` and ``num_field`` set from a point ``theta0``
        of the hyperparameters (after :meth:`check`): a log joint of flat ``x = (theta,
        f)``, for a fit from a family of one's own (:func:`jaxvb.latent.hierarchical`).

        Example:
          >>> import jax.numpy as jnp, jaxvb
          >>> model = jaxvb.LatentGaussian(
          ...     log_prior=lambda th: -0.5 * jnp.sum(th**2),
          ...     prior=lambda th: (jnp.zeros(3), jnp.exp(th[0]) * jnp.eye(3)),
          ...     log_lik=lambda f, y: -0.5 * (y - f) ** 2,
          ...     data=jnp.array([0.5, -1.0, 2.0])).bind(jnp.zeros(1))
          >>> model.num_hyper, model.num_field, round(float(model(jnp.zeros(4))), 4)
          (1, 3, -5.3818)
        """
        theta0 = jnp.asarray(theta0)
        num_field = self.check(theta0)
        return dataclasses.replace(
            self, num_hyper=int(theta0.shape[0]), num_field=int(num_field)
        )

    def start(self, theta0: Array):
        """``(model, q0, ok)``: the model with ``num_hyper`` set, the Laplace start and
        whether it succeeded (``jaxvb.fit`` calls this for a start point).

        The sites come from Newton's method for ``f`` at ``theta`` (the mode of
        ``p(f | theta, y)``, with ``a_t = -d^2 log p(y_t|f_t)`` floored at 0 for sites
        that are not log-concave there), ``q(theta)`` from :func:`jaxvb.laplace` on the
        hyperparameters' target ``L``; twice, the second time at the first's mode.
        """
        theta0 = jnp.asarray(theta0)
        if theta0.ndim != 1:
            raise ValueError(
                f"LatentGaussian: theta0 must have shape (k,), got {theta0.shape}"
            )
        if not jnp.issubdtype(theta0.dtype, jnp.floating):
            theta0 = theta0.astype(jnp.result_type(float))
        if self.num_hyper is not None and theta0.shape[0] != self.num_hyper:
            raise ValueError(
                f"LatentGaussian: theta0 has {theta0.shape[0]} values but this model "
                f"has num_hyper = {self.num_hyper} hyperparameters (it was bound by an "
                "earlier start or fit). Start from the hyperparameters alone, theta0 of "
                f"shape ({self.num_hyper},), not from a flat (theta, f) point"
            )
        model = self.bind(theta0)
        arrays, static = _static.partition(model)
        # the start runs at every call: optimised where its factorisations are costly
        # (the LGCP of benchmarks/latent_gaussian.py: 0.47 -> 0.15 s a call, ~2.5 s
        # more to compile once, alongside the fit's compile), else compiled quickly
        costly = _costly_factorisation(model, theta0.shape[0], theta0.dtype)
        q0, ok = (_start_optimised if costly else _start)(arrays, static, theta0)
        if is_concrete(ok) and not bool(ok):
            _name_the_prior(model, theta0)
        return model, q0, ok


def _name_the_prior(model: LatentGaussian, theta0: Array) -> None:
    """Where a start failed because ``p(f | theta0)`` has no normalising constant from
    its precision (no Cholesky factor), a warning that names it: the fit's own flags
    (``LAPLACE_FAILED``, non-finite diagnostics) cannot say why."""
    m, precision, log_norm = model.prior_of_field(theta0)
    if log_norm is not None:
        return
    if bool(
        jnp.isfinite(_prior_log_norm(_field.ops(precision), precision, None, m.shape[-1]))
    ):
        return
    warnings.warn(
        "LatentGaussian: the prior precision Q(theta0) has no Cholesky factor (it is "
        "not positive definite), so log p(f | theta0) has no normalising constant and "
        "the start failed. A prior flat in some direction (a zero corner for a flat "
        "intercept) is fine if prior returns (mean, precision, log_norm) with the "
        "density's log constant; otherwise Q(theta) must be positive definite.",
        RuntimeWarning,
        stacklevel=4,
    )


@_static.memo_by_signature
def _checked(model: LatentGaussian, theta: jax.ShapeDtypeStruct) -> int:
    """:meth:`LatentGaussian.check`'s traces, kept per model structure and shapes."""
    return model._check(theta)


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
#: and an optimised start (the LGCP of benchmarks/latent_gaussian.py: 6.4e5; a dense
#: field of T >= 67)
_COSTLY_FLOPS = 1e5


# One compiled program for the whole start (eagerly, its loops and searches would be
# traced again at every call).
def _start_traced(arrays, static, theta0):
    model = _static.combine(arrays, static)

    def round_(theta, _):
        a, b = _newton_sites(model, theta)
        target = functools.partial(_target, model, a, b)

        def vgh(th):
            # Hessians by differences of the exact gradient (forward over reverse
            # through the factorisation's scans costs ~35 gradients on XLA:CPU);
            # steps relative to the point's size
            value, grad, hess, _ = _value_grad_hessian_differences(
                target, th, jnp.maximum(1.0, jnp.abs(th)), central=False
            )
            return value, grad, hess

        # the search itself (jaxvb.laplace raises where it fails; here a failure is
        # the fit's LAPLACE_FAILED flag)
        theta_q, info = laplace_traced(
            lambda th: target(th)[0],
            theta,
            default_tol(theta.dtype),
            max_iter=200,
            vgh=vgh,
        )
        return theta_q.mean, (theta_q, info)

    # two rounds as a loop: the sites' search and the mode search compile once
    theta, (theta_qs, infos) = jax.lax.scan(round_, theta0, None, length=2)
    theta_q, info = jax.tree_util.tree_map(lambda v: v[-1], (theta_qs, infos))
    a, b = _newton_sites(model, theta)
    q0 = build(
        LatentGaussianApproximation,
        theta=theta_q,
        site_precision=a,
        site_shift=b,
        model=model,
        theta_centre=theta_q.mean,
        theta_frame=_frame_of(theta_q.cov),
    )
    return q0, near_mode(info) & q0.is_proper


_start = jit_once(_start_traced, static_argnames=("static",))
_start_optimised = jit_fast(_start_traced, static_argnames=("static",))


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
    if ep and _own_expectations(model):  # its closed forms, not the quadrature's
        _, d1, d2 = model.site_expectations(eta, var, theta)
    aux = (eta, var, mu, chol, d1, d2)
    return value, tuple(jax.lax.stop_gradient(v) for v in aux)


def _own_expectations(model: LatentGaussian) -> bool:
    """Whether the model computes its site expectations itself (in closed form)."""
    return type(model).site_expectations is not LatentGaussian.site_expectations


def _newton_sites(model: LatentGaussian, theta, num_iter: int = 30):
    """Sites ``(a, b)`` at the mode of ``p(f | theta, y)``, by Newton's method (at most
    ``num_iter`` iterations: every loop of the compiled program has a bound; it stops
    sooner once converged, usually after 4-8), each step
    halved until ``log p(f | theta, y)`` does not decrease (at most 30 times): from the
    prior mean a full step can overshoot far (a Poisson count with a small exposure
    has a curvature ``exposure * exp(f)`` that is tiny there, and the step is its
    inverse) and ``exp`` then overflows."""
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


# -------------------------------------------------------------------- the family


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
        # one draw of k + T normals, split: one random-number program where a split
        # key and two draws made three, each compiled again wherever a fit's program
        # draws (the step, the diagnostics' chunks, the check): the GLMM of
        # benchmarks/latent_gaussian.py's fit compiled 14 threefry hashes, now 8
        z = _random.normal(key, (self.num_hyper + self.num_latent,), self.dtype)
        return z[: self.num_hyper], z[self.num_hyper :]

    def from_noise(self, noise) -> Array:
        z_theta, z_f = noise
        theta = self.theta.from_noise(z_theta)
        mu, chol, ops = self.conditional(theta)
        # the noise's back-solve after the mean's solve: under vmap (many draws) both
        # are batched triangular solves, and two at once hung jaxlib 0.10 (after)
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
        the ``f``-linear part of ``log p - log q`` cancels within a pair (on the LGCP
        of ``benchmarks/latent_gaussian.py`` the pair's two values correlate at
        -0.69: the ELBO's standard error 0.056 from 500 pairs against 0.098 from
        1000 independent draws)."""
        theta, mu, chol, ops, z_f, log_q_f = self._draw_theta(key)
        log_q = self.theta.log_prob(theta) + log_q_f
        v = ops.back(*after(after((chol, z_f), log_q), mu))
        # log_joint's own factorisation after q's, not beside it (_platform.after:
        # under vmap, two batched factorisations at once hung jaxlib 0.10)
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
        times ``widen^2``) and, for each, ``num_f`` fields of ``q(f | theta)``. Each
        ``theta_i`` is weighted by ``w_i = mean_j p(y, theta_i, f_ij) / (r(theta_i)
        q(f_ij | theta_i))`` (``r`` the widened proposal; an unbiased estimate of
        ``p(y, theta_i) / r(theta_i)``, the conditional gap integrated out), the
        weights Pareto-smoothed (:func:`jaxvb.diagnostics.psis`); each ``theta_i``
        keeps one of its fields, picked by its ratio, and the ``n`` draws resample
        the pairs by the smoothed weights (sampling importance resampling, two
        stages). On the LGCP of ``benchmarks/latent_gaussian.py`` (counts of ~2 per
        cell) a ``q`` fitted to the ELBO (``target="elbo"``) has ``sigma`` 0.4 NUTS
        sd low, the corrected draws < 0.1 (the default ``"ep"`` target's ``q``
        itself 0.1).

        Args:
          key: a JAX random key.
          n: the number of draws returned.
          num_theta: hyperparameter draws weighted; the estimate's noise falls as
            ``1 / sqrt(ess)``.
          num_f: fields per hyperparameter draw (``num_theta * num_f`` evaluations of
            the log joint, in chunks; ``2 num_theta`` factorisations).
          widen: the proposal's scale against ``q(theta)``'s (``>= 1``). Wider
            proposals reach where ``q(theta)`` is too narrow, but there the fixed
            sites fit ``p(f | theta, y)`` worse and the inner ratios get noisier: on
            the LGCP ``widen=1.5`` raised k-hat from 0.5-0.7 to 0.85-0.9.
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

    def at(th, key_i):
        """For one ``theta``: ``log p(y, theta, f_j) - log q(f_j | theta)`` over ``num_f``
        draws of ``q(f | theta)``, and one of the draws picked by its ratio."""
        mu, chol, ops = q.conditional(th)
        k_z, k_j = jax.random.split(key_i)
        z = _random.normal(k_z, (num_field, num_f), q.dtype)
        f = (mu[:, None] + ops.back(chol, after(z, mu))).T  # (num_f, N), in turn
        log_q_f = 0.5 * (ops.logdet(chol) - num_field * _LOG_2PI) - 0.5 * jnp.sum(z * z, 0)
        m, precision, log_norm = model.prior_of_field(th)
        prior_ops = _field.ops(precision)
        precision = after(precision, chol)  # factored after q(f | theta)
        log_norm = _prior_log_norm(prior_ops, precision, log_norm, num_field)
        n_sites = model.num_sites(precision, num_field)
        d = (f - m).T  # (N, num_f)
        quad = jnp.sum(d * prior_ops.matvec(precision, d), 0)
        eta = jax.vmap(lambda fj: _field.project(fj, model.design, n_sites))(f)
        lik = jax.vmap(lambda e: jnp.sum(model.site_log_lik(e, th)))(eta)
        ratio = model.prior_log_density(th) + log_norm - 0.5 * quad + lik - log_q_f
        ratio = jnp.where(jnp.isnan(ratio), -jnp.inf, ratio)
        return ratio, f[jax.random.categorical(k_j, ratio)]

    chunk = max(1, min(num_theta, _IMPORTANCE_HELD // (num_f * num_field)))
    ratios, picked = jax.lax.map(
        lambda a: at(*a), (theta, jax.random.split(k_f, num_theta)), batch_size=chunk
    )
    ratios = ratios - log_proposal[:, None]
    log_w = jax.nn.logsumexp(ratios, axis=1) - math.log(num_f)
    smoothed = psis(log_w)
    i = jax.random.categorical(k_pick, smoothed.log_weights, shape=(n,))
    weights = jnp.exp(smoothed.log_weights)
    return LatentImportance(
        theta=theta[i],
        f=picked[i],
        khat=smoothed.khat,
        ess=1.0 / jnp.sum(weights**2),
        log_evidence=jax.nn.logsumexp(ratios) - math.log(num_theta * num_f),
    )


# -------------------------------------------------------------------- the method


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
    (below). The log density a draw reports is
    ``L(theta)``.

    Args:
      target: what ``q(theta)`` is fitted to. ``"ep"`` (default): expectation
        propagation's approximation of ``log p(y, theta)`` at the current sites,
        ``log p(theta) + log Z(theta) + sum_t log E[p(y_t|f_t) / s_t(f_t)]`` under
        ``q(f_t | theta)`` (:meth:`LatentGaussian.site_gaps`); ``"elbo"``: the paper's
        ``L(theta)``, the ELBO with ``f`` integrated out, ``E[log ...]`` in place of
        ``log E[...]``. The ELBO's gap ``KL(q(f | theta) || p(f | theta, y))`` grows
        with the field's prior variance where the likelihood is far from Gaussian
        (small counts), which pulls ``q(theta)`` towards small variances: on the LGCP
        of ``benchmarks/latent_gaussian.py`` (~2 counts a cell) ``"elbo"`` puts
        ``sigma``'s mean 0.43 NUTS sd low, ``"ep"`` 0.08; on the stochastic-volatility
        series ``s2`` -0.25 and -0.07 sd. Only ``q(theta)`` changes (the sites are
        Algorithm 2's either way; the result's ELBO is that of the fitted ``q``), at
        the cost of one more pass of the site likelihood over the quadrature nodes; for
        Gaussian observations the two agree (every gap is zero).
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
        difference matters: ``L``'s level moves with the sites from step to step,
        by O(T) nats early on, against an O(1) quadratic over ``q(theta)``; the
        values alone, regressed with an intercept, gave improper or far-off fits on a
        simulated SV series of ``T = 10^4`` (1 of 3 keys in 20 steps, 1 of 4 in 250),
        the differences none (4 of 4 in 20 and in 250 steps, within the gradient
        regression's key-to-key spread). Its cost, two values, against the
        gradient's ~3.6 values through blocked scans: measured with 250 steps, no
        diagnostics, on a slow 2-core machine, 2.98 s against 4.52 s on the LGCP of
        ``benchmarks/latent_gaussian.py`` (banded, ``w = 40``), but 0.167 against
        0.150 s on its GLMM (a diagonal prior) and 0.89 against 0.86 s on its SV series
        (tridiagonal), where a gradient costs little more than a value: hence the
        default. ``q(theta)`` agreed within the key-to-key spread on all three. The
        other choices form the Hessian at each draw, ``P = -E hess L``, ``m = z +
        P^{-1} E grad L``: ``"forward"``: forward differences of the exact gradient
        along each hyperparameter, steps ``sqrt(eps)`` times its sd under
        ``q(theta)``, ``k + 1`` gradients (relative error ~1e-8 in float64, ~3e-4 in
        float32); ``"central"``: central differences, ``2k + 1`` gradients, error
        ~1e-10; ``"autodiff"``: forward over reverse mode, exact, but through the
        scans it costs ~35 gradients on XLA:CPU (6.3 ms against 0.18 ms for a
        gradient at ``T = 945``, ``k = 3``).

    Example:
      >>> import jaxvb
      >>> jaxvb.methods.resolve("latent_gaussian", None).name
      'latent_gaussian'
    """

    if hessian not in (None, "forward", "central", "autodiff", "regression", "values"):
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
        regression, values = mode(q0) == "regression", mode(q0) == "values"
        theta = q0.theta
        mu, _, _ = q0.conditional(theta.mean)
        a = q0.site_precision
        eta = _field.project(mu, q0.model.design, a.shape[-1])
        sites = dict(A=a, G=q0.site_shift - a * eta, Z=eta)
        if values:
            return dict(**_value_init(q0), **sites)
        if regression:
            # q0's own pseudo-draws, about the fixed centre c (q0's mean): the gradient
            # of its quadratic, -P0 (theta - m0), gives E[g d'] = -P0 cov0 = -I
            z = theta.mean - q0.theta_centre
            eye = jnp.eye(z.shape[0], dtype=z.dtype)
            return dict(GX=-eye, XX=theta.cov + jnp.outer(z, z), g=0.0 * z, z=z, **sites)
        return dict(P=theta.precision, g=jnp.zeros_like(theta.mean), z=theta.mean, **sites)

    def noise(key, q):
        return q.noise(key)

    def estimate(noise, q, log_joint):
        del log_joint
        regression, values = mode(q) == "regression", mode(q) == "values"
        z_theta, z_f = noise
        theta = q.theta.from_noise(z_theta)
        model = q.model

        def target_fn(th):
            return _target(model, q.site_precision, q.site_shift, th, ep)

        if values:
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
        elif regression:
            (value, aux), grad = jax.value_and_grad(target_fn, has_aux=True)(theta)
            d = theta - q.theta_centre
            stats = dict(GX=jnp.outer(grad, d), XX=jnp.outer(d, d), g=grad, z=d)
            last = grad
        else:
            if mode(q) == "autodiff":
                value, grad, hess, aux = _value_grad_hessian_aux(target_fn)(theta)
            else:
                sd = jnp.sqrt(jnp.diagonal(q.theta.cov))
                value, grad, hess, aux = _value_grad_hessian_differences(
                    target_fn, theta, sd, central=mode(q) == "central"
                )
            stats = dict(P=-hess, g=grad, z=theta)
            last = hess
        eta, var, mu, chol, d1, d2 = aux
        # the draw's back-solve after the derivatives (their solves): under vmap,
        # batched solves side by side can hang jaxlib 0.10 (_platform.after)
        f = mu + _field.ops(model.prior_of_field(theta)[1]).back(chol, after(z_f, last))
        stats.update(A=-d2, G=d1, Z=eta)
        return stats, jnp.concatenate([theta, f]), value

    def solve(stats, q, log_joint):
        del log_joint
        regression, values = mode(q) == "regression", mode(q) == "values"
        if values:
            precision, g = _fit_in_frame(stats["C"], stats["gv"], q.theta_frame)
            centre = q.theta_centre
            stats = dict(stats, g=g)
        elif regression:
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

    return Method(
        name="latent_gaussian",
        init=init,
        noise=noise,
        estimate=estimate,
        solve=solve,
        min_draws=lambda q: 1,
    )


def _frame_of(cov: Array) -> Array:
    """The Cholesky factor of ``cov``, or the identity where it has none (a failed
    start, already flagged ``LAPLACE_FAILED``): the frame only conditions the
    statistics, any fixed invertible one gives the same fit in exact arithmetic."""
    chol = jnp.linalg.cholesky(cov)
    ok = jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.diagonal(chol) > 0)
    return jnp.where(ok, chol, jnp.eye(cov.shape[-1], dtype=cov.dtype))


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


register("latent_gaussian", latent_gaussian, default_for=(LatentGaussianApproximation,))
