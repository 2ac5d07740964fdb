"""The iteration as a small kernel anyone can drive: ``init``, ``step``, ``finalize``.

The public path of :mod:`jaxvb.core.kernel`, where the kernel and its documentation
live; its public names are this module's.
"""

from jaxvb.core.kernel import *  # noqa: F403 (the same names, under their public path)
from jaxvb.core.kernel import __all__  # noqa: F401
