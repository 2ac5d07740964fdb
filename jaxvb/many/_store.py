"""The store of :func:`jaxvb.fit_many`: its header, its chunk files, and reading it back.

:func:`fit_many` fits one model to every data set of a collection a chunk at a time:
each chunk of ``chunk_size`` data sets is one call of :func:`jaxvb.fit_batched` over
this process's devices (the last chunk padded with copies, so one program serves all
chunks), and its results are written to the store before the next chunk is loaded.
:func:`load_many` reads a store back as one batched pytree.

**The store** is a directory that NumPy alone reads:

* ``header.json``: ``format`` (``"jaxvb.many"``), ``format_version``, the versions of
  jaxvb and JAX, the ``settings`` (``num_datasets``, ``chunk_size``, ``num_chunks``,
  the key's implementation and data), ``data`` (each source array's per-data-set
  dtype and shape), ``model`` (SHA-256 of ``fit_one``'s jaxpr on one data set, its
  constants included), ``leaves`` (each result leaf's name, dtype and per-data-set
  shape) and ``structure`` (how the leaves form the result, for :func:`load_many`).
* ``chunk-000000.npz``, ``chunk-000001.npz``, ...: chunk ``i`` holds data sets
  ``i * chunk_size`` up to the next chunk's first, as ``index`` (``int64``), one array
  per result leaf named by its pytree path (``q.mean``, ``status``, ``elbo``, ...) with
  a leading axis over the chunk's data sets, and, for a :class:`jaxvb.Result`,
  ``reason``: ``"ok"`` or :func:`jaxvb.explain`'s account of the status.

A chunk is complete when its file exists under its final name: files are written to a
temporary name in the store, flushed to disk and renamed, so a killed run leaves whole
chunks only. The files carry no timestamps: two runs of the same fits write the same
bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import time
import uuid
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb.core.result import Result, Trace
from jaxvb.core.status import Status
from jaxvb.families._base import build
from jaxvb.interop.io import FAMILIES

FORMAT = "jaxvb.many"
FORMAT_VERSION = 1
HEADER = "header.json"
#: How long a process other than process 0 waits for process 0's header.
HEADER_WAIT_S = 600.0
#: The names of a chunk file's arrays that are not result leaves.
RESERVED = ("index", "reason")
_RECORDS = {"Result": Result, "Trace": Trace}
_FAMILY_PATHS = {cls: path for path, cls in FAMILIES.items()}


class ManySummary(NamedTuple):
    """What :func:`fit_many` returns (and prints): where the store stands.

    Attributes:
      store: the store's path.
      num_datasets: data sets in the collection.
      num_stored: data sets whose chunk is in the store (all of them when complete).
      num_fitted: data sets this call fitted (this process's share).
      counts: data sets in the store by status (``"OK"``, or the flags' names joined by
        ``|``); ``{}`` where the results have no ``status``.
      seconds: this call's time.

    Example:
      >>> import jaxvb
      >>> summary = jaxvb.ManySummary("store", num_datasets=10, num_stored=4,
      ...                             num_fitted=4, counts={"OK": 3, "HIGH_KHAT": 1},
      ...                             seconds=2.0)
      >>> summary.complete
      False
      >>> print(summary)
      jaxvb.fit_many: store incomplete, 4/10 data sets stored (HIGH_KHAT 1, OK 3); 4 fitted in 2.0 s
    """

    store: str
    num_datasets: int
    num_stored: int
    num_fitted: int
    counts: dict
    seconds: float

    @property
    def complete(self) -> bool:
        """Whether every chunk is in the store."""
        return self.num_stored == self.num_datasets

    def __str__(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        state = "complete" if self.complete else "incomplete"
        return (
            f"jaxvb.fit_many: {self.store} {state}, {self.num_stored}/{self.num_datasets} "
            f"data sets stored ({counts or 'no status'}); {self.num_fitted} fitted in "
            f"{self.seconds:.1f} s"
        )


# --- the header -------------------------------------------------------------------------


def describe(tree, path: str = "") -> dict:
    """The structure of ``tree`` as JSON, each array named by its ``keystr`` path."""
    if tree is None:
        return {"kind": "none"}
    for kind, cls in _RECORDS.items():
        if type(tree) is cls:
            fields = {f: describe(getattr(tree, f), f"{path}.{f}") for f in cls._fields}
            return {"kind": kind, "fields": fields}
    if type(tree) in _FAMILY_PATHS:
        fields, static = {}, {}
        for f in dataclasses.fields(tree):
            value = getattr(tree, f.name)
            if f.metadata.get("static", False):
                static[f.name] = value
            else:
                fields[f.name] = describe(value, f"{path}.{f.name}")
        json.dumps(static)
        return {
            "kind": "family",
            "class": _FAMILY_PATHS[type(tree)],
            "fields": fields,
            "static": static,
        }
    if type(tree) in (tuple, list):
        items = [describe(v, f"{path}[{j}]") for j, v in enumerate(tree)]
        return {"kind": type(tree).__name__, "items": items}
    if type(tree) is dict and all(isinstance(k, str) for k in tree):
        return {"kind": "dict", "items": {k: describe(v, f"{path}[{k!r}]") for k, v in tree.items()}}  # fmt: skip
    if hasattr(tree, "shape") and hasattr(tree, "dtype"):
        return {"kind": "array", "name": leaf_name(path)}
    raise TypeError(type(tree).__name__)


def array_names(node: dict) -> set[str]:
    """The names of the arrays a :func:`describe` node holds."""
    if node["kind"] == "array":
        return {node["name"]}
    children = node.get("fields") or node.get("items") or {}
    values = children.values() if isinstance(children, dict) else children
    return set().union(*(array_names(v) for v in values))


def _rebuild(node: dict, arrays: dict):
    kind = node["kind"]
    if kind == "none":
        return None
    if kind == "array":
        return arrays[node["name"]]
    if kind in _RECORDS:
        return _RECORDS[kind](**{f: _rebuild(v, arrays) for f, v in node["fields"].items()})
    if kind == "family":
        fields = {f: _rebuild(v, arrays) for f, v in node["fields"].items()}
        return build(FAMILIES[node["class"]], **fields, **node["static"])
    if kind in ("tuple", "list"):
        items = [_rebuild(v, arrays) for v in node["items"]]
        return tuple(items) if kind == "tuple" else items
    return {k: _rebuild(v, arrays) for k, v in node["items"].items()}


def leaf_name(path: str) -> str:
    return path[1:] if path.startswith(".") else path or "value"


def _read_header(store: Path) -> dict:
    try:
        header = json.loads((store / HEADER).read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{store} is not a jaxvb.fit_many store: its {HEADER} cannot be read ({e})"
        ) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{store} is not a jaxvb.fit_many store (format {FORMAT!r})")
    if header.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{store} was written by a newer jaxvb ({header.get('jaxvb_version')}); "
            "upgrade jaxvb to read it"
        )
    return header


def _check_header(store: Path, stored: dict, wanted: dict) -> None:
    differ = []
    for name in ("jaxvb_version", "jax_version", "data", "model"):
        if stored.get(name) != wanted[name]:
            differ.append(
                f"{name}: the store has {stored.get(name)}, this call {wanted[name]}"
            )
    for name, value in wanted["settings"].items():
        if stored.get("settings", {}).get(name) != value:
            was = stored.get("settings", {}).get(name)
            differ.append(f"{name}: the store has {was}, this call {value}")
    if differ:
        raise ValueError(
            f"fit_many: the store {store} was written by another model or other settings, "
            "and its results are not mixed with this call's:\n  "
            + "\n  ".join(differ)
            + "\nUse a new store directory, or call fit_many as the store was written."
        )


def agree_on_header(store: Path, wanted: dict, rank: int) -> None:
    """Process 0 writes the header of a new store; every process checks it is theirs."""
    if rank == 0 and not (store / HEADER).exists():
        text = json.dumps(wanted, indent=1).encode()
        _atomic_write(store / HEADER, lambda f: f.write(text))
    _check_header(store, wait_for_header(store), wanted)


def wait_for_header(store: Path) -> dict:
    """The store's header, once process 0 has written it."""
    deadline = time.monotonic() + HEADER_WAIT_S
    while not (store / HEADER).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"fit_many: process 0 wrote no {store / HEADER} in {HEADER_WAIT_S:.0f} s"
            )
        time.sleep(0.05)
    return _read_header(store)


# --- the chunk files --------------------------------------------------------------------


def chunk_path(store: Path, i: int) -> Path:
    return store / f"chunk-{i:06d}.npz"


def _atomic_write(path: Path, write: Callable) -> None:
    """``write(file)`` to a temporary file beside ``path``, fsynced, then renamed."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # the rename itself, on file systems that allow it
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_npz(f, arrays: dict) -> None:
    # np.savez stamps each member with the time; a fixed date makes equal stores equal
    # byte for byte.
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(value))


def write_chunk(store: Path, i: int, rows: range, arrays: dict) -> None:
    try:
        _atomic_write(chunk_path(store, i), lambda f: _write_npz(f, arrays))
    except OSError as e:
        full = " (the disk is full)" if e.errno == errno.ENOSPC else ""
        raise OSError(
            e.errno,
            f"fit_many: could not write chunk {i} (data sets {rows.start}..{rows.stop - 1})"
            f" to the store {store}{full}: {e.strerror or e}. The chunks written before it "
            "are kept and the store stays valid: make room and call fit_many again with "
            "the same arguments to resume.",
        ) from e


def summary_of(store: Path, header: dict, fitted: int, seconds: float) -> ManySummary:
    settings, counts, stored = header["settings"], Counter(), 0
    for i in range(settings["num_chunks"]):
        path = chunk_path(store, i)
        if not path.exists():
            continue
        with np.load(path, allow_pickle=False) as chunk:
            stored += len(chunk["index"])
            if "status" in chunk.files:
                for s, n in zip(
                    *np.unique(chunk["status"], return_counts=True), strict=True
                ):
                    counts[Status(int(s)).name or "OK"] += int(n)
    return ManySummary(
        str(store), settings["num_datasets"], stored, fitted, dict(counts), seconds
    )


# --- reading ----------------------------------------------------------------------------


def _ranges(ids: list[int]) -> str:
    parts, start = [], None
    for j, i in enumerate(ids):
        start = i if start is None else start
        if j + 1 == len(ids) or ids[j + 1] != i + 1:
            parts.append(str(start) if start == i else f"{start}-{i}")
            start = None
    return ", ".join(parts)


def _read_chunk(store: Path, i: int, names: list, settings: dict) -> dict:
    path, size = chunk_path(store, i), settings["chunk_size"]
    try:
        with np.load(path, allow_pickle=False) as chunk:
            columns = {n: chunk[n] for n in names}
    except Exception as e:  # a damaged file (the disk, or a copy): name it
        raise ValueError(
            f"jaxvb.load_many: {path} cannot be read ({type(e).__name__}: {e}); delete it "
            "and call fit_many again to fit that chunk anew"
        ) from None
    rows = range(i * size, min((i + 1) * size, settings["num_datasets"]))
    if columns["index"].tolist() != list(rows):
        raise ValueError(
            f"jaxvb.load_many: {path} does not hold the data sets of chunk {i}"
        )
    return columns


def load_many(store: str | os.PathLike, *, partial: bool = False, like: Any = None):
    """Reads a :func:`fit_many` store back as one pytree over all its data sets.

    Args:
      store: the store's directory.
      partial: return what an incomplete store holds, with the data sets' indices,
        instead of refusing it.
      like: a pytree of ``fit_one``'s structure (e.g. one result, or
        ``jax.eval_shape`` of ``fit_one``), needed only where ``fit_one`` returns a
        pytree of a type the header cannot describe (anything but tuples, lists,
        dicts, :class:`jaxvb.Result` and jaxvb's families).

    Returns:
      ``fit_one``'s pytree with a leading axis over the data sets in index order; with
      ``partial=True``, ``(tree, indices)``.

    Raises:
      ValueError: not a store, or (without ``partial``) chunks are missing: the error
        names them.

    Example:
      >>> import tempfile, jaxvb
      >>> jaxvb.load_many(tempfile.mkdtemp())
      Traceback (most recent call last):
      ...
      ValueError: ... is not a jaxvb.fit_many store: its header.json cannot be read (...)
    """
    store = Path(store)
    header = _read_header(store)
    settings = header["settings"]
    present = [i for i in range(settings["num_chunks"]) if chunk_path(store, i).exists()]
    missing = sorted(set(range(settings["num_chunks"])) - set(present))
    if missing and not partial:
        raise ValueError(
            f"jaxvb.load_many: the store {store} is incomplete: chunks {_ranges(missing)} "
            f"of {settings['num_chunks']} are missing. Call fit_many again with the same "
            "arguments to finish it, or load_many(store, partial=True) for what is there."
        )
    names = ["index", *header["leaves"]]
    columns: dict[str, list] = {n: [] for n in names}
    for i in present:
        for n, column in _read_chunk(store, i, names, settings).items():
            columns[n].append(column)
    arrays = {}
    for n in names:
        spec = header.get("leaves", {}).get(n)
        empty = np.zeros([0, *spec["shape"]], spec["dtype"]) if spec else np.zeros(0, int)
        arrays[n] = np.concatenate(columns[n]) if columns[n] else empty
    indices = arrays.pop("index")
    arrays = {n: jnp.asarray(a) for n, a in arrays.items()}
    if like is not None:
        flat, treedef = jax.tree_util.tree_flatten_with_path(like)
        leaves = [arrays[leaf_name(jax.tree_util.keystr(p))] for p, _ in flat]
        tree = jax.tree_util.tree_unflatten(treedef, leaves)
    elif header.get("structure") is None:
        raise ValueError(
            f"jaxvb.load_many: the results in {store} are a pytree of a type the header "
            "does not describe; pass like= (one result of fit_one, or its jax.eval_shape)"
        )
    else:
        tree = _rebuild(header["structure"], arrays)
    return (tree, indices) if partial else tree
