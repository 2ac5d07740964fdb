"""``fit_many``: a collection of data sets fitted chunk by chunk into a store."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb._version import __version__
from jaxvb.batch import fit_batched
from jaxvb.core.result import Result
from jaxvb.core.status import Status, explain
from jaxvb.many._store import (
    FORMAT,
    FORMAT_VERSION,
    HEADER,
    RESERVED,
    ManySummary,
    agree_on_header,
    array_names,
    chunk_path,
    describe,
    leaf_name,
    summary_of,
    wait_for_header,
    write_chunk,
)

# --- the collection ---------------------------------------------------------------------


@dataclasses.dataclass
class _Source:
    num_datasets: int
    chunk_size: int
    load: Callable[[int], Any]
    arrays: tuple | None = None

    @property
    def num_chunks(self) -> int:
        return -(-self.num_datasets // self.chunk_size)

    def rows(self, i: int) -> range:
        return range(i * self.chunk_size, min((i + 1) * self.chunk_size, self.num_datasets))


def _source(source, num_datasets, chunk_size) -> _Source:
    if callable(source):
        if not isinstance(num_datasets, int | np.integer) or num_datasets < 1:
            raise ValueError(
                "fit_many: a source that loads chunks needs num_datasets=, the number of "
                f"data sets in the collection (an integer >= 1), got {num_datasets!r}"
            )
        return _Source(int(num_datasets), chunk_size, source)
    if not isinstance(source, tuple | list) or not source:
        raise TypeError(
            "fit_many: source must be a tuple of arrays with a common leading axis (one "
            "element per data set) or a function load(i) returning chunk i's arrays, "
            f"got {type(source).__name__}"
        )
    arrays = tuple(np.asarray(a) for a in source)  # sliced on the host, chunk by chunk
    sizes = [a.shape[0] if a.ndim else None for a in arrays]
    if None in sizes or len(set(sizes)) != 1 or sizes[0] == 0:
        named = ", ".join(f"source[{j}] {tuple(a.shape)}" for j, a in enumerate(arrays))
        raise ValueError(
            "fit_many: the arrays of source must share a leading axis of at least one "
            f"data set; their shapes are {named}"
        )
    if num_datasets is not None and num_datasets != sizes[0]:
        raise ValueError(
            f"fit_many: num_datasets={num_datasets} but source holds {sizes[0]} data sets"
        )
    out = _Source(sizes[0], chunk_size, None, arrays)
    out.load = lambda i: tuple(a[out.rows(i).start : out.rows(i).stop] for a in arrays)
    return out


def _load_chunk(source: _Source, i: int, store: Path, spec) -> tuple:
    rows = source.rows(i)
    where = f"chunk {i} (data sets {rows.start}..{rows.stop - 1})"
    try:
        data = source.load(i)
    except Exception as e:
        raise RuntimeError(
            f"fit_many: loading {where} raised {type(e).__name__}: {e}. The chunks "
            f"finished before it are kept in {store}; fix the loader and call fit_many "
            "again with the same arguments to resume."
        ) from e
    data = tuple(data) if isinstance(data, tuple | list) else (data,)
    got = [(tuple(np.shape(a)), np.dtype(a.dtype).str) for a in data]
    if any(len(s) == 0 or s[0] != len(rows) for s, _ in got) or (
        spec is not None and [(list(s[1:]), d) for s, d in got] != spec
    ):
        expected = [f"({len(rows)}, *{tuple(s)}) {d}" for s, d in spec or []]
        raise ValueError(
            f"fit_many: {where} has arrays {[f'{s} {d}' for s, d in got]}; expected "
            f"{expected or f'{len(rows)} data sets on each leading axis'}"
        )
    return data


def _spec(data) -> list:
    """Each array's per-data-set shape and dtype, as the header records them."""
    return [(list(np.shape(a)[1:]), np.dtype(a.dtype).str) for a in data]


# --- the header -------------------------------------------------------------------------


def _key(key) -> jax.Array:
    if isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    try:
        return jax.random.wrap_key_data(jnp.asarray(key, jnp.uint32))
    except Exception as e:
        raise TypeError(
            f"fit_many: key must be a JAX PRNG key (jax.random.key(0)), got {key!r}"
        ) from e


def _fingerprint(fit_one, key, spec) -> tuple[str, Any]:
    """SHA-256 of ``fit_one``'s jaxpr (and constants) on one data set; its output shape."""
    args = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d)) for s, d in spec]
    one_key = jax.ShapeDtypeStruct((), key.dtype)
    closed, shape = jax.make_jaxpr(fit_one, return_shape=True)(one_key, *args)
    digest = hashlib.sha256(re.sub(r" at 0x[0-9a-f]+", "", str(closed)).encode())
    for const in closed.consts:
        digest.update(np.ascontiguousarray(np.asarray(const)).tobytes())
    return digest.hexdigest(), shape


def _header(fit_one, key, source: _Source, spec) -> dict:
    model, shape = _fingerprint(fit_one, key, spec)
    flat = jax.tree_util.tree_flatten_with_path(shape)[0]
    leaves = {leaf_name(jax.tree_util.keystr(p)): v for p, v in flat}
    clash = [n for n in RESERVED if n in leaves]
    if clash or len(leaves) != len(flat):
        raise ValueError(f"fit_many: fit_one's result has leaves named {clash or flat}")
    if any(jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key) for v in leaves.values()):
        raise TypeError("fit_many: fit_one returns a PRNG key array; return key_data")
    try:
        structure = describe(shape)
        structure = structure if array_names(structure) == set(leaves) else None
    except TypeError:  # a pytree of the user's own: load_many(store, like=...)
        structure = None
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "jaxvb_version": __version__,
        "jax_version": jax.__version__,
        "settings": {
            "num_datasets": source.num_datasets,
            "chunk_size": source.chunk_size,
            "num_chunks": source.num_chunks,
            "key_impl": str(jax.random.key_impl(key)),
            "key_data": np.asarray(jax.random.key_data(key)).tolist(),
        },
        "data": [{"shape": s, "dtype": d} for s, d in spec],
        "model": model,
        "leaves": {
            n: {"dtype": np.dtype(v.dtype).str, "shape": list(v.shape)}
            for n, v in leaves.items()
        },
        "structure": structure,
    }


def _reasons(out, status) -> np.ndarray:
    """``"ok"``, or why each data set's fit is flagged (its status explained)."""
    reasons = []
    for j, s in enumerate(status):
        if s == 0:
            reasons.append("ok")
        elif isinstance(out, Result):
            one = jax.tree_util.tree_map(lambda a, j=j: a[j], out)
            reasons.append(explain(one))
        else:
            reasons.append(Status(int(s)).name or str(int(s)))
    return np.asarray(reasons, dtype=str)


# --- fitting ----------------------------------------------------------------------------


@jax.jit
def _keys(key, index):
    return jax.vmap(jax.random.fold_in, (None, 0))(key, index)


def _fit_chunk(fit_one, key, data, rows: range, chunk_size, batch_size) -> dict:
    take = np.minimum(np.arange(chunk_size), len(rows) - 1)  # padding: copies, dropped
    index = np.asarray(rows, np.int64)
    padded = tuple(np.asarray(a)[take] for a in data)
    out = fit_batched(
        fit_one,
        _keys(key, jnp.asarray(index[take], jnp.uint32)),
        *padded,
        devices=jax.local_devices(),
        batch_size=batch_size,
    )
    out = jax.tree_util.tree_map(lambda a: np.asarray(a)[: len(rows)], out)
    arrays = {"index": index}
    for path, value in jax.tree_util.tree_flatten_with_path(out)[0]:
        arrays[leaf_name(jax.tree_util.keystr(path))] = value
    if "status" in arrays:
        arrays["reason"] = _reasons(out, arrays["status"])
    return arrays


class _Progress:
    """A line on standard error: data sets done, per second, and the time left.

    The rate counts the chunks after the first, whose time includes the compilation.
    """

    def __init__(self, total: int, done: int, show: bool):
        self.total, self.done, self.show = total, done, show
        self.fitted, self.flagged, self.shown = 0, 0, 0.0
        self.start, self.first = time.monotonic(), None  # (time, data sets) after chunk 1

    def update(self, n: int, flagged: int, last: bool) -> None:
        self.done += n
        self.fitted += n
        self.flagged += flagged
        now = time.monotonic()
        if self.first is None:
            self.first = (now, self.fitted)
        if not self.show or (now - self.shown < 1.0 and not last):
            return
        self.shown, tty = now, sys.stderr.isatty()
        since, before = self.first if self.fitted > self.first[1] else (self.start, 0)
        rate = (self.fitted - before) / max(now - since, 1e-9)
        line = (
            f"jaxvb.fit_many: {self.done}/{self.total} data sets "
            f"({100 * self.done / self.total:.0f}%), {rate:.4g}/s, "
            f"{(self.total - self.done) / rate:.0f} s left"
        )
        line += f", {self.flagged} flagged" if self.flagged else ""
        end = "\n" if last or not tty else ""
        print(("\r" if tty else "") + line, end=end, file=sys.stderr, flush=True)


def fit_many(
    fit_one: Callable[..., Any],
    source: Sequence[Any] | Callable[[int], Sequence[Any]],
    *,
    store: str | os.PathLike,
    chunk_size: int,
    key: jax.Array,
    num_datasets: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
) -> ManySummary:
    """Fits ``fit_one`` to every data set of ``source``, chunk by chunk, into ``store``.

    Data set ``i`` is fitted with the key ``jax.random.fold_in(key, i)``, so its result
    depends neither on the chunking nor on the number of processes, nor on restarts.
    Each chunk of ``chunk_size`` data sets is one :func:`jaxvb.fit_batched` call over
    this process's devices (``jax.local_devices()``), and its results are written to
    the store (this module's docstring has the layout) before the next chunk is loaded:
    one chunk's data and results are in memory at a time.

    **Resuming.** Calling ``fit_many`` again with the same arguments fits only the
    chunks the store lacks; the finished store is the same, byte for byte, as an
    uninterrupted run's. A store written for another ``fit_one`` (its jaxpr), other
    data shapes or dtypes, ``chunk_size``, ``key``, number of data sets, or another
    jaxvb or JAX version is refused with a ``ValueError`` saying what differs.

    **Many processes.** After ``jax.distributed.initialize()``, every process makes the
    same call: process ``p`` of ``P`` fits the chunks ``i`` with ``i % P == p`` on its
    own devices (process 0 writes the header; the others wait for it).

    **Failures.** A fit that fails is stored with its ``status`` and, for a
    :class:`jaxvb.Result`, the ``reason`` (:func:`jaxvb.explain`); it is never dropped
    and never stops the run.

    Args:
      fit_one: ``(key, *data_set) -> pytree of arrays`` (typically a
        :class:`jaxvb.Result`); traceable. Pass the same object to reuse its program.
      source: a tuple of arrays with a common leading axis (one element per data set),
        or ``load(i)`` returning chunk ``i``'s arrays: data sets ``i * chunk_size`` up to
        ``min((i + 1) * chunk_size, num_datasets)``, for collections that do not fit in
        memory.
      store: the store's directory (made if missing).
      chunk_size: data sets per chunk (and per compiled call); a multiple of the number
        of local devices splits evenly.
      key: a JAX PRNG key.
      num_datasets: the number of data sets; required with a ``load`` function.
      batch_size: passed to :func:`jaxvb.fit_batched` (fits at once per device).
      progress: print a progress line (data sets per second, time left) and the
        summary to standard error.

    Returns:
      A :class:`ManySummary`: counts by status over the store, and what this call did.

    Example:
      >>> import tempfile, jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> def fit_one(key, center):
      ...     log_joint = lambda x: -0.5 * jnp.sum((x - center) ** 2)
      ...     return jaxvb.fit(log_joint, q0, key, num_steps=20, num_eval_draws=2)
      >>> store = tempfile.mkdtemp()
      >>> summary = jaxvb.fit_many(fit_one, (jnp.arange(5.0)[:, None],), store=store,
      ...                          chunk_size=2, key=jax.random.key(0), progress=False)
      >>> summary.num_stored, summary.counts
      (5, {'OK': 5})
      >>> jaxvb.load_many(store).q.mean[:, 0].round(6).tolist()
      [0.0, 1.0, 2.0, 3.0, 4.0]
    """
    started = time.monotonic()
    if not callable(fit_one):
        raise TypeError(f"fit_many: fit_one must be a function, got {fit_one!r}")
    if not isinstance(chunk_size, int | np.integer) or chunk_size < 1:
        raise ValueError(
            f"fit_many: chunk_size must be an integer >= 1, got {chunk_size!r}"
        )
    src, key = _source(source, num_datasets, int(chunk_size)), _key(key)
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    rank, size = jax.process_index(), jax.process_count()
    mine = [i for i in range(src.num_chunks) if i % size == rank]
    todo = [i for i in mine if not chunk_path(store, i).exists()]
    first = None
    if src.arrays is not None:
        spec = _spec(src.arrays)
    elif (store / HEADER).exists() or rank != 0 or not todo:
        spec = [(d["shape"], d["dtype"]) for d in wait_for_header(store)["data"]]
    else:  # a new store: process 0's first chunk gives the data's shapes
        first = (todo[0], _load_chunk(src, todo[0], store, None))
        spec = _spec(first[1])
    spec = [(list(s), d) for s, d in spec]
    header = _header(fit_one, key, src, spec)
    agree_on_header(store, header, rank)
    for i in mine:  # temporary files of chunks this process owns: left by a killed run
        for tmp in store.glob(f".{chunk_path(store, i).name}.*.tmp"):
            tmp.unlink(missing_ok=True)
    total = sum(len(src.rows(i)) for i in mine)
    bar = _Progress(total, total - sum(len(src.rows(i)) for i in todo), progress)
    for n, i in enumerate(todo):
        data = first[1] if first and first[0] == i else _load_chunk(src, i, store, spec)
        arrays = _fit_chunk(fit_one, key, data, src.rows(i), src.chunk_size, batch_size)
        write_chunk(store, i, src.rows(i), arrays)
        flagged = int(np.count_nonzero(arrays["status"])) if "status" in arrays else 0
        bar.update(len(src.rows(i)), flagged, last=n == len(todo) - 1)
        del data, arrays
    summary = summary_of(store, header, bar.fitted, time.monotonic() - started)
    if progress:
        print(summary, file=sys.stderr, flush=True)
    return summary
