"""Standard normal noise for the families' draws, cheap to compile.

``jax.random.normal`` makes a normal as ``sqrt(2) erfinv(w)``; in float64 XLA expands
``erfinv`` into a long two-branch polynomial, and every place a program draws normals
compiles its own copy of it (with the threefry rounds before it). A fit's program draws
in several places (the step, the offset, the diagnostics' chunks, the start's draws),
so on XLA:CPU those copies are a sizeable share of a first fit's compile time; the
Box-Muller transform below compiles to a few elementwise operations.

The draws are exact standard normals, one per pair of uniforms (``sqrt(-2 log u1)
cos(2 pi u2)``, Box and Muller 1958; the sine's twin is not used, so that normal ``i``
depends on the key and ``i`` alone: JAX's threefry fills an array by position, and an
array of normals is a prefix of a longer one, as ``jax.random.normal``'s is, up to the
last bit: XLA's vectorised ``log`` and ``cos`` may round a lane apart from the loop's
tail). ``u1``
is ``1 - uniform``, in ``(0, 1]``: the largest ``|z|`` is ``sqrt(-2 log 2^-52)`` = 8.5
in float64 and 5.6 in float32, as for ``jax.random.normal`` (its uniforms' grid bounds
its tails alike).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = ["normal"]


def normal(key: jax.Array, shape: Sequence[int] = (), dtype=float) -> jax.Array:
    """Standard normals of ``shape`` and ``dtype`` from ``key`` (Box-Muller).

    Example:
      >>> import jax
      >>> from jaxvb._random import normal
      >>> z = normal(jax.random.key(0), (3,))
      >>> bool(jax.numpy.allclose(normal(jax.random.key(0), (4,))[:3], z, rtol=1e-6))
      True
    """
    dtype = jnp.dtype(dtype) if dtype is not float else jnp.result_type(float)
    u = jax.random.uniform(key, (*tuple(shape), 2), dtype)
    radius = jnp.sqrt(-2.0 * jnp.log(1.0 - u[..., 0]))  # 1 - u: exact, in (0, 1]
    return radius * jnp.cos((2.0 * math.pi) * u[..., 1])
