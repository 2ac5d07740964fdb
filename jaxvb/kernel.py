"""The iteration as a small kernel anyone can drive: ``init``, ``step``, ``finalize``.

The public path of :mod:`jaxvb.core.kernel`, where the kernel and its documentation
live.
"""

from jaxvb.core.kernel import Info, State, finalize, init, step

__all__ = ["Info", "State", "finalize", "init", "step"]
