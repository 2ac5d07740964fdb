"""Tests run in float64 (float32 is checked explicitly where it matters) on the CPU.

XLA's backend optimisation is turned off for the tests, and so are XLA:CPU's fusion
emitters (``--xla_cpu_use_fusion_emitters=false``: fused loops are emitted the older,
quicker way; the suite took half the time; a jaxlib whose XLA lacks the flag, which it
would refuse, runs without it): the tests check numbers, not speed, and
the default settings spend most of the suite's time compiling. Benchmarks and users
keep the defaults.

JAX's persistent compilation cache is opt-in: ``JAXVB_TEST_CACHE=1`` stores compiled
programs in ``.jax_cache/`` at the top of the repository (git-ignored;
``JAX_COMPILATION_CACHE_DIR`` overrides it). It is set through environment variables, so
that the xdist workers, the notebook kernels and the benchmark subprocesses the tests
start all read and fill the same cache, and a second run compiles only what changed.
It is off by default (and in CI) because jaxlib's cache writer crashed an xdist worker
with a segmentation fault in CI (``put_executable_and_time``, several processes writing
one directory); a test never depends on it. Delete the directory to reclaim the space.

Every test has a time limit (``--timeout`` in pyproject.toml, pytest-timeout): a fit
that never returns fails its test with a traceback instead of stalling the suite.

Tiers (markers registered in pyproject.toml): ``slow`` for long statistical runs and
large fits, ``integration`` for notebooks, benchmark quick runs, subprocesses and live
NUTS runs. ``-m "not slow and not integration"`` is the fast tier.
"""

import os
import subprocess
import sys
from pathlib import Path

_FUSION = "--xla_cpu_use_fusion_emitters=false"


def _xla_knows(flag: str) -> bool:
    """Whether this jaxlib's XLA accepts ``flag`` (an unknown flag in ``XLA_FLAGS`` is
    fatal), tried once in a subprocess; the answer travels in the environment to the
    xdist workers and the subprocesses the tests start."""
    key = "JAXVB_TEST_XLA_FUSION_FLAG"
    if key not in os.environ:
        env = dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu")
        code = "import jax.numpy as jnp; jnp.ones(2).sum().block_until_ready()"
        try:
            run = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, timeout=300
            )
            os.environ[key] = "1" if run.returncode == 0 else "0"
        except (OSError, subprocess.TimeoutExpired):
            os.environ[key] = "0"
    return os.environ[key] == "1"


os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_backend_optimization_level=0"
    + (" " + _FUSION if _xla_knows(_FUSION) else "")
).strip()
_CACHE = os.environ.get("JAXVB_TEST_CACHE", "").lower() in ("1", "true", "yes")
if _CACHE:
    os.environ.setdefault(
        "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".jax_cache")
    )
    # With the optimiser off most programs compile in well under JAX's default threshold
    # of 1 s, yet together they are the suite's time: cache every one, whatever its size.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
if _CACHE:
    # The same settings again, in case a plugin imported jax before the variables were set.
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )
    jax.config.update(
        "jax_persistent_cache_min_entry_size_bytes",
        int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
    )


import pytest  # noqa: E402

from jaxvb import _process  # noqa: E402


@pytest.fixture(autouse=True)
def _free_compiled_programs():
    """Free compiled programs when a worker holds many memory maps.

    XLA:CPU keeps each compiled program in memory maps of its own (~700 per fit); an
    xdist worker that runs a few hundred tests passes Linux's ``vm.max_map_count`` and
    the next compilation segfaults (seen in CI). ``jaxvb.fit`` guards users at 60% of
    the limit with a warning; the tests clear quietly, well below it.
    """
    yield
    n = _process.num_maps()
    if n is not None and n > 15_000:
        jax.clear_caches()
