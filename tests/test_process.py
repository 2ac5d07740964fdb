"""The guard against the operating system's limit on memory maps (jaxvb._process)."""

import jax
import jax.numpy as jnp
import pytest

import jaxvb
from jaxvb import _process


def test_num_maps_counts_this_process():
    n = _process.num_maps()
    if n is None:
        pytest.skip("no /proc/self/maps on this system")
    assert n > 10


def test_fit_clears_compiled_programs_near_the_map_limit(monkeypatch):
    if _process.num_maps() is None:
        pytest.skip("no /proc/self/maps on this system")
    double = jax.jit(lambda x: 2 * x)
    double(jnp.ones(2))
    assert double._cache_size() == 1
    # Pretend the limit is just above what the process holds now.
    monkeypatch.setattr(_process, "_MAX_MAPS", _process.num_maps() + 10)
    with pytest.warns(RuntimeWarning, match="vm.max_map_count"):
        res = jaxvb.fit(
            lambda x: -0.5 * jnp.sum(x**2),
            jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
            jax.random.key(0),
            num_steps=20,
        )
    assert res.ok
    assert double._cache_size() == 0  # cleared before the fit compiled its own


def test_no_clearing_inside_a_trace(monkeypatch):
    monkeypatch.setattr(_process, "_MAX_MAPS", 1)
    assert jax.jit(lambda x: x + _process.guard_maps())(0) == 0


def test_no_clearing_far_from_the_limit(monkeypatch):
    monkeypatch.setattr(_process, "_MAX_MAPS", 10**9)
    assert not _process.guard_maps()
