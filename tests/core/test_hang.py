"""Every fit returns.

Each ``while_loop`` of a compiled fit has a hard bound on its iterations that holds when
every quantity in it is NaN or inf (a loop whose condition compares NaNs can run
forever); each is driven here with such input under a timeout. The last test runs
several fits of NumPyro's Gaussian-process example at once (processes), the case
reported to freeze, and asserts that each returns.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import env_with_xla_schedule

import jaxvb
from jaxvb._gamma import _MAX_ROUNDS, log_standard_gamma
from jaxvb.baselines.vbem_probit import vbem
from jaxvb.core.start import _find_mode


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


def _gp_fit(seed: int) -> int:
    """The reproducer: one fit, as ``python tests/core/test_hang.py SEED`` runs it."""
    import jaxvb.numpyro

    x, y = _gp_data()
    res = jaxvb.numpyro.fit(
        _gp_model,
        jax.random.key(seed),
        x,
        y,
        num_steps=2000,
        fit_kwargs={"on_failure": "ignore"},
    )
    return int(res.status)  # where the reported fits waited forever


@pytest.mark.integration
@pytest.mark.timeout(660)
def test_gaussian_process_fits_at_once_all_return():
    # Processes, as reported (three at once on two cores froze 3 of 6); NumPyro's
    # handler stack is global, so fits in threads of one process would trace each
    # other's models.
    pytest.importorskip("numpyro")
    root = pathlib.Path(__file__).resolve().parents[2]
    env = env_with_xla_schedule(PYTHONPATH=os.pathsep.join([str(root), *sys.path]))
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(seed)],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(3)
    ]
    deadline = time.monotonic() + 600.0  # ~20 s each alone on a quiet machine
    outcomes = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            outcomes.append(f"timed out after 600 s: {err[-2000:]}")
            continue
        outcomes.append(out.strip() if proc.returncode == 0 else err[-2000:])
    assert all(o.startswith("status ") for o in outcomes), outcomes


def _importance_in_chunks() -> float:
    """The reproducer of ``importance_resample``'s chunks, as ``python
    tests/core/test_hang.py importance`` runs it: a 30-value dense field, 2000
    hyperparameter draws of 128 fields each, which the evaluation splits into chunks
    (lax.map's remainder batch beside its scan hung here, two batched factorisations
    at once)."""
    import jaxvb

    n = 30
    x = jnp.linspace(0.0, 1.0, n)
    kernel = jnp.exp(-0.5 * (x[:, None] - x[None]) ** 2 / 0.3**2) + 1e-4 * jnp.eye(n)
    precision = jnp.linalg.inv(kernel)
    y = (jnp.sin(6.0 * x) > 0).astype(float)
    model = jaxvb.LatentGaussian(
        log_prior=lambda th: -0.5 * jnp.sum(th**2),
        prior=lambda th: (jnp.zeros(n), jnp.exp(-2.0 * th[0]) * precision),
        log_lik=lambda f, y: y * f - jnp.logaddexp(0.0, f),
        data=y,
    )
    res = jaxvb.fit(model, jnp.zeros(1), jax.random.key(0), num_steps=100)
    out = res.q.importance_resample(jax.random.key(1), 500, num_f=128, warn=False)
    return float(out.khat)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_importance_resample_in_chunks_returns():
    root = pathlib.Path(__file__).resolve().parents[2]
    env = env_with_xla_schedule(PYTHONPATH=os.pathsep.join([str(root), *sys.path]))
    proc = subprocess.run(
        [sys.executable, __file__, "importance"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("khat "), proc.stderr[-2000:]


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)
    if sys.argv[1] == "importance":
        print(f"khat {_importance_in_chunks()}", flush=True)
    else:
        print(f"status {_gp_fit(int(sys.argv[1]))}", flush=True)
