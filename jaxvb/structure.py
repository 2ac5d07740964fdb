"""Log joints with structure the methods can use: factors (sec. 5.1) and minibatches (5.5).

Both are ordinary log joints -- calling one at ``x`` gives the full log density, so every
method and every diagnostic works on them -- that also tell :func:`jaxvb.fit` more:

- :class:`Factors`: a Gaussian prior times sites that each see ``x`` through one
  projection ``f_i = v_i' x`` (GLMs: probit, logistic, Poisson). The method
  :func:`jaxvb.methods.sites` fits one small regression per site.
- :class:`Minibatch`: a prior times a likelihood over ``N`` observations; ``fit`` uses the
  unbiased estimate ``log p(x) + N/K * sum over K random observations`` at each step.

Both hold arrays but hash by identity, so they can be the static ``log_joint`` of the
jitted loop; to fit many data sets, build them inside the function you ``jit``/``vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb.families.gaussian import Gaussian

SCHEDULES = ("random", "sweep")


def _num_rows(data: Any, what: str) -> int:
    leaves = jax.tree_util.tree_leaves(data)
    if not leaves:
        raise ValueError(f"{what}: data must hold at least one array")
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
    if None in sizes or len(sizes) != 1:
        raise ValueError(
            f"{what}: every array in data must have the same leading axis, one entry "
            f"per observation; got leading sizes {sorted(map(str, sizes))}"
        )
    return sizes.pop()


class Factors:
    r"""``log p(x) = log N(x; m0, P0^{-1}) + sum_i site_log_lik(v_i' x, data_i)``.

    The factor structure of section 5.1: every likelihood factor depends on ``x`` only
    through one projection ``f_i = v_i' x``, so a Gaussian ``q(x)`` is the prior times
    one Gaussian term in each ``f_i``, fitted by :func:`jaxvb.methods.sites` with a
    3-dimensional regression per site instead of one of dimension ``1 + M(M+3)/2``.
    The Gaussian prior is conjugate and enters exactly.

    Args:
      prior: the Gaussian prior of ``x``, shape ``(M,)``.
      site_log_lik: ``site_log_lik(f, data_i) -> scalar``, the log likelihood of one
        observation given its linear predictor ``f`` (a scalar); written with
        ``jax.numpy`` and twice differentiable in ``f`` for the gradient and Hessian
        estimators.
      design: ``(N, M)``; row ``i`` is ``v_i``.
      data: a pytree of arrays with leading axis ``N`` (e.g. the responses ``y``).

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jaxvb.models import probit
      >>> beta, design, y = probit.simulate(jax.random.key(0), num_datasets=1)
      >>> model = jaxvb.Factors(jaxvb.Gaussian(jnp.zeros(5), jnp.eye(5)),
      ...                       probit.site_log_lik, design[0], y[0])
      >>> bool(jnp.allclose(model(beta[0]), probit.log_joint(beta[0], design[0], y[0])))
      True
      >>> res = jaxvb.fit(model, model.prior, jax.random.key(1), num_steps=200,
      ...                 method="sites")
      >>> res.q.mean.shape
      (5,)
    """

    def __init__(
        self,
        prior: Gaussian,
        site_log_lik: Callable[[jax.Array, Any], jax.Array],
        design: jax.typing.ArrayLike,
        data: Any,
    ):
        if not isinstance(prior, Gaussian):
            raise TypeError(
                f"Factors: prior must be a jaxvb.Gaussian (the conjugate factor that "
                f"enters exactly), got {type(prior).__name__}"
            )
        design = jnp.asarray(design)
        if not jnp.issubdtype(design.dtype, jnp.floating):
            design = design.astype(prior.dtype)
        if design.ndim != 2 or design.shape[1] != prior.dim:
            raise ValueError(
                f"Factors: design must have shape (N, {prior.dim}) to match the prior's "
                f"dimension, got {design.shape}"
            )
        if not callable(site_log_lik):
            raise TypeError(
                "Factors: site_log_lik must be a function (f, data_i) -> scalar"
            )
        n = _num_rows(data, "Factors")
        if n != design.shape[0]:
            raise ValueError(
                f"Factors: data has {n} rows but design has {design.shape[0]}; one row "
                "of data per row of the design"
            )
        self.prior = prior
        self.site_log_lik = site_log_lik
        self.design = design.astype(prior.dtype)
        self.data = data

    @property
    def num_sites(self) -> int:
        return self.design.shape[0]

    def site_values(self, f: jax.Array) -> jax.Array:
        """``site_log_lik(f_i, data_i)`` for all sites, ``(N,) -> (N,)``."""
        return jax.vmap(self.site_log_lik)(f, self.data)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        return self.prior.log_prob(x) + jnp.sum(self.site_values(self.design @ x))


class Minibatch:
    r"""``log p(x) = log_prior(x) + sum_i log_lik(x, data_i)``, fitted on minibatches.

    Section 5.5: all of the paper's estimates are linear in ``log p`` and its
    derivatives, so they stay unbiased when ``log p`` is replaced by

        log_prior(x) + N / K * sum_{i in B_t} log_lik(x, data_i)

    for a set ``B_t`` of ``K`` observations drawn anew at every step, and the fit
    converges to the full-data answer. ``fit`` does this for every method; calling the
    object gives the full-data log joint, which the diagnostics use.

    Args:
      log_prior: ``x -> scalar``.
      log_lik: ``(x, data_i) -> scalar``, one observation's log likelihood.
      data: a pytree of arrays with leading axis ``N``.
      batch_size: ``K``.
      schedule: ``"random"``: ``K`` observations without replacement at each step.
        ``"sweep"``: the paper's scheme -- ``N / K`` fixed consecutive blocks (``K`` must
        divide ``N``), visited in a new random order on every pass over the data.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> y = jnp.array([0.5, 1.5, 1.0, 2.0])
      >>> model = jaxvb.Minibatch(lambda x: -0.5 * jnp.sum(x**2),
      ...                         lambda x, yi: -0.5 * jnp.sum((yi - x) ** 2), y,
      ...                         batch_size=2)
      >>> res = jaxvb.fit(model, jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1)),
      ...                 jax.random.key(0), num_steps=2000)
      >>> round(float(res.q.mean[0]), 1), round(float(res.q.cov[0, 0]), 2)  # 1.0, 0.2
      (1.0, 0.2)
    """

    def __init__(
        self,
        log_prior: Callable[[jax.Array], jax.Array],
        log_lik: Callable[[jax.Array, Any], jax.Array],
        data: Any,
        *,
        batch_size: int,
        schedule: str = "random",
    ):
        if not callable(log_prior) or not callable(log_lik):
            raise TypeError("Minibatch: log_prior and log_lik must be functions")
        n = _num_rows(data, "Minibatch")
        if not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= n:
            raise ValueError(
                f"Minibatch: batch_size must be an integer in [1, {n}] (the number of "
                f"observations), got {batch_size!r}"
            )
        if schedule not in SCHEDULES:
            raise ValueError(
                f"Minibatch: schedule must be one of {SCHEDULES}, got {schedule!r}"
            )
        if schedule == "sweep" and n % batch_size:
            raise ValueError(
                f"Minibatch: schedule='sweep' splits the {n} observations into equal "
                f"blocks, so batch_size must divide {n}; got {batch_size}"
            )
        self.log_prior = log_prior
        self.log_lik = log_lik
        self.data = data
        self.num_obs = n
        self.batch_size = int(batch_size)
        self.schedule = schedule

    def _sum_lik(self, x, data):
        return jnp.sum(jax.vmap(self.log_lik, (None, 0))(x, data))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.log_prior(x) + self._sum_lik(x, self.data)

    def indices(self, key: jax.Array, step: jax.Array) -> jax.Array:
        """The observations of step ``step`` (1-based) under ``key``, shape ``(K,)``."""
        n, k = self.num_obs, self.batch_size
        if self.schedule == "random":
            return jax.random.permutation(jax.random.fold_in(key, step), n)[:k]
        num_blocks = n // k
        sweep, position = jnp.divmod(step - 1, num_blocks)
        order = jax.random.permutation(jax.random.fold_in(key, sweep), num_blocks)
        return order[position] * k + jnp.arange(k)

    def batch(self, key: jax.Array, step: jax.Array) -> Callable[[jax.Array], jax.Array]:
        """The unbiased log joint of step ``step``: prior + ``N/K`` x batch likelihood."""
        idx = self.indices(key, step)
        data = jax.tree_util.tree_map(lambda v: jnp.asarray(v)[idx], self.data)
        scale = self.num_obs / self.batch_size

        def log_joint(x):
            return self.log_prior(x) + scale * self._sum_lik(x, data)

        return log_joint
