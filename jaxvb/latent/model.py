r"""The latent Gaussian model: the paper's hierarchical approximation as a general tool.

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
algebra of ``q(f | theta)`` (its moments, ``log Z`` and the sites' terms) is
:mod:`jaxvb.latent._field`'s. Fixed effects go last in the field (``design``, an
:class:`jaxvb.linalg.Arrowhead` prior). :mod:`jaxvb.composite` fits the same model
and ``q(f | theta)`` with the paper's exponential-family ``q(theta)`` instead (the
stochastic-volatility model of :mod:`jaxvb.models.stochastic_volatility` and the eight
schools are ``LatentGaussian`` models fitted so).

The model is a :class:`LatentGaussian` (here, with its validation); ``jaxvb.fit`` calls
its :meth:`~LatentGaussian.start` (:mod:`jaxvb.latent.start`) and fits a
:class:`jaxvb.latent.LatentGaussianApproximation` with :func:`jaxvb.latent.latent_gaussian`
(:mod:`jaxvb.latent.method`, which describes the iteration).

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
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb import _static, linalg
from jaxvb._algebra import cast_tree
from jaxvb.families._base import Array, is_concrete, register_dataclass
from jaxvb.latent import _field
from jaxvb.latent.approximation import _costly_factorisation
from jaxvb.latent.start import _name_the_prior, _start, _start_optimised
from jaxvb.latent.target import _prior_log_norm

__all__ = ["LatentGaussian"]

_STATIC = {"static": True}


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
    ``log_lik``, a large part of a cheap step's cost."""
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
        ``num_quadrature x T`` points, much of a cheap step's cost. The default, 20,
        keeps wide sites (a posterior sd of order one on the linear predictor)
        accurate; narrow sites (many observations each) can take fewer, such as 10.
      log_lik_takes_theta: call ``log_lik(f, data, theta)``: observations that also
        depend on the hyperparameters (a noise scale, a dispersion).
      num_hyper: ``k``; set by :meth:`start` (``jaxvb.fit`` calls it), ``None`` before.
      theta_names: one name per hyperparameter, as it reads after its transform, for
        the summary and ArviZ (``None``: ``theta[0]``, ``theta[1]``, ...).
      theta_transforms: one function per hyperparameter (``None`` the identity), or
        a dict keyed by ``theta_names``: each maps its unconstrained value to the
        constrained scale, elementwise (``jnp.exp`` for a log scale; see
        :meth:`jaxvb.latent.LatentGaussianApproximation.constrained`).
        ``q(theta)`` itself stays on the unconstrained scale.
      field_name: the field's name in the summary and ArviZ (default ``"f"``).
      simulate: ``(key, f (T,), data) -> y``, one replicated data set at the sites'
        values (``log_lik``'s ``f``; ``(key, f, data, theta)`` with
        ``log_lik_takes_theta``): ``jaxvb.to_arviz``'s posterior predictive.

    These four describe the model and do not enter the fit's programs: static, like
    the functions (a new data set of the same shapes reuses the compiled fit).

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
    theta_names: tuple[str, ...] | None = dataclasses.field(default=None, metadata=_STATIC)
    theta_transforms: tuple[Callable | None, ...] | None = dataclasses.field(
        default=None, metadata=_STATIC
    )
    field_name: str = dataclasses.field(default="f", metadata=_STATIC)
    simulate: Callable | None = dataclasses.field(default=None, metadata=_STATIC)

    def __post_init__(self):
        for name in ("log_prior", "prior", "log_lik", "simulate"):
            value = getattr(self, name)
            if not (callable(value) or (name == "simulate" and value is None)):
                raise TypeError(
                    f"LatentGaussian: {name} must be a function, got {type(value).__name__}"
                )
        if not isinstance(self.num_quadrature, int) or self.num_quadrature < 1:
            raise ValueError(
                f"LatentGaussian: num_quadrature must be a positive integer, got "
                f"{self.num_quadrature!r}"
            )
        names, transforms = _checked_names(self)
        # tuples, hashable: these fields are part of the model's static structure
        object.__setattr__(self, "theta_names", names)
        object.__setattr__(self, "theta_transforms", transforms)

    # -- the pieces ------------------------------------------------------------------

    # The three pieces as the engine calls them (a subclass, such as jaxvb.numpyro's,
    # may compute them from its data instead of from the user's functions).

    def prior_log_density(self, theta: Array) -> Array:
        """``log p(theta)``, a scalar."""
        return jnp.asarray(self.log_prior(theta)).astype(theta.dtype)

    def prior_of_field(self, theta: Array):
        """``(mean, precision, log_norm)`` of ``p(f | theta)``: ``log_norm`` the
        prior's log normalising constant where ``prior`` gives it, else ``None``
        (then computed from the precision's factor:
        :func:`jaxvb.latent.target._prior_log_norm`)."""
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

    def _own_expectations(self) -> bool:
        """Whether the model computes its site expectations itself (in closed form)."""
        return type(self).site_expectations is not LatentGaussian.site_expectations

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
        """:meth:`check` on shapes alone: ``prior``'s, ``log_lik``'s, ``log_prior``'s."""
        mean, precision, log_norm = jax.eval_shape(self.prior_of_field, theta)
        t = _check_prior(mean, precision, log_norm, self.design)
        self._check_log_lik(theta, precision, t)
        lp = jax.eval_shape(self.prior_log_density, theta)
        if getattr(lp, "shape", None) != ():
            raise ValueError(
                "LatentGaussian: log_prior(theta) must return a scalar, got shape "
                f"{getattr(lp, 'shape', type(lp).__name__)}"
            )
        _check_transforms(self, theta)
        return t

    def _check_log_lik(self, theta: jax.ShapeDtypeStruct, precision, t: int) -> None:
        """A clear error where ``log_lik`` fails on the sites' ``(n,)`` values or does
        not return one log-likelihood for each."""
        design = self.design
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
        hyperparameters' target ``L``; in rounds, the sites refreshed at each round's
        point, each but the last moving ``theta`` a bounded step
        (:data:`jaxvb.latent.start.ROUND_STEPS`).
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
        # (a faster start for a longer compile, once, alongside the fit's), else
        # compiled quickly
        costly = _costly_factorisation(model, theta0.shape[0], theta0.dtype)
        q0, ok = (_start_optimised if costly else _start)(arrays, static, theta0)
        if is_concrete(ok) and not bool(ok):
            _name_the_prior(model, theta0)
        return model, q0, ok


@_static.memo_by_signature
def _checked(model: LatentGaussian, theta: jax.ShapeDtypeStruct) -> int:
    """:meth:`LatentGaussian.check`'s traces, kept per model structure and shapes."""
    return model._check(theta)


def _checked_names(model: LatentGaussian):
    """``(theta_names, theta_transforms)`` as tuples (a dict of transforms in the
    names' order), or a clear error about them or ``field_name``."""
    names, transforms, field = model.theta_names, model.theta_transforms, model.field_name
    if names is not None:
        ok = isinstance(names, (tuple, list)) and all(
            isinstance(n, str) and n for n in names
        )
        if not ok or len(set(names)) != len(names):
            raise ValueError(
                "LatentGaussian: theta_names must be distinct non-empty strings, one "
                f"per hyperparameter, such as ('sigma', 'rho'); got {names!r}"
            )
        names = tuple(names)
    if isinstance(transforms, dict):
        if names is None or not set(transforms) <= set(names):
            raise ValueError(
                "LatentGaussian: a dict of theta_transforms is keyed by theta_names "
                f"{names!r}; got the keys {tuple(transforms)!r}"
            )
        transforms = tuple(transforms.get(n) for n in names)
    if transforms is not None:
        if not isinstance(transforms, (tuple, list)) or not all(
            t is None or callable(t) for t in transforms
        ):
            raise TypeError(
                "LatentGaussian: theta_transforms must be a sequence of functions (None "
                "for the identity), one per hyperparameter, such as (jnp.exp, None), or "
                f"a dict keyed by theta_names; got {transforms!r}"
            )
        transforms = tuple(transforms)
    if not (isinstance(field, str) and field) or field in (names or ("theta",)):
        raise ValueError(
            "LatentGaussian: field_name must be a non-empty string other than the "
            f"hyperparameters' names {names or ('theta',)!r}; got {field!r}"
        )
    return names, transforms


def _check_transforms(model: LatentGaussian, theta: jax.ShapeDtypeStruct) -> None:
    """A clear error where ``theta_names`` or ``theta_transforms`` do not have one
    entry per hyperparameter, or a transform does not map a scalar to a scalar."""
    k = theta.shape[0]
    for what in ("theta_names", "theta_transforms"):
        given = getattr(model, what)
        if given is not None and len(given) != k:
            raise ValueError(
                f"LatentGaussian: {len(given)} {what} for the {k} hyperparameters of "
                f"theta0 (shape ({k},)); give one per hyperparameter"
            )
    scalar = jax.ShapeDtypeStruct((), theta.dtype)
    for i, t in enumerate(model.theta_transforms or ()):
        shape = None if t is None else getattr(jax.eval_shape(t, scalar), "shape", None)
        if t is not None and shape != ():
            raise ValueError(
                f"LatentGaussian: theta_transforms[{i}] must map one unconstrained value "
                f"(a scalar) to one constrained value; it returned shape {shape}"
            )


def _check_prior(mean, precision, log_norm, design) -> int:
    """``N``, the field's length, from the shapes of ``prior(theta)``'s ``(mean,
    precision, log_norm)`` and of ``design``, or a clear error about them."""
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
    if design is not None:
        shape = getattr(design, "shape", None)
        if shape is None or len(shape) != 2 or shape[0] + shape[1] != t:
            raise ValueError(
                "LatentGaussian: design must be an (n, p) array, the sites seeing "
                "eta = f[:n] + design @ f[n:] for a field f of N = n + p values "
                f"(N = {t} from prior's mean); got "
                f"{shape if shape is not None else type(design).__name__}"
            )
    _check_precision(precision, design, t)
    return t


def _check_precision(precision, design, t: int) -> None:
    """A clear error where ``precision`` is not a ``(N, N)`` array, a
    :class:`jaxvb.linalg.Banded` or an :class:`jaxvb.linalg.Arrowhead` of ``N = t``
    (and, with ``design``, an arrowhead or dense one)."""
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
