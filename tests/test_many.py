"""``jaxvb.fit_many`` and ``jaxvb.load_many``: a store that resumes, refuses and splits.

The fast tests share one small model (``MODEL``, compiled once for ``CHUNK`` data sets)
and one uninterrupted store (``reference``); the subprocess tests (a real ``SIGKILL``,
2 and 4 ``jax.distributed`` processes on 127.0.0.1, the benchmark's quick run) are
marked ``integration``. The children run ``MODEL``'s source, so their ``fit_one`` has
the same jaxpr (the store's fingerprint) as this process's.
"""

import collections
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb
from jaxvb import batch

ROOT = Path(__file__).resolve().parents[1]
MODEL = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, jaxvb

    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))

    def fit_one(key, center, scale):
        def log_joint(x):
            r = (x - center) / scale
            return -0.5 * jnp.sum(r**2) - 0.05 * jnp.sum(r**4)
        return jaxvb.fit(log_joint, q0, key, num_steps=20, num_eval_draws=8)

    NUM, CHUNK = 7, 3  # three chunks, the last padded
    centers = jnp.linspace(-1.0, 1.0, 2 * NUM).reshape(NUM, 2)
    scales = jnp.ones(NUM).at[4].set(jnp.nan)  # data set 4's fit fails
    KEY = jax.random.key(11)
    """
)
SPACE: dict = {}
exec(MODEL, SPACE)
fit_one, centers, scales = SPACE["fit_one"], SPACE["centers"], SPACE["scales"]
NUM, CHUNK, KEY = SPACE["NUM"], SPACE["CHUNK"], SPACE["KEY"]


def files(store) -> dict:
    """Each file of a store and its bytes."""
    return {p.name: p.read_bytes() for p in sorted(Path(store).iterdir())}


def compile_counter():
    """A list that collects the names of the programs XLA compiles from now on."""
    seen: list = []

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(kw.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    return seen


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run, with the compilations it made."""
    store = tmp_path_factory.mktemp("reference")
    seen = compile_counter()
    summary = jaxvb.fit_many(
        fit_one, (centers, scales), store=store, chunk_size=CHUNK, key=KEY, progress=False
    )
    return store, summary, list(seen)


def test_one_program_and_the_results_of_a_vmapped_fit(reference):
    store, summary, compiled = reference
    # Three chunks, the last padded: one compiled fit for all of them.
    assert sum("_sharded_vmap" in name for name in compiled) == 1, compiled
    assert summary.complete and summary.num_fitted == NUM
    assert summary.counts["OK"] == NUM - 1 and sum(summary.counts.values()) == NUM
    res = jaxvb.load_many(store)
    assert isinstance(res, jaxvb.Result) and isinstance(res.q, jaxvb.Gaussian)
    keys = jax.vmap(jax.random.fold_in, (None, 0))(KEY, jnp.arange(NUM, dtype=jnp.uint32))
    direct = jax.jit(jax.vmap(fit_one))(keys, centers, scales)
    for a, b in zip(jax.tree.leaves(res), jax.tree.leaves(direct), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)
    assert int(res.status[4]) != 0 and not bool(res.ok[4])


def test_the_store_is_plain_numpy_and_json(reference):
    store = reference[0]
    header = json.loads((store / "header.json").read_text())
    assert header["settings"]["num_chunks"] == 3 and header["structure"]["kind"] == "Result"
    with np.load(store / "chunk-000001.npz", allow_pickle=False) as chunk:
        assert chunk["index"].tolist() == [3, 4, 5]
        assert chunk["q.mean"].shape == (3, 2) and chunk["status"][1] != 0
        reasons = chunk["reason"].tolist()
    assert reasons[0] == reasons[2] == "ok"
    assert "not finite" in reasons[1]  # jaxvb.explain's account of data set 4


def test_resume_fits_what_is_missing_and_equals_the_uninterrupted_store(
    reference, tmp_path, capsys
):
    store = tmp_path / "store"
    shutil.copytree(reference[0], store)
    (store / "chunk-000001.npz").unlink()
    (store / ".chunk-000001.npz.deadbeef.tmp").write_bytes(b"half a chunk")  # a kill
    with pytest.raises(ValueError, match=r"chunks 1 of 3 are missing"):
        jaxvb.load_many(store)
    part, index = jaxvb.load_many(store, partial=True)
    assert index.tolist() == [0, 1, 2, 6] and part.q.mean.shape == (4, 2)
    summary = jaxvb.fit_many(
        fit_one, (centers, scales), store=store, chunk_size=CHUNK, key=KEY
    )
    assert summary.num_fitted == 3 and summary.complete  # only chunk 1's data sets
    assert files(store) == files(reference[0])  # bit for bit, the temporary file gone
    (store / "chunk-000002.npz").write_bytes(b"damaged")
    with pytest.raises(ValueError, match="chunk-000002.npz cannot be read"):
        jaxvb.load_many(store)
    # The progress line (data sets per second, time left) and the summary, printed.
    lines = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"jaxvb.fit_many: 7/7 data sets \(100%\), [0-9.e+]+/s, 0 s left, 1 flagged",
                        lines[-2]), lines  # fmt: skip
    assert lines[-1] == str(summary) and "7/7 data sets stored" in lines[-1]


def test_a_store_of_other_settings_or_another_model_is_refused(reference, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(reference[0], store)
    run = dict(store=store, chunk_size=CHUNK, key=KEY, progress=False)
    cases = [
        ((fit_one, (centers, scales)), dict(chunk_size=2), "chunk_size"),
        ((fit_one, (centers, scales)), dict(key=jax.random.key(12)), "key_data"),
        ((fit_one, (centers[:6], scales[:6])), {}, "num_datasets"),
        ((fit_one, (centers.astype(jnp.float32), scales)), {}, "data"),
        ((lambda k, c, s: fit_one(k, c, 2 * s), (centers, scales)), {}, "model"),
    ]
    for (fn, source), change, name in cases:
        with pytest.raises(
            ValueError, match=rf"another model or other settings(.|\n)*{name}"
        ):
            jaxvb.fit_many(fn, source, **{**run, **change})
    header = json.loads((store / "header.json").read_text())
    (store / "header.json").write_text(json.dumps({**header, "jaxvb_version": "0.0.1"}))
    with pytest.raises(ValueError, match="jaxvb_version: the store has 0.0.1"):
        jaxvb.fit_many(fit_one, (centers, scales), **run)
    (store / "header.json").write_text(json.dumps({**header, "format_version": 99}))
    with pytest.raises(ValueError, match="newer jaxvb"):
        jaxvb.load_many(store)
    assert files(store).keys() == files(reference[0]).keys()  # nothing mixed in


def test_bad_sources_are_named():
    run = dict(store="unused", chunk_size=2, key=KEY, progress=False)
    with pytest.raises(ValueError, match=r"source\[0\] \(7, 2\), source\[1\] \(6,\)"):
        jaxvb.fit_many(fit_one, (centers, scales[:6]), **run)
    with pytest.raises(ValueError, match="num_datasets"):
        jaxvb.fit_many(fit_one, lambda i: (centers, scales), **run)
    with pytest.raises(ValueError, match="chunk_size must be an integer"):
        jaxvb.fit_many(fit_one, (centers, scales), **{**run, "chunk_size": 0})


def test_a_failing_loader_and_a_full_disk_keep_what_is_done(
    reference, tmp_path, monkeypatch
):
    store = tmp_path / "store"
    run = dict(store=store, chunk_size=CHUNK, key=KEY, num_datasets=NUM, progress=False)

    def rows(i):
        return slice(i * CHUNK, (i + 1) * CHUNK)

    def broken(i):
        if i == 2:
            raise KeyError("no such file")
        return centers[rows(i)], scales[rows(i)]

    with pytest.raises(
        RuntimeError, match=r"loading chunk 2 \(data sets 6..6\) raised KeyError"
    ):
        jaxvb.fit_many(fit_one, broken, **run)
    assert sorted(files(store)) == ["chunk-000000.npz", "chunk-000001.npz", "header.json"]

    with pytest.raises(ValueError, match=r"chunk 2 \(data sets 6..6\) has arrays"):
        jaxvb.fit_many(fit_one, lambda i: (centers[:2], scales[:2]), **run)
    (store / "chunk-000001.npz").unlink()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def filling(i):  # the disk fills up after chunk 1 is loaded
        monkeypatch.setattr(np.lib.format, "write_array", full)
        return centers[rows(i)], scales[rows(i)]

    with pytest.raises(OSError, match=rf"chunk 1 \(data sets 3..5\) to the store {store}"):
        jaxvb.fit_many(fit_one, filling, **run)
    monkeypatch.undo()
    assert sorted(files(store)) == ["chunk-000000.npz", "header.json"]  # no half file
    summary = jaxvb.fit_many(fit_one, lambda i: (centers[rows(i)], scales[rows(i)]), **run)
    assert summary.num_fitted == 4 and files(store) == files(reference[0])


@pytest.mark.slow  # a program of its own
def test_any_pytree_of_arrays(tmp_path):
    def draw(key, x):
        return {"x": x + jax.random.normal(key, x.shape), "pair": (x.sum(), jnp.int32(1))}

    xs = jnp.arange(10.0).reshape(5, 2)
    jaxvb.fit_many(draw, (xs,), store=tmp_path, chunk_size=2, key=KEY, progress=False)
    out = jaxvb.load_many(tmp_path)
    keys = jax.vmap(jax.random.fold_in, (None, 0))(KEY, jnp.arange(5, dtype=jnp.uint32))
    assert out["x"].shape == (5, 2) and out["pair"][1].tolist() == [1] * 5
    np.testing.assert_array_equal(out["x"], jax.vmap(draw)(keys, xs)["x"])
    # A pytree type of the user's own is read back with like=.
    Pair = collections.namedtuple("Pair", "a b")
    store = tmp_path / "pairs"
    jaxvb.fit_many(lambda k, x: Pair(x, 2 * x), (xs,), store=store, chunk_size=2, key=KEY,
                   progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="pass like="):
        jaxvb.load_many(store)
    pairs = jaxvb.load_many(store, like=Pair(xs[0], xs[0]))
    assert isinstance(pairs, Pair) and pairs.b.tolist() == (2 * xs).tolist()


@pytest.mark.slow  # a program of its own
def test_the_fits_do_not_depend_on_the_chunking(reference, tmp_path):
    """A chunk of one: the same fits (to rounding: a batch of another size is another
    program), and a second compiled program, for the second chunk size."""
    before = batch._sharded_vmap._cache_size()
    jaxvb.fit_many(
        fit_one, (centers[:2], scales[:2]), store=tmp_path, chunk_size=1, key=KEY,
        progress=False,
    )  # fmt: skip
    assert batch._sharded_vmap._cache_size() == before + 1
    one, ref = jaxvb.load_many(tmp_path), jaxvb.load_many(reference[0])
    np.testing.assert_allclose(one.q.mean, ref.q.mean[:2], rtol=1e-10)


# --- subprocesses -------------------------------------------------------------------------

KILLED = textwrap.dedent(
    """
    import pathlib, sys, time
    exec(sys.argv[3])  # MODEL
    store, ready = sys.argv[1], pathlib.Path(sys.argv[2])

    def load(i):
        if i == 2:  # chunks 0 and 1 are stored: the parent may kill now
            ready.touch()
            time.sleep(600)
        return centers[i * CHUNK : (i + 1) * CHUNK], scales[i * CHUNK : (i + 1) * CHUNK]

    jaxvb.fit_many(fit_one, load, store=store, chunk_size=CHUNK, key=KEY,
                   num_datasets=NUM, progress=False)
    """
)
PROCESS = textwrap.dedent(
    """
    import json, sys
    import jax
    rank, count, port, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=count, process_id=rank
    )
    exec(sys.argv[5])  # MODEL, after initialize: it computes with JAX
    summary = jaxvb.fit_many(fit_one, (centers, scales), store=store, chunk_size=CHUNK,
                             key=KEY, progress=False)
    print(json.dumps([jax.process_index(), jax.process_count(), summary.num_fitted]))
    """
)


def child_env():
    return dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1")


@pytest.mark.integration
def test_a_run_killed_with_sigkill_resumes_to_the_same_store(reference, tmp_path):
    store, ready = tmp_path / "store", tmp_path / "ready"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(store), str(ready), MODEL],
        env=child_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), child.stderr.read()[-3000:] if child.poll() is not None else ""
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL
    child.stderr.close()
    assert sorted(p.name for p in store.glob("chunk-*")) == [
        "chunk-000000.npz",
        "chunk-000001.npz",
    ]
    summary = jaxvb.fit_many(
        fit_one, (centers, scales), store=store, chunk_size=CHUNK, key=KEY, progress=False
    )
    assert summary.num_fitted == 1  # chunk 2 only: each data set fitted once
    assert files(store) == files(reference[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
@pytest.mark.parametrize("count", [2, 4])
def test_processes_share_the_chunks_and_write_one_process_store(reference, tmp_path, count):
    store, port = tmp_path / "store", str(free_port())
    children = [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, str(rank), str(count), port, str(store), MODEL],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(count)
    ]
    outs = [child.communicate(timeout=600) for child in children]
    for child, (_, err) in zip(children, outs, strict=True):
        assert child.returncode == 0, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    # Chunk i goes to process i % count: with 3 chunks of 3, 3, 1 data sets.
    fitted = [sum(len(range(NUM)[i * CHUNK : (i + 1) * CHUNK]) for i in range(r, 3, count))
              for r in range(count)]  # fmt: skip
    assert reports == [[r, count, fitted[r]] for r in range(count)]
    assert files(store) == files(reference[0])


@pytest.mark.integration
def test_the_benchmark_runs_quick(tmp_path):
    """``benchmarks/many_fits.py --quick``: streamed runs, processes and the overhead."""
    script = ROOT / "benchmarks" / "many_fits.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "many_fits.json").read_text())
    streamed = report["streamed"]
    assert [r["num_datasets"] for r in streamed] == [400, 1200]
    assert all(r["ok_fraction"] > 0.95 and r["peak_rss_mb"] > 0 for r in streamed)
    assert [r["fitted_by_process"] for r in report["processes"]] == [[800], [400, 400]]
    assert report["overhead"]["max_abs_difference_of_q"] < 1e-10
    assert (tmp_path / "many_fits.png").stat().st_size > 0
