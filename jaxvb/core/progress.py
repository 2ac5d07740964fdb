"""Progress reports from inside ``fit``'s compiled loop.

A report is a ``lax.cond`` in the scan body, taken every ``every`` steps, that
estimates the current iterate's ELBO and R^2 from a few fresh draws and hands them to
the host with ``jax.debug.callback``. When ``fit`` has no ``progress`` the cond is not
built at all (``progress`` is a static argument), so the compiled loop has no callback
and no extra work. The report's draws come from a key of their own, folded in from a
key the iteration never uses, so a fit with reports is bit for bit the fit without.

Under ``vmap`` JAX would call a debug callback once per batch element (it unrolls them);
the callback here has its own batching rule instead, so a batched fit makes one call per
report with arrays of the batch shape.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from jaxvb import diagnostics


class ProgressInfo(NamedTuple):
    """One progress report of :func:`jaxvb.fit`, as its callback receives it.

    The estimates are of the current iterate ``q_{t+1}`` (the approximation after
    step ``t``), from ``num_draws`` fresh draws of it (see :class:`Progress`); the
    fit's result is the average over the second half of the steps, so the last report
    is close to, but not the same as, ``result.elbo`` and ``result.r_squared``.

    Attributes:
      step: ``t``, the step just taken, ``1 .. num_steps`` (a Python int).
      num_steps: ``N``, the fit's number of steps.
      elbo: ELBO estimate, ``E_q[log p - log q]`` (a NumPy array: shape ``()`` for one
        fit, the batch shape under ``jax.vmap``).
      elbo_stderr: its Monte Carlo standard error (same shape).
      r_squared: ``1 - Var_q[log p - log q] / Var_q[log p]`` (same shape).
      status: the :class:`jaxvb.Status` flags raised so far (same shape).

    Example:
      A callback for ``fit(..., progress=jaxvb.Progress(every=10, callback=show))``:

      >>> import numpy as np, jaxvb
      >>> def show(info):
      ...     print(f"{info.step}/{info.num_steps}: ELBO {float(info.elbo):.2f}, "
      ...           f"R^2 {float(info.r_squared):.3f}")
      >>> show(jaxvb.ProgressInfo(step=50, num_steps=100, elbo=np.array(-13.0),
      ...                         elbo_stderr=np.array(0.02), r_squared=np.array(0.976),
      ...                         status=np.array(0)))
      50/100: ELBO -13.00, R^2 0.976
    """

    step: int
    num_steps: int
    elbo: np.ndarray
    elbo_stderr: np.ndarray
    r_squared: np.ndarray
    status: np.ndarray


@dataclasses.dataclass(frozen=True)
class Progress:
    """How :func:`jaxvb.fit` reports its progress (its ``progress`` argument).

    ``fit(..., progress=k)`` is ``Progress(every=k)``: a line on standard error every
    ``k`` steps. ``fit(..., progress=fn)`` is ``Progress(every=ceil(num_steps / 10),
    callback=fn)``: about ten calls of ``fn``.

    Every report costs ``num_draws`` evaluations of ``log_joint`` at fresh draws of the
    current iterate; the draws use their own key, so the fit is the same bit for bit
    with or without reports. The reports come from inside the compiled loop through
    ``jax.debug.callback``, so they work under ``jax.jit`` and ``jax.vmap`` too; under
    ``vmap`` each report is one call with arrays of the batch shape (the printed line
    summarises them by median, minimum and maximum). As with ``log_joint``, a new
    callback object compiles the fit anew: pass the same one to reuse it.

    Attributes:
      every: report after every ``every``-th step and after the last (an int >= 1).
      callback: called with a :class:`ProgressInfo` at each report; ``None`` prints a
        line to ``sys.stderr``.
      num_draws: fresh draws of the current iterate per report (an int >= 2).

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: -0.5 * jnp.sum((x - 1.0) ** 2)
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> seen = []
      >>> progress = jaxvb.Progress(every=10, callback=seen.append)
      >>> res = jaxvb.fit(log_joint, q0, jax.random.key(0), num_steps=25,
      ...                 progress=progress)
      >>> [info.step for info in seen]
      [10, 20, 25]
      >>> seen[-1].elbo.shape, bool(seen[-1].r_squared > 0.99)
      ((), True)
    """

    every: int
    callback: Callable[[ProgressInfo], object] | None = None
    num_draws: int = 100

    def __post_init__(self):
        if not _is_int(self.every) or self.every < 1:
            raise ValueError(
                f"Progress.every must be an integer >= 1 (report every that many steps), "
                f"got {self.every!r}"
            )
        if self.callback is not None and not callable(self.callback):
            raise TypeError(
                f"Progress.callback must be callable or None, got {self.callback!r}"
            )
        if not _is_int(self.num_draws) or self.num_draws < 2:
            raise ValueError(
                f"Progress.num_draws must be an integer >= 2, got {self.num_draws!r}"
            )


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def resolve(progress, num_steps: int) -> Progress | None:
    """``fit``'s ``progress`` argument as a :class:`Progress` (or ``None`` when off)."""
    if progress is None or isinstance(progress, Progress):
        return progress
    if _is_int(progress):
        if progress < 1:
            raise ValueError(
                f"progress must be a number of steps >= 1 (a report every that many "
                f"steps), a callable or a jaxvb.Progress, got {progress!r}"
            )
        return Progress(every=int(progress))
    if callable(progress):
        return Progress(every=max(1, math.ceil(num_steps / 10)), callback=progress)
    raise TypeError(
        f"progress must be None, a number of steps k >= 1 (print a line every k steps), "
        f"a callable (given a jaxvb.ProgressInfo about ten times) or a jaxvb.Progress, "
        f"got {progress!r}"
    )


def report(progress: Progress, key, t, num_steps: int, q, log_joint, status) -> None:
    """Inside the scan body: reports ``q`` on the steps ``progress`` asks for.

    ``key`` must not be one of the iteration's keys; the report folds ``t`` into it.
    """

    def on():
        d = diagnostics.evaluate(
            jax.random.fold_in(key, t), q, log_joint, progress.num_draws
        )
        _emitter(progress.callback, num_steps)(
            t, (d.elbo, d.elbo_stderr, d.r_squared, status)
        )

    due = (t % progress.every == 0) | (t == num_steps)
    jax.lax.cond(due, on, lambda: None)


def _emitter(callback, num_steps):
    host = partial(_on_host, callback, num_steps)

    # Without this rule, vmap would unroll the debug callback into one call per batch
    # element; with it, one call gets the whole batch (nested vmaps stack the axes).
    @custom_vmap
    def emit(step, values):
        jax.debug.callback(host, step, values)
        return step

    @emit.def_vmap
    def _batched(axis_size, in_batched, step, values):
        values = jax.tree_util.tree_map(
            lambda v, b: v if b else jnp.broadcast_to(v, (axis_size, *jnp.shape(v))),
            values,
            in_batched[1],
        )
        return emit(step, values), in_batched[0]

    return emit


def _on_host(callback, num_steps, step, values):
    elbo, stderr, r2, status = (np.asarray(v) for v in values)
    info = ProgressInfo(int(np.asarray(step)), num_steps, elbo, stderr, r2, status)
    if callback is None:
        _print_line(info)
        return
    try:
        callback(info)
    except Exception as e:  # noqa: BLE001 - the fit must not be lost to a report
        # An exception raised here would reach XLA as an INTERNAL error and lose the
        # fit: it is reported as a warning and the fit goes on.
        warnings.warn(
            f"jaxvb.fit: the progress callback {getattr(callback, '__name__', callback)!r} "
            f"raised {type(e).__name__}: {e} (at step {info.step}); the fit goes on and "
            "its result is unaffected",
            RuntimeWarning,
            stacklevel=2,
        )


def _print_line(info: ProgressInfo, file=None) -> None:
    """Prints one report as a line (to ``sys.stderr`` by default)."""
    width = len(str(info.num_steps))
    head = f"jaxvb.fit step {info.step:>{width}}/{info.num_steps}"
    if info.elbo.ndim == 0:
        line = (
            f"{head}  ELBO {float(info.elbo):.6g} ± {float(info.elbo_stderr):.2g}"
            f"  R^2 {float(info.r_squared):.4f}"
        )
        if int(info.status):
            line += f"  status {int(info.status)}"
    else:
        elbo, r2 = info.elbo.ravel(), info.r_squared.ravel()
        line = (
            f"{head}  {elbo.size} fits  ELBO median {np.median(elbo):.6g} "
            f"(min {elbo.min():.6g}, max {elbo.max():.6g})  R^2 median "
            f"{np.median(r2):.4f} (min {r2.min():.4f})"
        )
        flagged = int(np.count_nonzero(info.status))
        if flagged:
            line += f"  {flagged} flagged"
    print(line, file=sys.stderr if file is None else file, flush=True)


__all__ = ["Progress", "ProgressInfo"]
