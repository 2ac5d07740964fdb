"""What the paper's experiments compare the fixed-form approximation to."""

from jaxvb.baselines import vbem_probit

__all__ = ["vbem_probit"]
