"""Passing a log joint to a compiled program: its arrays traced, the rest static.

A plain function is static (compiled once per function object). A log joint that is a
pytree -- ``jax.tree_util.Partial(fn, data)``, a registered class holding its data --
is split: its array leaves become arguments of the compiled program and the rest (the
tree structure, functions, hashable settings) its static part, so a new data set of
the same shapes and dtypes reuses the program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


class Static:
    """The static part of a log joint: hashable, compared by value.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> def model(x, data):
      ...     return -jnp.sum((x - data) ** 2)
      >>> arrays, static = partition(jax.tree_util.Partial(model, jnp.ones(2)))
      >>> arrays2, static2 = partition(jax.tree_util.Partial(model, jnp.zeros(2)))
      >>> static == static2, hash(static) == hash(static2)   # one compiled program
      (True, True)
      >>> float(combine(arrays2, static2)(jnp.ones(2)))
      -2.0
    """

    __slots__ = ("treedef", "leaves")

    def __init__(self, treedef, leaves: tuple[Hashable, ...]):
        self.treedef = treedef
        self.leaves = leaves

    def __hash__(self):
        return hash((self.treedef, self.leaves))

    def __eq__(self, other):
        return (
            isinstance(other, Static)
            and self.treedef == other.treedef
            and self.leaves == other.leaves
        )


_ARRAY = object()  # where a traced leaf goes


class _Identity:
    """An unhashable static leaf (a dataclass instance with ``__eq__``, say), hashed
    and compared by identity, as a plain function is: one program per object."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return id(self.value)

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.value is self.value


def _hashable(leaf: Any) -> Any:
    try:
        hash(leaf)
    except TypeError:
        return _Identity(leaf)
    return leaf


def partition(log_joint: Callable, abstract: bool = False) -> tuple[list[Any], Static]:
    """``(arrays, static)``: the array leaves of ``log_joint`` and the rest of it
    (``abstract``: ``jax.ShapeDtypeStruct`` leaves, as ``jax.eval_shape`` returns a
    log joint, count as arrays)."""
    leaves, treedef = jax.tree_util.tree_flatten(log_joint)

    def is_array(leaf):
        return _is_array(leaf) or (abstract and isinstance(leaf, jax.ShapeDtypeStruct))

    arrays = [leaf for leaf in leaves if is_array(leaf)]
    rest = tuple(_ARRAY if is_array(leaf) else _hashable(leaf) for leaf in leaves)
    return arrays, Static(treedef, rest)


def hashable(static: Static) -> bool:
    """Whether ``static`` can key a compiled program (a pytree's auxiliary data may
    not be hashable)."""
    try:
        hash(static)
    except TypeError:
        return False
    return True


def combine(arrays: list[Any], static: Static) -> Callable:
    """The log joint that :func:`partition` split into ``arrays`` and ``static``."""
    it = iter(arrays)
    leaves = [
        next(it) if leaf is _ARRAY else leaf.value if isinstance(leaf, _Identity) else leaf
        for leaf in static.leaves
    ]
    return jax.tree_util.tree_unflatten(static.treedef, leaves)


def signature(*objs: Any) -> Hashable | None:
    """A hashable key of ``objs``' structure, static parts and the shapes and dtypes
    of their arrays: all that a shape computation of them (``jax.eval_shape``, a
    trace) sees. ``None`` where a static part is not hashable."""
    key = []
    for obj in objs:
        arrays, static = partition(obj, abstract=True)
        avals = tuple(
            (
                tuple(a.shape),
                str(a.dtype),
                bool(getattr(getattr(a, "aval", a), "weak_type", False)),
            )
            for a in arrays
        )
        key.append((static, avals))
    key = tuple(key)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def memo_by_signature(fn: Callable, maxsize: int = 64) -> Callable:
    """``fn`` with its results kept by the :func:`signature` of its arguments, for a
    function of shapes only (a check by ``jax.eval_shape``, a trace): a second fit of
    the same model, with new data of the same shapes, does not trace it again (2-20
    ms a call). Errors are not kept; the oldest result goes past ``maxsize``."""
    cache: dict = {}

    @functools.wraps(fn)
    def call(*args):
        key = signature(*args)
        if key is None:
            return fn(*args)
        if key in cache:
            return cache[key]
        out = fn(*args)
        if len(cache) >= maxsize:
            cache.pop(next(iter(cache)))
        cache[key] = out
        return out

    call.cache_clear = cache.clear
    return call
