"""The convergence check, a wrapper around the iteration that owns its own state.

At a solution the regression of the paper returns ``q`` itself: one more update from
fresh draws of a converged ``q`` differs from it by Monte Carlo noise only. The check
runs its draws as extra steps of the iteration's own ``lax.scan`` (the method's
estimate, the log joint's derivatives and most of the program, is then traced once),
with the update swapped for a sum into its :class:`Check`; at the last step of the
iteration it records the result (:func:`settle`), and its draws come from that.
:func:`distances` then measures how far the update moves ``q``;
:func:`jaxvb.core.status.fit_status` turns that into a verdict.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxvb._algebra import finite_rows, masked_sum
from jaxvb._platform import after, draws_in_sequence
from jaxvb.core import kernel
from jaxvb.methods import Method

#: Elements of draws held at once: by the check (its draws, to the end of the fit) and
#: by a chunk of the diagnostics or of the check's distances (their work arrays).
MAX_HELD = 2**22
MAX_CHUNK = 2**20
#: The fewest draws the check takes by default (a short fit's: the check costs at most
#: a quarter of the iteration's draws otherwise).
MIN_CHECK_DRAWS = 32


def size(q) -> int:
    """The number of values in one draw of ``q``."""
    return max(1, math.prod(q.event_shape))


def chunk_size(d: int) -> int:
    """Draws evaluated at once: 100, fewer for a long event (one at d ~ 10^6), so that
    memory stays bounded whatever the dimension."""
    return max(1, min(100, MAX_CHUNK // max(1, d)))


def default_draws(q0, num_steps: int, per_step: int, num_eval_draws: int) -> int:
    """The check's draws when ``fit`` is not told: ``min(num_eval_draws, 200)``, at
    most a quarter of the iteration's draws (each is a step of the same loop) and at
    least :data:`MIN_CHECK_DRAWS`, and at most ~:data:`MAX_HELD` values held (a long
    latent field, d ~ 10^6, gets 16 draws).

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.core.convergence import default_draws
      >>> q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
      >>> default_draws(q0, 1000, 1, 1000), default_draws(q0, 250, 1, 1000)
      (200, 62)
    """
    return min(
        num_eval_draws,
        200,
        max(16, MAX_HELD // size(q0)),
        max(MIN_CHECK_DRAWS, num_steps * per_step // 4),
    )


def num_steps_for(num_check_draws: int, per_step: int) -> int:
    """Check steps for ``num_check_draws``: an even number, half for each half."""
    return 2 * -(-(num_check_draws // 2) // per_step) if num_check_draws else 0


class Check(NamedTuple):
    """The convergence check's part of the scan's carry.

    ``q``/``good``: the fit's result (:func:`kernel.finalize` at the last step), whose
    draws the check steps use; ``sums``/``counts``: their statistics summed for the two
    halves of the check (leading axis 2); ``x``: the draws, one row per check step.

    Example:
      The check by hand on a Gaussian target, which ``q`` already equals: eight
      check steps from ``q`` (here the state's, as nothing was averaged), then the
      distances, both zero to rounding.

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jaxvb.core import convergence, kernel
      >>> log_joint = lambda x: -0.5 * jnp.sum((x - 1.0) ** 2)
      >>> method, q = jaxvb.methods.hessian(), jaxvb.Gaussian(jnp.ones(2), jnp.eye(2))
      >>> state = kernel.init(jax.random.key(0), q, log_joint, method)
      >>> check = convergence.init(q, state.stats, num_check_steps=8, per_step=1)
      >>> check = convergence.settle(check, state, 4, 4, method, log_joint)
      >>> for t in range(5, 13):
      ...     keys = jax.random.split(jax.random.key(t), 1)
      ...     draws = kernel.draw(keys, check.q, log_joint, method)
      ...     check = convergence.accumulate(check, draws, t, num_steps=4)
      >>> shift, noise = convergence.distances(check, method, log_joint)
      >>> float(shift) < 1e-20, float(noise) < 1e-20
      (True, True)
    """

    q: Any
    good: jax.Array
    sums: Any
    counts: jax.Array
    x: Any


def distances(check: Check, method: Method, log_joint):
    """``(shift, noise)`` from the check steps' statistics.

    At a solution the regression of the paper returns ``q`` itself, so the update from
    draws of a converged ``q`` differs from it by Monte Carlo noise only. ``shift`` is
    KL(q || update) and ``noise`` KL(update_1 || update_2) between the updates of the
    two halves of the draws (about four times the noise of ``shift``), both to second
    order, ``Var_q[log a - log b] / 2`` on the check's own draws of ``q`` (a second set
    of draws would cost another random-number program to compile): unlike the natural
    parameters, ``log_prob`` stays accurate for ill-conditioned Gaussians.

    Example:
      See :class:`Check`: on a target ``q`` already equals, both are zero.

      >>> from jaxvb.core import convergence
      >>> callable(convergence.distances)
      True
    """
    q, dtype = check.q, check.q.dtype
    tree = jax.tree_util.tree_map

    def update(total, n):
        mean = tree(lambda v: v / jnp.maximum(n, 1.0).astype(dtype), total)
        return method.solve(mean, q, log_joint)

    # The three updates (all draws, each half) in one vmapped solve, and the log
    # densities of q and of them in one vmapped log_prob: each traced once, not three
    # and four times (a structured q's solve and log_prob are much of what the check
    # compiles: a latent field's banded factorisations)
    both = tree(lambda v: jnp.stack([v[0] + v[1], v[0], v[1]]), check.sums)
    counts = jnp.stack([check.counts[0] + check.counts[1], *check.counts])
    updates = jax.vmap(update)(both, counts)
    qs = tree(lambda a, b: jnp.concatenate([a[None], b]), q, updates)
    x = check.x.reshape(-1, *check.x.shape[2:])
    if draws_in_sequence(q):  # one factorisation after another (a latent field's)
        log_probs = jax.lax.map(lambda xi: jax.lax.map(lambda one: one.log_prob(xi), qs), x)
    else:
        log_probs = jax.lax.map(
            lambda xi: jax.vmap(lambda one: one.log_prob(xi))(qs),
            x,
            batch_size=chunk_size(x.shape[-1]),
        )  # (num_draws, 4): q, the update, the halves' updates
    # after the densities: both factor the four (_platform.after)
    proper = jax.vmap(lambda one: one.is_proper)(after(qs, log_probs))

    def distance(i, j):
        value = 0.5 * jnp.var(log_probs[:, i] - log_probs[:, j])
        ok = proper[i] & proper[j] & jnp.isfinite(value)
        return jnp.where(ok, value, jnp.inf)

    return distance(0, 1), distance(2, 3)


def init(q0, stats, num_check_steps: int, per_step: int) -> Check:
    """The check before the iteration: ``stats`` gives the statistics' shapes.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jaxvb.core import convergence, kernel
      >>> q = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
      >>> state = kernel.init(jax.random.key(0), q, lambda x: -x @ x,
      ...                     jaxvb.methods.hessian())
      >>> convergence.init(q, state.stats, num_check_steps=4, per_step=1).x.shape
      (4, 1, 2)
    """
    dtype = q0.dtype
    zeros2 = jax.tree_util.tree_map(lambda v: jnp.zeros((2, *v.shape), dtype), stats)
    # the check's draws, per step (as the kernel keeps its non-finite draw: q's points)
    x0 = jnp.zeros((num_check_steps, per_step, *q0.event_shape), dtype)
    return Check(q0, jnp.zeros((), bool), zeros2, jnp.zeros((2,), dtype), x0)


def settle(check: Check, state, t, num_steps: int, method: Method, log_joint) -> Check:
    """At the iteration's last step, the result (:func:`jaxvb.kernel.finalize`), whose
    draws the check steps use; ``check`` unchanged before.

    Example:
      See :class:`Check`.

      >>> from jaxvb.core import convergence
      >>> callable(convergence.settle)
      True
    """
    q, good = jax.lax.cond(
        t == num_steps,
        lambda: kernel.finalize(state, method, log_joint),
        lambda: (check.q, check.good),
    )
    return check._replace(q=q, good=good)


def accumulate(check: Check, draws: kernel.Draws, t, num_steps: int) -> Check:
    """A check step: its draws' statistics summed into one of the two halves.

    Example:
      See :class:`Check`.

      >>> from jaxvb.core import convergence
      >>> callable(convergence.accumulate)
      True
    """
    dtype = check.q.dtype
    s_hat = draws.stats
    use = finite_rows(s_hat)
    half = (t - num_steps) % 2  # the two halves alternate
    add = masked_sum(s_hat, use)
    sums = jax.tree_util.tree_map(lambda a, v: a.at[half].add(v), check.sums, add)
    counts = check.counts.at[half].add(jnp.sum(use).astype(dtype))
    row = t - num_steps - 1
    xs = check.x.at[row].set(draws.x.astype(dtype))
    return check._replace(sums=sums, counts=counts, x=xs)


__all__ = ["Check", "accumulate", "default_draws", "distances", "init", "settle"]
