"""Methods: how the regression statistics are estimated and solved."""

from jaxvb.methods._base import Method
from jaxvb.methods.hessian import HessianStats, hessian
from jaxvb.methods.regression import RegressionStats, expected_outer_stats, regression

__all__ = [
    "HessianStats",
    "Method",
    "RegressionStats",
    "expected_outer_stats",
    "hessian",
    "regression",
]
