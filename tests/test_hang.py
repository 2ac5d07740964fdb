"""Every fit returns (issue 16, reproducer 9).

Each ``while_loop`` of a compiled fit has a hard bound on its iterations that holds when
every quantity in it is NaN or inf (a loop whose condition compares NaNs can run
forever); each is driven here with such input under a timeout. The last test runs
several fits of NumPyro's Gaussian-process example at once, the case reported to
freeze, and asserts that each returns.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb
from jaxvb._gamma import _MAX_ROUNDS, log_standard_gamma
from jaxvb._laplace import _find_mode
from jaxvb.baselines.vbem_probit import vbem


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_gamma_retry_loop_ends_for_any_shape():
    # An infinite shape never passes Marsaglia-Tsang's test (inf - inf): this looped
    # forever before the loop had a bound.
    a = jnp.array([1.0, 0.3, jnp.inf, -jnp.inf, jnp.nan, 0.0, -1.0])
    log_x = np.asarray(log_standard_gamma(jax.random.key(0), a))
    assert np.all(np.isfinite(log_x[:2]))
    assert np.all(np.isnan(log_x[2:]))
    assert _MAX_ROUNDS >= 16  # a finite shape goes without a draw w.p. < 0.05^64


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "log_p",
    [
        lambda x: jnp.nan * jnp.sum(x),  # NaN everywhere, the start included
        lambda x: jnp.where(x[0] > 0.5, jnp.nan, -0.5 * jnp.sum((x - 2.0) ** 2)),
        lambda x: jnp.where(x[0] > 0.5, jnp.inf, -0.5 * jnp.sum((x - 2.0) ** 2)),
    ],
    ids=["nan-everywhere", "nan-towards-mode", "inf-towards-mode"],
)
def test_laplace_search_ends_on_nonfinite_log_density(log_p):
    s = jax.jit(lambda x0: _find_mode(log_p, x0, 50, 1e-6))(jnp.zeros(2))
    assert 1 <= int(s.num_iter) <= 50


@pytest.mark.timeout(120)
def test_vbem_loop_ends_on_nan_data():
    design = jnp.full((6, 2), jnp.nan)
    res = jax.jit(lambda d: vbem(d, jnp.array([0, 1, 0, 1, 1, 0]), num_iters=30))(design)
    assert int(res.num_iters) <= 30 and not bool(res.converged)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fit_with_log_density_nan_in_places_returns():
    # NaN beyond x0 = 0.5, where q's draws land: the step control's retry loop refuses
    # update after update (improper or NaN), and the fit must still end, flagged.
    def log_p(x):
        return jnp.where(x[0] > 0.5, jnp.nan, -0.5 * jnp.sum((x - 1.0) ** 2))

    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    res = jaxvb.fit(log_p, q0, jax.random.key(0), num_steps=40, on_failure="ignore")
    assert int(res.status) != 0


# NumPyro's Gaussian-process example (examples/gp.py): 25 points, LogNormal(0, 10) priors.
def _gp_data():
    rng = np.random.default_rng(0)
    x = np.linspace(-1.0, 1.0, 25)
    y = x + 0.2 * x**3 + 0.5 * (0.5 + x) ** 2 * np.sin(4.0 * x)
    y = y + 0.15 * rng.standard_normal(25)
    return jnp.asarray(x), jnp.asarray((y - y.mean()) / y.std())


def _gp_model(x, y):
    import numpyro
    import numpyro.distributions as dist

    var = numpyro.sample("kernel_var", dist.LogNormal(0.0, 10.0))
    noise = numpyro.sample("kernel_noise", dist.LogNormal(0.0, 10.0))
    length = numpyro.sample("kernel_length", dist.LogNormal(0.0, 10.0))
    k = var * jnp.exp(-0.5 * ((x[:, None] - x[None, :]) / length) ** 2)
    k = k + (noise + 1e-6) * jnp.eye(x.shape[0])
    cov = dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=k)
    numpyro.sample("y", cov, obs=y)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_gaussian_process_fits_at_once_all_return():
    pytest.importorskip("numpyro")
    import jaxvb.numpyro

    x, y = _gp_data()
    results: dict[int, object] = {}

    def run(seed):
        res = jaxvb.numpyro.fit(
            _gp_model,
            jax.random.key(seed),
            x,
            y,
            num_steps=2000,
            fit_kwargs={"on_failure": "ignore", "num_eval_draws": 200},
        )
        results[seed] = int(res.status)  # reading the status waited forever in the report

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=540)
    assert not any(t.is_alive() for t in threads), f"fits still running: {results}"
    assert sorted(results) == [0, 1, 2]
