"""Millions of probit fits streamed into a store (``jaxvb.fit_many``): memory, processes, overhead.

The paper's probit model (section 5: N = 100 observations, M = 5 regressors, prior
N(0, I)) fitted by Algorithm 2 (``method="hessian"``, ``NUM_STEPS`` steps from the prior,
``NUM_EVAL_DRAWS`` diagnostics draws) to each of many data sets simulated as the paper
does (``jaxvb.models.probit.simulate``). Chunk ``i`` is simulated from
``fold_in(key, i)`` when ``fit_many`` loads it, so the collection is never in memory.

1. **Streamed, bounded memory**: ``SIZES`` data sets, each run in a fresh process: the
   seconds after compile, data sets per second, the peak resident memory (``VmHWM``)
   and the resident memory sampled through the run (it must not grow with the number
   of data sets).
2. **Processes**: the same data sets split over 1, 2 and 4 ``jax.distributed``
   processes on 127.0.0.1 (each compiles first; the clock starts when all have).
3. **The store's overhead**: ``fit_many`` of in-memory arrays against one
   ``jaxvb.fit_batched`` call of the same data, both after compile.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402
from jaxvb.models import probit  # noqa: E402

NAME = "many_fits"
NUM_STEPS = 50
NUM_EVAL_DRAWS = 2
FULL = dict(
    sizes=(10**4, 10**5, 10**6),
    chunk_size=2000,
    process_counts=(1, 2, 4),
    process_datasets=2 * 10**4,
    overhead_datasets=2 * 10**4,
    timeout_s=7200,
)
QUICK = dict(
    sizes=(400, 1200),
    chunk_size=200,
    process_counts=(1, 2),
    process_datasets=800,
    overhead_datasets=400,
    timeout_s=900,
)
NOTES = [
    f"Algorithm 2 with {NUM_STEPS} steps and {NUM_EVAL_DRAWS} diagnostics draws per "
    "fit, so that 10^6 fits run in minutes on 2 CPU cores; 'ok_fraction' is the share of fits "
    "with status 0.",
    "Each streamed size runs in a fresh process, which compiles the chunk program first "
    "('compile_s'); 'seconds' and 'datasets_per_s' are fit_many's, after compile.",
    "rss_growth_mb: the largest resident memory sampled in the last quarter of "
    "fit_many's run minus that in its first quarter: bounded memory keeps it near 0.",
    "Processes share the machine's CPU cores: with 2 cores, more processes than 2 cannot "
    "add throughput, and XLA:CPU already spreads one process's work over both cores.",
]


# --- the model and the collection ---------------------------------------------------------


def make_fit_one():
    """``(key, design, y) -> jaxvb.Result``: one probit data set, from the prior."""
    q0 = jaxvb.Gaussian(
        jnp.zeros(probit.PAPER_NUM_FEATURES), jnp.eye(probit.PAPER_NUM_FEATURES)
    )

    def fit_one(key, design, y):
        return jaxvb.fit(
            partial(probit.log_joint, design=design, y=y),
            q0,
            key,
            method="hessian",
            num_steps=NUM_STEPS,
            num_eval_draws=NUM_EVAL_DRAWS,
            on_failure="ignore",
        )

    return fit_one


@partial(jax.jit, static_argnums=1)
def _simulate(key, num):
    _, design, y = probit.simulate(key, num)
    return design, y


def make_loader(seed: int, num_datasets: int, chunk_size: int):
    """``load(i)``: chunk ``i``'s data sets, simulated when asked for."""

    def load(i):
        rows = min(chunk_size, num_datasets - i * chunk_size)
        design, y = _simulate(jax.random.fold_in(jax.random.key(seed), i), chunk_size)
        return np.asarray(design)[:rows], np.asarray(y)[:rows]

    return load


def warm_up(fit_one, chunk_size: int) -> float:
    """Compiles the chunk program (``fit_many`` then reuses it); its seconds."""
    design, y = _simulate(jax.random.key(0), chunk_size)
    keys = jax.random.split(jax.random.key(0), chunk_size)
    t0 = time.perf_counter()
    jax.block_until_ready(
        jaxvb.fit_batched(fit_one, keys, design, y, devices=jax.local_devices())
    )
    return time.perf_counter() - t0


class RssSampler(threading.Thread):
    """The process's resident memory (``VmRSS``), sampled every ``every`` seconds."""

    def __init__(self, every: float = 0.25):
        super().__init__(daemon=True)
        self.every, self.samples, self.stopped = every, [], threading.Event()
        self.t0 = time.perf_counter()

    def run(self):
        while not self.stopped.wait(self.every):
            kb = common._proc_kb("/proc/self/status", "VmRSS")
            self.samples.append((time.perf_counter() - self.t0, (kb or 0) / 1024))

    def thinned(self, num: int = 200) -> list:
        step = max(1, len(self.samples) // num)
        return [[round(t, 2), round(m, 1)] for t, m in self.samples[::step]]


# --- workers (each in a fresh process) ----------------------------------------------------


def worker_stream(spec: dict) -> dict:
    n, chunk = spec["num_datasets"], spec["chunk_size"]
    sampler = RssSampler()
    sampler.start()
    fit_one = make_fit_one()
    compile_s = warm_up(fit_one, chunk)
    with tempfile.TemporaryDirectory() as store:
        t0 = time.perf_counter()
        summary = jaxvb.fit_many(
            fit_one,
            make_loader(spec["seed"], n, chunk),
            num_datasets=n,
            store=store,
            chunk_size=chunk,
            key=jax.random.key(spec["seed"]),
            progress=spec.get("progress", False),
        )
        seconds = time.perf_counter() - t0
        store_bytes = sum(p.stat().st_size for p in Path(store).iterdir())
    sampler.stopped.set()
    sampler.join()
    during = [m for t, m in sampler.samples if t >= t0 - sampler.t0] or [0.0]
    quarter = max(1, len(during) // 4)
    return dict(
        num_datasets=n,
        chunk_size=chunk,
        compile_s=round(compile_s, 2),
        seconds=round(seconds, 2),
        datasets_per_s=round(n / seconds, 1),
        ok_fraction=summary.counts.get("OK", 0) / n,
        counts=summary.counts,
        peak_rss_mb=round(common.peak_rss_mb(), 1),
        rss_at_start_mb=during[0],
        rss_growth_mb=round(max(during[-quarter:]) - max(during[:quarter]), 1),
        store_bytes_per_dataset=round(store_bytes / n, 1),
        rss_samples=sampler.thinned(),
    )


def worker_process(spec: dict) -> dict:
    rank, count = spec["rank"], spec["count"]
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{spec['port']}",
        num_processes=count,
        process_id=rank,
    )
    fit_one = make_fit_one()
    compile_s = warm_up(fit_one, spec["chunk_size"])
    sync = Path(spec["sync"])
    (sync / f"warm-{rank}").touch()
    while not (sync / "go").exists():
        time.sleep(0.02)
    start = time.time()
    summary = jaxvb.fit_many(
        fit_one,
        make_loader(spec["seed"], spec["num_datasets"], spec["chunk_size"]),
        num_datasets=spec["num_datasets"],
        store=spec["store"],
        chunk_size=spec["chunk_size"],
        key=jax.random.key(spec["seed"]),
        progress=False,
    )
    return dict(rank=rank, compile_s=round(compile_s, 2), start=start, end=time.time(),
                fitted=summary.num_fitted)  # fmt: skip


def worker_overhead(spec: dict) -> dict:
    n, chunk = spec["num_datasets"], spec["chunk_size"]
    fit_one = make_fit_one()
    design, y = _simulate(jax.random.key(spec["seed"]), n)
    design, y = np.asarray(design), np.asarray(y)
    key = jax.random.key(spec["seed"])
    keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(n, dtype=jnp.uint32))
    common.timed(jaxvb.fit_batched, fit_one, keys, design, y)  # compile
    in_memory, batched_s = common.timed(jaxvb.fit_batched, fit_one, keys, design, y)
    with tempfile.TemporaryDirectory() as warm:  # compiles what fit_many runs
        jaxvb.fit_many(fit_one, (design, y), store=warm, chunk_size=chunk, key=key,
                       progress=False)  # fmt: skip
    with tempfile.TemporaryDirectory() as store:
        t0 = time.perf_counter()
        jaxvb.fit_many(fit_one, (design, y), store=store, chunk_size=chunk, key=key,
                       progress=False)  # fmt: skip
        many_s = time.perf_counter() - t0
        stored = jaxvb.load_many(store)
    diff = max(
        float(np.max(np.abs(np.asarray(a, float) - np.asarray(b, float))))
        for a, b in zip(
            jax.tree.leaves(stored.q), jax.tree.leaves(in_memory.q), strict=True
        )
    )
    return dict(
        num_datasets=n,
        chunk_size=chunk,
        fit_batched_s=round(batched_s, 2),
        fit_many_s=round(many_s, 2),
        overhead=round(many_s / batched_s - 1, 3),
        max_abs_difference_of_q=diff,
    )


WORKERS = {"stream": worker_stream, "process": worker_process, "overhead": worker_overhead}


# --- the runs ------------------------------------------------------------------------------


def worker_env() -> dict:
    return dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1")


def run_one(spec: dict, timeout_s: float) -> dict:
    payloads, error = common.run_worker(__file__, spec, timeout_s, env=worker_env())
    if error or not payloads:
        return dict(spec, error=error or "no result")
    return payloads[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(count: int, settings: dict, seed: int) -> dict:
    """``count`` processes on one store; the clock from the last compile to the last end."""
    with tempfile.TemporaryDirectory() as sync, tempfile.TemporaryDirectory() as store:
        base = dict(kind="process", count=count, port=free_port(), sync=sync, store=store,
                    num_datasets=settings["process_datasets"], seed=seed,
                    chunk_size=settings["chunk_size"])  # fmt: skip
        results: list = [None] * count

        def launch(rank):
            results[rank] = run_one(dict(base, rank=rank), settings["timeout_s"])

        threads = [threading.Thread(target=launch, args=(r,)) for r in range(count)]
        for t in threads:
            t.start()
        while len(list(Path(sync).glob("warm-*"))) < count and any(
            t.is_alive() for t in threads
        ):
            time.sleep(0.05)
        (Path(sync) / "go").touch()
        for t in threads:
            t.join()
    if any("error" in r for r in results):
        return dict(processes=count, error=[r.get("error") for r in results])
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    n = settings["process_datasets"]
    return dict(
        processes=count,
        num_datasets=n,
        seconds=round(seconds, 2),
        datasets_per_s=round(n / seconds, 1),
        fitted_by_process=[r["fitted"] for r in results],
        compile_s=[r["compile_s"] for r in results],
    )


def plot(report: dict, path):
    fig = common.figure(figsize=(10, 4))
    ax = fig.add_subplot(1, 2, 1)
    for row in report["streamed"]:
        if "rss_samples" in row:
            t, m = np.asarray(row["rss_samples"]).T
            ax.plot(t / max(t[-1], 1e-9), m, label=f"{row['num_datasets']:,} data sets")
    ax.set(xlabel="fraction of the worker's time (compile, then fit_many)",
           ylabel="resident memory (MB)",
           title="fit_many: memory through a run")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.legend()
    ax = fig.add_subplot(1, 2, 2)
    rows = [r for r in report["processes"] if "datasets_per_s" in r]
    ax.bar([str(r["processes"]) for r in rows], [r["datasets_per_s"] for r in rows])
    over = report["overhead"]
    if "fit_batched_s" in over:
        rate = over["num_datasets"] / over["fit_batched_s"]
        ax.axhline(rate, color="k", ls="--", label="in-memory fit_batched, 1 process")
        ax.legend(loc="lower right")
    ax.set(xlabel="processes", ylabel="data sets per second",
           title=f"{report['environment']['cpu_count']} CPU cores")  # fmt: skip
    common.save(fig, path)


def targets(report: dict) -> dict:
    rows = [r for r in report["streamed"] if "peak_rss_mb" in r]
    out = {}
    if len(rows) >= 2:
        small, large = rows[0], rows[-1]
        growth = large["peak_rss_mb"] - small["peak_rss_mb"]
        out["peak_rss_flat"] = dict(
            target="peak RSS grows by < 10% from the smallest to the largest run",
            value=round(growth, 1),
            sizes=[small["num_datasets"], large["num_datasets"]],
            met=growth < 0.1 * small["peak_rss_mb"],
        )
    over = report["overhead"]
    if "overhead" in over:
        out["store_overhead"] = dict(
            target="fit_many within 25% of an in-memory fit_batched",
            value=over["overhead"],
            met=over["overhead"] < 0.25,
        )
    return out


def main(argv=None) -> dict:
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="hundreds of data sets, 1 and 2 processes")  # fmt: skip
    parser.add_argument("--sizes", type=int, nargs="*", default=None,
                        help="the streamed runs' numbers of data sets")  # fmt: skip
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        jax.config.update("jax_enable_x64", True)
        common.emit(WORKERS[spec["kind"]](spec))
        return {}
    settings = dict(QUICK if args.quick else FULL)
    if args.sizes:
        settings["sizes"] = tuple(args.sizes)
    out = common.output_dir(args, NAME)
    base = dict(seed=args.seed, chunk_size=settings["chunk_size"])
    streamed = []
    for n in settings["sizes"]:
        print(f"streamed: {n} data sets", flush=True)
        streamed.append(
            run_one(dict(base, kind="stream", num_datasets=n), settings["timeout_s"])
        )
    processes = []
    for count in settings["process_counts"]:
        print(f"processes: {count}", flush=True)
        processes.append(run_processes(count, settings, args.seed))
    print("overhead", flush=True)
    n = settings["overhead_datasets"]
    overhead = run_one(dict(base, kind="overhead", num_datasets=n), settings["timeout_s"])
    report = dict(
        description=__doc__.splitlines()[0],
        environment=common.environment(),
        settings=dict(
            settings,
            num_steps=NUM_STEPS,
            num_eval_draws=NUM_EVAL_DRAWS,
            method="hessian",
            dtype="float64",
            quick=args.quick,
        ),  # fmt: skip
        streamed=streamed,
        processes=processes,
        overhead=overhead,
        notes=NOTES,
    )
    report["targets"] = targets(report)
    common.print_targets(report["targets"])
    common.write_json(out, NAME, report)
    plot(report, out / f"{NAME}.png")
    return report


if __name__ == "__main__":
    main()
