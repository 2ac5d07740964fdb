"""``fit``'s checks of its arguments, written once, run before anything compiles."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb import _static
from jaxvb.core._indices import out_of_bounds_reads
from jaxvb.families._base import Family, is_concrete
from jaxvb.methods import Method, resolve


@_static.memo_by_signature
def check_log_joint(log_joint, q0):
    """``q0`` is a family or the ShapeDtypeStruct of a starting point (a trace of
    ``log_joint``: kept per model structure and shapes)."""
    if isinstance(q0, jax.ShapeDtypeStruct):
        x, what = q0, f"the starting point x0 of shape {q0.shape}"
    else:
        x = jax.ShapeDtypeStruct(q0.event_shape, q0.dtype)
        what = f"q0 = {type(q0).__name__} with event shape {q0.event_shape}"
    try:
        closed, out = jax.make_jaxpr(log_joint, return_shape=True)(x)
    except Exception as e:
        raise ValueError(
            f"log_joint failed on a draw of shape {x.shape} ({x.dtype}) from {what}: {e}. "
            "Does q0 have the dimension log_joint expects?"
        ) from e
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(f"log_joint must return one array, got {type(out).__name__}")
    reads = out_of_bounds_reads(closed)
    if reads:
        raise ValueError(
            f"log_joint reads outside an array at a draw of shape {x.shape} from {what}: "
            f"{'; '.join(reads[:3])}. JAX clamps such an index (x[1] of a one-element x "
            "reads x[0]) instead of raising, so the fit would be of another model. Does "
            "q0 have the dimension log_joint expects?"
        )
    if out.shape != ():
        raise ValueError(
            f"log_joint must return a scalar, got shape {out.shape}. Sum the terms of the "
            "log density (e.g. jnp.sum(...)), and check that q0 has the model's dimension."
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"log_joint must return a floating-point scalar, got dtype {out.dtype}. "
            "Return the log density itself, not a count or a boolean."
        )
    return out.dtype


def check_key(key) -> None:
    """A JAX random key: a typed key (``jax.random.key``) or a raw ``uint32[2]`` one
    (``jax.random.PRNGKey``)."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if key.shape == ():
            return
    elif dtype == jnp.uint32 and getattr(key, "shape", None) == (2,):
        return
    raise TypeError(
        "key must be one JAX random key, jax.random.key(seed), got "
        + (
            f"an array of dtype {dtype} and shape {key.shape}"
            if dtype is not None
            else type(key).__name__
        )
        + ". Under jax.vmap, map over jax.random.split(key, n)."
    )


def validate(q0, key, options: dict) -> tuple[Method, float]:
    """``(method, step_size)`` for a fit from ``q0`` with ``options`` (``fit``'s
    keyword arguments), or a clear error naming the argument and the remedy.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jaxvb.core.validate import validate
      >>> q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
      >>> options = dict(method=None, num_steps=100, num_draws=1, max_backtracks=8,
      ...                num_eval_draws=1000, antithetic=False, step_size=None)
      >>> method, w = validate(q0, jax.random.key(0), options)
      >>> method.name, w
      ('hessian', 0.1)
      >>> validate(q0, jax.random.key(0), dict(options, num_steps=1))
      Traceback (most recent call last):
      ...
      ValueError: num_steps must be an integer >= 2, got 1
    """
    num_steps, num_draws = options["num_steps"], options["num_draws"]
    max_backtracks, num_eval_draws = options["max_backtracks"], options["num_eval_draws"]
    antithetic, step_size = options["antithetic"], options["step_size"]
    if not isinstance(q0, Family):
        raise TypeError(
            f"q0 must be a jaxvb family such as jaxvb.Gaussian(mean, cov), or a starting "
            f"point x0, got {type(q0).__name__}"
        )
    if math.prod(q0.event_shape) == 0:
        raise ValueError(
            f"q0 = {type(q0).__name__} has event shape {q0.event_shape}, dimension 0; "
            "there is nothing to fit"
        )
    if jnp.dtype(q0.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise TypeError(
            f"q0 has dtype {jnp.dtype(q0.dtype).name}; jaxvb fits in float32 or float64 "
            "(float16 and bfloat16 lose the regression statistics to round-off). Build "
            "q0 from float32 or float64 arrays."
        )
    m = resolve(options["method"], q0)
    if not isinstance(num_steps, (int, np.integer)) or num_steps < 2:
        raise ValueError(f"num_steps must be an integer >= 2, got {num_steps!r}")
    if not isinstance(max_backtracks, (int, np.integer)) or max_backtracks < 0:
        raise ValueError(f"max_backtracks must be an integer >= 0, got {max_backtracks!r}")
    if not isinstance(num_draws, (int, np.integer)) or num_draws < 1:
        raise ValueError(f"num_draws must be a positive integer, got {num_draws!r}")
    if not isinstance(num_eval_draws, (int, np.integer)) or num_eval_draws < 2:
        raise ValueError(
            "num_eval_draws (draws of q for the diagnostics) must be an integer >= 2: a "
            f"variance needs two draws; got {num_eval_draws!r}"
        )
    per_step = num_draws * (2 if antithetic else 1)
    averaged = (num_steps - num_steps // 2) * per_step
    needed = m.min_draws(q0)
    if averaged < needed:
        least = 2 * math.ceil(needed / per_step)
        raise ValueError(
            f"num_steps={num_steps} is too small for {m.name} on {type(q0).__name__}: the "
            f"average over the second half holds {averaged} draws, but solving for its "
            f"{needed} unknowns needs at least {needed}. Use num_steps >= {least} (the "
            "paper's 2(k + 1) with one draw per step), or more draws per step."
        )
    if antithetic:  # traced only: raises where the family has no antithetic
        jax.eval_shape(lambda k: q0.antithetic(q0.noise(k)), key)
    if step_size is None:
        step_size = 1.0 / math.sqrt(num_steps)
    if is_concrete(step_size) and not 0.0 < float(step_size) <= 1.0:
        raise ValueError(f"step_size must lie in (0, 1], got {step_size}")
    return m, step_size


__all__ = ["validate"]
