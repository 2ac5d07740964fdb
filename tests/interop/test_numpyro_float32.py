"""Hierarchical NumPyro models in float32, JAX's default dtype and what a GPU runs.

Each model of ``benchmarks/hierarchical.py`` below is fitted as its user would, with
x64 off (``jax.enable_x64(False)``, the data in float32), by the route the NumPyro
guide recommends (the benchmark's), and scored as ``benchmarks/hierarchical.py``
scores the float64 fits: every marginal of the reported sites from 4000 of
``res.sample``'s draws (importance-resampled), against the stored NUTS reference
(``tests/data/hierarchical_nuts.json``, 8000 draws), within 0.25 reference sd in mean
and [0.8, 1.2] in sd. Those are accuracy bounds, not Monte Carlo ones: the draws'
own error is about 0.02 sd in mean and 2% in sd (ESS in the thousands), and
float32's rounding (``eps`` = 1.2e-7 relative, on log densities of order 100) is
below both, so float32 is held to the same bounds as float64.
"""

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb
import jaxvb.numpyro

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "data" / "hierarchical_nuts.json"
MEAN_TOL, SD_LO, SD_HI = 0.25, 0.8, 1.2
CASES = ("eight_schools_centered", "eight_schools_noncentered", "radon_intercepts")


@pytest.fixture(scope="module")
def hierarchical():
    """``benchmarks/hierarchical.py``: its models, data and recommended routes."""
    pytest.importorskip("numpyro")
    path = ROOT / "benchmarks" / "hierarchical.py"
    spec = importlib.util.spec_from_file_location("hierarchical", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _in_float32(value):
    """An array of the benchmark's data in float32 (integers in int32); other values
    (a plate's size) as they are."""
    if not hasattr(value, "dtype"):
        return value
    if jnp.issubdtype(value.dtype, jnp.floating):
        return jnp.asarray(np.asarray(value), jnp.float32)
    return jnp.asarray(np.asarray(value), jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_float32_fit_is_as_accurate_as_float64(hierarchical, name):
    spec = hierarchical.MODELS[name]
    ref = json.loads(REFERENCE.read_text())["models"][name]["sites"]
    with jax.enable_x64(False):
        data = {k: _in_float32(v) for k, v in spec.data().items()}
        res = jaxvb.numpyro.fit(
            spec.model, jax.random.key(0), num_steps=1000, **spec.route, **data
        )
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
