"""The benchmarks' shared harness: timing, peers, subprocesses, the record and the output.

Every script in ``benchmarks/`` is one experiment; what they share is here:

* **Timing.** :func:`timed` (one call, ending in ``jax.block_until_ready``),
  :func:`time_calls` (repeated calls after compile: median and spread),
  :func:`first_and_after` (the first call, compile included, then calls after compile),
  :func:`lower_and_compile` (``jit(fn).lower(...).compile()``, its seconds apart),
  :func:`compile_log` (JAX's compile events by program).
* **The model's own cost.** :func:`hessian_scan`.
* **Results and draws.** :func:`status_record`, :func:`draws_summary` (a reference's
  record of one quantity), :func:`kde_on_grid`, :func:`rounded`.
* **Peers in the same process.** :func:`nuts`: NumPyro NUTS on a log joint.
* **Fresh processes.** :func:`run_worker` runs a script's ``--worker`` function in a
  subprocess (its own peak memory, its own compile caches, a time limit) and collects
  what it :func:`emit`\\ s; :func:`peak_rss_mb`, :func:`memory_available_mb`.
* **The record.** :func:`environment`: machine, versions, JAX settings, devices, and the
  git commit as data.
* **Output.** :func:`parser` and :func:`output_dir` (the options every script has),
  :func:`write_json`, :func:`read_result`, :func:`print_targets`, :func:`figure` and
  :func:`save` (PNG).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
if str(ROOT) not in sys.path:  # a checkout without `pip install -e .`
    sys.path.insert(1, str(ROOT))

#: Peers and tools whose versions the record names where they are installed.
_PACKAGES = ("numpyro", "optax", "scipy", "matplotlib")


# --- timing ------------------------------------------------------------------------------


def timed(fn: Callable, *args):
    """``(fn(*args), seconds)``, the call ending in ``block_until_ready``."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


def time_calls(fn: Callable, args_for_call: Callable, repeats: int) -> dict:
    """Seconds per call of an already compiled ``fn`` (``block_until_ready`` each).

    ``args_for_call(i)`` gives the arguments of call ``i`` (e.g. a new key each time).
    """
    times = [timed(fn, *args_for_call(i))[1] for i in range(repeats)]
    return dict(
        median_s=statistics.median(times),
        min_s=min(times),
        q25_s=float(np.quantile(times, 0.25)),
        q75_s=float(np.quantile(times, 0.75)),
        repeats=int(repeats),
    )


def first_and_after(call: Callable, repeats: int):
    """``call(0)`` (compile included), then ``call(1) .. call(repeats)`` after compile.

    Returns the first call's output and ``dict(first_call_s, run)`` (``run`` as
    :func:`time_calls`'s).
    """
    out, first = timed(call, 0)
    run = time_calls(call, lambda i: (i + 1,), repeats)
    return out, dict(first_call_s=first, run=run)


def lower_and_compile(fn: Callable, *args, options: dict | None = None):
    """``jax.jit(fn)`` lowered and compiled for ``args`` (XLA ``options`` if given):
    the compiled function and the seconds its compilation took."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile(compiler_options=options)
    return compiled, time.perf_counter() - t0


_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_recording: list[list] = []
_listening = False


def _listener(event, duration, **kwargs):
    if event in _COMPILE_EVENTS:
        for log in _recording:
            log.append((event, kwargs.get("fun_name", "?"), duration))


@contextlib.contextmanager
def compile_log():
    """Collects ``(event, function name, seconds)`` of JAX's compile events."""
    global _listening
    if not _listening:  # once per process: JAX has no public way to unregister
        jax.monitoring.register_event_duration_secs_listener(_listener)
        _listening = True
    log: list = []
    _recording.append(log)
    try:
        yield log
    finally:
        _recording.remove(log)


def compile_summary(log) -> dict:
    """Compile seconds (trace + lowering + XLA) by program, and how many XLA compiles."""
    by_fun: dict[str, float] = collections.defaultdict(float)
    for _, fun, seconds in log:
        by_fun[fun] += seconds
    big = {f: round(s, 3) for f, s in by_fun.items() if s >= 0.05}
    small = sum(s for s in by_fun.values() if s < 0.05)
    if small:
        big["(programs under 0.05 s each)"] = round(small, 3)
    return dict(
        compile_s=round(sum(by_fun.values()), 3),
        num_compiles=sum(e.endswith("backend_compile_duration") for e, _, _ in log),
        by_program=dict(sorted(big.items(), key=lambda kv: -kv[1])),
    )


def hessian_scan(log_joint: Callable) -> Callable:
    """Jitted ``xs -> sums``: the value, gradient and Hessian of ``log_joint`` at each row
    of ``xs`` (``jaxvb.methods.value_grad_hessian``, what ``method="hessian"`` computes
    per draw), summed in one ``lax.scan``: the model's own cost, against which a fit's
    steps are measured."""
    import jaxvb

    vgh = jaxvb.methods.value_grad_hessian(log_joint)

    @jax.jit
    def run(xs):
        def body(total, x):
            return jax.tree_util.tree_map(jnp.add, total, vgh(x)), None

        d, dtype = xs.shape[1], xs.dtype
        zeros = (jnp.zeros((), dtype), jnp.zeros(d, dtype), jnp.zeros((d, d), dtype))
        return jax.lax.scan(body, zeros, xs)[0]

    return run


def loglog_slope(x, y) -> float:
    """The least-squares slope of ``log y`` against ``log x``."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y)), 1)[0])


# --- results and draws ---------------------------------------------------------------------


def status_record(result, length: int = 600) -> dict:
    """A fit's ``status``, its flags' names and, when not 0, ``jaxvb.explain``'s text."""
    import jaxvb

    status = jaxvb.Status(int(result.status))
    out = dict(status=int(status), flags=status.name if status else "OK")
    if status:
        out["explanation"] = jaxvb.explain(result)[:length]
    return out


def rounded(a, digits: int = 7) -> list:
    """``a`` flattened to a list of floats of ``digits`` significant digits."""
    return [float(f"{x:.{digits}g}") for x in np.asarray(a, np.float64).ravel()]


def draws_summary(x, quantiles, thinned: int = 2000) -> dict:
    """A reference's record of one quantity from draws ``x`` of shape ``(chains,
    draws)``: moments, quantiles, ESS and split R-hat (NumPyro's), the Monte Carlo
    error of the mean, and ``thinned`` of the draws (for histograms)."""
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    x = np.asarray(x, np.float64)
    flat = x.reshape(-1)
    ess = float(effective_sample_size(x))
    sd = float(np.std(flat))
    return dict(
        mean=float(np.mean(flat)),
        sd=sd,
        quantiles={str(q): float(np.quantile(flat, q)) for q in quantiles},
        ess=ess,
        r_hat=float(split_gelman_rubin(x)),
        mean_mc_error=sd / np.sqrt(ess),
        draws_thinned=rounded(flat[:: max(1, flat.size // thinned)][:thinned]),
    )


def kde_on_grid(reference_draws, draws, num: int, pad: float) -> tuple[list, list]:
    """A Gaussian kernel density estimate (``scipy.stats.gaussian_kde``) of ``draws`` on
    ``num`` points over the reference's draws, widened by ``pad`` of their range."""
    from scipy.stats import gaussian_kde

    lo, hi = np.quantile(np.asarray(reference_draws), [0.0005, 0.9995])
    grid = np.linspace(lo - pad * (hi - lo), hi + pad * (hi - lo), num)
    return rounded(grid, 6), rounded(gaussian_kde(np.asarray(draws))(grid), 6)


# --- peers ---------------------------------------------------------------------------------


def nuts(
    log_joint: Callable,
    *,
    num_warmup: int,
    num_samples: int,
    num_chains: int = 1,
    chain_method: str = "vectorized",
):
    """NumPyro NUTS on ``log_joint`` (flat ``x``), the peer the benchmarks run in their
    own process. Returns ``run(key, init) -> MCMC``, which returns once the draws are
    computed; it runs one ``MCMC`` object, so a second run reuses its compiled
    sampler. ``extra_fields`` holds ``num_steps`` and ``diverging``."""
    from numpyro.infer import MCMC, NUTS

    mcmc = MCMC(
        NUTS(potential_fn=lambda x: -log_joint(x)),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method=chain_method,
        progress_bar=False,
    )

    def run(key, init):
        mcmc.run(key, init_params=init, extra_fields=("num_steps", "diverging"))
        jax.block_until_ready(mcmc.last_state)
        return mcmc

    return run


# --- fresh processes -------------------------------------------------------------------------

_TAG = "BENCHMARK_WORKER "


def emit(payload) -> None:
    """Hands ``payload`` (JSON) from a worker process to :func:`run_worker`."""
    print(_TAG + json.dumps(payload), flush=True)


def run_worker(script, spec: dict, timeout_s: float, env: dict | None = None):
    """``python script --worker JSON(spec)`` in a fresh process, under a time limit.

    Returns ``(payloads, error)``: what the worker :func:`emit`\\ ted (also before a
    timeout or a crash) and ``None``, or a sentence saying how it ended.
    """
    cmd = [sys.executable, str(script), "--worker", json.dumps(spec)]
    error = None
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env
        )
        stdout, stderr = proc.stdout, proc.stderr
        if proc.returncode:
            error = f"exit {proc.returncode}: {stderr.strip()[-600:]}"
    except subprocess.TimeoutExpired as err:

        def text(b):
            return b.decode() if isinstance(b, bytes) else b or ""

        stdout, stderr = text(err.stdout), text(err.stderr)
        error = f"stopped after {timeout_s:.0f} s"
    sys.stderr.write(stderr[-2000:])
    payloads = [
        json.loads(line[len(_TAG) :])
        for line in stdout.splitlines()
        if line.startswith(_TAG)
    ]
    return payloads, error


def _proc_kb(path: str, field: str) -> int | None:
    """A ``field: <n> kB`` line of a ``/proc`` file, or ``None`` (not Linux)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory (``VmHWM``: Linux's ``ru_maxrss`` would carry
    a parent's peak over ``fork`` and ``exec``; it is the fallback elsewhere)."""
    kb = _proc_kb("/proc/self/status", "VmHWM")
    return (kb or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def memory_available_mb() -> float | None:
    """The memory the kernel says is available (``MemAvailable``), or ``None``."""
    kb = _proc_kb("/proc/meminfo", "MemAvailable")
    return None if kb is None else kb / 1024


def load_average() -> float | None:
    """The 1-minute load average (other processes slow every timing)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


# --- the record ------------------------------------------------------------------------------


def git_state() -> dict:
    """The commit the numbers come from, and whether ``jaxvb/`` had local changes."""

    def git(*cmd):
        try:
            return subprocess.run(
                ["git", *cmd], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = git("status", "--porcelain", "--", "jaxvb")
    return dict(commit=git("rev-parse", "HEAD"), jaxvb_dirty=bool(status))


def environment() -> dict:
    """Machine, library versions, JAX settings and devices, for the results JSON."""
    import jaxvb

    versions = {}
    for name in _PACKAGES:
        try:
            versions[f"{name}_version"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return dict(
        cpu_count=os.cpu_count(),
        cpu_affinity=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        jax_version=jax.__version__,
        jaxlib_version=getattr(jax.lib, "__version__", None),
        jaxvb_version=jaxvb.__version__,
        numpy_version=np.__version__,
        **versions,
        python=platform.python_version(),
        platform=platform.platform(),
        backend=jax.default_backend(),
        devices=[str(d) for d in jax.devices()],
        x64=bool(jax.config.jax_enable_x64),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        git=git_state(),
    )


# --- options and output ------------------------------------------------------------------------


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every benchmark has (each adds its own ``--quick``, saying what a
    quick run leaves out): ``--out``, ``--seed`` and the hidden ``--worker``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default benchmarks/results/; with --quick a new "
        "temporary directory)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def output_dir(args, name: str) -> Path:
    """``--out``, else a temporary directory for a quick run, else ``results/``."""
    if args.out is not None:
        out = Path(args.out)
    elif getattr(args, "quick", False):
        out = Path(tempfile.mkdtemp(prefix=f"{name}_"))
    else:
        out = RESULTS
    out.mkdir(parents=True, exist_ok=True)
    return out


def _plain(value):
    if isinstance(value, np.ndarray | jax.Array):
        return np.asarray(value).tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_json(directory: Path, name: str, report: dict, indent: int | None = 1) -> Path:
    """``directory/name.json`` (numpy scalars and arrays as plain numbers and lists)."""
    path = Path(directory) / f"{name}.json"
    path.write_text(json.dumps(report, indent=indent, default=_plain) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def read_result(name: str, directory: Path = RESULTS) -> dict:
    """``directory/name.json`` (by default the stored results)."""
    return json.loads((Path(directory) / f"{name}.json").read_text())


def stored_rows(directory: Path, name: str, subset, key: str = "models") -> dict:
    """The rows ``directory/name.json`` holds under ``key`` where ``subset`` (``--only``)
    asks for part of a benchmark, which then updates those rows and keeps the rest;
    ``{}`` for a whole run or where nothing is stored yet."""
    path = Path(directory) / f"{name}.json"
    if not subset or not path.exists():
        return {}
    return json.loads(path.read_text()).get(key, {})


def _short(value):
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_short(v) for v in value]
    return round(value, 3) if isinstance(value, float) else value


def print_targets(targets: dict) -> None:
    """Each target of a report, met or not, with its value; a group of targets (per
    model or per variant) one line per member."""
    for name, t in targets.items():
        members = [("", t)] if "met" in t else t.items()
        members = [(k, m) for k, m in members if isinstance(m, dict) and "met" in m]
        for label, m in members:
            met = "met" if m["met"] else "NOT met"
            numbers = (v for v in m.values() if type(v) in (int, float))
            value = m.get("value", next(numbers, None))
            print(f"  {name:28s} {label:28s} {met:8s} {_short(value)}")


def figure(**kw):
    """A plain :class:`matplotlib.figure.Figure`, not registered with pyplot: nothing
    here selects or changes a matplotlib backend (a notebook shows the returned figure,
    a script saves it)."""
    from matplotlib.figure import Figure

    return Figure(**kw)


def save(fig, path=None, dpi: int = 120):
    """``fig`` laid out, and written to ``path`` as a PNG if a path is given."""
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig
