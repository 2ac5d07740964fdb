"""The version of jaxvb, in one place (the package, saved files and ArviZ records)."""

__version__ = "0.1.0"
