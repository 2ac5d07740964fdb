"""Many fits at once, spread over every visible device.

:func:`fit_batched` is ``jax.vmap`` of a one-data-set fit, compiled once with
``jax.jit`` and sharded over the leading (batch) axis with JAX's own machinery: a
one-axis :class:`jax.sharding.Mesh` of the devices, a
``NamedSharding(mesh, PartitionSpec("batch"))`` for the inputs (``jax.device_put``)
and the outputs (``jax.lax.with_sharding_constraint``). XLA then runs each device's
block of fits on that device, with no communication between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

T = TypeVar("T")

#: The name of the mesh axis the batch is split over.
BATCH_AXIS = "batch"


def fit_batched(
    fit_one: Callable[..., T],
    *batched_args: Any,
    devices: Sequence[jax.Device] | None = None,
    batch_size: int | None = None,
) -> T:
    """``jax.vmap(fit_one)(*batched_args)``, sharded over devices along the batch axis.

    Every leaf of every argument has a leading axis of one size ``B`` (``B`` data
    sets, ``B`` keys, ...); ``fit_one`` maps one element of each (no batch axis) to a
    pytree of arrays, typically a :class:`jaxvb.Result`. The batch is split into equal
    blocks, one per device, and all blocks run at once: on ``n`` GPUs each fits
    ``B / n`` data sets. ``B`` is padded to a multiple of ``n`` by repeating the last
    element, and the padding's results are dropped.

    The results are ``B``-long arrays sharded over the devices (see
    ``result.q.mean.sharding``) when ``B`` is a multiple of the number of devices;
    otherwise the padding is sliced off and JAX keeps the (unevenly divisible)
    results replicated on every device. Either way they equal ``jax.vmap(fit_one)``
    on one device up to rounding (the same keys give the same fits). Things shared by
    all fits (``q0``, settings) belong in ``fit_one``'s closure; pass the same
    ``fit_one`` object to reuse its compiled program.

    Args:
      fit_one: ``(*one_element_of_each_arg) -> pytree of arrays``; traceable (it
        runs under ``jax.jit`` and ``jax.vmap``).
      *batched_args: pytrees of arrays (or typed key arrays) with a common leading
        axis of size ``B >= 1``.
      devices: the devices to split the batch over; default ``jax.devices()``, every
        device of the default backend (after ``jax.distributed.initialize()``, those
        of every process).
      batch_size: at most this many fits at once on each device (``jax.lax.map`` with
        ``batch_size``: vmapped groups one after another), which bounds memory; default
        all of a device's block at once. Memory grows with the fits run at once
        (``benchmarks/results/gpu.json`` records the peak for the paper's probit fit
        with the default diagnostics). The results are the same either way, up to
        rounding.

    Returns:
      ``fit_one``'s pytree with a leading axis of size ``B`` on every leaf.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> def fit_one(center, key):  # one data set (here a centre) and one key
      ...     log_joint = lambda x: -0.5 * jnp.sum((x - center) ** 2)
      ...     return jaxvb.fit(log_joint, q0, key, num_steps=20)
      >>> centers = jnp.arange(5.0)[:, None]
      >>> keys = jax.random.split(jax.random.key(0), 5)
      >>> res = jaxvb.fit_batched(fit_one, centers, keys)
      >>> res.q.mean[:, 0].round(6).tolist()
      [0.0, 1.0, 2.0, 3.0, 4.0]
    """
    if not callable(fit_one):
        raise TypeError(f"fit_one must be a function of one batch element, got {fit_one!r}")
    leaves = jax.tree_util.tree_leaves(batched_args)
    if not leaves:
        raise ValueError(
            "fit_batched needs at least one batched argument (e.g. an array of keys) "
            "whose leading axis is the batch"
        )
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
    if None in sizes or len(sizes) != 1 or 0 in sizes:
        shapes = [tuple(np.shape(leaf)) for leaf in leaves]
        raise ValueError(
            "every leaf of the batched arguments must have the same leading (batch) "
            f"axis of size >= 1; got shapes {shapes}"
        )
    (size,) = sizes
    if batch_size is not None and (
        not isinstance(batch_size, int | np.integer) or batch_size < 1
    ):
        raise ValueError(
            f"batch_size must be a positive integer or None, got {batch_size!r}"
        )
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("devices is empty")
    pad = -size % len(devices)
    if pad:  # repeat the last element: the padding fits are real fits, then dropped
        index = np.minimum(np.arange(size + pad), size - 1)
        batched_args = jax.tree_util.tree_map(lambda a: a[index], batched_args)
    sharding = NamedSharding(
        Mesh(np.asarray(devices), (BATCH_AXIS,)), PartitionSpec(BATCH_AXIS)
    )
    if batch_size is None or batch_size >= (size + pad) // len(devices):
        out = _sharded_vmap(fit_one, sharding, *jax.device_put(batched_args, sharding))
    else:  # (devices, per device): vmapped over devices, mapped in groups within
        per = (size + pad) // len(devices)
        blocks = jax.tree_util.tree_map(
            lambda a: a.reshape((len(devices), per) + a.shape[1:]), batched_args
        )
        out = _sharded_map(
            fit_one, sharding, int(batch_size), *jax.device_put(blocks, sharding)
        )
        out = jax.tree_util.tree_map(
            lambda a: a.reshape((per * len(devices),) + a.shape[2:]), out
        )
    if pad:
        out = jax.tree_util.tree_map(lambda a: a[:size], out)
    return out


@partial(jax.jit, static_argnums=(0, 1))
def _sharded_vmap(fit_one, sharding, *batched_args):
    out = jax.vmap(fit_one)(*batched_args)
    return jax.tree_util.tree_map(
        lambda a: jax.lax.with_sharding_constraint(a, sharding), out
    )


@partial(jax.jit, static_argnums=(0, 1, 2))
def _sharded_map(fit_one, sharding, batch_size, *blocks):
    def one_device(*block):
        return jax.lax.map(lambda xs: fit_one(*xs), block, batch_size=batch_size)

    out = jax.vmap(one_device)(*blocks)
    return jax.tree_util.tree_map(
        lambda a: jax.lax.with_sharding_constraint(a, sharding), out
    )
