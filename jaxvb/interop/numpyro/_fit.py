""":func:`fit`: a NumPyro model's posterior fitted by :func:`jaxvb.fit`.

Checks the options, builds the log joint, finds the start (an init strategy's point,
a given ``x0``, or a given ``q0``) and runs the engine; with ``latent=`` the model is
fitted as a :class:`jaxvb.LatentGaussian` instead.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.infer import init_to_median

from jaxvb import _static
from jaxvb._platform import jit_once
from jaxvb.core.fit import fit as _fit
from jaxvb.core.status import FitError
from jaxvb.families._base import Family, is_concrete
from jaxvb.interop.numpyro._latent import (
    _latent_spec,
    _LatentView,
    _NumPyroLatent,
    _unused,
    observation_groups,
)
from jaxvb.interop.numpyro._log_joint import LogJoint, log_joint
from jaxvb.interop.numpyro._result import NumPyroResult
from jaxvb.interop.numpyro._sites import _is_latent, _model_trace
from jaxvb.methods import Method

__all__ = ["RouteWarning", "fit"]


class RouteWarning(UserWarning):
    """:func:`fit` was asked for a route that costs far more than another that fits
    the same model: a dense ``MultivariateNormal`` latent site fitted without
    ``latent=``. An ordinary ``UserWarning`` subclass, so the ``warnings`` filters
    apply.

    Example:
      >>> import warnings, jaxvb.numpyro
      >>> issubclass(jaxvb.numpyro.RouteWarning, UserWarning)
      True
      >>> with warnings.catch_warnings():
      ...     warnings.simplefilter("ignore", jaxvb.numpyro.RouteWarning)
      ...     pass  # dense fits in here do not warn
    """


#: A ``MultivariateNormal`` latent site of at least this many values, fitted without
#: ``latent=``, gets a :class:`RouteWarning` (below it, its factorisation is cheap).
DENSE_FIELD_WARN_SIZE = 16


# Run once per fit: XLA's backend optimisation would cost more to compile than it saves.
@jit_once(static_argnames=("static", "init_strategy"))
def _start(arrays, static, key, x0, *, init_strategy):
    """The starting point (``x0``, or the init strategy's) and the log density there.

    One compiled program per model structure, rather than the model's operations
    compiled one by one as they run eagerly.
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
        (tridiagonal), and each observed value must depend on one value of it
        (several may depend on the same one, as the homes of a county on its
        intercept: their log-likelihoods are summed into that value's site). The
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

    Warns:
      RouteWarning: a latent site with a dense ``MultivariateNormal`` prior (16 values
        or more) fitted without ``latent=``: what that costs, and the ``latent=`` route.

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
    fit_kwargs = _checked_fit_kwargs(fit_kwargs)
    lj = log_joint(model, *model_args, **model_kwargs)
    key_init, key_fit = jax.random.split(key)
    if init is None:
        init = init_to_median
    if latent is not None:
        return _fit_latent(
            lj, latent, key_init, key_fit, num_steps, method, init, fit_kwargs
        )
    _warn_dense_fields(lj)
    q0 = _q0(lj, key_init, init)
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
    x0 = _start_point(lj, key_init, None, init)
    model = _NumPyroLatent(_unused, _unused, _unused, data=lj, spec=spec)
    theta0 = x0[jnp.asarray(spec.theta_index)]
    if all(is_concrete(a) for a in jax.tree_util.tree_leaves(lj)):
        # concrete data: read off which field value each observation depends on, at
        # the start moved off any symmetric point (the field's prior median, say)
        f0 = x0[spec.f_start : spec.f_start + spec.size]
        nudge = np.random.default_rng(0).normal(0.0, 0.3, spec.size)
        groups = observation_groups(model, theta0, f0 + jnp.asarray(nudge, f0.dtype))
        model = dataclasses.replace(model, groups=groups)
    view = _LatentView(lj, spec)
    try:
        result = _fit(
            model, theta0, key_fit, num_steps=num_steps, method=method, **fit_kwargs
        )
    except FitError as e:
        raise FitError(str(e), NumPyroResult(e.result, view)) from None
    return NumPyroResult(result, view)


def _dense_fields(lj: LogJoint) -> dict[str, int]:
    """Latent sites with a ``MultivariateNormal`` prior of at least
    :data:`DENSE_FIELD_WARN_SIZE` values (name -> size), where the model has other
    latent sites to be ``theta``; read from the model's abstract trace (nothing
    compiles)."""
    if len(lj.latent_shapes) < 2:
        return {}
    trace = _model_trace(lj._full_model, lj.model_args, lj.model_kwargs)
    out = {}
    for name, site in trace.items():
        if not _is_latent(site):
            continue
        base = site["fn"]
        while isinstance(base, (dist.Independent, dist.ExpandedDistribution)):
            base = base.base_dist
        size = int(np.prod(lj.latent_shapes[name], dtype=int))
        if isinstance(base, dist.MultivariateNormal) and size >= DENSE_FIELD_WARN_SIZE:
            out[name] = size
    return out


def _warn_dense_fields(lj: LogJoint) -> None:
    """A :class:`RouteWarning` for each dense Gaussian field fitted without
    ``latent=``: what the plain route costs and what ``latent=`` does instead."""
    for name, n in _dense_fields(lj).items():
        warnings.warn(
            f"jaxvb.numpyro.fit: the latent site {name!r} has a MultivariateNormal "
            f"prior over {n} values. Without latent=, every evaluation of the log "
            f"joint factorises its {n} x {n} covariance (with the gradient and Hessian, "
            f"for each draw of every step) and q is one dense Gaussian over all "
            f"{lj.dim} coordinates. latent={name!r} fits it as a latent Gaussian "
            f"field, q(theta) q({name} | theta), where each observation depends on one "
            f"value of {name!r}. (warnings.simplefilter('ignore', "
            "jaxvb.numpyro.RouteWarning) silences this.)",
            RouteWarning,
            stacklevel=3,
        )


def _checked_fit_kwargs(fit_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``fit_kwargs`` as a dict, refused where it names an argument of :func:`fit`."""
    fit_kwargs = dict(fit_kwargs or {})
    clash = sorted({"num_steps", "method", "log_joint", "q0", "key"} & set(fit_kwargs))
    if clash:
        raise TypeError(
            f"jaxvb.numpyro.fit: give {clash} as arguments of fit, not in fit_kwargs"
        )
    return fit_kwargs


def _q0(lj: LogJoint, key: jax.Array, init: Callable | Family | jax.Array):
    """The start of a fit without ``latent=``: ``init`` itself where it is a family
    over ``x``, else the point ``x0`` it gives (an init strategy's, or ``init``)."""
    if isinstance(init, Family):
        if tuple(init.event_shape) != (lj.dim,):
            raise ValueError(
                f"jaxvb.numpyro.fit: init has event shape {tuple(init.event_shape)}, but "
                f"the model's unconstrained latent vector has shape ({lj.dim},)"
            )
        return init
    if callable(init):
        return _start_point(lj, key, None, init)
    x0 = jnp.asarray(init)
    if x0.shape != (lj.dim,):
        raise ValueError(
            f"jaxvb.numpyro.fit: init has shape {x0.shape}, but the model's "
            f"unconstrained latent vector has shape ({lj.dim},)"
        )
    return _start_point(lj, key, x0, None)


def _start_point(lj: LogJoint, key: jax.Array, x0, init_strategy) -> jax.Array:
    """:func:`_start`'s point, refused where the log density there is not finite."""
    arrays, static = _static.partition(lj)
    x0, start = _start(arrays, static, key, x0, init_strategy=init_strategy)
    if is_concrete(start) and not np.isfinite(float(start)):
        raise ValueError(
            f"jaxvb.numpyro.fit: the log density is {float(start)} at the starting "
            f"point {lj.constrain(x0)}; pick one inside the support with "
            "init=numpyro.infer.init_to_value(values={...})."
        )
    return x0
