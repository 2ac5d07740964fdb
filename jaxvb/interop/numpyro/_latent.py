"""``fit(..., latent=...)``: a NumPyro model as a :class:`jaxvb.LatentGaussian`.

One latent site is the field ``f``, the others are ``theta``, both on NumPyro's
unconstrained scale. The field's Gaussian prior given ``theta`` and each
observation's log-likelihood are read from the model's trace at ``(theta, f)``;
:class:`_LatentView` maps the fit's draws back to the model's sites.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.util import constrain_fn

from jaxvb.families._base import register_dataclass
from jaxvb.interop.numpyro._log_joint import LogJoint
from jaxvb.latent import LatentGaussian
from jaxvb.linalg import Banded


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
