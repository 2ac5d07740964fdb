"""Comparisons shared by the test modules."""

import os

import jax
import numpy as np
import pytest


def rel_err(a, b):
    """The largest elementwise relative error of ``a`` against ``b``."""
    # in float64: the floor 1e-300 is 0 in float32, and 0 / 0 a NaN that max() drops
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def family_rel_err(q, target):
    """The largest relative error over the parameters of two families of one type."""
    leaves_q = jax.tree_util.tree_leaves(q)
    leaves_t = jax.tree_util.tree_leaves(target)
    # np.max, not max(): a NaN anywhere must fail the comparison, not be skipped
    return float(np.max([rel_err(a, b) for a, b in zip(leaves_q, leaves_t, strict=True)]))


def tiered(values, slow=()):
    """``values`` for ``pytest.mark.parametrize``, those in ``slow`` in the slow tier."""
    return [pytest.param(v, marks=pytest.mark.slow) if v in slow else v for v in values]


def env_with_xla_schedule(**extra) -> dict:
    """The environment for a subprocess that tests jaxvb against jaxlib 0.10's hang:
    the suite's without its scheduler flag (``tests/conftest.py``), which keeps the
    hang away from most programs (not all: a dense field's draws hung with it,
    ``test_latent``), so that the subprocess runs under XLA's default schedule."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if "concurrency_optimized_scheduler" not in f]
    return dict(os.environ, XLA_FLAGS=" ".join(flags), **extra)
