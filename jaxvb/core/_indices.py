"""Constant indices that fall outside an array, found in a traced log joint.

JAX clamps an out-of-bounds index instead of raising (``x[1]`` of a one-element ``x``
reads ``x[0]``), so a ``q0`` with fewer dimensions than the model reads gives a fit of
the wrong model with status 0. Every index the user writes as a Python int (or a
constant array) is a constant in the traced program: this module folds those
constants through the few integer operations JAX's indexing emits (the wrap of
negative indices) and checks the ``dynamic_slice`` and ``gather`` reads against the
shapes they read from. Indices computed from traced values are not checked. Why not
``jax.experimental.checkify``: it would compile and run the log joint once more,
seconds on the first call for a large model; this reads the trace ``fit`` makes anyway.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.extend import core as ext_core


# Integer operations worth folding (what indexing emits for an index and its wrap),
# evaluated in NumPy: an eager JAX op would compile a program of its own per shape.
def _broadcast_in_dim(x, shape, broadcast_dimensions, **_):
    expanded = np.ones(len(shape), int)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = x.shape[src]
    return np.broadcast_to(x.reshape(expanded), shape)


def _select_n(which, *cases):
    return np.choose(which.astype(int), np.broadcast_arrays(*cases))


_FOLD = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg": lambda a: -a,
    "max": np.maximum,
    "min": np.minimum,
    "rem": np.fmod,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "select_n": _select_n,
}
_FOLD_PARAMS = {
    "convert_element_type": lambda x, new_dtype, **_: x.astype(new_dtype),
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": lambda x, new_sizes, **_: x.reshape(new_sizes),
    "squeeze": lambda x, dimensions, **_: np.squeeze(x, axis=tuple(dimensions)),
    "concatenate": lambda *xs, dimension, **_: np.concatenate(xs, axis=dimension),
}
_MAX_FOLD = 4096  # elements: constant index arrays larger than this are not folded


def _value(v, env):
    if isinstance(v, ext_core.Literal):
        return np.asarray(v.val)
    return env.get(v)


def out_of_bounds_reads(closed) -> list[str]:
    """Descriptions of the constant out-of-bounds reads in a ``ClosedJaxpr``."""
    env = _constants(closed.jaxpr.constvars, closed.consts)
    found: list[str] = []
    _walk(closed.jaxpr, env, found)
    return found


def _constants(constvars, consts) -> dict:
    """The small integer constants among a program's captured values (a traced one,
    e.g. data closed over under ``vmap``, is not a constant)."""
    env = {}
    for var, const in zip(constvars, consts, strict=True):
        if isinstance(const, jax.core.Tracer):
            continue
        dtype = getattr(const, "dtype", None)
        if dtype is None or not np.issubdtype(dtype, np.integer):
            continue
        if np.size(const) <= _MAX_FOLD:
            env[var] = np.asarray(const)
    return env


def _walk(jaxpr, env, found) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [_value(v, env) for v in eqn.invars]
        if name == "dynamic_slice":
            _check_dynamic_slice(eqn, ins, found)
        elif name == "gather":
            _check_gather(eqn, ins, found)
        elif (name in _FOLD or name in _FOLD_PARAMS) and all(i is not None for i in ins):
            _fold(eqn, ins, env)
        # nested programs with constant inputs (jit, custom derivatives, closed calls)
        for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
            sub = eqn.params.get(key)
            if sub is None:
                continue
            inner = sub.jaxpr if isinstance(sub, ext_core.ClosedJaxpr) else sub
            if not isinstance(inner, ext_core.Jaxpr) or len(inner.invars) != len(ins):
                continue
            sub_env = {}
            if isinstance(sub, ext_core.ClosedJaxpr):
                sub_env = _constants(inner.constvars, sub.consts)
            for var, val in zip(inner.invars, ins, strict=True):
                if val is not None:
                    sub_env[var] = val
            _walk(inner, sub_env, found)


def _fold(eqn, ins, env) -> None:
    ins = [np.asarray(i) for i in ins]
    if not all(np.issubdtype(i.dtype, np.integer) or i.dtype == bool for i in ins):
        return
    name = eqn.primitive.name
    try:
        if name in _FOLD:
            out = _FOLD[name](*ins)
        else:
            out = _FOLD_PARAMS[name](*ins, **eqn.params)
    except Exception:  # noqa: BLE001 - folding is best effort: an unknown form is skipped
        return
    out = np.asarray(out)
    if out.size <= _MAX_FOLD and len(eqn.outvars) == 1:
        env[eqn.outvars[0]] = out


def _check_dynamic_slice(eqn, ins, found) -> None:
    operand = eqn.invars[0].aval
    sizes = eqn.params["slice_sizes"]
    for axis, start in enumerate(ins[1:]):
        if start is None:
            continue
        start = int(np.asarray(start))
        dim = operand.shape[axis]
        if start < 0 or start + sizes[axis] > dim:
            found.append(_describe(operand.shape, axis, start, sizes[axis]))


def _check_gather(eqn, ins, found) -> None:
    indices = ins[1]
    if indices is None:
        return
    params = eqn.params
    mode = str(params.get("mode", ""))
    if "PROMISE_IN_BOUNDS" not in mode:
        return  # CLIP or FILL_OR_DROP: asked for (jnp.take's modes), so deliberate
    dims = params["dimension_numbers"]
    if getattr(dims, "operand_batching_dims", ()):
        return
    operand = eqn.invars[0].aval
    starts = np.asarray(indices).reshape(-1, len(dims.start_index_map))
    for j, axis in enumerate(dims.start_index_map):
        limit = operand.shape[axis] - params["slice_sizes"][axis]
        bad = (starts[:, j] < 0) | (starts[:, j] > limit)
        if np.any(bad):
            first = int(starts[np.argmax(bad), j])
            found.append(_describe(operand.shape, axis, first, params["slice_sizes"][axis]))


def _describe(shape, axis, start, size) -> str:
    where = "index" if size == 1 else f"slice of {size} from index"
    return f"{where} {start} along axis {axis} of an array of shape {tuple(shape)}"
