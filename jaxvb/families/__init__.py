"""Approximating families: exponential families as immutable pytrees."""

from jaxvb.families._base import ExponentialFamily, Family, ScalarFamily, register_family
from jaxvb.families.beta import Beta
from jaxvb.families.exponential import Exponential
from jaxvb.families.gamma import Gamma
from jaxvb.families.gaussian import Gaussian
from jaxvb.families.inverse_gamma import InverseGamma
from jaxvb.families.mixture import GaussianMixture

__all__ = [
    "Beta",
    "Exponential",
    "ExponentialFamily",
    "Family",
    "Gamma",
    "Gaussian",
    "GaussianMixture",
    "InverseGamma",
    "ScalarFamily",
    "register_family",
]
