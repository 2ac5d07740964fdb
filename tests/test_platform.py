"""jaxvb._platform: the workarounds for jaxlib, XLA and the OS, their switches, and a tier
that runs as users do (XLA's default options)."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import env_with_xla_schedule

import jaxvb
from jaxvb import _platform


def test_num_maps_counts_this_process():
    n = _platform.num_maps()
    if n is None:
        pytest.skip("no /proc/self/maps on this system")
    assert n > 10


@pytest.mark.slow
def test_fit_clears_compiled_programs_near_the_map_limit(monkeypatch):
    if _platform.num_maps() is None:
        pytest.skip("no /proc/self/maps on this system")
    double = jax.jit(lambda x: 2 * x)
    double(jnp.ones(2))
    assert double._cache_size() == 1
    # Pretend the limit is just above what the process holds now.
    monkeypatch.setattr(_platform, "_MAX_MAPS", _platform.num_maps() + 10)
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
    monkeypatch.setattr(_platform, "_MAX_MAPS", 1)
    assert jax.jit(lambda x: x + _platform.guard_maps())(0) == 0


def test_maps_are_counted_again_only_after_a_compilation(monkeypatch):
    """A second fit that compiles nothing new does not read /proc/self/maps (10-20 ms
    in a process holding 10,000-20,000 maps)."""
    monkeypatch.setattr(_platform, "_MAX_MAPS", 10**9)
    counts = []
    monkeypatch.setattr(_platform, "num_maps", lambda: counts.append(1) or 100)
    _platform.guard_maps()  # whatever compiled before this test
    counts.clear()
    assert not _platform.guard_maps()
    assert counts == []  # nothing compiled since the last count
    jax.jit(lambda x: x * 3.0 + 1.0)(jnp.ones(3))  # a new program
    assert not _platform.guard_maps()
    assert counts == [1]


def test_no_clearing_far_from_the_limit(monkeypatch):
    monkeypatch.setattr(_platform, "_MAX_MAPS", 10**9)
    assert not _platform.guard_maps()


def test_jaxvbs_programs_compile_at_level_1_unless_xla_flags_set_a_level(monkeypatch):
    """jaxvb's own programs on the CPU: XLA's backend at optimisation level 1 (quicker
    to compile than the default 2, as fast to run: ``_platform._CPU_OPTIONS``), unless
    ``XLA_FLAGS`` sets a level (the tests set 0), which a compiler option would
    override."""
    if jax.default_backend() != "cpu":
        pytest.skip("CPU options")
    unset = " ".join(
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_backend_optimization_level")
    )
    monkeypatch.setenv("XLA_FLAGS", unset)
    options = _platform.compile_options.__wrapped__()
    if options:  # an XLA that knows the options
        assert options["xla_backend_optimization_level"] == 1
    monkeypatch.setenv("XLA_FLAGS", unset + " --xla_backend_optimization_level=0")
    assert "xla_backend_optimization_level" not in _platform.compile_options.__wrapped__()
    # the tests' own setting: level 0 from conftest's XLA_FLAGS
    assert "xla_backend_optimization_level" not in _platform.compile_options()


def test_after_keeps_the_values_and_no_nan_of_what_it_waits_for():
    """``after(x, before)`` is ``x`` (float leaves, others untouched), also where
    ``before`` is NaN (a failed factorisation), and passes gradients to ``x``."""
    x = {"a": jnp.arange(3.0), "n": jnp.arange(3)}
    for before in (jnp.ones((2, 2)), jnp.full((2, 2), jnp.nan)):
        out = jax.jit(_platform.after)(x, before)
        assert out["a"].tolist() == [0.0, 1.0, 2.0] and out["n"].dtype == x["n"].dtype
    grad = jax.grad(lambda v: jnp.sum(_platform.after(v, jnp.nan) ** 2))(jnp.ones(2))
    assert grad.tolist() == [2.0, 2.0]


_TWO_FACTORISATIONS = """
import jax, jax.numpy as jnp
from jaxvb._platform import after
jax.config.update("jax_enable_x64", True)

def f(a, b):
    ca = jnp.linalg.cholesky(a)
    return jnp.sum(ca) + jnp.sum(jnp.linalg.cholesky(after(b, ca)))

x = jax.random.normal(jax.random.key(0), (64, 40, 40))
a = x @ jnp.swapaxes(x, -1, -2) + 40.0 * jnp.eye(40)
g = jax.jit(f)
for i in range(1500):
    g(a + i * 1e-9, a + 1.0).block_until_ready()
print("ok")
"""


@pytest.mark.integration
def test_two_batched_factorisations_in_turn_do_not_hang():
    """Two independent vmapped Cholesky factorisations in one program hang jaxlib 0.10
    on a 2-core CPU within seconds (both thread-pool threads wait in LAPACK's batch
    split); ordered by ``after`` they run. A subprocess, so that a hang fails the test
    at its timeout instead of stopping the session."""
    import subprocess
    import sys

    env = env_with_xla_schedule(JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", _TWO_FACTORISATIONS],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


_SWITCHED_OFF = """
import jax, jax.numpy as jnp
from jaxvb import _platform
assert not any(_platform.enabled(n) for n in _platform.WORKAROUNDS)
assert _platform.compile_options() == {}
assert not _platform.outside_traces()
x = jnp.arange(3.0)
assert _platform.after(x, jnp.nan) is x
print("off")
"""


@pytest.mark.integration
def test_the_releases_that_skip_the_flag_probe_take_every_test_flag():
    """``_FLAGS_KNOWN`` spares the suite the probe on releases whose XLA takes every
    test flag: on such a release the probe (a subprocess) agrees; on another, the
    flags are the probe's answers."""
    if _platform._jaxlib_version()[:2] not in _platform._FLAGS_KNOWN:
        pytest.skip(f"jaxlib {jax.lib.__version__}: the suite probes its flags")
    assert _platform._xla_accepts(_platform._TEST_FLAGS)


@pytest.mark.integration
def test_every_workaround_can_be_switched_off():
    """``JAXVB_WORKAROUNDS_OFF=all``: no option, no ordering, no private API; an
    unknown name is a clear error, not ignored."""
    env = dict(os.environ, JAXVB_WORKAROUNDS_OFF="all", JAX_PLATFORMS="cpu")
    run = subprocess.run(
        [sys.executable, "-c", _SWITCHED_OFF], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == "off", run.stderr[-2000:]
    env["JAXVB_WORKAROUNDS_OFF"] = "map_guard,no_such_thing"
    run = subprocess.run(
        [sys.executable, "-c", "import jaxvb"], env=env, capture_output=True, text=True
    )
    assert run.returncode != 0 and "no_such_thing" in run.stderr


@pytest.mark.integration
def test_smoke_tests_pass_with_xla_default_options():
    """The tier that runs as users do: the golden fits and ``fit``'s fast tests with
    XLA's default options (``JAXVB_TEST_XLA=default``: none of the suite's flags), and
    jaxvb's own options for its own programs, as a user gets them."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, JAXVB_TEST_XLA="default")
    env["XLA_FLAGS"] = " ".join(
        f for f in env.get("XLA_FLAGS", "").split() if f not in _platform._TEST_FLAGS
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow and not integration",
            "tests/core/test_golden.py",
            "tests/core/test_fit.py",
            "tests/core/test_kernel.py",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:]
