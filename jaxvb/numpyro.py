"""NumPyro models in jaxvb: the public path of :mod:`jaxvb.interop.numpyro`.

``jaxvb.numpyro.fit(model, key, *args, num_steps=...)`` fits a NumPyro model's
continuous latent sites on their unconstrained scale; ``jaxvb.numpyro.log_joint``
gives the model's log joint as a function of one flat vector.
"""

from jaxvb.interop.numpyro import *  # noqa: F403  (its __all__ is this module's)
from jaxvb.interop.numpyro import __all__  # noqa: F401
