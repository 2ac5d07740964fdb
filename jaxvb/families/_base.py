"""The exponential-family protocol every approximating family implements.

A family is an immutable pytree (array fields are leaves) describing

    q_eta(x) = exp(T(x) . eta - U(eta)) nu(x)                       (paper, eq. 3)

with flat natural parameters ``eta`` of length ``k``. A subclass gives five things:
``sufficient_stats`` (T), ``natural_params`` (eta), ``from_natural`` (eta -> family),
``_log_normalizer`` (U as a function of eta) and a reparameterised sampler split into
``noise`` (parameter-free randomness) and ``from_noise`` (the differentiable map s(eta, z)).
Everything else -- ``log_prob``, ``entropy``, the moments of T, the Fisher information,
sampling -- is derived here, mostly by differentiating ``U`` with JAX.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb import _static
from jaxvb._platform import jit_fast, outside_traces

Array = jax.Array


def register_family(cls):
    """Makes ``cls`` a frozen dataclass and a pytree.

    Fields are leaves unless declared ``dataclasses.field(metadata={"static": True})``.
    Unflattening bypasses ``__init__`` so that JAX can rebuild a family from tracers,
    batched leaves or placeholder objects without running the user-facing validation.

    A family that leaves out a piece of its protocol is refused here, when the class
    is created, rather than deep inside a traced fit.

    Example:
      >>> import dataclasses, jax, jax.numpy as jnp
      >>> from jaxvb.families import Family, register_family
      >>> class Located(Family):   # a point mass: what Family asks, and nothing else
      ...     loc: jax.Array
      ...     name: str = dataclasses.field(default="x", metadata={"static": True})
      ...     event_shape = property(lambda self: self.loc.shape)
      ...     is_proper = property(lambda self: jnp.all(jnp.isfinite(self.loc)))
      ...     def noise(self, key):
      ...         return jnp.zeros(())
      ...     def from_noise(self, noise):
      ...         return self.loc + noise
      ...     def log_prob(self, x):
      ...         return jnp.where(jnp.all(x == self.loc), 0.0, -jnp.inf)
      >>> Located = register_family(Located)
      >>> q = Located(jnp.ones(2))
      >>> [leaf.tolist() for leaf in jax.tree_util.tree_leaves(q)]   # name is static
      [[1.0, 1.0]]
      >>> doubled = jax.tree_util.tree_map(lambda v: 2 * v, q)
      >>> doubled.loc.tolist(), doubled.name
      ([2.0, 2.0], 'x')
      >>> @register_family
      ... class Incomplete(Family):
      ...     loc: jax.Array
      Traceback (most recent call last):
      ...
      TypeError: Incomplete does not implement event_shape, from_noise, is_proper, log_prob, noise, which every Family must provide
    """
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise TypeError(
            f"{cls.__name__} does not implement {', '.join(missing)}, which every "
            f"{_required_by(cls)} must provide"
        )
    return register_dataclass(cls)


def register_dataclass(cls):
    """Makes ``cls`` a frozen dataclass and a pytree (:func:`register_family` without
    the check of the family protocol: for the parts a composite family is made of)."""
    cls = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
    fields = dataclasses.fields(cls)
    data = tuple(f.name for f in fields if not f.metadata.get("static", False))
    meta = tuple(f.name for f in fields if f.metadata.get("static", False))

    def flatten_with_keys(obj):
        children = [(jax.tree_util.GetAttrKey(n), getattr(obj, n)) for n in data]
        return children, tuple(getattr(obj, n) for n in meta)

    def flatten(obj):
        return [getattr(obj, n) for n in data], tuple(getattr(obj, n) for n in meta)

    def unflatten(aux, children):
        obj = object.__new__(cls)
        for name, value in zip(data, children, strict=True):
            object.__setattr__(obj, name, value)
        for name, value in zip(meta, aux, strict=True):
            object.__setattr__(obj, name, value)
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls


def build(cls, **fields):
    """Constructs a family without the user-facing validation of ``__post_init__``.

    Used by ``from_natural``, where an improper parameter must give a flagged family
    (``is_proper`` False) rather than an exception, so that it works under ``jit``.
    """
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def as_float_arrays(*values):
    """Converts parameters to JAX arrays of one common floating dtype.

    Integers become the default float dtype; mixed float precisions promote as JAX does.
    Tracers pass through with their dtype promoted the same way.
    """
    arrays = [jnp.asarray(v) for v in values]
    dtype = jnp.result_type(*arrays)
    if not jnp.issubdtype(dtype, jnp.floating):
        dtype = jnp.result_type(float)
    if jnp.dtype(dtype).itemsize < 4:
        raise TypeError(
            f"the parameters have dtype {jnp.dtype(dtype).name}; jaxvb's families work in "
            "float32 or float64 (float16 and bfloat16 lose the regression statistics to "
            "round-off, and JAX's linear algebra refuses them). Build the family from "
            "float32 or float64 arrays."
        )
    return tuple(a.astype(dtype) for a in arrays)


def is_concrete(x) -> bool:
    """True when ``x`` holds values now (not a tracer under jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


def check_positive(name: str, family: str, value: Array) -> None:
    """Raises when a concrete parameter is not strictly positive and finite."""
    if is_concrete(value):
        v = np.asarray(value)
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(
                f"{family}: {name} must be positive and finite, got {v!r}. "
                f"A non-positive {name} is not a proper distribution."
            )


def _required_by(cls) -> str:
    return next(
        base.__name__
        for base in cls.__mro__
        if base.__name__ in ("ScalarFamily", "ExponentialFamily", "Family")
    )


class Family(abc.ABC):
    """What :func:`jaxvb.fit` needs of an approximating distribution.

    An immutable pytree (decorate subclasses with :func:`register_family`) with a
    reparameterised sampler split into ``noise`` (parameter-free randomness) and
    ``from_noise`` (the differentiable map ``s(eta, z)``), a log density and a check
    that its parameters are proper. Most families are an :class:`ExponentialFamily`;
    one that is not (:class:`~jaxvb.GaussianMixture`) is a ``Family`` fitted by a
    method of its own. A subclass that leaves out an abstract method is refused when
    it is registered.

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> q = jaxvb.GaussianMixture.around(jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)), 3)
      >>> isinstance(q, jaxvb.Family), isinstance(q, jaxvb.ExponentialFamily)
      (True, False)
      >>> sorted(jaxvb.Family.__abstractmethods__)
      ['event_shape', 'from_noise', 'is_proper', 'log_prob', 'noise']
    """

    @property
    @abc.abstractmethod
    def event_shape(self) -> tuple[int, ...]:
        """The shape of one draw ``x``."""

    @property
    def dtype(self):
        return jax.tree_util.tree_leaves(self)[0].dtype

    @property
    def factors_per_draw(self) -> bool:
        """Whether a draw (and its density) factors a matrix of its own, e.g. a
        conditional ``q(f | theta)`` with a blocked banded or dense precision: then
        Monte Carlo draws are evaluated one after another on the CPU
        (:mod:`jaxvb.diagnostics`), where a loop over such factorisations is faster
        than their batch. False: draws share the family's factor and are vmapped."""
        return False

    @property
    @abc.abstractmethod
    def is_proper(self) -> Array:
        """Whether the parameters define a proper distribution (a boolean scalar)."""

    @abc.abstractmethod
    def noise(self, key: Array) -> Any:
        """Parameter-free randomness for one draw (a pytree)."""

    @abc.abstractmethod
    def from_noise(self, noise: Any) -> Array:
        """The draw ``s(eta, noise)``; differentiable in the parameters."""

    @abc.abstractmethod
    def log_prob(self, x: Array) -> Array:
        """log q(x) for one draw ``x`` (``-inf`` outside the support)."""

    def antithetic(self, noise: Any) -> Any:
        """Noise whose draw is negatively correlated with ``from_noise(noise)``."""
        raise NotImplementedError(
            f"{type(self).__name__} has no antithetic sampler: its draws are not a "
            "symmetric transform of standard noise. Use antithetic=False, or more draws "
            "per step (num_draws)."
        )

    def in_support(self, x: Array) -> Array:
        """Whether ``x`` lies in the support (a boolean scalar)."""
        return jnp.all(jnp.isfinite(x))

    def sample(self, key: Array, sample_shape: tuple[int, ...] = ()) -> Array:
        """Draws of shape ``sample_shape + event_shape``; reparameterised where JAX can."""
        sample_shape = tuple(sample_shape)
        if outside_traces():
            # Called on its own: one compiled program per family structure and shape
            # (its operations dispatched one by one would each compile a program of
            # their own); inside a trace, part of the caller's program.
            arrays, static = _static.partition((self, key))
            if _static.hashable(static):
                return _sample_compiled(arrays, static=static, sample_shape=sample_shape)
        return self._sample(key, sample_shape)

    def _sample(self, key: Array, sample_shape: tuple[int, ...]) -> Array:
        n = math.prod(sample_shape)
        if sample_shape == ():
            return self.from_noise(self.noise(key))
        keys = jax.random.split(key, n)
        draws = jax.vmap(lambda k: self.from_noise(self.noise(k)))(keys)
        return draws.reshape(tuple(sample_shape) + self.event_shape)

    def sample_and_log_prob(
        self, key: Array, sample_shape: tuple[int, ...] = ()
    ) -> tuple[Array, Array]:
        """``sample(key, sample_shape)`` and ``log_prob`` of each draw.

        A family overrides it where the density of its own draws is cheaper than
        ``log_prob`` of an arbitrary point (distrax's ``sample_and_log_prob``).
        """
        x = self.sample(key, sample_shape)
        flat = x.reshape((-1,) + self.event_shape)
        log_q = jax.vmap(self.log_prob)(flat).reshape(tuple(sample_shape))
        return x, log_q

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if is_concrete(v) and hasattr(v, "shape") and np.size(v) <= 6:
                parts.append(f"{f.name}={np.asarray(v).tolist()}")
            else:
                parts.append(f"{f.name}={getattr(v, 'shape', v)}")
        return f"{type(self).__name__}({', '.join(parts)})"


class ExponentialFamily(Family):
    """Base class of the exponential-family approximations.

    Subclasses are decorated with :func:`register_family`; see the module docstring for
    what they must implement. ``event_shape`` is the shape of one draw ``x``.

    Example:
      What every family derives from its five methods, here ``Gamma(3, 2)`` with
      ``T(x) = (log x, -x)``:

      >>> import jax.numpy as jnp, jaxvb
      >>> q = jaxvb.Gamma(jnp.array([3.0]), jnp.array([2.0]))
      >>> q.natural_params.tolist(), q.num_stats, q.event_shape
      ([2.0, 2.0], 2, (1,))
      >>> round(float(q.log_normalizer), 6), round(float(q.entropy), 6)
      (-1.386294, 1.154431)
      >>> [round(v, 6) for v in q.mean_sufficient_stats.tolist()]   # E[log x], -E[x]
      [0.229637, -1.5]
      >>> [round(v, 6) for v in q.fisher_information.ravel().tolist()]   # Cov[T]
      [0.394934, -0.5, -0.5, 0.75]
      >>> bool(q.from_natural(jnp.array([-2.0, 2.0])).is_proper)   # concentration -1
      False
    """

    # --- what a subclass implements (with Family's event_shape, is_proper, noise,
    # from_noise) ---------------------------------------------------------------------

    @abc.abstractmethod
    def sufficient_stats(self, x: Array) -> Array:
        """T(x), shape ``(k,)``, for one draw ``x`` of shape ``event_shape``."""

    @property
    @abc.abstractmethod
    def natural_params(self) -> Array:
        """eta, shape ``(k,)``."""

    @abc.abstractmethod
    def from_natural(self, eta: Array) -> ExponentialFamily:
        """The family of this type and shape with natural parameters ``eta``.

        No check is made here: an ``eta`` outside the natural parameter space gives a
        family whose ``is_proper`` is False (its fields may hold NaN).
        """

    @abc.abstractmethod
    def _log_normalizer(self, eta: Array) -> Array:
        """U(eta) for natural parameters ``eta`` of this family's shape."""

    def log_base_measure(self, x: Array) -> Array:
        """log nu(x); zero for every family here."""
        del x
        return jnp.zeros((), self.dtype)

    # --- derived --------------------------------------------------------------------

    @property
    def num_stats(self) -> int:
        """k, the number of sufficient statistics."""
        return int(self.natural_params.shape[-1])

    @property
    def log_normalizer(self) -> Array:
        """U(eta) at this family's natural parameters."""
        return self._log_normalizer(self.natural_params)

    @property
    def mean_sufficient_stats(self) -> Array:
        """E_q[T(x)] = dU/deta, shape ``(k,)``."""
        return jax.grad(self._log_normalizer)(self.natural_params)

    @property
    def fisher_information(self) -> Array:
        """Cov_q[T(x)] = d^2U/deta^2, shape ``(k, k)``."""
        return jax.hessian(self._log_normalizer)(self.natural_params)

    def log_prob(self, x: Array) -> Array:
        """log q(x) for one draw ``x`` (``-inf`` outside the support)."""
        x = jnp.asarray(x, self.dtype)
        inside = self.in_support(x)
        safe_x = jnp.where(inside, x, self._support_point())
        lp = (
            self.sufficient_stats(safe_x) @ self.natural_params
            - self.log_normalizer
            + self.log_base_measure(safe_x)
        )
        return jnp.where(inside, lp, -jnp.inf)

    def _support_point(self) -> Array:
        """Any point inside the support, used to keep masked branches finite."""
        return self.mean

    def kl_divergence(self, other: ExponentialFamily) -> Array:
        """``KL(self || other)`` for two members of the same family.

        ``U(eta_o) - U(eta_s) - (eta_o - eta_s) . E_s[T]``: one gradient of ``U``.

        Example:
          >>> import jaxvb
          >>> p, q = jaxvb.Gamma(2.0, 1.0), jaxvb.Gamma(3.0, 2.0)
          >>> round(float(p.kl_divergence(q)), 6), float(p.kl_divergence(p))
          (0.190921, 0.0)
        """
        eta_s, eta_o = self.natural_params, other.natural_params
        return (
            self._log_normalizer(eta_o)
            - self.log_normalizer
            - (eta_o - eta_s) @ self.mean_sufficient_stats
        )

    @property
    def entropy(self) -> Array:
        """H[q] = U(eta) - eta . E[T] - E[log nu]."""
        return self.log_normalizer - self.natural_params @ self.mean_sufficient_stats


class ScalarFamily(ExponentialFamily):
    """A product of independent scalar exponential families, one per element.

    The parameters are arrays of one common shape, which is also the event shape. A
    subclass maps its usual parameters to per-element natural-parameter arrays and back
    (``_natural_parts`` / ``_from_natural_parts``), gives the per-element statistics
    (``_stats_parts``) and the per-element log normaliser (``_log_normalizer_parts``);
    the flat layout ``eta = (part_1.ravel(), part_2.ravel(), ...)`` is handled here.

    Example:
      A half-normal family, ``q(x) ∝ exp(-tau x^2 / 2)`` on ``x >= 0``
      (``T(x) = -x^2 / 2``, ``eta = tau``, ``U = log(pi / (2 tau)) / 2``):

      >>> import jax, jax.numpy as jnp
      >>> from jaxvb.families import ScalarFamily, register_family
      >>> @register_family
      ... class HalfNormal(ScalarFamily):
      ...     precision: jax.Array
      ...     def _natural_parts(self):
      ...         return (self.precision,)
      ...     def _from_natural_parts(self, precision):
      ...         return HalfNormal(precision)
      ...     def _stats_parts(self, x):
      ...         return (-0.5 * x**2,)
      ...     def _log_normalizer_parts(self, precision):
      ...         return 0.5 * jnp.log(0.5 * jnp.pi / precision)
      ...     def noise(self, key):
      ...         return jax.random.normal(key, self.event_shape, self.dtype)
      ...     def from_noise(self, z):
      ...         return jnp.abs(z) / jnp.sqrt(self.precision)
      ...     def in_support(self, x):
      ...         return jnp.all(x >= 0)
      ...     @property
      ...     def mean(self):
      ...         return jnp.sqrt(2.0 / (jnp.pi * self.precision))
      >>> q = HalfNormal(jnp.array([4.0]))
      >>> q.natural_params.tolist(), round(float(q.log_prob(jnp.array([0.5]))), 6)
      ([4.0], -0.032644)
      >>> q.sample(jax.random.key(0), (3,)).shape   # ready for jaxvb.fit
      (3, 1)
    """

    def __post_init__(self):
        # Every parameter of the scalar families is positive; they broadcast together.
        names = [f.name for f in dataclasses.fields(self)]
        values = as_float_arrays(*(getattr(self, n) for n in names))
        for name, value in zip(names, jnp.broadcast_arrays(*values), strict=True):
            object.__setattr__(self, name, value)
            check_positive(name, type(self).__name__, value)

    @abc.abstractmethod
    def _natural_parts(self) -> tuple[Array, ...]:
        """See the class docstring."""

    @abc.abstractmethod
    def _from_natural_parts(self, *parts: Array) -> ScalarFamily:
        """See the class docstring."""

    @abc.abstractmethod
    def _stats_parts(self, x: Array) -> tuple[Array, ...]:
        """See the class docstring."""

    @abc.abstractmethod
    def _log_normalizer_parts(self, *parts: Array) -> Array:
        """See the class docstring."""

    @property
    def event_shape(self) -> tuple[int, ...]:
        return tuple(jax.tree_util.tree_leaves(self)[0].shape)

    def _split(self, eta: Array) -> tuple[Array, ...]:
        n = math.prod(self.event_shape)
        parts = jnp.split(eta, len(dataclasses.fields(self)))
        return tuple(p.reshape(self.event_shape) for p in parts) if n else parts

    @property
    def natural_params(self) -> Array:
        return jnp.concatenate([p.ravel() for p in self._natural_parts()])

    def from_natural(self, eta: Array) -> ScalarFamily:
        return self._from_natural_parts(*self._split(eta))

    def sufficient_stats(self, x: Array) -> Array:
        return jnp.concatenate([s.ravel() for s in self._stats_parts(x)])

    def _log_normalizer(self, eta: Array) -> Array:
        return jnp.sum(self._log_normalizer_parts(*self._split(eta)))

    @property
    def is_proper(self) -> Array:
        leaves = jax.tree_util.tree_leaves(self)
        return jnp.all(jnp.stack([jnp.all(jnp.isfinite(v) & (v > 0)) for v in leaves]))


def positive(x: jax.Array) -> jax.Array:
    """A draw on ``(0, inf)`` kept inside it: one that underflowed to 0 or overflowed
    to ``inf`` (``Gamma(0.05, 1)`` draws fall below float32's smallest normal number
    1.2e-38 about 1 time in 80) is moved to the nearest positive finite number, where
    ``log x`` and ``log p`` are finite. The regression's statistics stay consistent:
    ``T(x)`` and ``log p`` are both evaluated at the moved point."""
    info = jnp.finfo(x.dtype)
    return jnp.clip(x, info.tiny, info.max)


@jit_fast(static_argnames=("static", "sample_shape"))
def _sample_compiled(arrays, *, static, sample_shape):
    q, key = _static.combine(arrays, static)
    return q._sample(key, sample_shape)
