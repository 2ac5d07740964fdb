"""On an accelerator: what a CPU cannot show, in one short run.

Three sections, each in its own process under a share of a time budget (an out-of-memory
error or a section that runs long is recorded, and the others still run):

1. **probit**: ``benchmarks/probit.py``'s timed fit (Algorithm 2, 200 steps, from the
   prior) over ``B`` data sets in one call of ``jaxvb.fit_batched``, ``B = 500`` (the
   paper's) and ``100,000``: float64 and float32 without diagnostics, float64 with the
   default diagnostics. First call and median after compile. Accuracy needs no
   reference: each data set's ``beta`` is drawn from the prior, so the fraction of
   coefficients inside their 95% intervals should be 95% (its Monte Carlo error is
   given), and float32's means are compared with float64's in posterior sds.
2. **dimension**: ``benchmarks/dimension.py``'s worker at ``d = 1002`` and ``5002``.
3. **sv**: the paper's stochastic-volatility fit
   (``benchmarks/stochastic_volatility.py``'s :func:`fit_program`, 250 steps, no
   diagnostics) on one simulated series of length ``T`` and on ``B`` series of length
   945 at once (``jax.vmap``). The longer ``T`` run only while the previous ones predict
   they fit the time left.

Writes ``gpu.json``: one record per device (``runs[device kind]``, merged into an
existing file), each naming the device, with its sections. The CPU record (``--cpu``) is
this script on a small CPU with the sizes it affords, for contrast.

Usage::

    python benchmarks/gpu.py                  # the accelerator's sizes
    python benchmarks/gpu.py --cpu            # the sizes a small CPU affords
    python benchmarks/gpu.py --quick          # smoke test (tiny sizes), temp output
    python benchmarks/gpu.py --budget 400     # seconds for all sections together
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402

NAME = "gpu"
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
SV_BATCH_T = 945  # the paper's series length


def device_memory() -> dict | None:
    """The device allocator's peak and current bytes (GPU backends; None on CPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # not every backend reports
        return None
    keep = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
    return {k: int(stats[k]) for k in keep if k in stats} if stats else None


def _error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) < 600 else text[:300] + " ... " + text[-300:]


def tridiagonal() -> str:
    """How ``jaxvb.linalg`` runs bandwidth-1 algebra here: ``JAXVB_TRIDIAGONAL``, and
    for "auto" (the default) row scans on the CPU, prefix compositions elsewhere."""
    mode = os.environ.get("JAXVB_TRIDIAGONAL", "auto")
    if mode == "auto":
        return "sequential" if jax.default_backend() == "cpu" else "parallel"
    return mode


# --- sections (each runs in its own process) -------------------------------------------------


def probit_section(spec: dict, deadline: float) -> None:
    import probit as bench  # benchmarks/probit.py: the same fit as its speed section

    from jaxvb.models import probit

    means64 = {}
    for size in spec["sizes"]:
        beta, design, y = probit.simulate(jax.random.key(0), size)
        for label in spec["variants"]:
            name, num_eval_draws, dtype = bench.SPEED_VARIANTS[label]
            row = dict(
                num_datasets=size,
                variant=label,
                method=name,
                num_steps=bench.TIMED_STEPS,
                num_eval_draws=num_eval_draws,
                dtype=np.dtype(dtype).name,
            )
            if time.time() > deadline:
                common.emit(dict(row, error="no time left"))
                continue
            fit_one = bench.make_fit(name, bench.TIMED_STEPS, num_eval_draws)
            v, yy = design.astype(dtype), y.astype(dtype)
            try:
                res, timing = common.first_and_after(
                    lambda i, v=v, yy=yy, f=fit_one, n=size: jaxvb.fit_batched(
                        f, v, yy, jax.random.split(jax.random.key(1 + i), n)
                    ),
                    spec["repeats"],
                )
                mean = np.asarray(res.q.mean, np.float64)
                sd = np.sqrt(np.diagonal(np.asarray(res.q.cov, np.float64), 0, -2, -1))
                z = (mean - np.asarray(beta)) / sd
                row.update(
                    **timing,
                    us_per_dataset=1e6 * timing["run"]["median_s"] / size,
                    flagged_fraction=float(np.mean(np.asarray(res.status) != 0)),
                    rmse_mean_vs_beta=float(np.sqrt(np.mean((mean - beta) ** 2))),
                    coverage_95=float(np.mean(np.abs(z) < 1.959964)),
                    coverage_95_mc_sd=math.sqrt(0.95 * 0.05 / z.size),
                    z_sd=float(np.std(z)),
                    device_memory=device_memory(),
                )
                if num_eval_draws == 2 and row["dtype"] == "float64":
                    means64[size] = (mean, sd)
                elif num_eval_draws == 2 and size in means64:
                    m64, s64 = means64[size]
                    row["float32_vs_float64_max_sd"] = float(
                        np.max(np.abs(mean - m64) / s64)
                    )
                if num_eval_draws > 2:
                    row["mean_r_squared"] = float(np.nanmean(np.asarray(res.r_squared)))
            except Exception as err:  # out of memory, say: recorded, not fatal
                row["error"] = _error(err)
            common.emit(row)


def dimension_section(spec: dict, deadline: float) -> None:
    import dimension as bench  # benchmarks/dimension.py: its worker, in this process

    for G in spec["groups"]:
        if time.time() > deadline:
            common.emit(dict(G=G, d=G + 2, error="no time left"))
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
            row = dict(bench.worker(one), device_memory=device_memory())
        except Exception as err:
            row = dict(G=G, d=G + 2, error=_error(err))
        common.emit(row)


def simulate_sv(key, num_series: int, T: int):
    """``num_series`` series of length ``T`` from the SV model (``sv.simulate``)."""
    from stochastic_volatility import SIMULATION

    from jaxvb.models import stochastic_volatility as sv

    keys = jax.random.split(key, num_series)
    return jnp.asarray(np.stack([sv.simulate(k, T, **SIMULATION) for k in keys]))


def sv_section(spec: dict, deadline: float) -> None:
    from stochastic_volatility import NUM_STEPS, fit_program

    options = dict(num_steps=NUM_STEPS, indirect_effects=False, num_eval_draws=2)
    single = jax.jit(lambda y, key: fit_program(y, key, **options))
    batched = jax.jit(jax.vmap(single))
    done = []  # (T, first call, seconds per fit) of the single series so far
    for T in spec["single_T"]:
        row = dict(kind="single", T=T, num_series=1, tridiagonal=tridiagonal(), **options)
        if done:
            # The compile as long as the last length's, the run extrapolated in log-log
            # from the last two lengths (a slope of at least 0.5: the near-flat times
            # of the prefix compositions at small T would promise too much).
            t1, first1, run1 = done[-1]
            slope = 1.0
            if len(done) > 1:
                t0, _, run0 = done[-2]
                slope = max(0.5, math.log(run1 / run0) / math.log(t1 / t0))
            run = 1.5 * run1 * (T / t1) ** slope
            predicted = (first1 - run1) + (1 + spec["repeats"]) * run
            if time.time() + predicted > deadline:
                common.emit(dict(row, error=f"skipped: ~{predicted:.0f} s predicted"))
                continue
        try:
            y = simulate_sv(jax.random.key(T), 1, T)[0]
            res, timing = common.first_and_after(
                lambda i, y=y: single(y, jax.random.key(i)), spec["repeats"]
            )
            row.update(
                **timing,
                status=int(res.status),
                elbo=float(res.elbo),
                device_memory=device_memory(),
            )
            done.append((T, timing["first_call_s"], timing["run"]["median_s"]))
        except Exception as err:
            row["error"] = _error(err)
        common.emit(row)

    for num_series in spec["batch"]:
        batch_t = spec.get("batch_T", SV_BATCH_T)
        row = dict(
            kind="batch",
            T=batch_t,
            num_series=num_series,
            tridiagonal=tridiagonal(),
            **options,
        )
        if time.time() > deadline:
            common.emit(dict(row, error="no time left"))
            continue
        try:
            ys = simulate_sv(jax.random.key(7), num_series, batch_t)
            res, timing = common.first_and_after(
                lambda i, ys=ys, n=num_series: batched(
                    ys, jax.random.split(jax.random.key(100 + i), n)
                ),
                spec["repeats"],
            )
            row.update(
                **timing,
                ms_per_series=1e3 * timing["run"]["median_s"] / num_series,
                flagged_fraction=float(np.mean(np.asarray(res.status) != 0)),
                device_memory=device_memory(),
            )
        except Exception as err:
            row["error"] = _error(err)
        common.emit(row)


SECTIONS = dict(probit=probit_section, dimension=dimension_section, sv=sv_section)


# --- the driver ------------------------------------------------------------------------------


def run_section(name: str, spec: dict, seconds: float, commit: str | None) -> dict:
    """The section in a fresh process; its rows, also those emitted before a timeout."""
    deadline = time.time() + 0.85 * seconds  # leaves the section time to finish a row
    job = dict(name=name, spec=spec, deadline=deadline)
    t0 = time.perf_counter()
    rows, error = common.run_worker(__file__, job, seconds)
    out = dict(
        spec=spec,
        time_limit_s=seconds,
        wall_s=time.perf_counter() - t0,
        rows=[dict(r, commit=commit) for r in rows],
    )
    if error:
        out["error"] = error
    return out


def row_line(name: str, row: dict) -> str:
    if "error" in row:
        return f"  {name}: {row['error'][:200]}"
    timing = row if "run" in row else row["fit"]["iterations"]
    size = {k: row[k] for k in ("num_datasets", "variant", "d", "kind", "T") if k in row}
    return (
        f"  {name} {size}: first call {timing['first_call_s']:.2f} s, after compile "
        f"{timing['run']['median_s']:.4f} s"
    )


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--cpu", action="store_true", help="sizes for a small CPU")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds, all sections")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="which to run")
    parser.add_argument("--commit", default=None, help="the commit (no git on the device)")
    parser.add_argument(
        "--override",
        default=None,
        help='JSON replacing settings per section, e.g. \'{"probit": {"sizes": [500]}}\'',
    )
    args = parser.parse_args(argv)
    if args.worker is not None:
        job = json.loads(args.worker)
        try:
            SECTIONS[job["name"]](job["spec"], job["deadline"])
        except Exception:
            traceback.print_exc()
            raise
        return None

    settings = QUICK if args.quick else CPU if args.cpu else FULL
    if args.override:
        settings = _with(settings, json.loads(args.override))
    out = common.output_dir(args, NAME)
    env = common.environment()
    if args.commit:
        env["git"] = dict(env["git"], commit=args.commit)
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
    t_start = time.perf_counter()
    names = [s for s in args.sections.split(",") if s]
    shares = sum(settings[s]["share"] for s in names)
    for name in names:
        spec = {k: v for k, v in settings[name].items() if k != "share"}
        left = args.budget - (time.perf_counter() - t_start)
        seconds = max(30.0, left * settings[name]["share"] / shares)
        shares -= settings[name]["share"]
        print(f"{name}: up to {seconds:.0f} s", flush=True)
        section = run_section(name, spec, seconds, env["git"]["commit"])
        record["sections"][name] = section
        for row in section["rows"]:
            print(row_line(name, row), flush=True)
        record["wall_s"] = time.perf_counter() - t_start
        path = out / f"{NAME}.json"
        report = json.loads(path.read_text()) if path.exists() else {}
        report["description"] = __doc__.split("\n\n")[0]
        report.setdefault("runs", {})[label] = record
        common.write_json(out, NAME, report)
    return record


if __name__ == "__main__":
    main()
