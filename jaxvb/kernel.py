"""The iteration as a small kernel anyone can drive: ``init``, ``step``, ``finalize``.

The public path of :mod:`jaxvb.core.kernel`, where the kernel and its documentation
live.
"""

from jaxvb.core.kernel import (
    Draws,
    Info,
    Record,
    State,
    draw,
    finalize,
    init,
    record,
    start_record,
    step,
    update,
)

__all__ = [
    "Draws",
    "Info",
    "Record",
    "State",
    "draw",
    "finalize",
    "init",
    "record",
    "start_record",
    "step",
    "update",
]
