"""Log joints of the paper's examples and of conjugate models with known answers."""

from jaxvb.models import beta_binomial, conjugate, probit

__all__ = ["beta_binomial", "conjugate", "probit"]
