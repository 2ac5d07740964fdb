"""What the paper's experiments compare the fixed-form approximation to.

``numpyro_probit`` imports NumPyro only when its functions run, so importing this
package never needs it.
"""

from jaxvb.baselines import numpyro_probit, vbem_probit

__all__ = ["numpyro_probit", "vbem_probit"]
