"""ArviZ out: draws of a fitted approximation as an ``arviz.InferenceData``.

ArviZ is an optional dependency (``pip install arviz``, or the ``arviz`` extra); it is
imported only when a function here is called. The draws of ``q`` are independent, so a
"chain" is just a block of them: ``num_chains > 1`` splits the draws into equal blocks,
which gives ArviZ's chain-based diagnostics (``r_hat`` close to 1, ``ess`` close to the
number of draws) something to compute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb._version import __version__


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
) -> Any:
    """Draws of a fitted approximation as an ``arviz.InferenceData``.

    For a plain :func:`jaxvb.fit` result (or a family such as ``result.q``): draws ``x``
    of ``q`` make the ``posterior`` group. For a NumPyro model use the result of
    :func:`jaxvb.numpyro.fit`, whose ``.to_arviz`` names the variables after the
    model's sites and maps them back to their constrained scale.

    Args:
      result: a :class:`jaxvb.Result` or a fitted family (anything with ``.sample``).
      key: a JAX random key.
      num_samples: the number of independent draws of ``q``.
      names: ``None``: one variable ``"x"`` of the family's event shape; a string: that
        name for it; a sequence of ``d`` strings: one scalar variable per coordinate of
        ``x`` (shape ``(d,)``).
      num_chains: split the draws into this many chains of equal length (ArviZ's
        ``chain`` dimension); the draws are independent, so the split only gives the
        chain-based diagnostics something to compare.

    Returns:
      ``arviz.InferenceData`` with a ``posterior`` group of dimensions
      ``(chain, draw, ...)``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.Gaussian(jnp.array([1.0, -1.0]), jnp.eye(2))
      >>> idata = jaxvb.to_arviz(q, jax.random.key(0), 1000, names=["a", "b"],
      ...                        num_chains=4)
      >>> sorted(idata.posterior.data_vars), dict(idata.posterior.sizes)
      (['a', 'b'], {'chain': 4, 'draw': 250})
    """
    q = getattr(result, "q", result)
    if not hasattr(q, "sample"):
        raise TypeError(
            f"to_arviz: expected a jaxvb.Result or a fitted family, got {type(result).__name__}"
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


__all__ = ["to_arviz"]
