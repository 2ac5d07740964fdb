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

XLA:CPU's concurrency-optimised scheduler is off too
(``--xla_cpu_enable_concurrency_optimized_scheduler=false``): with it, jaxlib 0.10 can
run two independent batched LAPACK calls (vmapped Cholesky factorisations, in jaxvb's
code or a test's model) at once on a 2-core machine, and each waits on the thread pool
the other holds: the process hangs (``jaxvb._platform.after`` orders jaxvb's own; a
reproducer with two, and one with five, independent factorisations hung within seconds
with the default schedule and ran 3000 calls without it). A CI run lost a worker this
way and did not finish within its 90 minutes.

Every test has a time limit (``--timeout`` in pyproject.toml, pytest-timeout): a fit
that never returns fails its test with a traceback instead of stalling the suite.
pytest-timeout's thread needs the interpreter lock; a hang that holds it is ended by a
second watchdog (``faulthandler``, a C thread) a minute later, which prints every
thread's stack and ends the worker.

Tiers (markers registered in pyproject.toml): ``slow`` for long statistical runs and
large fits, ``integration`` for notebooks, benchmark quick runs, subprocesses and live
NUTS runs. ``-m "not slow and not integration"`` is the fast tier.
"""

import faulthandler
import os
import subprocess
import sys
from pathlib import Path

_FUSION = "--xla_cpu_use_fusion_emitters=false"
_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _key(flag: str) -> str:
    return "JAXVB_TEST_" + flag.lstrip("-").split("=")[0].upper()


def _xla_accepts(flags: tuple[str, ...]) -> bool:
    """Whether this jaxlib's XLA starts with ``flags`` in ``XLA_FLAGS`` (an unknown flag
    there is fatal), tried in a subprocess."""
    env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    code = "import jax.numpy as jnp; jnp.ones(2).sum().block_until_ready()"
    try:
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0


def _xla_knows(*flags: str) -> list[str]:
    """The ``flags`` this jaxlib's XLA accepts, found once (all together in one
    subprocess, one by one only where that fails); the answers travel in the
    environment to the xdist workers and the subprocesses the tests start."""
    unknown = [f for f in flags if _key(f) not in os.environ]
    if unknown and _xla_accepts(tuple(unknown)):
        os.environ.update({_key(f): "1" for f in unknown})
    for f in unknown:
        if _key(f) not in os.environ:
            os.environ[_key(f)] = "1" if _xla_accepts((f,)) else "0"
    return [f for f in flags if os.environ[_key(f)] == "1"]


os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_backend_optimization_level=0"
    + "".join(" " + flag for flag in _xla_knows(_FUSION, _SCHEDULER))
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

from jaxvb import _platform  # noqa: E402

#: The hard limit of one test, past pytest-timeout's (pyproject.toml: 900 s).
_HARD_TIMEOUT_S = 960.0


@pytest.fixture(autouse=True)
def _hard_timeout():
    """End the process where a test outlives pytest-timeout: ``faulthandler``'s
    watchdog is a C thread, so it fires even where the hang holds the interpreter
    lock (pytest-timeout's thread cannot then run); it prints every thread's stack to
    the real stderr (the worker's, which xdist passes on) and exits."""
    faulthandler.dump_traceback_later(_HARD_TIMEOUT_S, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(autouse=True)
def _free_compiled_programs():
    """Free compiled programs when a worker holds many memory maps.

    XLA:CPU keeps each compiled program in memory maps of its own (~700 per fit); an
    xdist worker that runs a few hundred tests passes Linux's ``vm.max_map_count`` and
    the next compilation segfaults (seen in CI). ``jaxvb.fit`` guards users at 60% of
    the limit with a warning; the tests clear quietly at 30,000 maps, below it (each
    clearing costs the next tests the small programs they compile again).
    """
    yield
    n = _platform.num_maps()
    if n is not None and n > 30_000:
        jax.clear_caches()
