r"""The probit model in NumPyro: NUTS for the exact posterior, SVI as a peer method.

The same model as :mod:`jaxvb.models.probit`, prior ``x ~ N(0, I)`` and

    log p(y | x) = sum_i log Phi((2 y_i - 1) v_i' x),

written with :func:`numpyro.factor` and :func:`jaxvb.models.probit.site_log_lik`, so that
NumPyro and jaxvb target the identical log density (``log_ndtr``, accurate in the
tails), not two parameterisations of it.

- :func:`nuts`: a long NUTS run, whose sample mean and covariance are the reference
  posterior moments of the benchmark (with their effective sample sizes, so the Monte
  Carlo error of the reference is known).
- :func:`svi`: stochastic variational inference with ``AutoMultivariateNormal`` (a
  full-covariance Gaussian, the family of jaxvb's fit) and ``optax.adam``, started from
  the prior like every method of the paper's comparison. It is a pure function of the
  data and the key, one ``lax.scan`` over ``SVI.update``, so that it can be jitted and
  timed after compile, the same way as :func:`jaxvb.fit`.

NumPyro is imported inside the functions: ``import jaxvb.baselines`` does not need it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from jaxvb.models import probit


class NutsResult(NamedTuple):
    """Reference posterior moments from :func:`nuts`.

    Attributes:
      mean: posterior mean, shape ``(M,)``.
      cov: posterior covariance, shape ``(M, M)`` (sample covariance, ``ddof=1``).
      samples: the draws, shape ``(num_chains, num_samples, M)``.
      ess: effective sample size of each coordinate, shape ``(M,)``.
      r_hat: split Gelman-Rubin statistic of each coordinate, shape ``(M,)``.
      num_divergent: divergent transitions after warmup.

    Example:
      >>> from jaxvb.baselines import numpyro_probit
      >>> numpyro_probit.NutsResult._fields
      ('mean', 'cov', 'samples', 'ess', 'r_hat', 'num_divergent')
    """

    mean: np.ndarray
    cov: np.ndarray
    samples: np.ndarray
    ess: np.ndarray
    r_hat: np.ndarray
    num_divergent: int


class SviResult(NamedTuple):
    """The Gaussian that :func:`svi` fits and its loss trace.

    Attributes:
      mean: shape ``(M,)``.
      cov: shape ``(M, M)``.
      loss: the negative ELBO estimate at each step, shape ``(num_steps,)``.

    Example:
      >>> from jaxvb.baselines import numpyro_probit
      >>> numpyro_probit.SviResult._fields
      ('mean', 'cov', 'loss')
    """

    mean: jax.Array
    cov: jax.Array
    loss: jax.Array


def model(design: ArrayLike, y: ArrayLike) -> None:
    """The probit model as a NumPyro model: ``x ~ N(0, I)``, ``y_i ~ Phi(v_i' x)``.

    Args:
      design: regressors ``v_i`` as rows, shape ``(N, M)``.
      y: binary responses in ``{0, 1}``, shape ``(N,)``.

    Example:
      NumPyro's log density of the model is jaxvb's probit log joint:

      >>> import jax.numpy as jnp
      >>> from numpyro.infer.util import log_density
      >>> from jaxvb.baselines import numpyro_probit
      >>> from jaxvb.models import probit
      >>> design = jnp.array([[1.0, 0.5], [1.0, -1.0], [1.0, 2.0]])
      >>> y, x = jnp.array([1.0, 0.0, 1.0]), jnp.array([0.3, -0.2])
      >>> lp, _ = log_density(numpyro_probit.model, (design, y), {}, {"x": x})
      >>> bool(jnp.isclose(lp, probit.log_joint(x, design, y)))
      True
    """
    import numpyro
    import numpyro.distributions as dist

    design = jnp.asarray(design)
    m = design.shape[-1]
    x = numpyro.sample("x", dist.Normal(jnp.zeros(m, design.dtype), 1.0).to_event(1))
    numpyro.factor("y", jnp.sum(probit.site_log_lik(design @ x, y)))


def nuts(
    design: ArrayLike,
    y: ArrayLike,
    key: jax.Array,
    *,
    num_warmup: int = 1000,
    num_samples: int = 5000,
    num_chains: int = 4,
    chain_method: str = "vectorized",
    mcmc: Any = None,
) -> NutsResult:
    """Posterior mean and covariance of the probit model from NUTS (NumPyro).

    Args:
      design: shape ``(N, M)``.
      y: shape ``(N,)``.
      key: a JAX random key.
      num_warmup: warmup (adaptation) iterations per chain.
      num_samples: kept draws per chain.
      num_chains: chains, run ``chain_method`` (``"vectorized"`` runs them in one
        program, which needs no extra devices).
      mcmc: optionally a ``numpyro.infer.MCMC`` from :func:`make_mcmc` to reuse, so
        that many data sets of one shape share one compilation.

    Returns:
      A :class:`NutsResult`.

    Example:
      Not run as a doctest: even a short run is slow to compile NUTS
      (``tests/baselines/test_numpyro_baselines.py`` runs it).

      >>> import jax, jax.numpy as jnp
      >>> from jaxvb.baselines import numpyro_probit
      >>> design = jnp.array([[1.0, 0.5], [1.0, -1.0], [1.0, 2.0], [1.0, 0.0]])
      >>> y = jnp.array([1.0, 0.0, 1.0, 0.0])
      >>> ref = numpyro_probit.nuts(design, y, jax.random.key(0), num_warmup=500,
      ...                           num_samples=1000, num_chains=2)  # doctest: +SKIP
      >>> ref.mean.shape, ref.cov.shape, ref.samples.shape  # doctest: +SKIP
      ((2,), (2, 2), (2, 1000, 2))
    """
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    if mcmc is None:
        mcmc = make_mcmc(
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            chain_method=chain_method,
        )
    mcmc.run(key, jnp.asarray(design), jnp.asarray(y), extra_fields=("diverging",))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    flat = draws.reshape(-1, draws.shape[-1])
    diverging = np.asarray(mcmc.get_extra_fields()["diverging"])
    return NutsResult(
        mean=flat.mean(0),
        cov=np.cov(flat, rowvar=False),
        samples=draws,
        ess=np.asarray(effective_sample_size(draws)),
        r_hat=np.asarray(split_gelman_rubin(draws)),
        num_divergent=int(diverging.sum()),
    )


def make_mcmc(
    *,
    num_warmup: int = 1000,
    num_samples: int = 5000,
    num_chains: int = 4,
    chain_method: str = "vectorized",
):
    """A ``numpyro.infer.MCMC`` with NUTS on :func:`model`, compiled once per data shape.

    ``jit_model_args=True``: the data are arguments of the compiled sampler, so running
    it on another data set of the same shape does not compile again.

    Example:
      One sampler for many data sets of one shape, passed to :func:`nuts`:

      >>> from jaxvb.baselines import numpyro_probit
      >>> mcmc = numpyro_probit.make_mcmc(num_warmup=500, num_samples=1000)
      >>> mcmc.num_warmup, mcmc.num_samples, mcmc.num_chains
      (500, 1000, 4)
      >>> # refs = [numpyro_probit.nuts(d, y, key, mcmc=mcmc) for d, y in data_sets]
    """
    from numpyro.infer import MCMC, NUTS

    return MCMC(
        NUTS(model),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method=chain_method,
        progress_bar=False,
        jit_model_args=True,
    )


def svi(
    design: ArrayLike,
    y: ArrayLike,
    key: jax.Array,
    *,
    num_steps: int,
    learning_rate: Any = 0.05,
    num_particles: int = 1,
) -> SviResult:
    """SVI with a full-covariance Gaussian guide (``AutoMultivariateNormal``) and Adam.

    The guide starts at the prior (mean zero, ``scale_tril = I``), as every method of
    the paper's comparison does; each step is one ``SVI.update`` with a
    ``Trace_ELBO(num_particles)`` gradient estimate, and the steps are one ``lax.scan``.
    Pure in ``(design, y, key)``: ``jax.jit(partial(svi, num_steps=..., ...))`` compiles
    the whole run, so its time can be measured apart from compilation, and it vmaps
    over data sets and keys.

    Args:
      design: shape ``(N, M)``.
      y: shape ``(N,)``.
      key: a JAX random key.
      num_steps: optimiser steps.
      learning_rate: Adam's step size, a float or an optax schedule.
      num_particles: draws per ELBO gradient estimate.

    Returns:
      :class:`SviResult` with the fitted mean and covariance.

    Example:
      Not run as a doctest: NumPyro's SVI step is slow to compile
      (``tests/baselines/test_numpyro_baselines.py`` runs it).

      >>> import jax, jax.numpy as jnp
      >>> from jaxvb.baselines import numpyro_probit
      >>> design = jnp.array([[1.0, 0.5], [1.0, -1.0], [1.0, 2.0], [1.0, 0.0]])
      >>> y = jnp.array([1.0, 0.0, 1.0, 0.0])
      >>> res = numpyro_probit.svi(design, y, jax.random.key(0), num_steps=1000)  # doctest: +SKIP
      >>> res.mean.shape, res.cov.shape, res.loss.shape  # doctest: +SKIP
      ((2,), (2, 2), (1000,))
    """
    import optax
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoMultivariateNormal
    from numpyro.infer.initialization import init_to_value

    design = jnp.asarray(design)
    m = design.shape[-1]
    guide = AutoMultivariateNormal(
        model,
        init_loc_fn=init_to_value(values={"x": jnp.zeros(m, design.dtype)}),
        init_scale=1.0,
    )
    engine = SVI(model, guide, optax.adam(learning_rate), Trace_ELBO(num_particles))
    state = engine.init(key, design, y)

    def step(state, _):
        state, loss = engine.update(state, design, y)
        return state, loss

    state, losses = jax.lax.scan(step, state, length=num_steps)
    params = engine.get_params(state)
    loc, scale_tril = params["auto_loc"], params["auto_scale_tril"]
    return SviResult(mean=loc, cov=scale_tril @ scale_tril.T, loss=losses)
