"""Methods by name, and which method a family gets by default.

Each method registers itself in its own file::

    register("hessian", hessian, default_for=(Gaussian,))

so that a new method is one file and one export line, and :func:`jaxvb.fit` names no
method and no family: it asks :func:`resolve`.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxvb.methods._base import Method

_FACTORIES: dict[str, Callable[[], Method]] = {}
_DEFAULTS: dict[type, str] = {}


def register(
    name: str, factory: Callable[[], Method], *, default_for: tuple[type, ...] = ()
) -> None:
    """Makes ``fit(..., method=name)`` call ``factory()``; the default for ``default_for``.

    A family gets the default registered for the nearest class in its method
    resolution order, so a default for :class:`~jaxvb.ExponentialFamily` covers every
    family that has no more specific one.

    Example:
      >>> import jaxvb
      >>> from jaxvb.methods import _registry
      >>> _registry.register("my_regression", lambda: jaxvb.methods.regression("analytic"))
      >>> _registry.resolve("my_regression", jaxvb.Gamma(1.0, 1.0)).name
      'regression(analytic, init=analytic)'
      >>> del _registry._FACTORIES["my_regression"]
    """
    if name in _FACTORIES and _FACTORIES[name] is not factory:
        raise ValueError(f"a method named {name!r} is registered already")
    _FACTORIES[name] = factory
    for family in default_for:
        if family in _DEFAULTS and _DEFAULTS[family] != name:
            raise ValueError(
                f"{family.__name__} has a default method already: {_DEFAULTS[family]!r}"
            )
        _DEFAULTS[family] = name


def names() -> list[str]:
    """The registered method names, sorted.

    Example:
      >>> import jaxvb
      >>> jaxvb.methods.names()
      ['gradient', 'hessian', 'latent_gaussian', 'mixture', 'regression', 'sites']
    """
    return sorted(_FACTORIES)


def resolve(method: str | Method | None, q0) -> Method:
    """The :class:`Method` that ``method`` names (``None``: ``q0``'s default).

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.methods import resolve
      >>> resolve(None, jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))).name
      'hessian'
      >>> resolve(None, jaxvb.Gamma(1.0, 1.0)).name
      'regression(joint, init=analytic)'
      >>> resolve(None, jaxvb.GaussianMixture.around(
      ...     jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)), 3)).name
      'mixture(stratified)'
    """
    if isinstance(method, Method):
        return method
    if method is None:
        for cls in type(q0).__mro__:
            if cls in _DEFAULTS:
                return _FACTORIES[_DEFAULTS[cls]]()
        raise TypeError(
            f"no default method for {type(q0).__name__}; pass method= one of {names()}"
        )
    if isinstance(method, str):
        if method not in _FACTORIES:
            raise ValueError(f"unknown method {method!r}; choose from {names()}")
        return _FACTORIES[method]()
    raise TypeError(f"method must be a name or a jaxvb.methods.Method, got {method!r}")
