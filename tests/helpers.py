"""Comparisons shared by the test modules."""

import jax
import numpy as np
import pytest


def rel_err(a, b):
    """The largest elementwise relative error of ``a`` against ``b``."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def family_rel_err(q, target):
    """The largest relative error over the parameters of two families of one type."""
    leaves_q = jax.tree_util.tree_leaves(q)
    leaves_t = jax.tree_util.tree_leaves(target)
    return max(rel_err(a, b) for a, b in zip(leaves_q, leaves_t, strict=True))


def tiered(values, slow=()):
    """``values`` for ``pytest.mark.parametrize``, those in ``slow`` in the slow tier."""
    return [pytest.param(v, marks=pytest.mark.slow) if v in slow else v for v in values]
