"""Hierarchical NumPyro models in float32, JAX's default dtype and what a GPU runs.

Each model is fitted as its user would, with x64 off (``jax.enable_x64(False)``), by
the route the NumPyro guide recommends, and scored as ``benchmarks/hierarchical.py``
scores the float64 fits: every marginal of the reported sites from 4000 of
``res.sample``'s draws (importance-resampled), against the stored NUTS reference
(``tests/data/hierarchical_nuts.json``, 8000 draws), within 0.25 reference sd in mean
and [0.8, 1.2] in sd. Those are accuracy bounds, not Monte Carlo ones: the draws'
own error is about 0.02 sd in mean and 2% in sd (ESS in the thousands), and
float32's rounding (``eps`` = 1.2e-7 relative, on log densities of order 100) is
below both, so float32 is held to the same bounds as float64.
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from test_numpyro_latent import radon_intercepts

import jaxvb
import jaxvb.numpyro
from jaxvb import data
from jaxvb.models.eight_schools import SIGMA, Y

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "hierarchical_nuts.json"
MEAN_TOL, SD_LO, SD_HI = 0.25, 0.8, 1.2


def eight_schools(y, sigma):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def eight_schools_nc(y, sigma):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", y.shape[0]):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
        numpyro.deterministic("theta", mu + tau * eta)
        numpyro.sample("y", dist.Normal(mu + tau * eta, sigma), obs=y)


def _schools():
    return (jnp.asarray(Y, jnp.float32), jnp.asarray(SIGMA, jnp.float32))


def _radon():
    y, floor, county, _ = data.radon()
    return (
        jnp.asarray(y, jnp.float32),
        jnp.asarray(floor, jnp.float32),
        jnp.asarray(county, jnp.int32),
        int(county.max()) + 1,
    )


CASES = {
    "eight_schools_centered": (eight_schools, _schools, {"latent": "theta"}),
    "eight_schools_noncentered": (eight_schools_nc, _schools, {}),
    "radon_intercepts": (radon_intercepts, _radon, {"latent": "a"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_float32_fit_is_as_accurate_as_float64(name):
    model, make_data, route = CASES[name]
    ref = json.loads(REFERENCE.read_text())["models"][name]["sites"]
    with jax.enable_x64(False):
        args = make_data()
        res = jaxvb.numpyro.fit(model, jax.random.key(0), *args, num_steps=1000, **route)
        draws = res.sample(jax.random.key(7), 4000)
    assert int(res.status) == 0, res.message
    assert res.q.dtype == jnp.float32
    for site, r in ref.items():
        got = np.asarray(draws[site], np.float64).reshape(4000, -1)
        assert draws[site].dtype == jnp.float32, site
        error = np.abs(got.mean(0) - r["mean"]) / np.asarray(r["sd"])
        ratio = got.std(0) / np.asarray(r["sd"])
        assert error.max() <= MEAN_TOL, (site, error.max())
        assert SD_LO <= ratio.min() and ratio.max() <= SD_HI, (site, ratio)
