""":class:`NumPyroResult`: a fit of a NumPyro model, read on the model's own scale.

Draws of ``q`` go back through NumPyro's bijections (:meth:`NumPyroResult.sample`);
the posterior predictive and the pointwise log-likelihood run the model under
:class:`_AfterFit`, every plate given all its indices. A result is a pytree, so
``jax.vmap`` of :func:`jaxvb.numpyro.fit` gives a batch of fits that indexes like an
array.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.infer import Predictive
from numpyro.infer import log_likelihood as _numpyro_log_likelihood
from numpyro.primitives import Messenger

from jaxvb import _static
from jaxvb._platform import jit_once
from jaxvb.core.result import Result
from jaxvb.core.status import KHAT_RESAMPLE_LIMIT, KHAT_THRESHOLD
from jaxvb.core.summary import summary
from jaxvb.diagnostics._draws import map_chunks
from jaxvb.diagnostics.pareto import khat_sd, psis, psis_resample
from jaxvb.interop.arviz import from_draws
from jaxvb.interop.numpyro._latent import _LatentView
from jaxvb.interop.numpyro._log_joint import LogJoint
from jaxvb.interop.numpyro._sites import _full_plates_quiet

__all__ = ["Importance", "NumPyroResult"]

#: Proposals of ``q`` weighed per draw that :meth:`NumPyroResult.sample` returns
#: (at least :data:`MIN_PROPOSALS`): resampling with replacement from several times
#: as many proposals keeps the repeats few where the weights are even.
PROPOSALS_PER_DRAW = 4
MIN_PROPOSALS = 4000
#: Draws whose log joint is evaluated at once (vmapped); the rest in sequence.
CHUNK_SIZE = 100


class Importance(NamedTuple):
    """Importance-resampled draws of a fit (:meth:`NumPyroResult.importance`).

    Attributes:
      x: ``(n, dim)`` draws on the unconstrained scale, resampled from ``q``'s
        proposals by their Pareto-smoothed weights ``p / q`` (for a ``latent=`` fit,
        the hyperparameters' weights ``p(y, theta) / q(theta)`` with the field
        integrated out, as :meth:`jaxvb.LatentGaussianApproximation.importance_resample`
        computes them): approximate draws of the posterior.
      khat: the Pareto k-hat of those weights; at most 0.7 the resampled draws are
        reliable, above it the weights' tail is too heavy to correct ``q``.
      ess: the effective sample size of the smoothed weights.
      num_proposals: how many proposals were weighed.
      log_weight_variance: the variance of the log weights before smoothing (about
        twice ``KL(q || p)`` for a close fit): whether a k-hat above 0.7 matters.
      khat_sd: the Monte Carlo standard deviation of ``khat``
        (:func:`jaxvb.diagnostics.khat_sd`).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.numpyro import Importance
      >>> imp = Importance(jnp.zeros((3, 2)), jnp.asarray(0.4), jnp.asarray(2.9), 100)
      >>> imp.reliable, imp.x.shape
      (True, (3, 2))
    """

    x: jax.Array
    khat: jax.Array
    ess: jax.Array
    num_proposals: int
    log_weight_variance: jax.Array = jnp.nan
    khat_sd: jax.Array = jnp.nan

    @property
    def reliable(self) -> bool:
        """Whether ``khat`` is at most 0.7 (Stan's threshold for PSIS)."""
        return bool(np.asarray(self.khat) <= KHAT_THRESHOLD)


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


_FORWARDED = frozenset(Result._fields) | {"ok", "message"}


class _Source(NamedTuple):
    """Where a summary's draws came from: its note, and their effective number."""

    words: str
    effective: float | None


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

    def sample(
        self, key: jax.Array, num_samples: int, *, psis: bool | None = None
    ) -> dict[str, jax.Array]:
        """``num_samples`` draws of every latent and deterministic site, constrained.

        By default the draws are importance-resampled (:meth:`importance`): proposals
        of ``q`` weighed by ``p / q``, Pareto-smoothed, and resampled in proportion
        to their weights, which corrects ``q`` towards the posterior where it is
        narrower or shifted (a hierarchy's scale parameters, a skewed marginal).
        Up to a Pareto k-hat of 0.7 the correction is reliable; up to 1 it still
        converges and is kept; above 1 the draws are ``q``'s own. The k-hat that
        decides is the fit's (``khat``, the one its verdict rests on), not that of
        each call's proposals, so that every call gives the same kind of draws. The draws are mapped through
        NumPyro's bijections and the model is replayed at them
        (``numpyro.infer.util.constrain_fn``), with all the data, for the
        deterministic sites. Observed sites are not included.

        Args:
          key: a JAX random key.
          num_samples: the number of draws.
          psis: ``None`` (default): resampled where the fit's k-hat is at most 1, else
            ``q``'s own draws. ``True``: resampled whatever k-hat is (a
            ``RuntimeWarning`` above 1). ``False``: ``q``'s own draws (its moments,
            as fitted).

        Returns:
          A dict keyed by site name, in model order; each value has shape
          ``(num_samples, *site_shape)``. See the class example.
        """
        self._single("sample")
        x = self._draws(key, int(num_samples), psis)
        arrays, static = _static.partition(self.log_joint)
        draws = _constrain(arrays, static, x)  # vmap sorts the names
        return {name: draws[name] for name in self.log_joint.posterior_sites}

    def importance(
        self, key: jax.Array, num_samples: int, *, num_proposals: int | None = None
    ) -> Importance:
        """``num_samples`` draws of ``x`` resampled by Pareto-smoothed importance
        weights, with the weights' k-hat and effective sample size.

        ``num_proposals`` draws of ``q`` (by default ``4 num_samples``, at least
        4000) are weighed by ``p(x) / q(x)``, the log joint evaluated in chunks of
        100 draws; the weights are Pareto-smoothed (:func:`jaxvb.diagnostics.psis`)
        and ``num_samples`` draws are resampled from the proposals with
        replacement in proportion to them (sampling importance resampling, as
        Stan's Pathfinder returns its draws). For a ``latent=`` fit the weights are
        the hyperparameters' with the field integrated out
        (:meth:`jaxvb.LatentGaussianApproximation.importance_resample`).

        Example:
          A skewed posterior (a Poisson rate under a Gamma prior): ``q``, a
          log-normal on the rate's scale, is close, and the resampled draws move
          towards the exact ``Gamma(4, 3)`` (mean 4/3, sd 2/3). On the log scale the
          posterior's left tail is exponential and ``q``'s Gaussian: the weights' tail
          is heavy there, and ``khat`` says how far the resample can be trusted.

          >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
          >>> import jaxvb.numpyro
          >>> def model(y):
          ...     rate = numpyro.sample("rate", dist.Gamma(1.0, 1.0))
          ...     numpyro.sample("y", dist.Poisson(rate), obs=y)
          >>> res = jaxvb.numpyro.fit(model, jax.random.key(0), jnp.array([1.0, 2.0]),
          ...                         num_steps=200)
          >>> imp = res.importance(jax.random.key(1), 1000)
          >>> imp.x.shape, imp.num_proposals, bool(0 < imp.ess <= imp.num_proposals)
          ((1000, 1), 4000, True)
        """
        self._single("importance")
        n = int(num_samples)
        if n < 1:
            raise ValueError(f"importance: num_samples must be >= 1, got {num_samples!r}")
        q = self.result.q
        if isinstance(self.log_joint, _LatentView):
            m = int(num_proposals or max(MIN_PROPOSALS // 2, n // 2))
            out = q.importance_resample(key, n, num_theta=m, warn=False)
            x = jnp.concatenate([out.theta, out.f], axis=1)
            return Importance(x, out.khat, out.ess, m, out.log_weight_variance, out.khat_sd)
        m = int(num_proposals or max(MIN_PROPOSALS, PROPOSALS_PER_DRAW * n))
        if m < 25:
            raise ValueError(
                f"importance: num_proposals must be >= 25 (Pareto smoothing fits the "
                f"tail of at least 5 weights), got {num_proposals!r}"
            )
        arrays, static = _static.partition(self.log_joint)
        x, khat, ess, variance, spread = _importance(arrays, static, q, key, n=n, m=m)
        return Importance(x, khat, ess, m, variance, spread)

    def _summary_draws(self, key: jax.Array, n: int):
        """The summary's draws: :meth:`sample`'s, ``q``'s own where those are
        resampled (else ``None``), and where they came from."""
        self._single("summary")
        imp = self.importance(key, n)
        arrays, static = _static.partition(self.log_joint)
        own = _constrain(arrays, static, self.result.q.sample(key, (n,)))
        khat = self._deciding_khat(imp)
        if khat > KHAT_RESAMPLE_LIMIT:
            words = f"from {n} draws of q: the importance weights' k-hat is above 1"
            return own, None, _Source(words, None)
        words = (
            f"from {n} draws resampled from {imp.num_proposals} of q by importance "
            f"weights, k-hat {khat:.2f}, ess {float(imp.ess):.0f}; q mean, "
            "q sd: q's own draws"
        )
        draws = _constrain(arrays, static, imp.x)
        return draws, own, _Source(words, float(imp.ess))

    def _deciding_khat(self, imp: Importance) -> float:
        """The k-hat that decides between resampled draws and ``q``'s own: the fit's
        (``self.khat``, which :func:`jaxvb.numpyro.fit` reads from 16,000 proposals
        and bases its verdict on), so that the draws do not switch with the key of
        one call; this call's own (``imp.khat``) where the fit has none."""
        khat = float(np.asarray(self.result.khat))
        return khat if math.isfinite(khat) else float(np.asarray(imp.khat))

    def _draws(self, key: jax.Array, n: int, psis: bool | None) -> jax.Array:
        """:meth:`sample`'s draws of ``x``: resampled, or ``q``'s own."""
        if psis is False:
            return self.result.q.sample(key, (n,))
        imp = self.importance(key, n)
        khat = self._deciding_khat(imp)
        if khat <= KHAT_RESAMPLE_LIMIT:
            return imp.x
        if psis is None:
            return self.result.q.sample(key, (n,))
        warnings.warn(
            f"NumPyroResult.sample: the importance weights' Pareto k-hat is "
            f"{khat:.2f} (above 1): the weights have no mean and the "
            "resampled draws do not converge; psis=None gives q's own draws instead.",
            RuntimeWarning,
            stacklevel=3,
        )
        return imp.x

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
        """:func:`jaxvb.summary`: a row per site (``beta[0]``, ...), constrained, from
        :meth:`sample`'s draws, with ``q``'s own mean and sd beside them where those
        are importance-resampled."""
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


@jit_once(static_argnames=("static", "n", "m"))
def _importance(arrays, static, q, key, *, n, m):
    """``n`` draws resampled from ``m`` proposals of ``q`` by their smoothed weights
    ``p / q``, the weights' k-hat, effective sample size, log weights' variance and
    k-hat's Monte Carlo sd: one compiled program per model structure and sizes."""
    log_joint = _static.combine(arrays, static)
    key_q, key_r = jax.random.split(key)
    x = q.sample(key_q, (m,))
    log_r = map_chunks(log_joint, x, CHUNK_SIZE).astype(x.dtype) - jax.vmap(q.log_prob)(x)
    weights = psis(log_r)
    ess = 1.0 / jnp.sum(jnp.exp(2.0 * weights.log_weights))
    variance = jnp.nanvar(jnp.where(jnp.isfinite(log_r), log_r, jnp.nan))
    spread = khat_sd(jax.random.fold_in(key, 1), log_r)
    x = psis_resample(key_r, x, weights.log_weights, n)
    return x, weights.khat, ess, variance, spread


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
