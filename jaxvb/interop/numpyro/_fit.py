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
from jaxvb.core.status import (
    ERRORS,
    KHAT_FLAG_VARIANCE,
    KHAT_THRESHOLD,
    FitError,
    FitWarning,
    Status,
    check,
    never_proper,
)
from jaxvb.families._base import Family, is_concrete
from jaxvb.interop.numpyro._latent import (
    _latent_spec,
    _LatentView,
    _NumPyroLatent,
    _unused,
    observation_groups,
)
from jaxvb.interop.numpyro._log_joint import LogJoint, log_joint
from jaxvb.interop.numpyro._result import MIN_PROPOSALS, NumPyroResult
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
      of constrained draws keyed by site name, importance-resampled) and
      ``.to_arviz(key, n)``. Its ``.khat`` is the Pareto k-hat of the importance
      weights those draws rest on (:meth:`NumPyroResult.importance`; for a ``latent=``
      fit, the hyperparameters' with the field integrated out), and ``HIGH_KHAT`` is
      set from it.

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
        result = _quietly(
            _fit, lj, q0, key_fit, num_steps=num_steps, method=method, **fit_kwargs
        )
    except FitError as e:
        where = _upward_sites(lj, e.result) if never_proper(e.result) else ""
        raise FitError(str(e) + where, NumPyroResult(e.result, lj)) from None
    res = _judged_by_importance(NumPyroResult(result, lj), key_fit)
    check(
        res.result, fit_kwargs.get("on_failure", "raise"), num_steps=num_steps, stacklevel=2
    )
    return res


def _quietly(fit: Callable, *args, **kwargs):
    """``fit(*args, **kwargs)`` holding back its :class:`jaxvb.FitWarning`: the
    verdict is read again once the importance weights are in
    (:func:`_judged_by_importance`), and :func:`jaxvb.check` then warns about the
    final one. Other warnings pass on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(*args, **kwargs)
    for w in caught:
        if not issubclass(w.category, FitWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result


#: Above this dimension a fit that was never proper is not searched for the sites
#: along which the log density curves upwards (a Hessian per draw: d^2 numbers each).
UPWARD_SITES_MAX_DIM = 500


def _upward_sites(lj: LogJoint, result) -> str:
    """A sentence naming the sites along which the log density, averaged over 32 draws
    of the fit's ``q``, curves upwards most (the top of the averaged Hessian's largest
    eigenvector), or ``""`` where it curves downwards everywhere or ``lj`` is large."""
    if lj.dim > UPWARD_SITES_MAX_DIM:
        return ""
    arrays, static = _static.partition(lj)
    top = np.asarray(_upward_direction(arrays, static, result.q))
    if not np.all(np.isfinite(top)) or not np.any(top):
        return ""
    names = []
    for i in np.argsort(-np.abs(top))[:4]:
        site = lj.coordinate_name(int(i)).split("[")[0]
        if abs(top[i]) >= 0.2 * np.abs(top).max() and site not in names:
            names.append(site)
    return (
        f" Where q sits, the log density curves upwards most along the site(s) "
        f"{', '.join(names)}."
    )


@jit_once(static_argnames=("static",))
def _upward_direction(arrays, static, q):
    """The largest eigenvector of the log density's Hessian averaged over 32 draws of
    ``q`` where its eigenvalue is positive (upward curvature), else zeros."""
    lj = _static.combine(arrays, static)
    x = q.sample(jax.random.key(0), (32,))
    hess = jnp.mean(jax.lax.map(jax.hessian(lj), x), axis=0)
    values, vectors = jnp.linalg.eigh(0.5 * (hess + hess.T))
    return jnp.where(values[-1] > 0, vectors[:, -1], 0.0)


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
        result = _quietly(
            _fit, model, theta0, key_fit, num_steps=num_steps, method=method, **fit_kwargs
        )
    except FitError as e:
        where = _collapsed_scales(lj, spec, latent, e.result)
        raise FitError(str(e) + where, NumPyroResult(e.result, view)) from None
    res = _judged_by_importance(NumPyroResult(result, view), key_fit)
    check(
        res.result, fit_kwargs.get("on_failure", "raise"), num_steps=num_steps, stacklevel=3
    )
    return res


#: An unconstrained value below this, for a positive site among ``theta``, is a scale
#: run off towards 0 (exp(-8) = 3e-4 of its unit).
COLLAPSED_LOG_SCALE = -8.0


def _collapsed_scales(lj: LogJoint, spec, latent: str, result) -> str:
    """Where a ``latent=`` fit's start failed with a scale among the other sites run
    off towards 0 (a funnel among them): a sentence naming it and the remedies, else
    ``""``."""
    if Status.LAPLACE_FAILED not in Status(int(np.asarray(result.status))):
        return ""
    theta = np.asarray(result.q.theta.mean)
    trace = _model_trace(lj._full_model, lj.model_args, lj.model_kwargs)
    names = []
    for i, v in zip(spec.theta_index, theta, strict=True):
        name = lj.coordinate_name(int(i))
        support = getattr(trace[name.split("[")[0]]["fn"], "support", None)
        if v < COLLAPSED_LOG_SCALE and support is dist.constraints.positive:
            names.append(name)
    if not names:
        return ""
    return (
        f" The start's search ran {', '.join(names)} towards 0: a funnel among the "
        f"sites other than {latent!r}, where a group effect centred on that scale is "
        "not the field. Non-centre that effect (effect = mu + scale * z, z ~ Normal(0, "
        "1)), or, with two sets of group effects, non-centre both and fit without "
        "latent=."
    )


def _judged_by_importance(res: NumPyroResult, key: jax.Array) -> NumPyroResult:
    """A fit whose ``khat`` is the one its verdict rests on.

    Where the fit's own diagnostics set ``HIGH_KHAT`` (their draws of ``q``; for a
    ``latent=`` fit the joint weights of ``(theta, f)``, which also see where the
    conditional Gaussian misses), the result is kept. Otherwise ``khat`` becomes that
    of the weights :meth:`NumPyroResult.sample`'s draws rest on
    (:meth:`NumPyroResult.importance`, 16,000 proposals for 4000 draws: ``p / q``, or
    ``p(y, theta) / q(theta)`` with the field integrated out), which sets
    ``HIGH_KHAT`` by the engine's rule (``khat_sd`` becomes theirs too): above 0.7
    where ``q`` is materially off (the log weights' variance at least
    ``KHAT_FLAG_VARIANCE``). Not on k-hat alone: from
    a tail of a few rare draws it can read 0.4 on one key and 6 on the next for a fit
    whose log weights hardly vary. A result with an error flag, or a traced one
    (under ``jit`` or ``vmap``), keeps the fit's own k-hat.
    """
    leaves = jax.tree_util.tree_leaves(res.result)
    if not all(is_concrete(v) for v in leaves):
        return res
    status = int(res.result.status)
    if status & int(ERRORS | Status.HIGH_KHAT):
        return res
    imp = res.importance(jax.random.fold_in(key, 2), MIN_PROPOSALS)
    khat = float(np.asarray(imp.khat))
    material = float(np.asarray(imp.log_weight_variance)) >= KHAT_FLAG_VARIANCE
    flag = int(Status.HIGH_KHAT) if khat > KHAT_THRESHOLD and material else 0
    result = res.result._replace(
        khat=jnp.asarray(imp.khat),
        khat_sd=jnp.asarray(imp.khat_sd),
        status=res.result.status | flag,
    )
    return dataclasses.replace(res, result=result)


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
