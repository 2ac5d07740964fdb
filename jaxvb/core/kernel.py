"""The iteration of the paper as a small kernel: ``init``, ``step``, ``finalize``.

BlackJAX-style: a :class:`State` is carried from step to step, each step emits an
:class:`Info`, and the runner (:func:`jaxvb.fit`, or your own ``lax.scan``) owns the
loop. One step of Algorithm 1 / 2 with the fixed step ``w``:

    s^    <- mean over the step's draws of method.estimate      (non-finite draws left out)
    stats <- (1 - w) stats + w s^                               (step control: halve w
    q     <- method.solve(stats)                                 while q is refused)
    if t > average_from: sums += s^                              (the second half)
    stats, sums <- method.reframe(..., q_old, q)                 (if the method has it)

and ``finalize`` solves the averaged statistics once more. The kernel names no family
and no method: a :class:`jaxvb.methods.Method` says what the statistics are.

Example:
  Driving the kernel by hand, as ``fit`` does (without its checks and diagnostics):

  >>> import jax, jax.numpy as jnp, jaxvb
  >>> from jaxvb import kernel
  >>> log_joint = lambda x: -0.5 * jnp.sum((x - 2.0) ** 2)
  >>> method = jaxvb.methods.hessian()
  >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
  >>> state = kernel.init(jax.random.key(0), q0, log_joint, method)
  >>> def body(state, xs):
  ...     keys, t = xs
  ...     return kernel.step(keys, state, t, log_joint, method, step_size=0.2,
  ...                        average_from=5)
  >>> keys = jax.random.split(jax.random.key(1), (10, 1))
  >>> state, infos = jax.lax.scan(body, state, (keys, jnp.arange(1, 11)))
  >>> q, ok = kernel.finalize(state, method, log_joint)
  >>> q.mean.tolist(), bool(ok), infos.proper.shape
  ([2.0], True, (10,))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxvb._algebra import cast_tree, finite_rows, masked_sum, where_tree
from jaxvb.core.status import Status
from jaxvb.methods._base import Method


class State(NamedTuple):
    """What the iteration carries from one step to the next, and nothing else.

    Attributes:
      stats: the method's running statistics (a pytree).
      sums: the sum of the statistics estimated in the averaged steps.
      count: how many draws ``sums`` holds.
      q: the current approximation (the last proper iterate).

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
      >>> state = jaxvb.kernel.init(jax.random.key(0), q0, lambda x: -jnp.sum(x**2),
      ...                           jaxvb.methods.hessian())
      >>> state.stats.P.tolist(), float(state.count)
      ([[1.0, 0.0], [0.0, 1.0]], 0.0)
    """

    stats: Any
    sums: Any
    count: jax.Array
    q: Any


class Draws(NamedTuple):
    """One step's draws and what the method estimated from each (:func:`draw`).

    Attributes:
      stats: each draw's estimate of the statistics (leading axis: the draws).
      x: the draws, ``(num_draws, *event_shape)``.
      log_density: ``log_joint`` at each draw.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> draws = jaxvb.kernel.draw(jax.random.split(jax.random.key(0), 4), q,
      ...                           lambda x: -x @ x, jaxvb.methods.hessian())
      >>> isinstance(draws, jaxvb.kernel.Draws), draws.x.shape
      (True, (4, 1))
    """

    stats: Any
    x: jax.Array
    log_density: jax.Array


class Info(NamedTuple):
    """What one step reports.

    Attributes:
      log_density: the mean of ``log_joint`` over the step's finite draws.
      proper: whether the step's update was a proper distribution.
      damped: whether it was taken at a reduced step size.
      num_finite: how many of the step's draws entered the statistics.
      all_finite: whether every draw's statistics were finite.
      nonfinite_draw: the first draw whose statistics were not (the first draw if
        all were).

    Example:
      A draw where ``log_joint`` is NaN is left out of the step:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: jnp.where(x[0] > 0, -0.5 * x[0] ** 2, jnp.nan)
      >>> method = jaxvb.methods.hessian()
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> state = jaxvb.kernel.init(jax.random.key(0), q0, log_joint, method)
      >>> keys = jax.random.split(jax.random.key(1), 8)
      >>> state, info = jaxvb.kernel.step(keys, state, 1, log_joint, method,
      ...                                 step_size=0.5, average_from=0)
      >>> int(info.num_finite) < 8, bool(info.proper), bool(info.all_finite)
      (True, True, False)
    """

    log_density: jax.Array
    proper: jax.Array
    damped: jax.Array
    num_finite: jax.Array
    all_finite: jax.Array
    nonfinite_draw: jax.Array


class Record(NamedTuple):
    """What a runner reports about the whole iteration, kept beside the :class:`State`
    and updated from each step's :class:`Info` (:func:`record`): the kernel's state
    carries only what the next step needs.

    Attributes:
      status: ``int32`` :class:`jaxvb.Status` flags raised so far.
      first_improper_step, last_improper_step: steps whose update was improper
        (``-1`` if none).
      num_damped_steps: steps taken at a reduced step size.
      first_nonfinite_step: the first step with a non-finite log density (``-1``).
      nonfinite_draw: the draw at that step.

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> rec = jaxvb.kernel.start_record(jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)))
      >>> int(rec.status), int(rec.first_improper_step), rec.nonfinite_draw.shape
      (0, -1, (2,))
    """

    status: jax.Array
    first_improper_step: jax.Array
    last_improper_step: jax.Array
    num_damped_steps: jax.Array
    first_nonfinite_step: jax.Array
    nonfinite_draw: jax.Array


def init(key: jax.Array, q0: Any, log_joint: Callable, method: Method) -> State:
    """The state before the first step: ``method.init``'s statistics at ``q0``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.Gamma(jnp.ones(1), jnp.ones(1))
      >>> state = jaxvb.kernel.init(jax.random.key(0), q0, lambda x: -x[0],
      ...                           jaxvb.methods.regression())
      >>> state.stats.C.shape, state.q is q0, float(state.count)
      ((3, 3), True, 0.0)
    """
    dtype = q0.dtype
    stats = cast_tree(method.init(key, q0, log_joint), dtype)
    return State(
        stats=stats,
        sums=jax.tree_util.tree_map(jnp.zeros_like, stats),
        count=jnp.zeros((), dtype),
        q=q0,
    )


def start_record(q0: Any) -> Record:
    """The :class:`Record` before the first step.

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> rec = jaxvb.kernel.start_record(jaxvb.Gamma(jnp.ones(3), jnp.ones(3)))
      >>> int(rec.num_damped_steps), int(rec.first_nonfinite_step), rec.nonfinite_draw.shape
      (0, -1, (3,))
    """
    return Record(
        status=jnp.zeros((), jnp.int32),
        first_improper_step=jnp.full((), -1, jnp.int32),
        last_improper_step=jnp.full((), -1, jnp.int32),
        num_damped_steps=jnp.zeros((), jnp.int32),
        first_nonfinite_step=jnp.full((), -1, jnp.int32),
        nonfinite_draw=jnp.zeros(q0.event_shape, q0.dtype),
    )


def record(rec: Record, info: Info, t: jax.Array) -> Record:
    """``rec`` after step ``t``, from that step's :class:`Info`.

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> rec = jaxvb.kernel.start_record(jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1)))
      >>> info = jaxvb.kernel.Info(0.0, jnp.asarray(False), jnp.asarray(False), 1.0,
      ...                          jnp.asarray(True), jnp.zeros(1))
      >>> rec = jaxvb.kernel.record(rec, info, 3)
      >>> int(rec.status), int(rec.first_improper_step), int(rec.last_improper_step)
      (1, 3, 3)
    """
    t = jnp.asarray(t, jnp.int32)
    proper, bad = info.proper, ~info.all_finite
    new_nonfinite = bad & (rec.first_nonfinite_step < 0)
    new_improper = ~proper & (rec.first_improper_step < 0)
    status = (
        rec.status
        | jnp.where(proper, 0, int(Status.IMPROPER_PROPOSAL))
        | jnp.where(bad, int(Status.NONFINITE_LOG_DENSITY), 0)
    ).astype(jnp.int32)
    return Record(
        status=status,
        first_improper_step=jnp.where(new_improper, t, rec.first_improper_step),
        last_improper_step=jnp.where(proper, rec.last_improper_step, t),
        num_damped_steps=rec.num_damped_steps + info.damped,
        first_nonfinite_step=jnp.where(new_nonfinite, t, rec.first_nonfinite_step),
        nonfinite_draw=jnp.where(new_nonfinite, info.nonfinite_draw, rec.nonfinite_draw),
    )


def _draw_noise(keys: jax.Array, q: Any, method: Method, antithetic: bool = False) -> Any:
    """The noise of one step: one draw per key, then their antithetic twins if asked."""
    noise = jax.vmap(method.noise, (0, None))(keys, q)
    if not antithetic:
        return noise
    flipped = jax.vmap(lambda n: jax.tree_util.tree_map(q.antithetic, n))(noise)
    return jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), noise, flipped)


def _controlled_update(
    stats: Any,
    estimate: Any,
    q: Any,
    w: jax.Array,
    method: Method,
    log_joint: Callable,
    max_backtracks: int,
) -> tuple[Any, Any, jax.Array, jax.Array]:
    """``(stats, q_new, proper, tries)``: the step ``(1 - w) stats + w estimate``,
    halved until ``method.solve`` gives an update the method accepts.

    An update must be proper and, where the method has ``accept`` (a trust region),
    accepted; after ``max_backtracks`` halvings a proper update is taken anyway and an
    improper one is reported (``proper`` False) for the caller to skip.
    """

    def attempt(w_try):
        new = jax.tree_util.tree_map(
            lambda s, h: (1.0 - w_try) * s + w_try * h, stats, estimate
        )
        q_new = method.solve(new, q, log_joint)
        proper = q_new.is_proper
        take = proper if method.accept is None else proper & method.accept(q, q_new)
        return new, q_new, proper, take

    def retry(carry):
        w_try, _, _, _, _, n = carry
        return (0.5 * w_try, *attempt(0.5 * w_try), n + 1)

    def refused(carry):
        return ~carry[4] & (carry[5] < max_backtracks)

    first = (w, *attempt(w), jnp.zeros((), jnp.int32))
    # The loop sits behind a cond: most steps are taken at once, and on the CPU a
    # while loop that runs zero times still costs (copies of its carry, no fusion
    # across it).
    _, new, q_new, proper, _, tries = jax.lax.cond(
        first[4], lambda c: c, lambda c: jax.lax.while_loop(refused, retry, c), first
    )
    return new, q_new, proper, tries


def step(
    keys: jax.Array,
    state: State,
    t: jax.Array,
    log_joint: Callable,
    method: Method,
    *,
    step_size: jax.Array,
    average_from: float,
    antithetic: bool = False,
    max_backtracks: int = 8,
) -> tuple[State, Info]:
    """One iteration at step ``t`` (1-based) from draws made with ``keys``.

    Args:
      keys: ``(num_draws,)`` keys, one per draw (each gets an antithetic twin if
        ``antithetic``).
      state: the :class:`State` after step ``t - 1``.
      t: the step number; steps with ``t > average_from`` enter the average.
      log_joint: this step's log joint (for a minibatch log joint, its estimate).
      method: a :class:`jaxvb.methods.Method`.
      step_size: ``w``.
      average_from: the last step left out of the average (``fit``: ``num_steps / 2``).
      antithetic: also use the antithetic twin of every draw.
      max_backtracks: halvings of the step size for a refused update.

    Returns:
      ``(state, info)``.

    Example:
      One step of Algorithm 2 on a Gaussian target lands on it:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: -0.5 * jnp.sum((x - 3.0) ** 2)
      >>> method = jaxvb.methods.hessian()
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> state = jaxvb.kernel.init(jax.random.key(0), q0, log_joint, method)
      >>> state, info = jaxvb.kernel.step(jax.random.split(jax.random.key(1), 1), state,
      ...                                 1, log_joint, method, step_size=1.0,
      ...                                 average_from=0)
      >>> round(float(state.q.mean[0]), 12), bool(info.proper), float(state.count)
      (3.0, True, 1.0)
    """
    draws = draw(keys, state.q, log_joint, method, antithetic)
    return update(
        state,
        draws,
        t,
        log_joint,
        method,
        step_size=step_size,
        average_from=average_from,
        max_backtracks=max_backtracks,
    )


def draw(
    keys: jax.Array, q: Any, log_joint: Callable, method: Method, antithetic: bool = False
) -> Draws:
    """The first half of :func:`step`: one draw per key (and its antithetic twin if
    asked) and the method's estimate from each.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
      >>> draws = jaxvb.kernel.draw(jax.random.split(jax.random.key(0), 3), q,
      ...                           lambda x: -jnp.sum(x**2), jaxvb.methods.hessian())
      >>> draws.x.shape, draws.log_density.shape
      ((3, 2), (3,))
    """
    noise = _draw_noise(keys, q, method, antithetic)
    s_hat, x, log_p = jax.vmap(method.estimate, (0, None, None))(noise, q, log_joint)
    return Draws(cast_tree(s_hat, q.dtype), x, jnp.asarray(log_p).astype(q.dtype))


def update(
    state: State,
    draws: Draws,
    t: jax.Array,
    log_joint: Callable,
    method: Method,
    *,
    step_size: jax.Array,
    average_from: float,
    max_backtracks: int,
) -> tuple[State, Info]:
    """The second half of :func:`step`: the update from the step's :class:`Draws`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: -0.5 * jnp.sum((x - 3.0) ** 2)
      >>> method = jaxvb.methods.hessian()
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> state = jaxvb.kernel.init(jax.random.key(0), q0, log_joint, method)
      >>> draws = jaxvb.kernel.draw(jax.random.split(jax.random.key(1), 1), q0,
      ...                           log_joint, method)
      >>> state, info = jaxvb.kernel.update(state, draws, 1, log_joint, method,
      ...                                   step_size=1.0, average_from=0,
      ...                                   max_backtracks=8)
      >>> round(float(state.q.mean[0]), 12), bool(info.proper)
      (3.0, True)
    """
    s_hat, x, log_p = draws
    dtype = state.q.dtype
    q = state.q
    t = jnp.asarray(t, jnp.int32)

    ok = finite_rows(s_hat)  # a draw counts only if all its statistics are finite
    n_ok = jnp.sum(ok).astype(dtype)
    total = masked_sum(s_hat, ok)
    mean = jax.tree_util.tree_map(lambda v: v / jnp.maximum(n_ok, 1.0), total)
    w = jnp.where(n_ok > 0, step_size, 0.0)
    stats, q_new, proper, tries = _controlled_update(
        state.stats, mean, q, w, method, log_joint, max_backtracks
    )

    in_avg = t > average_from
    sums = jax.tree_util.tree_map(
        lambda a, v: a + jnp.where(in_avg, v, 0.0), state.sums, total
    )
    count = state.count + jnp.where(in_avg, n_ok, 0.0)

    damped = proper & (tries > 0)
    q_next = where_tree(proper, q_new, q)
    if method.reframe is not None:  # statistics taken relative to q follow it
        stats = method.reframe(stats, q, q_next)
        sums = method.reframe(sums, q, q_next)
    new_state = State(stats=stats, sums=sums, count=count, q=q_next)
    log_density = jnp.sum(jnp.where(ok, log_p, 0.0)) / jnp.maximum(n_ok, 1.0)
    first_bad = x[jnp.argmin(ok)].astype(dtype)
    info = Info(log_density, proper, damped, n_ok, jnp.all(ok), first_bad)
    return new_state, info


def finalize(state: State, method: Method, log_joint: Callable) -> tuple[Any, jax.Array]:
    """``(q, ok)``: the solution of the averaged statistics, or, where that is not
    proper (``ok`` False, :attr:`jaxvb.Status.IMPROPER_RESULT`), the last iterate.

    Example:
      Nothing averaged yet: the last iterate comes back, flagged.

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> method = jaxvb.methods.hessian()
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> state = jaxvb.kernel.init(jax.random.key(0), q0, lambda x: -x @ x, method)
      >>> q, ok = jaxvb.kernel.finalize(state, method, lambda x: -x @ x)
      >>> q.mean.tolist() == state.q.mean.tolist(), bool(ok)
      (True, False)
    """
    averaged = jax.tree_util.tree_map(
        lambda v: v / jnp.maximum(state.count, 1.0), state.sums
    )
    q_avg = method.solve(averaged, state.q, log_joint)
    ok = q_avg.is_proper & (state.count > 0)
    return where_tree(ok, q_avg, state.q), ok


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
