"""A NumPyro model as a log joint over one vector ``x``: :class:`LogJoint`,
:class:`MinibatchLogJoint` (section 5.5) and :func:`log_joint`.

``x`` holds the latent sites on NumPyro's unconstrained scale; a log joint is a pytree
whose leaves are the model's arrays and whose static part (the model and what its
trace said) compares by value, so one compiled fit serves new data of the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.infer import init_to_median
from numpyro.infer.util import constrain_fn, potential_energy, unconstrain_fn

from jaxvb import _static
from jaxvb._static import Static
from jaxvb.interop.numpyro._sites import (
    _abstract_trace,
    _check_sites,
    _full_plates_quiet,
    _is_latent,
    _model_trace,
    _observed_names,
    _plate_dims,
    _subsample_plates,
    _trace,
)

__all__ = ["LogJoint", "MinibatchLogJoint", "log_joint"]


class LogJoint:
    r"""The unconstrained log joint of a NumPyro model, as a function of one vector.

    ``x`` of shape ``(dim,)`` holds the latent sample sites on NumPyro's unconstrained
    scale (``biject_to(support).inv`` of each value), raveled in the order of the
    site names (``jax.flatten_util.ravel_pytree``); ``log_joint(x)`` is NumPyro's
    ``-potential_energy``: the model's log density at the constrained values plus the
    log-Jacobians of the bijections. Every plate is given all its indices, so the
    value is the full-data log joint even where a plate has a ``subsample_size``.

    Build one with :func:`log_joint` (which returns a :class:`MinibatchLogJoint` for a
    model that subsamples). Like any log joint, it goes into :func:`jaxvb.fit`,
    :func:`jaxvb.laplace` and ``jax.grad``.

    It is a pytree: its leaves are the arrays among the model's arguments (and the
    observed values), its static part the model function and the structure read from
    its trace (site names, shapes, supports' unconstrained shapes, subsampled plates),
    which compares and hashes by value. :func:`jaxvb.fit` passes the leaves to its
    compiled program as inputs, so a second log joint of the same model with new data
    of the same shapes and dtypes runs the program compiled for the first. (The model
    then sees its array arguments as traced values inside the fit: it may use their
    shapes, not their values, in Python control flow, as under ``jax.jit``.)

    Attributes:
      model, model_args, model_kwargs: the model and what it is called with.
      dim: the length of ``x``.
      latent_shapes: site name -> shape of its (constrained) value, in model order.
      deterministic_shapes: the same for the ``numpyro.deterministic`` sites.
      posterior_sites: the names of the latent and deterministic sites, in model order.
      observed: site name -> observed value (all of it, for a subsampled plate).
      subsample_plates: plate name -> ``(size, subsample_size)`` for each plate that
        subsamples.

    Example:
      >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist
      >>> import jaxvb.numpyro
      >>> def model(y):
      ...     scale = numpyro.sample("scale", dist.HalfNormal(1.0))
      ...     numpyro.sample("y", dist.Normal(0.0, scale), obs=y)
      >>> lj = jaxvb.numpyro.log_joint(model, jnp.array([0.5, -1.0]))
      >>> lj.dim, lj.latent_shapes
      (1, {'scale': ()})
      >>> x = lj.unconstrain({"scale": jnp.array(2.0)})  # log(2): HalfNormal's bijection
      >>> round(float(x[0]), 6), round(float(lj.constrain(x)["scale"]), 6)
      (0.693147, 2.0)
    """

    def __init__(self, model: Callable, *model_args: Any, **model_kwargs: Any):
        if not callable(model):
            raise TypeError(f"jaxvb.numpyro: model must be a function, got {model!r}")
        self.model = model
        self.model_args = model_args
        self.model_kwargs = model_kwargs
        trace = _model_trace(model, model_args, model_kwargs)
        self.subsample_plates = _subsample_plates(trace)
        if self.subsample_plates:
            trace = _abstract_trace(self._full_model, model_args, model_kwargs)
        _check_sites(trace, self.subsample_plates)

        latent = {name: site for name, site in trace.items() if _is_latent(site)}
        self.latent_shapes = {
            name: np.shape(site["value"]) for name, site in latent.items()
        }
        self.deterministic_shapes = {
            name: np.shape(site["value"])
            for name, site in trace.items()
            if site["type"] == "deterministic"
        }
        self.posterior_sites = [
            name
            for name in trace
            if name in self.latent_shapes or name in self.deterministic_shapes
        ]
        observed = _observed_names(trace)
        if any(isinstance(trace[name]["value"], jax.core.Tracer) for name in observed):
            trace = _trace(self._full_model, model_args, model_kwargs)  # computed obs
        self.observed = {name: trace[name]["value"] for name in observed}
        self._dims = {
            name: dims
            for name, site in trace.items()
            if site["type"] in ("sample", "deterministic")
            and (dims := _plate_dims(site)) is not None
        }
        self._read_unconstrained(latent)

    def _read_unconstrained(self, latent: Mapping[str, Any]) -> None:
        """Sets the layout of ``x``: the unconstrained shape of each latent site (the
        order of ``ravel_pytree``, a dict's sorted keys), ``dim`` and ``dtype``.

        Shapes only (no compiled operation), kept as plain data, which unlike
        ``ravel_pytree``'s unravel closure compares by value and so can be static
        pytree data.
        """
        values = {
            name: jax.ShapeDtypeStruct(jnp.shape(site["value"]), site["value"].dtype)
            for name, site in latent.items()
        }

        def unconstrained_values(values):
            with _full_plates_quiet():
                return unconstrain_fn(
                    self._full_model, self.model_args, self.model_kwargs, values
                )

        unconstrained = jax.eval_shape(unconstrained_values, values)
        self._unconstrained_shapes = tuple(
            (name, tuple(v.shape)) for name, v in sorted(unconstrained.items())
        )
        self.dim = sum(int(np.prod(v.shape, dtype=int)) for v in unconstrained.values())
        self.dtype = jnp.result_type(*unconstrained.values())

    def unravel(self, x: jax.Array) -> dict[str, jax.Array]:
        """The unconstrained value of each latent site, from ``x`` of shape ``(dim,)``."""
        out, start = {}, 0
        for name, shape in self._unconstrained_shapes:
            size = int(np.prod(shape, dtype=int))
            out[name] = x[start : start + size].reshape(shape)
            start += size
        return out

    def coordinate_name(self, i: int) -> str:
        """The latent site (and index within it) that coordinate ``i`` of ``x`` holds,
        on the unconstrained scale: ``"tau"``, ``"theta[3]"`` (for messages).

        Example:
          >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist
          >>> import jaxvb.numpyro
          >>> def model():
          ...     numpyro.sample("tau", dist.HalfNormal(1.0))
          ...     numpyro.sample("theta", dist.Normal(jnp.zeros(3), 1.0))
          >>> lj = jaxvb.numpyro.log_joint(model)
          >>> [lj.coordinate_name(i) for i in range(lj.dim)]
          ['tau', 'theta[0]', 'theta[1]', 'theta[2]']
        """
        start = 0
        for name, shape in self._unconstrained_shapes:
            size = int(np.prod(shape, dtype=int))
            if i < start + size:
                if not shape:
                    return name
                index = np.unravel_index(i - start, shape)
                return f"{name}[{', '.join(str(int(j)) for j in index)}]"
            start += size
        raise IndexError(f"coordinate {i} is outside x's {self.dim}")

    @property
    def _full_model(self) -> Callable:
        """The model with every subsampled plate given all its indices."""
        if not self.subsample_plates:
            return self.model
        data = {n: jnp.arange(size) for n, (size, _) in self.subsample_plates.items()}
        return handlers.substitute(self.model, data=data)

    def __call__(self, x: jax.Array) -> jax.Array:
        """The full-data log joint at ``x`` (unconstrained), with the log-Jacobians."""
        with _full_plates_quiet():
            return -potential_energy(
                self._full_model, self.model_args, self.model_kwargs, self.unravel(x)
            )

    def constrain(self, x: jax.Array) -> dict[str, jax.Array]:
        """The constrained value of every latent and deterministic site at ``x``."""
        with _full_plates_quiet():
            return constrain_fn(
                self._full_model,
                self.model_args,
                self.model_kwargs,
                self.unravel(x),
                return_deterministic=True,
            )

    def unconstrain(self, values: Mapping[str, Any]) -> jax.Array:
        """``x`` of shape ``(dim,)`` from the constrained values of the latent sites."""
        missing = sorted(set(self.latent_shapes) - set(values))
        if missing:
            raise ValueError(f"jaxvb.numpyro: no value for the latent site(s) {missing}")
        values = {name: values[name] for name in self.latent_shapes}
        with _full_plates_quiet():
            params = unconstrain_fn(
                self._full_model, self.model_args, self.model_kwargs, values
            )
        return ravel_pytree(params)[0].astype(self.dtype)

    def init_point(
        self, key: jax.Array, init_strategy: Callable = init_to_median
    ) -> jax.Array:
        """A starting ``x`` from a NumPyro init strategy (``numpyro.infer.init_to_*``).

        The model is run under ``substitute(seed(model, key), substitute_fn=init_strategy)``
        as NumPyro's ``initialize_model`` does, and the latent values it picks are
        mapped to the unconstrained scale.
        """
        model = handlers.substitute(
            handlers.seed(self._full_model, rng_seed=key), substitute_fn=init_strategy
        )
        with _full_plates_quiet():
            trace = handlers.trace(model).get_trace(*self.model_args, **self.model_kwargs)
        return self.unconstrain({name: trace[name]["value"] for name in self.latent_shapes})

    def arviz_dims(self) -> dict[str, list[str]]:
        """ArviZ dimension names per site (latent, deterministic and observed): a
        plate's name on the axis it indexes.

        Left out where a plate's name is also the name of a site (ArviZ would take it
        for a coordinate variable).
        """
        names = (
            set(self.latent_shapes) | set(self.deterministic_shapes) | set(self.observed)
        )
        return {
            site: dims
            for site, dims in self._dims.items()
            if not names.intersection(dims) and site in names
        }


class MinibatchLogJoint(LogJoint):
    """The log joint of a NumPyro model whose plates subsample (section 5.5).

    Calling it gives the full-data log joint, like :class:`LogJoint`. :func:`jaxvb.fit`
    also finds :meth:`batch` and uses, at every step, the model evaluated with fresh
    subsample indices: NumPyro's ``plate`` draws them (without replacement) and scales
    the likelihood by ``size / subsample_size``, an unbiased estimate of the full log
    joint, so the fit converges to the full-data answer.

    Example:
      >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
      >>> import jaxvb.numpyro
      >>> def model(y):
      ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
      ...     with numpyro.plate("data", y.shape[0], subsample_size=2) as idx:
      ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
      >>> lj = jaxvb.numpyro.log_joint(model, jnp.arange(6.0))
      >>> type(lj).__name__, lj.subsample_plates
      ('MinibatchLogJoint', {'data': (6, 2)})
      >>> x = jnp.array([2.5])
      >>> batch = jax.jit(jax.vmap(lambda t: lj.batch(jax.random.key(0), t)(x)))
      >>> values = batch(jnp.arange(1, 4001))  # 4000 steps' minibatch estimates
      >>> round(float(lj(x)), 2), round(float(values.mean()), 1)  # unbiased
      (-17.52, -17.5)
    """

    def __init__(self, model: Callable, *model_args: Any, **model_kwargs: Any):
        super().__init__(model, *model_args, **model_kwargs)
        if not self.subsample_plates:
            raise ValueError(
                "jaxvb.numpyro: MinibatchLogJoint needs a model with a plate that has a "
                "subsample_size; this one has none (use LogJoint or log_joint)"
            )

    def batch(self, key: jax.Array, step: jax.Array) -> Callable[[jax.Array], jax.Array]:
        """The unbiased log joint of step ``step``, its subsample drawn from ``key``."""
        batch_key = jax.random.fold_in(key, step)

        def log_joint(x):
            # A fresh seed handler per call: seed splits its key as the model runs, so
            # one shared across calls would give each trace (log p, grad, Hessian)
            # a different subsample and keep a tracer from an earlier trace.
            seeded = handlers.seed(self.model, rng_seed=batch_key)
            return -potential_energy(
                seeded, self.model_args, self.model_kwargs, self.unravel(x)
            )

        return log_joint


#: What a log joint's static part holds: the model and what its trace said.
_STRUCTURE = (
    "model",
    "subsample_plates",
    "latent_shapes",
    "deterministic_shapes",
    "posterior_sites",
    "_dims",
    "_unconstrained_shapes",
    "dim",
    "dtype",
)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


class _Structure:
    """A log joint's static pytree data: compared and hashed by value.

    Two log joints of the same model function whose traces have the same sites,
    shapes and plates have equal structures, so ``jax.jit`` (and :func:`jaxvb.fit`)
    treat them as one program whose inputs are their arrays.
    """

    __slots__ = ("cls", "attrs", "data", "_key")

    def __init__(self, cls: type, attrs: dict[str, Any], data: Static):
        self.cls = cls
        self.attrs = attrs
        self.data = data
        self._key = (cls, _freeze([attrs[name] for name in _STRUCTURE]), data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Structure) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)


def _flatten(lj: LogJoint):
    # the data's arrays are the children; its other leaves (a Python int that sizes a
    # plate, say) are static, so that they stay concrete inside a compiled program
    arrays, data = _static.partition((lj.model_args, lj.model_kwargs, lj.observed))
    attrs = {name: getattr(lj, name) for name in _STRUCTURE}
    return tuple(arrays), _Structure(type(lj), attrs, data)


def _unflatten(structure: _Structure, children) -> LogJoint:
    lj = object.__new__(structure.cls)
    lj.__dict__.update(structure.attrs)
    lj.model_args, lj.model_kwargs, lj.observed = _static.combine(
        list(children), structure.data
    )
    return lj


for _cls in (LogJoint, MinibatchLogJoint):
    jax.tree_util.register_pytree_node(_cls, _flatten, _unflatten)


def log_joint(model: Callable, *model_args: Any, **model_kwargs: Any) -> LogJoint:
    """The unconstrained log joint of ``model(*model_args, **model_kwargs)``.

    Returns a :class:`MinibatchLogJoint` when a plate of the model has a
    ``subsample_size``, else a :class:`LogJoint`. Use it to call :func:`jaxvb.fit`
    directly (any family, method or starting point); :func:`fit` does that for you.
    (``LogJoint(model, ...)`` itself never subsamples: a fit to it uses all the data
    at every step.)

    Raises:
      ValueError: the model fails to run with these arguments, or has a discrete,
        ``Delta`` or ``param`` latent site, a latent site inside a subsampled plate,
        or no latent site at all; the message names the sites and what to do.

    Example:
      >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
      >>> import jaxvb.numpyro
      >>> def model(y):
      ...     mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
      ...     numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
      >>> lj = jaxvb.numpyro.log_joint(model, jnp.array([1.0, 2.0, 3.0]))
      >>> type(lj).__name__, lj.dim
      ('LogJoint', 1)
      >>> x = jnp.array([1.5])  # the posterior mode, 6/4: the gradient is 0 there
      >>> round(float(lj(x)), 6), round(float(jax.grad(lj)(x)[0]), 6)
      (-6.175754, 0.0)
    """
    lj = LogJoint(model, *model_args, **model_kwargs)
    if not lj.subsample_plates:
        return lj
    # The same log joint, with batch(): no need to run the model again.
    minibatch = object.__new__(MinibatchLogJoint)
    minibatch.__dict__.update(lj.__dict__)
    return minibatch
