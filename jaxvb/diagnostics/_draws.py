"""Log densities at many draws, evaluated in chunks of bounded size.

:func:`jaxvb.diagnostics.evaluate` and :func:`jaxvb.diagnostics.mixture_evidence`
evaluate ``log_joint`` at a thousand or more draws; ``vmap`` over all of them at once
would hold every draw's intermediates in memory. Here the draws run in equal chunks of at
most ``chunk_size`` (vmapped within a chunk, the chunks one after another), so memory is
that of one chunk, and the numbers do not depend on the chunk size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxvb._platform import after, draws_in_sequence, each_draw


def log_densities(
    key, q, log_joint, num_draws: int, chunk_size: int, stats=False, start=None
):
    """``log p`` and ``log q`` at ``num_draws`` draws of ``q``, in equal chunks.

    ``num_draws`` is cut into ``n`` chunks of equal size ``c <= chunk_size`` (the last
    padded with repeated keys, whose values are dropped): one traced program, not a
    second one for a remainder. With a ``start``, ``num_draws`` more of it in the same
    program (one trace of ``log_joint``), returned as ``(densities of q's draws,
    (log p, log q, log start) at the start's draws and log start at q's)``.
    """
    if start is not None:
        return _log_densities_with_start(
            key, q, log_joint, num_draws, chunk_size, stats, start
        )

    if is_paired(q, start):
        return _paired_log_densities(key, q, log_joint, num_draws, chunk_size, stats)

    def one(k):
        x, log_q = q.sample_and_log_prob(k)
        x = after(x, log_q)  # a log joint that factors a matrix too: in turn
        out = (jnp.asarray(log_joint(x)).astype(q.dtype), log_q)
        return out + (q.sufficient_stats(x),) if stats else out

    return _chunked(
        one, jax.random.split(key, num_draws), num_draws, chunk_size, draws_in_sequence(q)
    )


def is_paired(q, start) -> bool:
    """Whether :func:`~jaxvb.diagnostics.evaluate` draws ``q`` in pairs (``q.paired_draws``: two draws
    that share the costly part, a latent field's ``theta``), without a ``start``."""
    return start is None and callable(getattr(q, "paired_draws", None))


def _paired_log_densities(key, q, log_joint, num_draws, chunk_size, stats):
    """:func:`log_densities` from ``ceil(num_draws / 2)`` pairs of
    ``q.paired_draws`` (pair ``i`` from the ``i``-th of ``jax.random.split(key,
    ceil(num_draws / 2))``; draws ``2i`` and ``2i + 1``; an odd ``num_draws`` drops
    the last pair's second)."""
    num_pairs = -(-num_draws // 2)

    def one(k):
        x, log_p, log_q = q.paired_draws(k, log_joint)
        out = (log_p, log_q)
        return out + (jax.vmap(q.sufficient_stats)(x),) if stats else out

    size = max(1, chunk_size // 2)
    out = _chunked(
        one, jax.random.split(key, num_pairs), num_pairs, size, draws_in_sequence(q)
    )
    return tuple(v.reshape((2 * num_pairs,) + v.shape[2:])[:num_draws] for v in out)


def _log_densities_with_start(key, q, log_joint, num_draws, chunk_size, stats, start):
    """:func:`log_densities` with a ``start``: ``q``'s draws and the start's in
    separate chunks of the same size, each chunk drawing from one of them (a ``cond``
    on the chunk, not a select per draw, which would run both): a draw is sampled with
    its own density (``sample_and_log_prob``, one factorisation for a latent field)
    and the other density evaluated at it, three densities per draw in all, and
    ``log_joint`` traced once, after the branch."""
    num_chunks, size = _chunk_layout(num_draws, chunk_size)

    def chunked_keys(k):
        keys = _padded(jax.random.split(k, num_draws), num_chunks * size)
        return keys.reshape((num_chunks, size) + keys.shape[1:])  # raw uint32 keys too

    keys = jnp.concatenate([chunked_keys(key), chunked_keys(jax.random.fold_in(key, 2))])
    from_start = jnp.arange(2 * num_chunks) >= num_chunks

    each = each_draw(q)

    def draws_of(own, other):
        def draw(ks):
            x, log_own = each(own.sample_and_log_prob, ks)
            # the other's factorisation after the own's (_platform.after)
            return x, log_own, each(other.log_prob, after(x, log_own))

        return draw

    def chunk(inputs):
        ks, s = inputs
        x, log_own, log_other = jax.lax.cond(s, draws_of(start, q), draws_of(q, start), ks)
        log_q = jnp.where(s, log_other, log_own).astype(q.dtype)
        log_s = jnp.where(s, log_own, log_other).astype(q.dtype)
        log_p = jnp.asarray(each(log_joint, x)).astype(q.dtype)
        out = (log_p, log_q, log_s)
        return out + (each(q.sufficient_stats, x),) if stats else out

    out = jax.lax.map(chunk, (keys, from_start))
    half = num_chunks * size
    flat = tuple(v.reshape((2 * half,) + v.shape[2:]) for v in out)
    own = tuple(v[:num_draws] for v in flat)
    other = tuple(v[half : half + num_draws] for v in flat[:3])
    return own[:2] + own[3:], other + (own[2],)


def _chunked(fn, inputs, num_draws: int, chunk_size: int, sequential: bool = False):
    """``vmap(fn)(inputs)`` in equal chunks of at most ``chunk_size`` rows (one row at
    a time where ``sequential``)."""
    keys = inputs
    if sequential:
        return jax.lax.map(fn, keys)
    num_chunks, size = _chunk_layout(num_draws, chunk_size)
    if num_chunks == 1:
        return jax.vmap(fn)(keys)
    padded = jax.tree_util.tree_map(lambda v: _padded(v, num_chunks * size), keys)
    out = jax.lax.map(fn, padded, batch_size=size)
    return tuple(v[:num_draws] for v in out)


def _chunk_layout(num_draws: int, chunk_size: int) -> tuple[int, int]:
    """``(n, c)``: ``num_draws`` in ``n`` equal chunks of ``c <= chunk_size`` rows."""
    num_chunks = -(-num_draws // chunk_size)
    return num_chunks, -(-num_draws // num_chunks)


def _padded(rows, total: int):
    """``rows`` padded to ``total`` with repeats of its first rows (their values are
    dropped): equal chunks, one traced program."""
    return jnp.concatenate([rows, rows[: total - rows.shape[0]]])


def map_chunks(fn, xs: jax.Array, chunk_size: int):
    """``vmap(fn)(xs)`` in equal chunks of at most ``chunk_size`` (as in
    :func:`log_densities`)."""
    n = xs.shape[0]
    num_chunks = -(-n // chunk_size)
    if num_chunks == 1:
        return jax.vmap(fn)(xs)
    size = -(-n // num_chunks)
    padded = jnp.concatenate([xs, xs[: num_chunks * size - n]])
    return jax.lax.map(fn, padded, batch_size=size)[:n]


def as_pairs(v: jax.Array) -> jax.Array:
    """``(n,)`` as ``(ceil(n / 2), 2)``, draws ``2i`` and ``2i + 1`` in row ``i`` (an
    odd ``n`` padded with a zero or ``False``)."""
    return jnp.concatenate([v, jnp.zeros(v.shape[0] % 2, v.dtype)]).reshape(-1, 2)
