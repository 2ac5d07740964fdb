"""Tests run in float64 (float32 is checked explicitly where it matters) on the CPU.

XLA's backend optimisation is turned off for the tests: they check numbers, not speed,
and the default level spends most of the suite's time compiling. Benchmarks and users
keep the default.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
).strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
