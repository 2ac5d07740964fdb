"""On an accelerator: what a CPU cannot show, in one short run.

Three sections, each in its own subprocess under a time limit (an out-of-memory error or
a section that runs long is recorded, and the others still run):

1. **probit**: the paper's probit model (Algorithm 2, ``method="hessian"``, 200 steps,
   from the prior, as ``benchmarks/probit.py`` times it) over ``B`` data sets in one
   call of ``jaxvb.fit_batched``: ``B = 500`` (the paper's) and ``100,000``; float64
   and float32 without diagnostics, float64 with the default diagnostics (1000 draws
   and the convergence check). First call (compile included) and the median after
   compile, new keys each call. Accuracy needs no reference: each data set's ``beta``
   is drawn from the prior, so over many data sets ``(mean - beta) / sd`` of a
   calibrated posterior is close to N(0, 1): the fraction of coefficients inside the
   95% interval (its Monte Carlo error is given), and the largest float32 / float64
   difference of the means in posterior sds.
2. **dimension**: ``benchmarks/dimension.py``'s worker (hierarchical logistic regression,
   dense Gaussian, from the Laplace start) at ``d = 1002`` and ``5002``: ``N`` value/
   gradient/Hessian evaluations of the log joint against a fit of ``N`` steps.
3. **sv**: the paper's stochastic-volatility fit (``jaxvb.models.stochastic_volatility``,
   250 steps, no diagnostics) on one simulated series of length ``T`` and on ``B``
   series of length 945 at once (``jax.vmap``). The banded algebra is a ``lax.scan``
   over the series, so one series is latency-bound on a GPU; the longer ``T`` are run
   only while the previous one predicts they fit the remaining time.

Writes ``gpu.json`` (``benchmarks/results/`` unless ``--out``): one record per device
(``runs[device kind]``, merged into an existing file), each naming the device, with
its sections. The CPU record is this script run on the development machine with the
sizes it can afford (``--cpu``), for contrast; timings compare only within a record.

Usage::

    python benchmarks/gpu.py                  # the accelerator's sizes, ~7 minutes
    python benchmarks/gpu.py --cpu            # the same, sizes a 2-core machine affords
    python benchmarks/gpu.py --quick          # smoke test (tiny sizes), temp output
    python benchmarks/gpu.py --budget 400     # seconds for all sections together
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import jaxvb
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(HERE.parent))
    import jaxvb

from _common import environment, time_calls  # noqa: E402

#: Per section: its sizes and the share of the time budget it may take.
FULL = dict(
    probit=dict(
        sizes=[500, 100_000],
        variants=["no_diagnostics", "float32_no_diagnostics", "default"],
        repeats=3,
        share=0.3,
    ),
    dimension=dict(
        groups=[1000, 5000],
        obs_per_group={"1000": 10, "5000": 2},
        num_steps={"1000": 200, "5000": 50},
        repeats=2,
        share=0.35,
    ),
    sv=dict(
        single_T=[945, 10_000, 100_000, 1_000_000], batch=[1000], repeats=2, share=0.35
    ),
)


def _with(settings: dict, override: dict) -> dict:
    """``settings`` with some sections' entries replaced (``--override``, the CPU's)."""
    return {k: dict(v, **override.get(k, {})) for k, v in settings.items()}


#: What a 2-core CPU affords of the same runs.
CPU = _with(
    FULL,
    dict(
        probit=dict(sizes=[500, 10_000]),
        dimension=dict(
            groups=[1000], obs_per_group={"1000": 10}, num_steps={"1000": 20}, repeats=1
        ),
        sv=dict(single_T=[945, 10_000, 100_000], batch=[100]),
    ),
)
QUICK = dict(
    probit=dict(sizes=[20], variants=["no_diagnostics"], repeats=1, share=0.3),
    dimension=dict(
        groups=[10], obs_per_group={"10": 10}, num_steps={"10": 20}, repeats=1, share=0.35
    ),
    sv=dict(single_T=[100], batch=[3], batch_T=50, repeats=1, share=0.35),
)
SV_STEPS = 250
SV_BATCH_T = 945  # the paper's series length (the batch's, unless the spec says)


def _first_call(fn, *args):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, out


def _device_memory() -> dict | None:
    """The device allocator's peak and current bytes (GPU backends; None on CPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # not every backend reports
        return None
    if not stats:
        return None
    keep = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
    return {k: int(stats[k]) for k in keep if k in stats}


def _emit(tag: str, payload) -> None:
    print(f"{tag} " + json.dumps(payload), flush=True)


def _error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) < 600 else text[:300] + " ... " + text[-300:]


# --- sections (each runs in its own subprocess) ---------------------------------------


def probit_section(spec: dict, deadline: float) -> None:
    import probit as bench  # benchmarks/probit.py: the same fit as its speed section

    from jaxvb.models import probit

    means64 = {}
    for size in spec["sizes"]:
        beta, design, y = probit.simulate(jax.random.key(0), size)
        keys = jax.random.split(jax.random.key(1), size)
        for label in spec["variants"]:
            if time.time() > deadline:
                _emit("ROW", dict(num_datasets=size, variant=label, error="no time left"))
                continue
            name, num_eval_draws, dtype = bench.SPEED_VARIANTS[label]
            fit_one = bench.make_fit(name, bench.TIMED_STEPS, num_eval_draws)
            v, yy = design.astype(dtype), y.astype(dtype)
            row = dict(
                num_datasets=size,
                variant=label,
                method=name,
                num_steps=bench.TIMED_STEPS,
                num_eval_draws=num_eval_draws,
                dtype=np.dtype(dtype).name,
            )
            try:

                def call(k, v=v, yy=yy, fit_one=fit_one):
                    return jaxvb.fit_batched(fit_one, v, yy, k)

                first, res = _first_call(call, keys)
                run = time_calls(
                    call,
                    lambda i, n=size: (jax.random.split(jax.random.key(2 + i), n),),
                    spec["repeats"],
                )
                mean = np.asarray(res.q.mean, np.float64)
                sd = np.sqrt(np.diagonal(np.asarray(res.q.cov, np.float64), 0, -2, -1))
                z = (mean - np.asarray(beta)) / sd
                inside = float(np.mean(np.abs(z) < 1.959964))
                n = z.size
                row.update(
                    first_call_s=first,
                    run=run,
                    us_per_dataset=1e6 * run["median_s"] / size,
                    flagged_fraction=float(np.mean(np.asarray(res.status) != 0)),
                    rmse_mean_vs_beta=float(np.sqrt(np.mean((mean - beta) ** 2))),
                    coverage_95=inside,
                    coverage_95_mc_sd=math.sqrt(0.95 * 0.05 / n),
                    z_sd=float(np.std(z)),
                    device_memory=_device_memory(),
                )
                if name == "hessian" and num_eval_draws == 2:
                    if row["dtype"] == "float64":
                        means64[size] = (mean, sd)
                    elif size in means64:
                        m64, s64 = means64[size]
                        row["float32_vs_float64_max_sd"] = float(
                            np.max(np.abs(mean - m64) / s64)
                        )
                if num_eval_draws > 2:
                    row["mean_r_squared"] = float(np.nanmean(np.asarray(res.r_squared)))
            except Exception as err:  # out of memory, say: recorded, not fatal
                row["error"] = _error(err)
            _emit("ROW", row)


def dimension_section(spec: dict, deadline: float) -> None:
    import dimension as bench  # benchmarks/dimension.py: its worker, in this process

    for G in spec["groups"]:
        if time.time() > deadline:
            _emit("ROW", dict(G=G, d=G + 2, error="no time left"))
            continue
        one = dict(
            G=G,
            seed=0,
            obs_per_group=spec["obs_per_group"][str(G)],
            num_steps=spec["num_steps"][str(G)],
            repeats=spec["repeats"],
            default_diagnostics=False,
        )
        try:
            row = bench.worker(one)
            row["device_memory"] = _device_memory()
        except Exception as err:
            row = dict(G=G, d=G + 2, error=_error(err))
        _emit("ROW", row)


def _simulate_sv(key, num_series: int, T: int, phi=0.95, s2=0.05, beta=0.65):
    """``num_series`` SV series of length ``T`` at once, as ``sv.simulate_with_volatility``."""
    k1, k2, k3 = jax.random.split(key, 3)
    xi = jax.random.normal(k1, (T, num_series)) * math.sqrt(s2)
    v1 = jax.random.normal(k2, (num_series,)) * math.sqrt(s2 / (1 - phi**2))
    _, rest = jax.lax.scan(lambda v, e: (phi * v + e, phi * v + e), v1, xi[1:])
    v = jnp.concatenate([v1[None], rest]).T
    return jax.random.normal(k3, (num_series, T)) * beta * jnp.exp(v / 2)


def _tridiagonal() -> str:
    """How ``jaxvb.linalg`` runs bandwidth-1 algebra here: a scan over rows or the
    log-depth prefix compositions (``JAXVB_TRIDIAGONAL``; by backend when "auto")."""
    from jaxvb.linalg import banded

    return "parallel" if banded._parallel_tridiagonal() else "sequential"


def sv_section(spec: dict, deadline: float) -> None:
    from jaxvb.models import stochastic_volatility as sv

    options = dict(
        num_steps=SV_STEPS, indirect_effects=False, num_eval_draws=2, max_backtracks=8
    )

    def one_fit(y, key):
        return sv._fit(y, key, **options)

    done = []  # (T, first call, seconds per fit) of the single series so far
    for T in spec["single_T"]:
        # Skip what would not fit: the compile as before, and the run extrapolated in
        # log-log from the last two lengths (slope at least 0.5: the prefix compositions'
        # near-flat times at small T would promise too much), from one as linear.
        if done:
            t1, first1, run1 = done[-1]
            slope = 1.0
            if len(done) > 1 and run1 > 0 and done[-2][2] > 0:
                t0, _, run0 = done[-2]
                slope = max(0.5, math.log(run1 / run0) / math.log(t1 / t0))
            run = 1.5 * run1 * (T / t1) ** slope
            predicted = (first1 - run1) + (1 + spec["repeats"]) * run
            if time.time() + predicted > deadline:
                _emit(
                    "ROW",
                    dict(
                        kind="single",
                        T=T,
                        error=f"skipped: ~{predicted:.0f} s predicted, not enough time left",
                    ),
                )
                continue
        row = dict(kind="single", T=T, num_series=1, tridiagonal=_tridiagonal(), **options)
        try:
            y = _simulate_sv(jax.random.key(T), 1, T)[0]
            fit = jax.jit(one_fit)
            first, res = _first_call(fit, y, jax.random.key(0))
            run = time_calls(
                fit, lambda i, y=y: (y, jax.random.key(1 + i)), spec["repeats"]
            )
            row.update(
                first_call_s=first,
                run=run,
                status=int(res.status),
                elbo=float(res.elbo),
                device_memory=_device_memory(),
            )
            done.append((T, first, run["median_s"]))
        except Exception as err:
            row["error"] = _error(err)
        _emit("ROW", row)

    for num_series in spec["batch"]:
        if time.time() > deadline:
            _emit("ROW", dict(kind="batch", num_series=num_series, error="no time left"))
            continue
        batch_t = spec.get("batch_T", SV_BATCH_T)
        row = dict(
            kind="batch",
            T=batch_t,
            num_series=num_series,
            tridiagonal=_tridiagonal(),
            **options,
        )
        try:
            ys = _simulate_sv(jax.random.key(7), num_series, batch_t)
            fit = jax.jit(jax.vmap(one_fit))

            def keys(i, n=num_series):
                return jax.random.split(jax.random.key(100 + i), n)

            first, res = _first_call(fit, ys, keys(0))
            run = time_calls(fit, lambda i, ys=ys: (ys, keys(1 + i)), spec["repeats"])
            row.update(
                first_call_s=first,
                run=run,
                ms_per_series=1e3 * run["median_s"] / num_series,
                flagged_fraction=float(np.mean(np.asarray(res.status) != 0)),
                device_memory=_device_memory(),
            )
        except Exception as err:
            row["error"] = _error(err)
        _emit("ROW", row)


SECTIONS = dict(probit=probit_section, dimension=dimension_section, sv=sv_section)


# --- the driver --------------------------------------------------------------------------


def run_section(name: str, spec: dict, seconds: float) -> dict:
    """The section in a subprocess; its rows, also those printed before a timeout."""
    deadline = time.time() + 0.85 * seconds  # leave the section time to finish a row
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--section",
        json.dumps(dict(name=name, spec=spec, deadline=deadline)),
    ]
    t0 = time.perf_counter()
    error = None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
        stdout, stderr = proc.stdout, proc.stderr
        if proc.returncode:
            error = f"exit {proc.returncode}: {stderr.strip()[-800:]}"
    except subprocess.TimeoutExpired as err:
        stdout = (
            (err.stdout or b"").decode()
            if isinstance(err.stdout, bytes)
            else err.stdout or ""
        )
        stderr = (
            (err.stderr or b"").decode()
            if isinstance(err.stderr, bytes)
            else err.stderr or ""
        )
        error = f"timed out after {seconds:.0f} s"
    sys.stderr.write(stderr[-3000:])
    rows = [json.loads(ln[4:]) for ln in stdout.splitlines() if ln.startswith("ROW ")]
    out = dict(spec=spec, time_limit_s=seconds, wall_s=time.perf_counter() - t0, rows=rows)
    if error:
        out["error"] = error
    return out


def _summary_line(name: str, row: dict) -> str:
    if "error" in row:
        return f"  {name}: {json.dumps({k: v for k, v in row.items() if k != 'spec'})}"
    if name == "probit":
        return (
            f"  probit B={row['num_datasets']:>6d} {row['variant']:24s} first "
            f"{row['first_call_s']:6.2f} s, run {row['run']['median_s']:7.3f} s "
            f"({row['us_per_dataset']:.1f} us/data set), coverage "
            f"{row['coverage_95']:.4f}, flagged {row['flagged_fraction']:.4f}"
        )
    if name == "dimension":
        fit = row["fit"]["iterations"]
        return (
            f"  dimension d={row['d']:>5d}: model {row['model']['ms_per_eval']:.3f} ms/eval, "
            f"fit {fit['ms_per_step']:.3f} ms/step ({fit['over_model']:.2f}x), first "
            f"{fit['first_call_s']:.1f} s"
        )
    return (
        f"  sv {row['kind']:6s} T={row['T']:>7d} x {row['num_series']:>5d}: first "
        f"{row['first_call_s']:6.2f} s, run {row['run']['median_s']:8.3f} s"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test, temp output")
    parser.add_argument("--cpu", action="store_true", help="sizes for a 2-core CPU")
    parser.add_argument("--out", default=None, help="output directory")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds, all sections")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="which to run")
    parser.add_argument("--commit", default=None, help="the commit (no git on the device)")
    parser.add_argument(
        "--override",
        default=None,
        help='JSON replacing settings per section, e.g. \'{"probit": {"sizes": [500]}}\'',
    )
    parser.add_argument("--section", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.section is not None:
        job = json.loads(args.section)
        try:
            SECTIONS[job["name"]](job["spec"], job["deadline"])
        except Exception:
            traceback.print_exc()
            raise
        return None

    settings = QUICK if args.quick else CPU if args.cpu else FULL
    if args.override:
        settings = _with(settings, json.loads(args.override))
    out = Path(
        args.out or (tempfile.mkdtemp(prefix="gpu_") if args.quick else HERE / "results")
    )
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    if args.commit:
        env["git"] = dict(env.get("git") or {}, commit=args.commit)
    device = jax.devices()[0]
    label = getattr(device, "device_kind", str(device)) or str(device)
    record = dict(
        device=label,
        backend=jax.default_backend(),
        settings_name="quick" if args.quick else "cpu" if args.cpu else "full",
        override=json.loads(args.override) if args.override else None,
        budget_s=args.budget,
        environment=env,
        sections={},
    )
    path = out / "gpu.json"
    t_start = time.perf_counter()
    names = [s for s in args.sections.split(",") if s]
    shares = sum(settings[s]["share"] for s in names)
    for name in names:
        spec = {k: v for k, v in settings[name].items() if k != "share"}
        left = args.budget - (time.perf_counter() - t_start)
        seconds = max(30.0, left * settings[name]["share"] / shares)
        shares -= settings[name]["share"]
        print(f"{name}: up to {seconds:.0f} s", flush=True)
        record["sections"][name] = run_section(name, spec, seconds)
        for row in record["sections"][name]["rows"]:
            print(_summary_line(name, row), flush=True)
        if "error" in record["sections"][name]:
            print(f"  {name}: {record['sections'][name]['error'][-300:]}", flush=True)
        record["wall_s"] = time.perf_counter() - t_start
        report = json.loads(path.read_text()) if path.exists() else {}
        report["description"] = __doc__.split("\n\n")[0]
        report.setdefault("runs", {})[label] = record
        path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path} ({record['wall_s']:.0f} s)")
    return record


if __name__ == "__main__":
    main()
