"""Save and load results: the public path of :mod:`jaxvb.interop.io`."""

from jaxvb.interop.io import FAMILIES, FORMAT_VERSION, load, save

__all__ = ["FAMILIES", "FORMAT_VERSION", "load", "save"]
