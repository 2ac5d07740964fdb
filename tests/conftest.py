"""Tests run in float64 (float32 is checked explicitly where it matters) on the CPU.

XLA's backend optimisation is turned off for the tests: they check numbers, not speed,
and the default level spends most of the suite's time compiling. Benchmarks and users
keep the default.

Compiled programs persist in JAX's compilation cache (``.jax_cache/`` at the top of
the repository, git-ignored; ``JAX_COMPILATION_CACHE_DIR`` overrides it, and
``JAX_ENABLE_COMPILATION_CACHE=false`` turns it off). It is set through environment
variables, so that the xdist workers, the notebook kernels and the benchmark
subprocesses the tests start all read and fill the same cache. Its key holds the
program, the jaxlib version and ``XLA_FLAGS``: a subprocess with other flags (or a
changed program) compiles and stores its own entry, never reuses a wrong one. The
cache only saves time; a test never depends on it (CI starts from an empty one). Delete
the directory to reclaim the space: nothing evicts old entries.

Tiers (markers registered in pyproject.toml): ``slow`` for long statistical runs and
large fits, ``integration`` for notebooks, benchmark quick runs, subprocesses and live
NUTS runs. ``-m "not slow and not integration"`` is the fast tier.
"""

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".jax_cache")
)
# With the optimiser off most programs compile in well under JAX's default threshold
# of 1 s, yet together they are the suite's time: cache every one, whatever its size.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
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
