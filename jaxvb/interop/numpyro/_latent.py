"""``fit(..., latent=...)``: a NumPyro model as a :class:`jaxvb.LatentGaussian`.

One latent site is the field ``f``, the others are ``theta``, both on NumPyro's
unconstrained scale. The field's Gaussian prior given ``theta`` and each
observation's log-likelihood are read from the model's trace at ``(theta, f)``;
:class:`_LatentView` maps the fit's draws back to the model's sites.

Each observation must depend on one value of the field; several may share one (the
homes of a county, the days of a group): :func:`observation_groups` finds which
value each observation depends on, before the fit, and the site of value ``j`` is
the sum of its observations' log-likelihoods.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.util import constrain_fn

from jaxvb import _static
from jaxvb._platform import jit_once
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
    #: Per observed site, the field value each of its observations depends on (an
    #: integer array), or ``None`` where observation ``t`` depends on value ``t``.
    groups: tuple | None = None

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

    def observation_log_probs(self, theta, f) -> list:
        """Each observed site's log-densities at ``(theta, f)``, flattened."""
        _, _, trace = self._trace(theta, f)
        return [
            trace[n]["fn"].log_prob(trace[n]["value"]).reshape(-1)
            for n in self.spec.observed
        ]

    def site_log_lik(self, f, theta):
        groups = self.groups or (None,) * len(self.spec.observed)
        total = jnp.zeros(self.spec.size, f.dtype)
        for name, lp, group in zip(
            self.spec.observed, self.observation_log_probs(theta, f), groups, strict=True
        ):
            if group is not None:
                total = total + jax.ops.segment_sum(lp, group, self.spec.size)
            elif lp.size == self.spec.size:
                total = total + lp
            else:
                raise ValueError(
                    f"jaxvb.numpyro: the observed site {name!r} has {lp.size} "
                    f"log-densities but the latent site {self.spec.latent!r} has "
                    f"{self.spec.size} values, and which value each observation "
                    "depends on could not be read off (the data are traced: fit each "
                    "data set in a Python loop, or give the model concrete data)"
                )
        return total


def observation_groups(model: _NumPyroLatent, theta, f, seed: int = 0) -> tuple | None:
    """Which value of the field each observation depends on, per observed site.

    Three directional derivatives of the observations' log-densities at ``(theta,
    f)`` (a point where no derivative vanishes by chance, almost surely): along the
    ones vector ``d_i``, along ``0, 1, ..., T-1`` (``j d_i`` for an observation that
    depends on value ``j`` alone) and along a random vector ``r`` (``r_j d_i``, the
    check). Where every site has one observation per value, in order, ``None``.

    Raises:
      ValueError: an observation depends on several values of the field, or on none
        (naming the site and the observation, and what applies instead).
    """
    size, dtype = model.spec.size, f.dtype
    rng = np.random.default_rng(seed)
    tangents = np.stack([np.ones(size), np.arange(size), rng.uniform(0.5, 1.5, size)])
    d1, dj, dr = (
        np.asarray(d) for d in _probe(model, theta, f, jnp.asarray(tangents, dtype))
    )
    eps = float(np.finfo(np.dtype(dtype)).eps)
    tol = 1e3 * eps * max(size, 1)
    groups, offset, identity = [], 0, True
    for name, n in zip(
        model.spec.observed, _observation_sizes(model, theta, f), strict=True
    ):
        a, j, r = d1[offset : offset + n], dj[offset : offset + n], dr[offset : offset + n]
        offset += n
        scale = np.abs(a) + np.finfo(np.dtype(dtype)).tiny
        g = np.rint(j / scale * np.sign(a)).astype(int)
        ok = np.abs(a) > 0
        ok &= np.abs(j - g * a) <= tol * np.abs(a) * np.maximum(g, 1)
        ok &= (g >= 0) & (g < size)
        ok &= np.abs(r - tangents[2][np.clip(g, 0, size - 1)] * a) <= tol * np.abs(r)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            what = (
                "depends on no value of it"
                if a[i] == 0 and r[i] == 0
                else "depends on several of its values"
            )
            raise ValueError(
                f"jaxvb.numpyro: with latent={model.spec.latent!r}, each observation "
                f"must depend on one value of that site; observation {i} of the "
                f"observed site {name!r} {what}. Fit without latent=, or name as "
                "latent= a site whose values each observation reads one of"
            )
        groups.append(g.astype(np.int32))
        identity &= n == size and bool(np.all(g == np.arange(size)))
    return None if identity else tuple(jnp.asarray(g) for g in groups)


def _observation_sizes(model, theta, f) -> list[int]:
    shapes = jax.eval_shape(model.observation_log_probs, theta, f)
    return [int(s.shape[0]) for s in shapes]


def _probe(model, theta, f, tangents):
    """The observations' log-densities differentiated along each row of ``tangents``
    (one compiled program; the model's non-array parts static)."""
    arrays, static = _static.partition(model)
    return _probe_compiled(arrays, static, theta, f, tangents)


@functools.partial(jit_once, static_argnames=("static",))
def _probe_compiled(arrays, static, theta, f, tangents):
    model = _static.combine(arrays, static)

    def flat(v):
        return jnp.concatenate(model.observation_log_probs(theta, v))

    _, along = jax.linearize(flat, f)
    return jax.vmap(along)(tangents)


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
