"""NumPyro models in: fit the posterior of a NumPyro model with jaxvb.

A NumPyro model is turned into a log joint over one flat vector ``x``: the model's
latent sample sites, each mapped to the real line by NumPyro's own bijections
(``biject_to(site.support)``), raveled with ``jax.flatten_util.ravel_pytree`` in the
order of their names. The log density is NumPyro's ``potential_energy`` (with the
log-Jacobians of those bijections), so ``x`` is what NumPyro's HMC samples and
:func:`fit` fits a Gaussian to it, by Algorithm 2 unless told otherwise. Draws of that
Gaussian are mapped back through the same bijections: :meth:`NumPyroResult.sample`
gives the constrained values of every latent and deterministic site, keyed by the
model's site names.

A model whose plates have a ``subsample_size`` is fitted on minibatches (section 5.5):
every step evaluates the model once with fresh subsample indices from NumPyro's own
``plate``, which scales the likelihood by ``size / subsample_size``; calling the log
joint gives the full-data density (every plate given all its indices), which the
starting point and the diagnostics use.

Compiling: the log joint is a pytree whose leaves are the model's array arguments, so
:func:`fit` compiles once per model structure; a second call with the same model and
new data of the same shapes and dtypes (and a new key) runs the compiled program at
once. To keep compiled programs across processes, turn on JAX's persistent cache
before the first fit::

    jax.config.update("jax_compilation_cache_dir", "/path/to/cache")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

(``benchmarks/first_fit.py`` measures what it saves: a later process's first fit
takes about a second instead of several.)

NumPyro is an optional dependency: ``import jaxvb`` does not import it, and importing
this module without it installed raises an ``ImportError`` saying how to install it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

try:
    import numpyro  # noqa: F401  (the error below names the package)
    import numpyro.distributions as dist
    from numpyro import handlers
    from numpyro.distributions.transforms import biject_to
    from numpyro.infer import Predictive, init_to_median
    from numpyro.infer import log_likelihood as _numpyro_log_likelihood
    from numpyro.infer.util import constrain_fn, potential_energy, unconstrain_fn
    from numpyro.primitives import Messenger
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "jaxvb.numpyro needs NumPyro, which is not installed: pip install numpyro "
        "(or pip install 'jaxvb[numpyro]')"
    ) from e

from jaxvb import _static
from jaxvb._platform import jit_once
from jaxvb.core.fit import fit as _fit
from jaxvb.core.result import Result
from jaxvb.core.status import FitError
from jaxvb.core.summary import summary
from jaxvb.families._base import Family, is_concrete, register_dataclass
from jaxvb.interop.arviz import from_draws
from jaxvb.latent import LatentGaussian
from jaxvb.linalg import Banded
from jaxvb.methods import Method

__all__ = ["LogJoint", "MinibatchLogJoint", "NumPyroResult", "fit", "log_joint"]

#: What to do about a discrete latent site; part of the error that names one.
_DISCRETE_REMEDY = (
    "jaxvb fits a Gaussian to the continuous latent variables (on NumPyro's "
    "unconstrained scale), so it cannot fit a discrete one, and NumPyro's enumeration "
    "(infer={'enumerate': 'parallel'}) is not supported. Sum the discrete variable out "
    "of the model by hand (e.g. a mixture likelihood with "
    "numpyro.distributions.MixtureSameFamily, or numpyro.factor with "
    "jax.scipy.special.logsumexp over its values), or observe it (obs=...). To sample "
    "discrete latent variables, use NumPyro's MCMC instead (NUTS, which enumerates "
    "them, or DiscreteHMCGibbs)."
)


@contextlib.contextmanager
def _full_plates_quiet():
    # A subsampled plate given all its indices warns that they do not match its
    # subsample_size: that is the point of the full-data log joint.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="subsample_size does not match", category=UserWarning
        )
        yield


class _AfterFit(Messenger):
    """Runs a model for what comes after the fit, on all the data it is given.

    Every plate that subsamples gets all its indices (``arange(size)`` of the size
    it is called with, so new data of another length works too); with ``redraw``,
    each observed site is drawn from its distribution instead of reading its ``obs``
    (the replicated data of a posterior predictive). The ``numpyro.factor`` sites
    met are recorded in ``factors``: they have no values to report.
    """

    def __init__(self, fn: Callable, redraw: bool):
        self.redraw = redraw
        self.factors: set[str] = set()
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate":
            size, subsample_size = msg["args"]
            if subsample_size is not None and subsample_size != size:
                msg["value"] = jnp.arange(size)
        elif msg["type"] == "sample" and msg["is_observed"]:
            if isinstance(msg["fn"], dist.Unit):
                self.factors.add(msg["name"])
            elif self.redraw:
                msg["value"], msg["is_observed"] = None, False


def _no_sampler(site):
    """A value for a latent site whose distribution cannot be sampled (an
    ``ImproperUniform``, whose ``sample`` raises an empty ``NotImplementedError``): the
    image of zeros on the unconstrained scale. ``None`` (draw as usual) otherwise."""
    if site["type"] != "sample" or site["is_observed"]:
        return None
    fn = site["fn"]
    while hasattr(fn, "base_dist"):  # Independent, ExpandedDistribution, masked
        if isinstance(fn, dist.ImproperUniform):
            break
        fn = fn.base_dist
    if not isinstance(fn, dist.ImproperUniform):
        return None
    outer = site["fn"]
    shape = tuple(site["kwargs"].get("sample_shape", ())) + tuple(outer.shape())
    transform = biject_to(outer.support)
    return transform(jnp.zeros(transform.inverse_shape(shape)))


def _trace(model, args, kwargs):
    # The values drawn here are discarded: only the sites' names, shapes, supports and
    # plates are read, so this fixed seed reaches no result.
    with _full_plates_quiet():
        seeded = handlers.substitute(
            handlers.seed(model, rng_seed=0), substitute_fn=_no_sampler
        )
        return handlers.trace(seeded).get_trace(*args, **kwargs)


def _abstract_trace(model, args, kwargs):
    """The model's trace, run under ``jax.eval_shape``: nothing is compiled or run.

    Run eagerly, every operation of the model compiles on its own the first time (a
    second or more for a small model). Values the model computes come out abstract
    (shape and dtype: all that is read from them); observed data stay as passed.
    Falls back to running it where the model cannot be traced abstractly.
    """
    out = {}

    def run():
        out["trace"] = _trace(model, args, kwargs)

    try:
        jax.eval_shape(run)
    except Exception:
        return _trace(model, args, kwargs)
    return out["trace"]


def _is_latent(site) -> bool:
    return site["type"] == "sample" and not site["is_observed"]


def _plate_dims(site) -> list[str] | None:
    """ArviZ dimension names of a sample or deterministic site's value: its plates
    where they index it (a deterministic value has no event axes: a plate counts from
    its last axis)."""
    shape = np.shape(site["value"])
    event_ndim = len(site["fn"].event_shape) if site["type"] == "sample" else 0
    dims: list[str | None] = [None] * len(shape)
    for frame in site["cond_indep_stack"]:
        axis = len(shape) - event_ndim + frame.dim
        if 0 <= axis < len(shape) and shape[axis] == frame.size:
            dims[axis] = frame.name
    if all(d is None for d in dims):
        return None
    return [d or f"{site['name']}_dim_{i}" for i, d in enumerate(dims)]


def _check_sites(trace, subsampled: Mapping[str, tuple[int, int]]) -> None:
    params = [name for name, site in trace.items() if site["type"] == "param"]
    if params:
        raise ValueError(
            f"jaxvb.numpyro: the model has numpyro.param site(s) {params}. jaxvb fits the "
            "posterior of sample sites, and a param has no prior: give it one "
            "(numpyro.sample), or fix its value with numpyro.handlers.substitute(model, "
            "data={...})."
        )
    latent = {name: site for name, site in trace.items() if _is_latent(site)}
    discrete = [
        f"'{name}' ({type(site['fn']).__name__})"
        for name, site in latent.items()
        if site["fn"].support.is_discrete
    ]
    if discrete:
        raise ValueError(
            f"jaxvb.numpyro: the model has discrete latent site(s) {', '.join(discrete)}. "
            + _DISCRETE_REMEDY
        )
    delta = [name for name, site in latent.items() if isinstance(site["fn"], dist.Delta)]
    if delta:
        raise ValueError(
            f"jaxvb.numpyro: latent site(s) {delta} have a Delta distribution, which has "
            "no density to fit; record such a value with numpyro.deterministic instead."
        )
    local = [
        f"'{name}' (plate '{frame.name}')"
        for name, site in latent.items()
        for frame in site["cond_indep_stack"]
        if frame.name in subsampled
    ]
    if local:
        raise ValueError(
            f"jaxvb.numpyro: latent site(s) {', '.join(local)} lie inside a plate with "
            "subsample_size. jaxvb fits minibatches of the likelihood of global latent "
            "variables only; fit this model without subsample_size, or move the local "
            "latent variables out of the subsampled plate."
        )
    if not latent:
        raise ValueError(
            "jaxvb.numpyro: the model has no latent sample sites (every numpyro.sample "
            "has obs=...), so there is no posterior to fit. Check that the parameters are "
            "numpyro.sample sites without obs."
        )


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
        try:
            trace = _abstract_trace(model, model_args, model_kwargs)
        except Exception as e:
            raise ValueError(
                f"jaxvb.numpyro: running the model failed ({type(e).__name__}: {e}). jaxvb "
                "runs it once as model(*model_args, **model_kwargs) under "
                "numpyro.handlers.seed to find its sites; check the model and the "
                "arguments passed to it."
            ) from e
        self.subsample_plates = {
            name: (int(site["args"][0]), int(site["args"][1]))
            for name, site in trace.items()
            if site["type"] == "plate"
            and site["args"][1] is not None
            and site["args"][1] != site["args"][0]
        }
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
        observed = [
            name
            for name, site in trace.items()
            if site["type"] == "sample"
            and site["is_observed"]
            and not isinstance(site["fn"], dist.Unit)  # numpyro.factor
        ]
        if any(isinstance(trace[name]["value"], jax.core.Tracer) for name in observed):
            trace = _trace(self._full_model, model_args, model_kwargs)  # computed obs
        self.observed = {name: trace[name]["value"] for name in observed}
        self._dims = {
            name: dims
            for name, site in trace.items()
            if site["type"] in ("sample", "deterministic")
            and (dims := _plate_dims(site)) is not None
        }
        values = {
            name: jax.ShapeDtypeStruct(jnp.shape(site["value"]), site["value"].dtype)
            for name, site in latent.items()
        }

        def unconstrained_values(values):
            with _full_plates_quiet():
                return unconstrain_fn(self._full_model, model_args, model_kwargs, values)

        # Shapes only (no compiled operation): the order of ravel_pytree (a dict's
        # sorted keys), kept as plain data, which unlike its unravel closure compares
        # by value and so can be static pytree data.
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

    __slots__ = ("cls", "attrs", "_key")

    def __init__(self, cls: type, attrs: dict[str, Any]):
        self.cls = cls
        self.attrs = attrs
        self._key = (cls, _freeze([attrs[name] for name in _STRUCTURE]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Structure) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)


def _flatten(lj: LogJoint):
    attrs = {name: getattr(lj, name) for name in _STRUCTURE}
    return (lj.model_args, lj.model_kwargs, lj.observed), _Structure(type(lj), attrs)


def _unflatten(structure: _Structure, children) -> LogJoint:
    lj = object.__new__(structure.cls)
    lj.__dict__.update(structure.attrs)
    lj.model_args, lj.model_kwargs, lj.observed = children
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


_FORWARDED = frozenset(Result._fields) | {"ok", "message"}


@dataclasses.dataclass(frozen=True, eq=False)
class NumPyroResult:
    """What :func:`jaxvb.numpyro.fit` returns: the engine's result and the model.

    Every attribute of :class:`jaxvb.Result` reads through (``q``, ``elbo``,
    ``log_evidence``, ``kl``, ``r_squared``, ``status``, ``ok``, ``message``, ...);
    ``q`` is a distribution over the unconstrained vector ``x`` of :class:`LogJoint`.
    :meth:`sample` and :meth:`to_arviz` give draws on the model's own scale,
    :meth:`predictive` posterior predictive draws (NumPyro's ``Predictive``) and
    :meth:`log_likelihood` the pointwise log-likelihood (in ``to_arviz``'s
    ``log_likelihood`` group, for ``az.loo``).

    A pytree: its leaves are the result's arrays and the log joint's (the model's
    data); the model and the structure of its trace are static. So ``jax.jit`` and
    ``jax.vmap`` can return it: ``jax.vmap`` of :func:`fit` over keys or data sets
    gives a batch of fits (:attr:`batch_shape`, ``len``), and ``res[i]`` one of them
    (every array indexed along the batch axes, data included), whose ``sample``,
    ``predictive``, ``to_arviz`` and ``message`` work like a single fit's. (A plain
    :class:`jaxvb.Result` is a ``NamedTuple``, whose ``[i]`` is its ``i``-th field:
    take one fit of a batch of those with ``jax.tree.map(lambda v: v[i], res)``.)

    Attributes:
      result: the :class:`jaxvb.Result` of the fit.
      log_joint: the :class:`LogJoint` it was fitted to.

    Example:
      >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
      >>> import jaxvb, jaxvb.numpyro
      >>> def model(y):
      ...     mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
      ...     numpyro.deterministic("mu2", 2.0 * mu)
      ...     with numpyro.plate("data", y.shape[0]):
      ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))  # over x = (mu,); no mode search
      >>> res = jaxvb.numpyro.fit(model, jax.random.key(0), jnp.array([1.0, 2.0, 3.0]),
      ...                         num_steps=20, init=q0, fit_kwargs={"num_eval_draws": 10})
      >>> round(float(res.r_squared), 6), round(float(res.q.mean[0]), 6)
      (1.0, 1.5)
      >>> draws = res.sample(jax.random.key(1), 100)
      >>> {name: v.shape for name, v in draws.items()}
      {'mu': (100,), 'mu2': (100,)}
      >>> idata = res.to_arviz(jax.random.key(1), 100, num_chains=2)
      >>> list(idata.posterior.data_vars), dict(idata.posterior.sizes)
      (['mu', 'mu2'], {'chain': 2, 'draw': 50})
    """

    result: Result
    log_joint: LogJoint

    def __getattr__(self, name: str) -> Any:
        if name == "message":
            self._single("message")
        if name in _FORWARDED:
            return getattr(self.result, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __dir__(self):
        return sorted(set(super().__dir__()) | _FORWARDED)

    def sample(self, key: jax.Array, num_samples: int) -> dict[str, jax.Array]:
        """``num_samples`` draws of every latent and deterministic site, constrained.

        Draws ``x`` of ``q`` are mapped through NumPyro's bijections and the model is
        replayed at them (``numpyro.infer.util.constrain_fn``), with all the data, for
        the deterministic sites. Observed sites are not included.

        Returns:
          A dict keyed by site name, in model order; each value has shape
          ``(num_samples, *site_shape)``. See the class example.
        """
        self._single("sample")
        x = self.result.q.sample(key, (int(num_samples),))
        arrays, static = _static.partition(self.log_joint)
        draws = _constrain(arrays, static, x)  # vmap sorts the names
        return {name: draws[name] for name in self.log_joint.posterior_sites}

    def predictive(
        self, key: jax.Array, num_samples: int, *model_args: Any, **model_kwargs: Any
    ) -> dict[str, jax.Array]:
        """Posterior predictive draws of every site, by NumPyro's ``Predictive``.

        The latent sites' draws are :meth:`sample`'s (the same ``key`` gives the same
        draws); ``numpyro.infer.Predictive`` runs the model at each of them and draws
        every observed site from its distribution (its ``obs`` is not read: these are
        replicated data), and the deterministic sites are computed anew. Every plate
        that subsamples is given all its indices.

        Args:
          key: a JAX random key.
          num_samples: the number of draws.
          *model_args, **model_kwargs: what to call the model with, e.g. new
            covariates to predict at (``model(X_new, y=None)``). When none are given,
            the arguments of the fit.

        Returns:
          A dict keyed by site name: the latent, deterministic and observed sites
          (in the fit's model order, then any other site), each of shape
          ``(num_samples, *site_shape)``. ``numpyro.factor`` sites are left out.

        Example:
          >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
          >>> import jaxvb, jaxvb.numpyro
          >>> def model(x, y=None):
          ...     w = numpyro.sample("w", dist.Normal(0.0, 1.0))
          ...     with numpyro.plate("data", x.shape[0]):
          ...         numpyro.sample("y", dist.Normal(w * x, 0.5), obs=y)
          >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
          >>> res = jaxvb.numpyro.fit(model, jax.random.key(0), jnp.arange(3.0),
          ...                         jnp.array([0.1, 0.9, 2.1]), num_steps=20, init=q0,
          ...                         fit_kwargs={"num_eval_draws": 10})
          >>> draws = res.predictive(jax.random.key(1), 100)  # at the fit's data
          >>> {name: v.shape for name, v in draws.items()}
          {'w': (100,), 'y': (100, 3)}
          >>> new = res.predictive(jax.random.key(1), 100, jnp.array([5.0]))  # y=None
          >>> new["y"].shape, bool(jnp.all(new["w"] == draws["w"]))
          ((100, 1), True)
        """
        samples = self.sample(key, num_samples)
        return self._predict(_predictive_key(key), samples, model_args, model_kwargs)

    def log_likelihood(
        self, key: jax.Array, num_samples: int, *model_args: Any, **model_kwargs: Any
    ) -> dict[str, jax.Array]:
        """The pointwise log-likelihood of each observed site at :meth:`sample`'s draws.

        ``numpyro.infer.log_likelihood`` at the latent sites' draws: for each observed
        site, ``site.fn.log_prob(obs)`` over its batch axes (one value per
        observation; a multivariate observation is one value), with every plate
        given all its indices. With new arguments (held-out data), the log
        predictive density of those data at each draw.

        Args:
          key, num_samples: as for :meth:`sample` (the same key, the same draws).
          *model_args, **model_kwargs: what to call the model with; when none are
            given, the arguments of the fit.

        Returns:
          A dict keyed by observed site name (``numpyro.factor`` sites left out),
          each of shape ``(num_samples, *batch_shape)``. :meth:`to_arviz` puts it in
          the ``log_likelihood`` group, for ``az.loo`` and ``az.waic``.
        """
        samples = self.sample(key, num_samples)
        return self._log_likelihood(samples, model_args, model_kwargs)

    def summary(self, key=None, num_samples=4000, names=None, prob=0.9, max_rows=10):
        """:func:`jaxvb.summary`: a row per site (``beta[0]``, ...), constrained."""
        return summary(self, key, num_samples, names, prob, max_rows)

    def to_arviz(
        self,
        key: jax.Array,
        num_samples: int,
        *,
        num_chains: int = 1,
        log_likelihood: bool = True,
        posterior_predictive: bool = False,
    ) -> Any:
        """An ``arviz.InferenceData`` of :meth:`sample`'s draws (needs ``arviz``).

        Groups: ``posterior`` (every latent and deterministic site, dimensions
        ``(chain, draw, *site_shape)``; a plate's name labels the axis it indexes),
        ``observed_data`` (the observed sites, all of the data), ``log_likelihood``
        (:meth:`log_likelihood` at the same draws, one variable per observed site:
        ``az.loo(idata)`` and ``az.waic(idata)`` read it; give ``var_name=`` when the
        model has several observed sites) unless ``log_likelihood=False``, and with
        ``posterior_predictive=True`` a ``posterior_predictive`` group (the observed
        sites of :meth:`predictive`, the same draws as ``predictive(key,
        num_samples)``, for ``az.plot_ppc``). The draws are independent:
        ``num_chains`` splits them into that many equal blocks (the default 1 is one
        chain of ``num_samples`` draws), which only gives ArviZ's chain-based
        diagnostics such as ``r_hat`` something to compare. See the class example.

        Since ``q`` is an approximation, ``az.loo``'s Pareto k-hat values judge the
        importance sampling from the approximate posterior; above 0.7 its estimate
        of the elpd is not reliable.
        """
        samples = self.sample(key, num_samples)
        observed = self.log_joint.observed
        predicted = None
        if posterior_predictive:
            draws = self._predict(_predictive_key(key), samples, (), {})
            predicted = {name: draws[name] for name in observed}
        return from_draws(
            samples,
            num_chains=num_chains,
            dims=self.log_joint.arviz_dims(),
            observed_data=observed,
            posterior_predictive=predicted,
            log_likelihood=self._log_likelihood(samples, (), {})
            if log_likelihood
            else None,
        )

    def _model_call(self, model_args, model_kwargs):
        """The model and what to call it with: the fit's arguments unless given."""
        lj = self.log_joint
        lj = lj.lj if isinstance(lj, _LatentView) else lj
        if not model_args and not model_kwargs:
            model_args, model_kwargs = lj.model_args, lj.model_kwargs
        return lj, model_args, model_kwargs

    def _predict(self, key, samples, model_args, model_kwargs):
        lj, args, kwargs = self._model_call(model_args, model_kwargs)
        latent = {name: samples[name] for name in lj.latent_shapes}
        drawn = _after_fit(key, latent, lj.model, args, kwargs, redraw=True)
        first = [
            n for n in (*lj.posterior_sites, *lj.observed) if n in drawn or n in latent
        ]
        names = first + [n for n in drawn if n not in first]
        return {name: latent[name] if name in latent else drawn[name] for name in names}

    def _log_likelihood(self, samples, model_args, model_kwargs):
        lj, args, kwargs = self._model_call(model_args, model_kwargs)
        latent = {name: samples[name] for name in lj.latent_shapes}
        values = _after_fit(None, latent, lj.model, args, kwargs, redraw=False)
        order = [n for n in lj.observed if n in values] + sorted(values)
        return {n: values[n] for n in dict.fromkeys(order)}

    # A batch of fits (jax.vmap of fit): every leaf has the batch axes in front.

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The batch axes of a batch of fits (``jax.vmap`` of :func:`fit`); ``()``
        for a single fit."""
        return tuple(np.shape(self.result.status))

    def _single(self, what: str) -> None:
        if self.batch_shape:
            raise TypeError(
                f"{what} of a batch of {self.batch_shape} fits (from jax.vmap); take one "
                "fit with res[i] first"
            )

    def __len__(self) -> int:
        if not self.batch_shape:
            raise TypeError(
                "len() of a single NumPyroResult (batch_shape is ()); only a batch of "
                "fits from jax.vmap has a length"
            )
        return self.batch_shape[0]

    def __bool__(self) -> bool:  # with __len__ defined, bool() would otherwise call it
        return True

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index: Any) -> NumPyroResult:
        """One fit (``res[i]``) or a sub-batch (``res[2:5]``, ``res[res.ok]``) of a
        batch of fits: every array of the result and of its log joint (the model's
        data included) indexed along the batch axes."""
        batch = self.batch_shape
        if not batch:
            raise TypeError(
                "this NumPyroResult is a single fit (batch_shape is ()); only a batch of "
                "fits from jax.vmap can be indexed"
            )
        parts = index if isinstance(index, tuple) else (index,)
        used = 0
        for part in parts:
            if part is None or part is Ellipsis:
                raise IndexError(
                    "a batch of fits is indexed by integers, slices or arrays along its "
                    f"batch axes {batch}; None and ... are not supported"
                )
            is_mask = np.asarray(part).dtype == bool
            used += np.ndim(part) if is_mask else 1
        if used > len(batch):
            raise IndexError(
                f"{used} indices for a batch of fits of batch_shape {batch}; the arrays "
                "behind the batch axes are the fits' own"
            )
        return jax.tree_util.tree_map(lambda v: v[index], self)


def _after_fit(key, latent, model, args, kwargs, *, redraw: bool):
    """NumPyro's ``Predictive`` (``redraw``) or ``log_likelihood`` at the draws
    ``latent`` of the latent sites, the model run under :class:`_AfterFit`; compiled
    once per model and shapes of its arguments (their arrays traced, the rest
    static), run eagerly where a static argument cannot be hashed."""
    arrays, static = _static.partition((model, args, kwargs))
    try:
        hash(static)
    except TypeError:
        return _run_after_fit(key, latent, arrays, static, redraw=redraw)
    return _run_after_fit_jit(key, latent, arrays, static, redraw=redraw)


def _run_after_fit(key, latent, arrays, static, *, redraw):
    model, args, kwargs = _static.combine(arrays, static)
    model = _AfterFit(model, redraw)
    with _full_plates_quiet():
        if redraw:
            predictive = Predictive(model, posterior_samples=latent, parallel=True)
            values = predictive(key, *args, **kwargs)
        else:
            values = _numpyro_log_likelihood(model, latent, *args, parallel=True, **kwargs)
    # The factor sites were recorded while the model ran (here, as it was traced).
    return {name: v for name, v in values.items() if name not in model.factors}


_run_after_fit_jit = jit_once(_run_after_fit, static_argnames=("static", "redraw"))


@jit_once(static_argnames=("static",))
def _constrain(arrays, static, x):
    """Draws ``x`` of shape ``(n, dim)`` mapped to every site's constrained value:
    compiled once per model structure (run eagerly, each operation of the model
    compiles on its own)."""
    return jax.vmap(_static.combine(arrays, static).constrain)(x)


def _predictive_key(key: jax.Array) -> jax.Array:
    """The key of the replicated data: apart from :meth:`NumPyroResult.sample`'s."""
    return jax.random.fold_in(key, 1)


def _flatten_result(res: NumPyroResult):
    # The log joint's arrays (the model's data) are children, like the result's, so
    # that a result leaving jax.vmap or jax.jit holds no tracer of theirs; the rest
    # of it (the model, the structure of its trace, non-array arguments) is static.
    arrays, static = _static.partition(res.log_joint)
    return (res.result, arrays), static


def _unflatten_result(static, children) -> NumPyroResult:
    result, arrays = children
    return NumPyroResult(result, _static.combine(arrays, static))


jax.tree_util.register_pytree_node(NumPyroResult, _flatten_result, _unflatten_result)


# ------------------------------------------------------------------ latent fields


@dataclasses.dataclass(frozen=True)
class _LatentSpec:
    """Where the latent field and the hyperparameters sit in :class:`LogJoint`'s ``x``
    (hashable: the static part of a compiled fit)."""

    latent: str
    size: int
    f_start: int
    theta_index: tuple[int, ...]
    theta_sites: tuple[str, ...]
    observed: tuple[str, ...]


def _latent_spec(lj: LogJoint, latent: str) -> _LatentSpec:
    if latent not in lj.latent_shapes:
        raise ValueError(
            f"jaxvb.numpyro: latent={latent!r} is not a latent sample site of the model; "
            f"its latent sites are {sorted(lj.latent_shapes)}"
        )
    if lj.subsample_plates:
        raise ValueError(
            "jaxvb.numpyro: latent= fits the whole data set; the model's plates "
            f"{sorted(lj.subsample_plates)} subsample. Drop subsample_size."
        )
    offsets, start = {}, 0
    for name, shape in lj._unconstrained_shapes:
        size = int(np.prod(shape, dtype=int))
        offsets[name] = (start, size)
        start += size
    f_start, size = offsets[latent]
    theta_sites = tuple(n for n, _ in lj._unconstrained_shapes if n != latent)
    if not theta_sites:
        raise ValueError(
            f"jaxvb.numpyro: latent={latent!r} is the model's only latent site; a latent "
            "Gaussian fit needs hyperparameters besides the field (with none, the "
            "posterior of the field is a plain jaxvb.numpyro.fit)"
        )
    index = tuple(
        i for n in theta_sites for i in range(offsets[n][0], offsets[n][0] + offsets[n][1])
    )
    return _LatentSpec(latent, size, f_start, index, theta_sites, tuple(lj.observed))


def _gaussian_prior(fn, size: int, site: str):
    """``(mean, precision)`` of a NumPyro Gaussian over a value of ``size`` elements."""
    base = fn
    while isinstance(base, (dist.Independent, dist.ExpandedDistribution)):
        base = base.base_dist
    if isinstance(base, dist.Normal):
        loc = jnp.broadcast_to(base.loc, fn.shape()).reshape(size)
        scale = jnp.broadcast_to(base.scale, fn.shape()).reshape(size)
        return loc, Banded((1.0 / scale**2)[None])
    if isinstance(base, dist.MultivariateNormal) and fn.event_shape == (size,):
        return jnp.broadcast_to(base.loc, (size,)), base.precision_matrix
    if isinstance(base, dist.GaussianRandomWalk) and fn.event_shape == (size,):
        # f_1 ~ N(0, s^2), f_t - f_{t-1} ~ N(0, s^2): a tridiagonal precision
        diag = jnp.full(size, 2.0).at[-1].set(1.0)
        off = jnp.full(size, -1.0).at[-1].set(0.0)
        return jnp.zeros(size), Banded(jnp.stack([diag, off]) / base.scale**2)
    raise TypeError(
        f"jaxvb.numpyro: the latent site {site!r} has a {type(base).__name__} "
        "distribution; a latent Gaussian fit needs a Gaussian prior given the other "
        "sites: Normal (in a plate or .to_event), MultivariateNormal (one vector) or "
        "GaussianRandomWalk"
    )


def _unused(*args):  # the pieces of a _NumPyroLatent come from its model, not these
    raise NotImplementedError


@register_dataclass
class _NumPyroLatent(LatentGaussian):
    """A NumPyro model as a :class:`jaxvb.LatentGaussian`: ``data`` is its
    :class:`LogJoint` (the model's arrays traced), ``spec`` where ``f`` and ``theta``
    sit in it."""

    spec: _LatentSpec | None = dataclasses.field(default=None, metadata={"static": True})

    def _trace(self, theta, f):
        lj, spec = self.data, self.spec
        flat = jnp.zeros(lj.dim, theta.dtype)
        flat = flat.at[jnp.asarray(spec.theta_index)].set(theta)
        flat = flat.at[spec.f_start : spec.f_start + spec.size].set(f)
        params = lj.unravel(flat)
        values = constrain_fn(lj.model, lj.model_args, lj.model_kwargs, params)
        model = handlers.substitute(handlers.seed(lj.model, rng_seed=0), data=values)
        trace = handlers.trace(model).get_trace(*lj.model_args, **lj.model_kwargs)
        return params, values, trace

    def prior_log_density(self, theta):
        params, values, trace = self._trace(theta, jnp.zeros(self.spec.size, theta.dtype))
        total = jnp.zeros((), theta.dtype)
        for name in self.spec.theta_sites:
            fn = trace[name]["fn"]
            total = total + jnp.sum(fn.log_prob(values[name]))
            jac = biject_to(fn.support).log_abs_det_jacobian(params[name], values[name])
            total = total + jnp.sum(jac)
        return total

    def prior_of_field(self, theta):
        _, _, trace = self._trace(theta, jnp.zeros(self.spec.size, theta.dtype))
        fn = trace[self.spec.latent]["fn"]
        mean, precision = _gaussian_prior(fn, self.spec.size, self.spec.latent)
        return jnp.asarray(mean, theta.dtype), precision, None

    def site_log_lik(self, f, theta):
        _, _, trace = self._trace(theta, f)
        total = jnp.zeros(self.spec.size, f.dtype)
        for name in self.spec.observed:
            site = trace[name]
            lp = site["fn"].log_prob(site["value"])
            if lp.size != self.spec.size:
                raise ValueError(
                    f"jaxvb.numpyro: the observed site {name!r} has {lp.size} "
                    f"log-densities but the latent site {self.spec.latent!r} has "
                    f"{self.spec.size} values; with latent=, each observation must "
                    "depend on one value of the field (one observation per value)"
                )
            total = total + lp.reshape(self.spec.size)
        return total


class _LatentView:
    """What :class:`NumPyroResult` needs from a log joint, for draws ``(theta, f)``.

    A pytree (the log joint its child, ``spec`` static), so that a result of the
    ``latent=`` route can leave ``jax.vmap`` and be sliced like any other.
    """

    def __init__(self, lj: LogJoint, spec: _LatentSpec):
        self.lj, self.spec = lj, spec

    posterior_sites = property(lambda self: self.lj.posterior_sites)
    observed = property(lambda self: self.lj.observed)
    arviz_dims = property(lambda self: self.lj.arviz_dims)

    def constrain(self, x):
        k = len(self.spec.theta_index)
        flat = jnp.zeros(self.lj.dim, x.dtype)
        flat = flat.at[jnp.asarray(self.spec.theta_index)].set(x[:k])
        flat = flat.at[self.spec.f_start : self.spec.f_start + self.spec.size].set(x[k:])
        return self.lj.constrain(flat)


jax.tree_util.register_pytree_node(
    _LatentView,
    lambda view: ((view.lj,), view.spec),
    lambda spec, children: _LatentView(children[0], spec),
)


# Run once per fit: XLA's backend optimisation would cost more to compile than it saves.
@jit_once(static_argnames=("static", "init_strategy"))
def _start(arrays, static, key, x0, *, init_strategy):
    """The starting point (``x0``, or the init strategy's) and the log density there.

    One compiled program per model structure: run eagerly, the model's operations
    compiled one by one (seconds for a small model on a first call).
    """
    lj = _static.combine(arrays, static)
    if init_strategy is not None:
        x0 = lj.init_point(key, init_strategy)
    return x0, lj(x0)


def fit(
    model: Callable,
    key: jax.Array,
    *model_args: Any,
    num_steps: int,
    method: str | Method | None = None,
    init: Callable | Family | jax.Array | None = None,
    latent: str | None = None,
    fit_kwargs: Mapping[str, Any] | None = None,
    **model_kwargs: Any,
) -> NumPyroResult:
    """Fits a Gaussian to the posterior of a NumPyro model, on its unconstrained scale.

    Builds :func:`log_joint` of ``model(*model_args, **model_kwargs)`` (NumPyro's
    potential energy with the log-Jacobians of its bijections), picks a starting
    point and runs :func:`jaxvb.fit`: by default from the Laplace approximation at the
    mode found from NumPyro's ``init_to_median``, with Algorithm 2
    (``method="hessian"``). A model whose plates have a ``subsample_size`` is fitted on
    minibatches, with all the data for the start and the diagnostics.

    Args:
      model: a NumPyro model (a function with ``numpyro.sample`` sites); its latent
        sites must be continuous.
      key: a JAX random key (split into one for the start, one for the fit).
      *model_args: positional arguments of the model (e.g. the data).
      num_steps: ``N``, the number of iterations of the fit.
      method: passed to :func:`jaxvb.fit`; ``None`` is ``"hessian"`` for a Gaussian.
      init: where to start. A NumPyro init strategy (``numpyro.infer.init_to_median``
        by default, ``init_to_value(values={...})``, ``init_to_sample``, ...) picks a
        point, where :func:`jaxvb.laplace` finds the mode and the Laplace
        approximation to start from. An array ``x0`` of shape ``(dim,)`` on the
        unconstrained scale does the same from ``x0``; a jaxvb family (e.g. a
        :class:`jaxvb.Gaussian` over ``x``) is used as ``q0`` directly, with no mode
        search.
      latent: the name of a latent site to fit as the field ``f`` of a
        :class:`jaxvb.LatentGaussian` (``q(theta) q(f | theta)``, the other latent sites
        being ``theta``, on NumPyro's unconstrained scale): its prior given the other
        sites must be a ``Normal`` (in a plate or ``.to_event``; a diagonal
        precision), a ``MultivariateNormal`` (dense) or a ``GaussianRandomWalk``
        (tridiagonal), and each observed value must depend on one value of it. The
        start is the init strategy's point for ``theta`` (``init`` must be one);
        ``.sample`` gives every site as usual.
      fit_kwargs: further options of :func:`jaxvb.fit` (``step_size``, ``num_draws``,
        ``antithetic``, ``max_backtracks``, ``num_eval_draws``, ``trace``,
        ``on_failure``), as a dict, so that they cannot clash with the model's own
        keyword arguments.
      **model_kwargs: keyword arguments of the model. (A model keyword named like one
        of the options above can be bound with ``functools.partial``.)

    Returns:
      :class:`NumPyroResult`: the engine's diagnostics (``.elbo``, ``.log_evidence``,
      ``.r_squared``, ``.status``, ``.q`` over ``x``, ...), ``.sample(key, n)`` (a dict
      of constrained draws keyed by site name) and ``.to_arviz(key, n)``.

    Raises:
      ValueError: the model fails to run, or has a discrete latent site (or another
        site jaxvb cannot fit; see :func:`log_joint`); the start is not finite.
      jaxvb.FitError: the fit is not trustworthy (with ``on_failure="raise"``, the
        default); its ``.result`` is the :class:`NumPyroResult`.

    Example:
      >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
      >>> import jaxvb.numpyro
      >>> def model(y):
      ...     mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
      ...     with numpyro.plate("data", y.shape[0]):
      ...         numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
      >>> res = jaxvb.numpyro.fit(model, jax.random.key(0), jnp.array([1.0, 2.0, 3.0]),
      ...                         num_steps=20, fit_kwargs={"num_eval_draws": 10})
      >>> q = res.q  # exact here: N(6/4, 1/4)
      >>> round(float(q.mean[0]), 6), round(float(q.cov[0, 0]), 6), int(res.status)
      (1.5, 0.25, 0)
    """
    fit_kwargs = dict(fit_kwargs or {})
    clash = sorted({"num_steps", "method", "log_joint", "q0", "key"} & set(fit_kwargs))
    if clash:
        raise TypeError(
            f"jaxvb.numpyro.fit: give {clash} as arguments of fit, not in fit_kwargs"
        )
    lj = log_joint(model, *model_args, **model_kwargs)
    key_init, key_fit = jax.random.split(key)
    if init is None:
        init = init_to_median
    if latent is not None:
        return _fit_latent(
            lj, latent, key_init, key_fit, num_steps, method, init, fit_kwargs
        )
    if isinstance(init, Family):
        if tuple(init.event_shape) != (lj.dim,):
            raise ValueError(
                f"jaxvb.numpyro.fit: init has event shape {tuple(init.event_shape)}, but "
                f"the model's unconstrained latent vector has shape ({lj.dim},)"
            )
        q0 = init
    else:
        if callable(init):
            q0 = None
        else:
            q0 = jnp.asarray(init)
            if q0.shape != (lj.dim,):
                raise ValueError(
                    f"jaxvb.numpyro.fit: init has shape {q0.shape}, but the model's "
                    f"unconstrained latent vector has shape ({lj.dim},)"
                )
        arrays, static = _static.partition(lj)
        q0, start = _start(
            arrays, static, key_init, q0, init_strategy=init if q0 is None else None
        )
        if is_concrete(start) and not np.isfinite(float(start)):
            raise ValueError(
                f"jaxvb.numpyro.fit: the log density is {float(start)} at the starting "
                f"point {lj.constrain(q0)}; pick one inside the support with "
                "init=numpyro.infer.init_to_value(values={...})."
            )
    try:
        result = _fit(lj, q0, key_fit, num_steps=num_steps, method=method, **fit_kwargs)
    except FitError as e:
        raise FitError(str(e), NumPyroResult(e.result, lj)) from None
    return NumPyroResult(result, lj)


def _fit_latent(lj, latent, key_init, key_fit, num_steps, method, init, fit_kwargs):
    """:func:`fit` with ``latent=``: the model as a :class:`jaxvb.LatentGaussian`."""
    spec = _latent_spec(lj, latent)
    if not callable(init) or isinstance(init, Family):
        raise TypeError(
            "jaxvb.numpyro.fit: with latent=, init must be a NumPyro init strategy "
            "(init_to_median, init_to_value(values={...}), ...); it picks theta's start"
        )
    arrays, static = _static.partition(lj)
    x0, start = _start(arrays, static, key_init, None, init_strategy=init)
    if is_concrete(start) and not np.isfinite(float(start)):
        raise ValueError(
            f"jaxvb.numpyro.fit: the log density is {float(start)} at the starting "
            f"point {lj.constrain(x0)}; pick one inside the support with "
            "init=numpyro.infer.init_to_value(values={...})."
        )
    model = _NumPyroLatent(_unused, _unused, _unused, data=lj, spec=spec)
    theta0 = x0[jnp.asarray(spec.theta_index)]
    view = _LatentView(lj, spec)
    try:
        result = _fit(
            model, theta0, key_fit, num_steps=num_steps, method=method, **fit_kwargs
        )
    except FitError as e:
        raise FitError(str(e), NumPyroResult(e.result, view)) from None
    return NumPyroResult(result, view)
