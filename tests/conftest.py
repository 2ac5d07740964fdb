"""Tests run in float64 (one module checks float32 explicitly) on the CPU."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
