"""Reading a NumPyro model's sites: its trace, taken once, and what jaxvb cannot fit.

The trace is taken under ``jax.eval_shape`` where the model allows it, so that reading
a model compiles nothing; :func:`_check_sites` turns what jaxvb cannot fit (a
discrete, ``Delta`` or ``param`` latent site, a latent site in a subsampled plate, no
latent site at all) into an error that names the sites and what to do.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions.transforms import biject_to

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

    Run eagerly, every operation of the model would compile on its own the first
    time. Values the model computes come out abstract
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


def _model_trace(model, args, kwargs):
    """:func:`_abstract_trace`, with an error that says how jaxvb runs the model."""
    try:
        return _abstract_trace(model, args, kwargs)
    except Exception as e:
        raise ValueError(
            f"jaxvb.numpyro: running the model failed ({type(e).__name__}: {e}). jaxvb "
            "runs it once as model(*model_args, **model_kwargs) under "
            "numpyro.handlers.seed to find its sites; check the model and the "
            "arguments passed to it."
        ) from e


def _subsample_plates(trace) -> dict[str, tuple[int, int]]:
    """Plate name -> ``(size, subsample_size)`` for each plate that subsamples."""
    return {
        name: (int(site["args"][0]), int(site["args"][1]))
        for name, site in trace.items()
        if site["type"] == "plate"
        and site["args"][1] is not None
        and site["args"][1] != site["args"][0]
    }


def _is_latent(site) -> bool:
    return site["type"] == "sample" and not site["is_observed"]


def _observed_names(trace) -> list[str]:
    """The observed sample sites, in model order; ``numpyro.factor`` sites (a ``Unit``
    distribution) have no data and are left out."""
    return [
        name
        for name, site in trace.items()
        if site["type"] == "sample"
        and site["is_observed"]
        and not isinstance(site["fn"], dist.Unit)
    ]


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
