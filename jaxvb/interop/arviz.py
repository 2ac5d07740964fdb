"""ArviZ out: draws of a fitted approximation as an ``arviz.InferenceData``.

ArviZ is an optional dependency (``pip install arviz``, or the ``arviz`` extra); it is
imported only when a function here is called. The draws of ``q`` are independent, so a
"chain" is just a block of them: ``num_chains > 1`` splits the draws into equal blocks,
which gives ArviZ's chain-based diagnostics (``r_hat`` close to 1, ``ess`` close to the
number of draws) something to compute.

A :class:`jaxvb.LatentGaussian` fit carries its model, so its ``InferenceData`` has
what ``az.loo`` and ``az.plot_ppc`` read: the hyperparameters by name on their
constrained scale and the field (``posterior``), the pointwise ``log_lik``
(``log_likelihood``), replicated data where the model can simulate them
(``posterior_predictive``) and the data (``observed_data``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb._platform import jit_once
from jaxvb._version import __version__
from jaxvb.core.status import KHAT_RESAMPLE_LIMIT
from jaxvb.latent.approximation import LatentGaussianApproximation

#: Hyperparameter draws weighed for the importance-resampled draws, at least (and at
#: least half the draws returned), as for a ``jaxvb.numpyro`` ``latent=`` fit.
MIN_THETA_PROPOSALS = 2000


def _import_arviz():
    try:
        import arviz
    except ImportError as e:
        raise ImportError(
            "jaxvb's ArviZ output needs arviz, which is not installed: "
            "pip install arviz (or pip install 'jaxvb[arviz]')"
        ) from e
    return arviz


def _split_chains(draws: Mapping[str, Any], num_chains: int) -> dict[str, np.ndarray]:
    """``(n, *shape)`` arrays as ``(num_chains, n // num_chains, *shape)`` numpy arrays."""
    if not isinstance(num_chains, (int, np.integer)) or num_chains < 1:
        raise ValueError(f"num_chains must be a positive integer, got {num_chains!r}")
    out = {}
    for name, value in draws.items():
        value = np.asarray(value)
        n = value.shape[0]
        if n % num_chains:
            raise ValueError(
                f"the {n} draws cannot be split into {num_chains} chains of equal length; "
                "make the number of draws a multiple of num_chains"
            )
        out[name] = value.reshape((num_chains, n // num_chains) + value.shape[1:])
    return out


def from_draws(
    draws: Mapping[str, Any],
    *,
    num_chains: int = 1,
    dims: Mapping[str, Sequence[str]] | None = None,
    coords: Mapping[str, Any] | None = None,
    observed_data: Mapping[str, Any] | None = None,
    posterior_predictive: Mapping[str, Any] | None = None,
    log_likelihood: Mapping[str, Any] | None = None,
) -> Any:
    """An ``InferenceData`` whose posterior group holds ``draws`` (leading axis: draws).

    ``posterior_predictive`` and ``log_likelihood`` (the same leading axis, one entry
    per draw) become those groups, split into the same chains. ``dims`` applies to
    every group; in ``log_likelihood`` a variable keeps only the names of its own axes
    (a pointwise log-likelihood has its observed site's batch axes, not its event
    axes), as ArviZ's ``from_numpyro`` does.
    """
    az = _import_arviz()

    def group(values):
        return _split_chains(values, num_chains) if values else None

    return az.from_dict(
        posterior=_split_chains(draws, num_chains),
        posterior_predictive=group(posterior_predictive),
        log_likelihood=group(log_likelihood),
        observed_data=None
        if not observed_data
        else {k: np.asarray(v) for k, v in observed_data.items()},
        dims=dict(dims) if dims else None,
        coords=dict(coords) if coords else None,
        attrs={"inference_library": "jaxvb", "inference_library_version": __version__},
    )


def to_arviz(
    result: Any,
    key: jax.Array,
    num_samples: int,
    *,
    names: str | Sequence[str] | None = None,
    num_chains: int = 1,
    psis: bool | None = None,
    log_likelihood: bool = True,
    posterior_predictive: bool | None = None,
    observed_data: Any = None,
    observed_name: str = "y",
) -> Any:
    """Draws of a fitted approximation as an ``arviz.InferenceData``.

    For a plain :func:`jaxvb.fit` result (or a family such as ``result.q``): draws ``x``
    of ``q`` make the ``posterior`` group. For a NumPyro model use the result of
    :func:`jaxvb.numpyro.fit`, whose ``.to_arviz`` names the variables after the
    model's sites and maps them back to their constrained scale.

    For a :class:`jaxvb.LatentGaussian` fit, ``num_samples`` draws of ``(theta, f)``
    (see ``psis``) make these groups, each ``(chain, draw, ...)``:

    - ``posterior``: each hyperparameter under its ``theta_names`` name on its
      constrained scale (``theta_transforms``; without names, one variable
      ``"theta"`` of shape ``(k,)``), and the field under ``field_name``, ``(N,)``.
    - ``log_likelihood``: ``log_lik`` at each draw, one value per site, ``(T,)``,
      named ``observed_name``: what ``az.loo`` and ``az.waic`` read (their k-hat
      values judge the importance sampling from these draws; above 0.7 the elpd is
      not reliable). Left out with ``log_likelihood=False``.
    - ``posterior_predictive``: the model's ``simulate`` at each draw, named
      ``observed_name`` (the predictive's key is apart from the draws').
    - ``observed_data``: ``observed_data`` if given, else the model's ``data`` where
      it is one array with one value per site.

    Args:
      result: a :class:`jaxvb.Result` or a fitted family (anything with ``.sample``).
      key: a JAX random key.
      num_samples: the number of draws of ``q``.
      names: ``None``: one variable ``"x"`` of the family's event shape; a string: that
        name for it; a sequence of ``d`` strings: one scalar variable per coordinate of
        ``x`` (shape ``(d,)``). For a latent Gaussian fit, ``k`` names for the
        hyperparameters in place of the model's ``theta_names``.
      num_chains: split the draws into this many chains of equal length (ArviZ's
        ``chain`` dimension); the draws are independent, so the split only gives the
        chain-based diagnostics something to compare.
      psis: which draws of a latent Gaussian fit (as
        :meth:`jaxvb.numpyro.NumPyroResult.sample` decides for a NumPyro fit):
        ``None`` (default), those of
        :meth:`~jaxvb.latent.LatentGaussianApproximation.importance_resample`
        (``q`` corrected towards the posterior by Pareto-smoothed weights) where
        their k-hat is at most :data:`jaxvb.core.status.KHAT_RESAMPLE_LIMIT`, else
        ``q``'s own;
        ``True``, resampled whatever the k-hat (a ``RuntimeWarning`` above the
        limit); ``False``, ``q``'s own, the draws of ``result.sample(key,
        num_samples)`` and of the summary. ``posterior.attrs["jaxvb_draws"]`` says
        which.
      log_likelihood: a latent Gaussian fit's ``log_likelihood`` group.
      posterior_predictive: a latent Gaussian fit's ``posterior_predictive`` group;
        ``None``: where the model has ``simulate``.
      observed_data: a latent Gaussian fit's observations, for ``observed_data``.
      observed_name: the observations' name in those three groups.

    Returns:
      ``arviz.InferenceData`` with a ``posterior`` group of dimensions
      ``(chain, draw, ...)`` and, for a latent Gaussian fit, the groups above.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.Gaussian(jnp.array([1.0, -1.0]), jnp.eye(2))
      >>> idata = jaxvb.to_arviz(q, jax.random.key(0), 1000, names=["a", "b"],
      ...                        num_chains=4)
      >>> sorted(idata.posterior.data_vars), dict(idata.posterior.sizes)
      (['a', 'b'], {'chain': 4, 'draw': 250})

      A latent Gaussian fit, Poisson counts with a named scale:

      >>> from jax.scipy.special import gammaln
      >>> model = jaxvb.LatentGaussian(
      ...     log_prior=lambda th: -0.5 * jnp.sum(th**2),
      ...     prior=lambda th: (jnp.zeros(4), jnp.exp(-2.0 * th[0]) * jnp.eye(4)),
      ...     log_lik=lambda f, y: y * f - jnp.exp(f) - gammaln(y + 1.0),
      ...     data=jnp.array([1.0, 3.0, 0.0, 2.0]),
      ...     theta_names=("sigma",), theta_transforms=(jnp.exp,),
      ...     simulate=lambda key, f, y: jax.random.poisson(key, jnp.exp(f)) * 1.0)
      >>> res = jaxvb.fit(model, jnp.zeros(1), jax.random.key(0), num_steps=100)
      >>> idata = jaxvb.to_arviz(res, jax.random.key(1), 200, psis=False)
      >>> sorted(idata.groups())
      ['log_likelihood', 'observed_data', 'posterior', 'posterior_predictive']
      >>> {name: v.shape for name, v in idata.posterior.data_vars.items()}
      {'sigma': (1, 200), 'f': (1, 200, 4)}
      >>> idata.log_likelihood["y"].shape
      (1, 200, 4)
    """
    q = getattr(result, "q", result)
    if not hasattr(q, "sample"):
        raise TypeError(
            f"to_arviz: expected a jaxvb.Result or a fitted family, got {type(result).__name__}"
        )
    if isinstance(q, LatentGaussianApproximation):
        return _latent_to_arviz(
            q,
            key,
            int(num_samples),
            names=names,
            num_chains=num_chains,
            psis=psis,
            log_likelihood=log_likelihood,
            posterior_predictive=posterior_predictive,
            observed_data=observed_data,
            observed_name=observed_name,
        )
    if psis is not None or posterior_predictive or observed_data is not None:
        raise ValueError(
            "to_arviz: psis, posterior_predictive and observed_data apply to a "
            "jaxvb.LatentGaussian fit, whose model has a likelihood; for a NumPyro "
            "model use jaxvb.numpyro.fit's result, res.to_arviz(...)"
        )
    x = jnp.asarray(q.sample(key, (int(num_samples),)))
    if names is None or isinstance(names, str):
        draws = {names or "x": x}
    else:
        names = list(names)
        if x.ndim != 2 or len(names) != x.shape[1]:
            raise ValueError(
                f"to_arviz: {len(names)} names for draws of shape {x.shape[1:]}; give one "
                "name per coordinate of x, or a single name"
            )
        draws = {name: x[:, i] for i, name in enumerate(names)}
    return from_draws(draws, num_chains=num_chains)


# ----------------------------------------------------------- latent Gaussian fits


def _latent_to_arviz(
    q,
    key,
    n,
    *,
    names,
    num_chains,
    psis,
    log_likelihood,
    posterior_predictive,
    observed_data,
    observed_name,
):
    """:func:`to_arviz` of a latent Gaussian fit's ``q``."""
    model = q.model
    k = q.num_hyper
    if isinstance(names, str) or (names is not None and len(list(names)) != k):
        raise ValueError(
            f"to_arviz: names must be {k} strings, one per hyperparameter of this latent "
            f"Gaussian fit (in place of the model's theta_names), got {names!r}"
        )
    if posterior_predictive and model.simulate is None:
        raise ValueError(
            "to_arviz: posterior_predictive=True needs the model's simulate, a function "
            "(key, f, data) -> y: jaxvb.LatentGaussian(..., simulate=...)"
        )
    theta, f, words = _latent_draws(q, key, n, psis)
    labels = names if names is not None else model.theta_names
    constrained = q.constrained(theta)
    if labels is None:
        draws = {"theta": constrained}
    else:
        draws = {str(label): constrained[:, i] for i, label in enumerate(labels)}
    draws[model.field_name] = f
    if len(draws) != (k if labels is not None else 1) + 1:
        raise ValueError(
            f"to_arviz: the names {tuple(draws)} repeat one; the hyperparameters and "
            "the field need a name each"
        )
    groups = {}
    if log_likelihood:
        groups["log_likelihood"] = {observed_name: _pointwise_log_lik(q, theta, f)}
    if posterior_predictive or (
        posterior_predictive is None and model.simulate is not None
    ):
        replicate = _replicate(q, jax.random.fold_in(key, 1), theta, f)
        groups["posterior_predictive"] = {observed_name: replicate}
    observed = _observed(q, observed_data)
    if observed is not None:
        groups["observed_data"] = {observed_name: observed}
    idata = from_draws(draws, num_chains=num_chains, **groups)
    idata.posterior.attrs["jaxvb_draws"] = words
    return idata


def _latent_draws(q, key, n, psis):
    """``(theta (n, k), f (n, N), words)``: :func:`to_arviz`'s draws (``psis``) and
    where they came from."""
    own = f"{n} draws of q"
    if psis is False:
        theta, f = q.unpack(q.sample(key, (n,)))
        return theta, f, own
    m = max(MIN_THETA_PROPOSALS, n // 2)
    out = q.importance_resample(key, n, num_theta=m, warn=False)
    khat = float(out.khat)
    if psis is None and not khat <= KHAT_RESAMPLE_LIMIT:
        theta, f = q.unpack(q.sample(key, (n,)))
        return theta, f, f"{own}: the importance weights' k-hat is {khat:.2f}"
    if khat > KHAT_RESAMPLE_LIMIT:
        warnings.warn(
            f"to_arviz: the importance weights' Pareto k-hat is {khat:.2f} (above "
            f"{KHAT_RESAMPLE_LIMIT:g}): the weights have no mean and the resampled "
            "draws do not converge; psis=None gives q's own draws instead.",
            RuntimeWarning,
            stacklevel=4,  # the caller of to_arviz
        )
    words = (
        f"{n} draws resampled from {m} of q(theta) by importance weights, k-hat "
        f"{khat:.2f}, ess {float(out.ess):.0f}"
    )
    return out.theta, out.f, words


@jit_once
def _pointwise_log_lik(q, theta, f):
    """``(n, T)``: the model's ``log_lik`` at each draw's sites."""
    model = q.model
    return jax.vmap(lambda th, v: model.site_log_lik(model.linear_predictor(v), th))(
        theta, f
    )


@jit_once
def _replicate(q, key, theta, f):
    """One replicated data set per draw, by the model's ``simulate``."""
    model = q.model

    def one(key, th, v):
        extra = (th,) if model.log_lik_takes_theta else ()
        return model.simulate(key, model.linear_predictor(v), model.data, *extra)

    return jax.vmap(one)(jax.random.split(key, theta.shape[0]), theta, f)


def _observed(q, given):
    """The observed data: ``given``, else the model's ``data`` where it is one array
    of one value per site, else ``None``."""
    if given is not None:
        return np.asarray(given)
    data = q.model.data
    num_field = q.num_latent
    sites = jax.eval_shape(
        q.model.linear_predictor, jax.ShapeDtypeStruct((num_field,), q.dtype)
    )
    if isinstance(data, (jax.Array, np.ndarray)) and data.shape == sites.shape:
        return np.asarray(data)
    return None


__all__ = ["to_arviz"]
