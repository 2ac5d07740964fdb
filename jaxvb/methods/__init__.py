"""Methods: how the regression statistics are estimated and solved."""

from jaxvb.methods._base import Method
from jaxvb.methods.regression import RegressionStats, expected_outer_stats, regression

__all__ = ["Method", "RegressionStats", "expected_outer_stats", "regression"]
