"""On an accelerator: what a CPU cannot show, in one short run.

Each section runs in its own process under a share of a time budget (an out-of-memory
error is recorded and the next size still runs; a section that runs out of time keeps
the rows it finished, and the next section still runs):

1. **probit**: ``benchmarks/probit.py``'s timed fit (Algorithm 2, 200 steps, from the
   prior) over ``B = 500`` (the paper's) and ``100,000`` data sets in one call of
   ``jaxvb.fit_batched``: float64 and float32 without diagnostics, float64 with the
   default ones. Each data set's ``beta`` is drawn from the prior, so 95% of the
   coefficients should lie inside their 95% intervals.
2. **dimension**: ``benchmarks/dimension.py``'s worker at ``d = 1002`` and ``5002``.
3. **sv**: the paper's stochastic-volatility fit (250 steps, no diagnostics) on ``B``
   simulated series of length 945 in one call of ``jaxvb.fit_batched``, and
   (``jaxvb.models.stochastic_volatility.fit``) on one series of growing length ``T``.

Writes ``gpu.json``, one record per device (``runs[device kind]``, merged into an
existing file); ``--cpu`` runs the sizes a small CPU affords, for contrast.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from functools import partial
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402
from jaxvb.models import stochastic_volatility as sv  # noqa: E402

NAME = "gpu"
SV_STEPS, SV_BATCH_T = 250, 945  # the paper's fit and series length
SV_SIMULATION = dict(phi=0.95, s2=0.05, beta=0.65)
PROBIT_VARIANTS = ["no_diagnostics", "float32_no_diagnostics", "default"]
#: Per section: its sizes and the share of the time budget it may take; dimension's
#: sizes are ``(groups G, observations per group, steps)``, ``d = G + 2``.
FULL = dict(
    probit=dict(sizes=[500, 100_000], variants=PROBIT_VARIANTS, repeats=3, share=0.3),
    dimension=dict(sizes=[[1000, 10, 200], [5000, 2, 50]], repeats=2, share=0.35),
    sv=dict(single_T=[945, 10**4, 10**5, 10**6], batch=[1000], repeats=2, share=0.35),
)


def _with(settings: dict, override: dict) -> dict:
    """``settings`` with some sections' entries replaced (``--override``, the CPU's)."""
    return {k: dict(v, **override.get(k, {})) for k, v in settings.items()}


CPU = _with(
    FULL,
    dict(
        probit=dict(sizes=[500, 10_000]),
        dimension=dict(sizes=[[1000, 10, 20]], repeats=1),
        sv=dict(single_T=[945, 10**4, 10**5], batch=[100]),
    ),
)
QUICK = _with(
    FULL,
    dict(
        probit=dict(sizes=[20], variants=["no_diagnostics"], repeats=1),
        dimension=dict(sizes=[[10, 10, 20]], repeats=1),
        sv=dict(single_T=[100], batch=[3], batch_T=50, repeats=1),
    ),
)


def device_memory() -> dict | None:
    """The device allocator's peak and current bytes (GPU backends; None on CPU)."""
    stats = jax.devices()[0].memory_stats()
    keep = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
    return {k: int(stats[k]) for k in keep if k in stats} if stats else None


@contextlib.contextmanager
def recorded(row: dict):
    """Emits ``row`` after the block, with the device memory, or with the error the
    block raised (out of memory, say): recorded, not fatal."""
    try:
        yield
        row["device_memory"] = device_memory()
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {str(err)[:600]}"
    common.emit(row)


def timed(row: dict, run, repeats: int):
    """``run(i)``'s first call and calls after compile into ``row``; its output."""
    out, timing = common.first_and_after(run, repeats)
    row.update(timing)
    return out


def batched(fit_one, *data, seed: int):
    """``i -> jaxvb.fit_batched(fit_one, *data, keys)``: new keys in each call."""
    n = len(data[0])
    return lambda i: jaxvb.fit_batched(
        fit_one, *data, jax.random.split(jax.random.key(seed + i), n)
    )


# --- sections (each runs in its own process) -------------------------------------------------


def probit_section(spec: dict) -> None:
    import probit as bench  # benchmarks/probit.py: the same fit as its speed section

    from jaxvb.models import probit

    means64 = {}
    for size in spec["sizes"]:
        beta, design, y = probit.simulate(jax.random.key(0), size)
        for label in spec["variants"]:
            method, draws, dtype = bench.SPEED_VARIANTS[label]
            dtype = np.dtype(dtype).name
            row = dict(num_datasets=size, variant=label, method=method)
            row.update(num_steps=bench.TIMED_STEPS, num_eval_draws=draws, dtype=dtype)
            with recorded(row):
                fit_one = bench.make_fit(method, bench.TIMED_STEPS, draws)
                run = batched(fit_one, design.astype(dtype), y.astype(dtype), seed=1)
                res = timed(row, run, spec["repeats"])
                mean = np.asarray(res.q.mean, np.float64)
                sd = np.sqrt(np.diagonal(np.asarray(res.q.cov, np.float64), 0, -2, -1))
                z = (mean - np.asarray(beta)) / sd
                row.update(
                    us_per_dataset=1e6 * row["run"]["median_s"] / size,
                    flagged_fraction=float(np.mean(np.asarray(res.status) != 0)),
                    rmse_mean_vs_beta=float(np.sqrt(np.mean((mean - beta) ** 2))),
                    coverage_95=float(np.mean(np.abs(z) < 1.959964)),
                    coverage_95_mc_sd=math.sqrt(0.95 * 0.05 / z.size),
                    z_sd=float(np.std(z)),
                )
                if draws > 2:
                    row["mean_r_squared"] = float(np.nanmean(np.asarray(res.r_squared)))
                elif dtype == "float64":
                    means64[size] = (mean, sd)
                elif size in means64:  # float32 against float64, in posterior sds
                    m64, s64 = means64[size]
                    row["float32_vs_float64_max_sd"] = float(
                        np.max(np.abs(mean - m64) / s64)
                    )


def dimension_section(spec: dict) -> None:
    import dimension as bench  # benchmarks/dimension.py: its worker, in this process

    for G, n, N in spec["sizes"]:
        row = dict(G=G, d=G + 2)
        with recorded(row):
            one = dict(G=G, seed=0, obs_per_group=n, num_steps=N, repeats=spec["repeats"])
            row.update(bench.worker(one))


def sv_fit_one(y, key):
    """One series' fit, traced under ``fit_batched``'s vmap."""
    return sv.fit(y, key, num_steps=SV_STEPS, num_eval_draws=2, on_failure="ignore")


def _sv_fit(y, options, i):
    return sv.fit(y, jax.random.key(i), on_failure="ignore", **options)


def sv_section(spec: dict) -> None:
    # jaxvb.linalg's bandwidth-1 algebra: row scans on the CPU, prefix compositions
    # elsewhere, unless JAXVB_TRIDIAGONAL says otherwise.
    mode = os.environ.get("JAXVB_TRIDIAGONAL", "auto")
    if mode == "auto":
        mode = "sequential" if jax.default_backend() == "cpu" else "parallel"
    options = dict(num_steps=SV_STEPS, indirect_effects=False, num_eval_draws=2)
    T = spec.get("batch_T", SV_BATCH_T)
    for B in spec["batch"]:  # first: the longest single series are the last to run
        row = dict(kind="batch", T=T, num_series=B, tridiagonal=mode, **options)
        with recorded(row):
            keys = jax.random.split(jax.random.key(7), B)
            ys = np.stack([sv.simulate(k, T, **SV_SIMULATION) for k in keys])
            res = timed(row, batched(sv_fit_one, ys, seed=100), spec["repeats"])
            row["ms_per_series"] = 1e3 * row["run"]["median_s"] / B
            row["flagged_fraction"] = float(np.mean(np.asarray(res.status) != 0))
    for T in spec["single_T"]:
        row = dict(kind="single", T=T, num_series=1, tridiagonal=mode, **options)
        with recorded(row):
            y = sv.simulate(jax.random.key(T), T, **SV_SIMULATION)
            run = partial(_sv_fit, y, options)
            res = timed(row, run, spec["repeats"])
            row.update(status=int(res.status), elbo=float(res.elbo))


SECTIONS = dict(probit=probit_section, dimension=dimension_section, sv=sv_section)


# --- the driver ------------------------------------------------------------------------------


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--cpu", action="store_true", help="sizes for a small CPU")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds, all sections")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="which to run")
    parser.add_argument("--commit", default=None, help="the commit (no git on the device)")
    parser.add_argument(
        "--override", default="{}", help='JSON per section, e.g. \'{"sv": {"batch": []}}\''
    )
    args = parser.parse_args(argv)
    if args.worker is not None:
        job = json.loads(args.worker)
        return SECTIONS[job["name"]](job["spec"])

    override = json.loads(args.override)
    settings = _with(QUICK if args.quick else CPU if args.cpu else FULL, override)
    out = common.output_dir(args, NAME)
    env = common.environment()
    if args.commit:
        env["git"] = dict(env["git"], commit=args.commit)
    device = jax.devices()[0]
    label = getattr(device, "device_kind", None) or str(device)
    record = dict(
        device=label,
        backend=jax.default_backend(),
        settings_name="quick" if args.quick else "cpu" if args.cpu else "full",
        override=override or None,
        budget_s=args.budget,
        environment=env,
        sections={},
    )
    t_start = time.perf_counter()
    for name in [s for s in args.sections.split(",") if s]:
        spec = {k: v for k, v in settings[name].items() if k != "share"}
        seconds = max(30.0, args.budget * settings[name]["share"])
        t0 = time.perf_counter()  # rows emitted before a time limit are kept
        rows, error = common.run_worker(__file__, dict(name=name, spec=spec), seconds)
        record["sections"][name] = dict(
            spec=spec,
            time_limit_s=seconds,
            wall_s=time.perf_counter() - t0,
            rows=[dict(r, commit=env["git"]["commit"]) for r in rows],
            **({"error": error} if error else {}),
        )
        record["wall_s"] = time.perf_counter() - t_start
        path = out / f"{NAME}.json"
        report = json.loads(path.read_text()) if path.exists() else {}
        report["description"] = __doc__.split("\n\n")[0]
        report.setdefault("runs", {})[label] = record
        common.write_json(out, NAME, report)
    return record


if __name__ == "__main__":
    main()
