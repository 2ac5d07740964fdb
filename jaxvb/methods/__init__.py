"""Methods: how the regression statistics are estimated and solved."""

from jaxvb.methods._base import Method, trust_region, value_grad_hessian
from jaxvb.methods._registry import names, register, resolve
from jaxvb.methods.gradient import MEAN_CHOLESKY, GradientStats, Parameterization, gradient
from jaxvb.methods.hessian import HessianStats, hessian
from jaxvb.methods.mixture import MixtureStats, mixture
from jaxvb.methods.regression import RegressionStats, expected_outer_stats, regression
from jaxvb.methods.sites import SiteStats, sites

__all__ = [
    "MEAN_CHOLESKY",
    "GradientStats",
    "HessianStats",
    "Parameterization",
    "gradient",
    "Method",
    "RegressionStats",
    "expected_outer_stats",
    "hessian",
    "mixture",
    "MixtureStats",
    "names",
    "register",
    "resolve",
    "regression",
    "SiteStats",
    "sites",
    "trust_region",
    "value_grad_hessian",
]
