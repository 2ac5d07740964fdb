"""The headline results of every benchmark, and the documentation's benchmark pages.

Reads the JSON files the benchmark scripts wrote to ``benchmarks/results/`` (nothing is
measured or hard-coded here) and makes one row per headline result: the experiment, what
is measured, jaxvb's number, the reference and its number, the target and whether it is
met. :func:`docs_pages` makes the documentation's pages from the same files (the
documentation build calls it from ``docs/hooks/benchmarks.py``).

Usage::

    python benchmarks/summary.py                  # print the table
    python benchmarks/summary.py --write-readme   # and write it into README.md
    python benchmarks/summary.py --check          # exit 1 if README.md is out of date
    python benchmarks/summary.py --docs /tmp/pages  # write the benchmark pages

The README holds the table between ``<!-- results-table:start -->`` and
``<!-- results-table:end -->``. ``--quick`` changes nothing, so that
``python -m jaxvb benchmark all --quick`` can run this script with the others.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
README = ROOT / "README.md"
START = "<!-- results-table:start -->"
END = "<!-- results-table:end -->"
COLUMNS = ("experiment", "measured", "jaxvb", "reference", "target", "met")

#: The fixed-form methods of ``probit.json``'s accuracy table.
PROBIT_FIXED_FORM = ("basic", "factor", "factor_gradient", "hessian", "hessian_minibatch")
#: The speed variants of ``probit.json``, in words.
PROBIT_VARIANTS = {
    "default": "float64, default diagnostics",
    "no_diagnostics": "float64, no diagnostics",
    "float32_no_diagnostics": "float32, no diagnostics",
}


def _load(results: Path, name: str) -> dict:
    path = results / f"{name}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(
            f"summary: {path} is missing; run `python benchmarks/{name}.py` to write it"
        ) from None


def _met(flag) -> str:
    """``yes``, ``no`` or ``—`` for a flag; several flags joined by ``; ``."""
    if isinstance(flag, list | tuple):
        return "; ".join(map(_met, flag))
    return {True: "yes", False: "no", None: "—"}[flag]


def _rows(experiment: str, *rows: str) -> list[tuple[str, str]]:
    """The headline results of one experiment, each written as its table row
    ``measured | jaxvb | reference | target | met`` (``—`` for cells left off the end)."""
    return [(experiment, row + " | —" * (4 - row.count(" | "))) for row in rows]


def _table(header: str, rows) -> list[str]:
    """The lines of a Markdown table whose header and rows are written ``a | b | c``."""
    width = header.count(" | ") + 1
    return [f"| {header} |", "|" + "---|" * width, *(f"| {row} |" for row in rows)]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def _matching(rows, **match) -> list[dict]:
    """The rows without an error that hold every ``key=value`` of ``match``."""
    return [
        r for r in rows if "error" not in r and all(r.get(k) == v for k, v in match.items())
    ]


# ---------------------------------------------------------------------------------
# The headline rows, one function per benchmark (named as its script).


def _toy_rates(checks: dict) -> list[tuple[str, str, str]]:
    """``(estimator, paper, jaxvb)`` for the two weaker estimators of the toy's rate."""
    labels = {
        "independent_N10000": "different randomness",
        "analytic_N10000": "analytic `C`",
    }
    return [
        (
            label,
            checks[key]["paper"].split(" (")[0].replace("+-", "±"),
            f"{checks[key]['eta_all']['mean']:.3f} ± {checks[key]['eta_all']['sd']:.3f}",
        )
        for key, label in labels.items()
    ]


def exponential_toy(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "exponential_toy")
    checks, runs = d["checks"], d["settings"]["repeats_a"]
    error = checks["joint_N4"]["max_rel_error_all"]
    return _rows(
        "Exponential toy (sec. 3.1)",
        f"Algorithm 1, 4 steps: max relative error of the rate ({runs} runs) | "
        f"{error:.1e} | paper: exact | <= 1e-10 | {_met(error <= 1e-10)}",
        *(
            f"{label}, 10^4 steps: rate, mean ± sd of {runs} runs (exact: 2) | {rate} | "
            f"paper: {paper}"
            for label, paper, rate in _toy_rates(checks)
        ),
    )


def beta_binomial(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "beta_binomial")
    t, keys, paper = d["targets"], d["settings"]["repeats"], d["paper"]["r_squared"]
    k1 = next(r for r in d["table"] if r["K"] == 1)["repeats"]
    return _rows(
        "Beta-binomial, mixtures (sec. 6.2)",
        f"K = 1: R^2 (exact, mean of {keys} keys) | "
        f"{_mean(r['exact_r_squared'] for r in k1):.3f} | paper: {paper['1']}",
        f"K = 8: exact KL(q ‖ p), worst of {keys} keys | {t['kl_k8']['worst']:.4f} | "
        f"2-D quadrature | <= 0.01 | {_met(t['kl_k8']['met'])}",
        f"K = 8: R^2 (exact), worst of {keys} keys | "
        f"{t['r_squared_k8']['worst_exact']:.4f} | paper: {paper['8']} | >= 0.997 | "
        f"{_met(t['r_squared_k8']['met'])}",
        f"K = 8: log-evidence error, worst of {keys} keys | "
        f"{t['log_evidence_k8']['worst']:.4f} | quadrature log Z = "
        f"{d['quadrature']['log_z']:.4f} | <= 0.05 | {_met(t['log_evidence_k8']['met'])}",
        "slowest fit after compile, K = 1..8 (2000 steps) | "
        f"{t['fit_time']['slowest_s']:.2f} s | — | <= 1 s | {_met(t['fit_time']['met'])}",
    )


def _variants(target: dict, unit: str, fmt: str) -> tuple[str, str]:
    """jaxvb's number for the default variant and for the best one (the largest speed-up,
    ``unit`` ``x``, or the shortest time), and whether each meets the target:
    ``("7.4 ms (float64, ...); 2.5 ms (float32, ...)", "no; yes")``."""
    variants = {k: v for k, v in target.items() if k in PROBIT_VARIANTS}
    best = (max if unit == "x" else min)(variants, key=lambda k: variants[k]["value"])
    shown = ["default"] if best == "default" else ["default", best]
    numbers = "; ".join(
        f"{format(variants[k]['value'], fmt)}{unit} ({PROBIT_VARIANTS[k]})" for k in shown
    )
    return numbers, _met([variants[k]["met"] for k in shown])


def probit(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "probit")
    table, paper, t, speed = d["table"], d["paper"], d["targets"], d["speed"]
    hessian, vbem, nuts = table["hessian"], table["vbem"], d["reference"]
    fixed = [table[k]["log_score"] for k in PROBIT_FIXED_FORM if k in table]
    svi = speed["svi_fastest_matching"]["float32"]
    svi_ms = 1e3 * svi["head_to_head_median_s"]["svi"]
    loop = [v["python_loop_s"] for v in speed["all_datasets"].values()]
    batch = t["all_datasets_vmapped_s"]
    single, single_met = _variants(t["single_fit_200_steps_ms"], " ms", ".1f")
    over_svi, over_svi_met = _variants(t["faster_than_svi"], "x", ".0f")
    vmapped, vmapped_met = _variants(batch, " s", ".2f")
    return _rows(
        f"Probit, {d['settings']['num_datasets']} data sets (sec. 5)",
        f"log score, fixed-form methods (VBEM) | {min(fixed):.3f} to {max(fixed):.3f} "
        f"({vbem['log_score']:.2f}) | paper: {paper['log_score_fixed_form']} "
        f"({paper['log_score_vbem']})",
        f"mean R^2, Algorithm 2 | {hessian['r_squared']:.3f} | "
        f"paper: {paper['mean_r_squared']}",
        f"KL to NUTS, Algorithm 2 (VBEM), {nuts['num_datasets']} data sets | "
        f"{hessian['vs_nuts']['kl']:.4f} ({vbem['vs_nuts']['kl']:.2f}) | "
        f"NUTS, {nuts['num_chains']} x {nuts['num_samples']} draws",
        "one fit, Algorithm 2, 200 steps, after compile: default; fastest | "
        f"{single} | — | <= 5 ms | {single_met}",
        f"speed-up over NumPyro SVI at equal accuracy: default; best | {over_svi} | "
        f"SVI ({svi['num_steps']} steps): {svi_ms:.0f} ms (float32) | >= 100x | "
        f"{over_svi_met}",
        f"all {batch['num_datasets']} data sets, one vmapped call: default; fastest | "
        f"{vmapped} | Python loop: {min(loop):.1f} to {max(loop):.1f} s | <= 1 s | "
        f"{vmapped_met}",
    )


def stochastic_volatility(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "stochastic_volatility")
    t, settings, nuts = d["targets"], d["settings"], d["nuts"]["settings"]
    fit_ms, speedup = t["fit_after_compile_ms"], t["speedup_vs_nuts"]
    means, sds = t["means_within_nuts_sd"], t["sds_within_15_percent"]
    n_fits = d["accuracy"]["svapprox"]["num_fits"]
    settled = d["converged"]["svapprox"]
    params = ("phi", "s2", "beta")
    settled_errors = {
        p: settled["over_fits"][p]["mean_error_in_nuts_sd"]["median"] for p in params
    }

    def per_param(values) -> str:
        return " / ".join(f"{values[p]:.2f}" for p in params)

    return _rows(
        "Stochastic volatility (sec. 6.1)",
        f"{settings['T']}-point fit, {settings['num_steps']} steps, after compile (with "
        f"sv.fit's default {fit_ms['default_diagnostic_draws']} diagnostic draws) | "
        f"{fit_ms['value']:.0f} ms ({fit_ms['with_default_diagnostics_ms']:.0f} ms) | — | "
        f"<= 50 ms | {_met(fit_ms['met'])}",
        f"speed-up over NUTS (after compile) | {speedup['value']:.0f}x | "
        f"NUTS, {nuts['num_chains']} x {nuts['num_samples']} draws: "
        f"{speedup['nuts_wall_s']:.0f} s | >= 200x | {_met(speedup['met'])}",
        f"mean error of the median of {n_fits} fits, in NUTS sd: phi / s2 / beta | "
        f"{per_param(means['value'])} | NUTS; worst fit: {per_param(means['worst_fit'])}; "
        f"settled after {settled['num_steps']} steps: {per_param(settled_errors)} | "
        f"<= 0.1 | {_met(means['met'])}",
        f"worst sd ratio error of {n_fits} fits, abs(sd / NUTS sd - 1): phi / s2 / beta | "
        f"{per_param(sds['value'])} | NUTS | <= 0.15 | {_met(sds['met'])}",
    )


def latent_gaussian(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "latent_gaussian")
    rows = []
    for name, p in d["problems"].items():
        t, ref = d["targets"][name], p["reference"]["settings"]
        lo, hi = t["hyper_sd_ratios"]["value"]
        accuracy = (t["hyper_means"], t["hyper_sd_ratios"], t["latent_rms_error"])
        speed, first = t["speedup_after_compile"], t["first_call_quicker"]
        rows += _rows(
            f"Latent Gaussian: {p['title']}",
            "hyperparameter means: worst error in NUTS sd; sd ratios; latent field: rms "
            f"error in NUTS sd | {t['hyper_means']['value']:.2f}; {lo:.2f}-{hi:.2f}; "
            f"{t['latent_rms_error']['value']:.3f} | NUTS, {ref['num_chains']} x "
            f"{ref['num_samples']} draws | <= 0.25; 0.7-1.3; <= 0.15 | "
            f"{_met(all(a['met'] for a in accuracy))}",
            "default fit after compile: speed-up over NUTS 500 + 1000; first call "
            f"(compile included), jaxvb / NUTS | {speed['value']:.0f}x; "
            f"{first['value']['jaxvb_s']:.1f} s / {first['value']['nuts_s']:.1f} s | "
            f"NUTS after compile: {p['nuts']['run_s']:.1f} s | >= 20x; sooner | "
            f"{_met([speed['met'], first['met']])}",
        )
    if slope := d["targets"].get("scaling_slope"):
        rows += _rows(
            "Latent Gaussian: SV, simulated",
            "log-log slope of fit time against T = "
            + ", ".join(f"{n:,}" for n in d["settings"]["scaling_T"])
            + f" | {slope['value']:.2f} | linear: 1 | 1 ± 0.15 | {_met(slope['met'])}",
        )
    return rows


def linalg_scaling(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "linalg_scaling")
    slope = d["loglog_slope"]
    largest = max(d["timings"]["arrowhead"], key=lambda r: r["T"])
    return _rows(
        "Arrowhead linear algebra (sec. 6.1)",
        "Cholesky + selected inverse: log-log slope of time against T (ns per step at "
        f"T = {largest['T']:,}) | {slope['arrowhead']['slope_all']:.2f} "
        f"({largest['ns_per_step']:.0f} ns) | banded part alone: "
        f"{slope['banded']['slope_all']:.2f}",
    )


def robustness(results: Path) -> list[tuple[str, str]]:
    table = _load(results, "robustness")["table"]

    def count(rows, *outcomes):
        return sum(r["counts"][o] for r in rows for o in outcomes)

    def total(rows):
        return sum(sum(r["counts"].values()) for r in rows)

    with_mode = [r for r in table if r["model"] != "eight_schools_centered"]
    laplace = [r for r in with_mode if r["start"] == "x0"]
    far = [r for r in with_mode if r["start"] != "x0"]
    silent_nan = count(table, "silent_nan")
    return _rows(
        "Robustness, real posteriors",
        "Algorithm 2 from the Laplace start: accurate fits (4 models with a mode) | "
        f"{count(laplace, 'accurate')} / {total(laplace)} | from N(0, I): "
        f"{count(far, 'accurate')} / {total(far)}",
        "fits wrong or NaN without a flag (every model and start) | "
        f"{count(table, 'silent_wrong', 'silent_nan')} / {total(table)} "
        f"({silent_nan} NaN) | — | no silent NaN | {_met(silent_nan == 0)}",
    )


def dimension(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "dimension")
    rows = []
    for r in d["rows"]:
        it = r["fit"]["iterations"]
        met = d["targets"].get(f"fit_over_model_d{r['d']}", {}).get("met")
        rows.append(
            f"d = {r['d']}: fit of N steps / N value-gradient-Hessian evaluations, after "
            "compile (ms per step) | "
            f"{it['over_model']:.2f}x ({it['ms_per_step']:.2f} ms) | "
            f"the model: {r['model']['ms_per_eval']:.2f} ms per evaluation | "
            f"{'<= 3x' if met is not None else '—'} | {_met(met)}"
        )
    return _rows("Dimension (dense Gaussian, Algorithm 2)", *rows)


def latent_gp_memory(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "latent_gp_memory")
    return _rows(
        f"Memory, latent GP (d = {d['settings']['d']})",
        f"default fit, {d['settings']['num_steps']} steps: peak resident memory; ms per "
        f"step after compile | {d['peak_rss_gb']:.2f} GB; {d['fit_ms_per_step']:.0f} ms | "
        f"the model's Hessian: {d['model_ms_per_hessian']:.0f} ms | "
        f"< {d['target']['peak_rss_gb_below']:g} GB | {_met(d['target']['met'])}",
    )


def first_fit(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "first_fit")
    return _rows(
        "First fit, posteriordb",
        *(
            f"{name}: first call, compile included (Laplace start, 1000 steps, check, "
            f"diagnostics); after compile | {m['jaxvb']['first_call_s']:.1f} s; "
            f"{1e3 * m['jaxvb']['run_s']:.0f} ms | NUTS 1000 + 1000, same process: "
            f"{m['nuts']['first_call_s']:.1f} s; {m['nuts']['run_s']:.1f} s | "
            ">= 3x sooner | "
            f"{_met(m['speedup_first_call'] >= d['targets']['speedup_first_call'])}"
            for name, m in d["models"].items()
        ),
    )


def xla_options(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "xla_options")

    def times(t):
        return f"{t['first_call_s']:.1f} s; {1e3 * t['after_compile_s']:.0f} ms"

    return _rows(
        "jaxvb's CPU compile options",
        *(
            f"{name}: first call, compile included; after compile (medians of "
            f"{d['rounds']} fresh processes) | {times(m['jaxvb'])} | XLA's defaults: "
            f"{times(m['xla_defaults'])} | first call sooner | "
            f"{_met(m['jaxvb']['first_call_s'] < m['xla_defaults']['first_call_s'])}"
            for name, m in d["median"].items()
        ),
    )


def gpu(results: Path) -> list[tuple[str, str]]:
    """Each accelerator record of ``gpu.json`` against the CPU's numbers."""
    d = _load(results, "gpu")

    def find(sections, name, largest=None, **match):
        """The first row of a section that matches, or the one with the ``largest``."""
        rows = _matching(sections.get(name, {}).get("rows", []), **match)
        if largest:
            return max(rows, key=lambda r: r[largest], default=None)
        return next(iter(rows), None)

    def secs(r, fmt=".2f"):
        return f"{r['run']['median_s']:{fmt}} s"

    # The CPU's numbers, the references of the GPU's rows.
    cpu = d["runs"].get("cpu", {}).get("sections", {})
    cpu_f64 = find(cpu, "probit", largest="num_datasets", variant="no_diagnostics")
    cpu_long = find(cpu, "sv", largest="T", kind="single")
    cpu_batch = find(cpu, "sv", kind="batch")
    on_cpu_f64 = (
        f"2-core CPU, float64: {cpu_f64['num_datasets']:,} in {secs(cpu_f64)}"
        if cpu_f64
        else "—"
    )
    on_cpu_long = (
        f"2-core CPU (row scans), T = {cpu_long['T']:,}: {secs(cpu_long, '.1f')}"
        if cpu_long
        else "—"
    )
    on_cpu_batch = (
        f"2-core CPU: {cpu_batch['num_series']} series in {secs(cpu_batch)}"
        if cpu_batch
        else "—"
    )
    out = []
    for device, run in d["runs"].items():
        if run.get("backend") == "cpu":
            continue
        sections, rows = run["sections"], []
        big = max(r["num_datasets"] for r in sections["probit"]["rows"])
        f64 = find(sections, "probit", num_datasets=big, variant="no_diagnostics")
        f32 = find(sections, "probit", num_datasets=big, variant="float32_no_diagnostics")
        if f64 and f32:
            rows.append(
                f"probit, {big:,} data sets in one call (Algorithm 2, 200 steps, no "
                f"diagnostics): float64; float32 | {secs(f64)}; {secs(f32)} | "
                f"{on_cpu_f64}"
            )
        if full := find(sections, "probit", num_datasets=big, variant="default"):
            peak = (full.get("device_memory") or {}).get("peak_bytes_in_use")
            memory = f" (peak {peak / 1e9:.1f} GB)" if peak else ""
            rows.append(
                f"probit, {big:,} data sets with the default diagnostics (1000 draws, "
                "convergence check); 95% interval coverage of the true coefficients | "
                f"{secs(full, '.1f')}{memory}; {100 * full['coverage_95']:.2f}% | "
                "calibrated: 95%"
            )
        rows += [
            f"dimension d = {r['d']}: ms per step, after compile | "
            f"{r['fit']['iterations']['ms_per_step']:.1f} ms | the model: "
            f"{r['model']['ms_per_eval']:.2f} ms per evaluation"
            for r in _matching(sections.get("dimension", {}).get("rows", []))
        ]
        if top := find(sections, "sv", largest="T", kind="single", tridiagonal="parallel"):
            # and at the CPU's longest T, where both measured it
            same_t = cpu_long and find(
                sections, "sv", kind="single", T=cpu_long["T"], tridiagonal="parallel"
            )
            at_t = f" (T = {same_t['T']:,})" if same_t else ""
            at_t_s = f" ({secs(same_t)})" if same_t else ""
            rows.append(
                f"stochastic volatility, T = {top['T']:,}, 250 steps, after compile{at_t} | "
                f"{secs(top)}{at_t_s} | {on_cpu_long}"
            )
        if batch := find(sections, "sv", kind="batch", tridiagonal="parallel"):
            rows.append(
                f"stochastic volatility, {batch['num_series']:,} series of {batch['T']} "
                f"days in one call | {secs(batch)} | {on_cpu_batch}"
            )
        out += _rows(f"On a GPU ({device})", *rows)
    return out


def hierarchical(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "hierarchical")
    models, tol = d["models"], d["settings"]["tolerances"]
    verdicts = [m["verdict"] for m in models.values()]

    def count(*names):
        return sum(v in names for v in verdicts)

    sound = count("accurate", "accurate (flagged)", "flagged", "refused")
    ref = d["settings"]["reference"]
    return _rows(
        f"Hierarchical models ({len(models)})",
        "recommended route: accurate (every marginal within "
        f"{tol['mean_sd']} NUTS sd in mean, sd ratio {tol['sd_ratio'][0]}-"
        f"{tol['sd_ratio'][1]}), or flagged; wrong with status 0 | "
        f"{count('accurate')} accurate, {count('flagged', 'refused')} flagged, "
        f"{count('accurate (flagged)')} accurate but flagged; "
        f"{count('wrong', 'silent narrow')} wrong | NUTS, {ref['num_chains']} x "
        f"{ref['num_samples']} draws | every model accurate or flagged | "
        f"{_met(sound == len(models))}",
        "status 0 with an sd ratio below "
        f"{tol['silent']} | {count('silent narrow')} | — | none | "
        f"{_met(count('silent narrow') == 0)}",
    )


def verdicts(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "verdicts")
    summaries = [m["summary"] for m in d["models"].values() if m.get("summary")]
    t, settings, ref = d["targets"], d["settings"], d["settings"]["reference"]
    fits = sum(s["num_fits"] for s in summaries)
    datasets = sum(s["num_datasets"] for s in summaries)

    def count(*names):
        return sum(s["verdicts_every_key"].get(v, 0) for s in summaries for v in names)

    agree = [
        t["no_inaccurate_fit_without_flag"]["met"],
        t["no_accurate_fit_flagged"]["met"],
    ]
    return _rows(
        f"Verdicts across data sets ({len(summaries)} models)",
        f"{fits} fits ({datasets} data sets x {settings['num_keys']} keys): accurate "
        "and unflagged; inaccurate and flagged; accurate but flagged; inaccurate "
        f"without a flag | {count('accurate')}; {count('flagged', 'refused')}; "
        f"{count('accurate (flagged)')}; {count('wrong', 'silent narrow')} | NUTS on "
        f"each data set, {ref['num_chains']} x {ref['num_samples']} draws | no "
        f"inaccurate fit without a flag; no accurate fit flagged | {_met(agree)}",
        "data sets whose flag changes with the fit's key | "
        f"{t['flag_same_over_keys']['value']} of {datasets} | — | none | "
        f"{_met(t['flag_same_over_keys']['met'])}",
    )


def many_fits(results: Path) -> list[tuple[str, str]]:
    d = _load(results, "many_fits")
    t, s = d["targets"], d["settings"]
    largest = max(d["streamed"], key=lambda r: r["num_datasets"])
    flat = t["peak_rss_flat"]
    over = t["store_overhead"]
    return _rows(
        "Many fits, streamed",
        f"probit data sets through `jaxvb.fit_many` ({s['method']}, {s['num_steps']} "
        f"steps), chunks of {s['chunk_size']}: data sets per second; peak RSS | "
        f"{largest['num_datasets']:,}: {largest['datasets_per_s']:.0f}/s; "
        f"{largest['peak_rss_mb']:.0f} MB | — | peak RSS flat in the number of data "
        f"sets (< 10% growth, {flat['sizes'][0]:,} to {flat['sizes'][-1]:,}) | "
        f"{_met(flat['met'])}",
        "the store's cost against an in-memory `fit_batched` of "
        f"{d['overhead']['num_datasets']:,} data sets | {100 * over['value']:.0f}% | "
        f"— | within 25% | {_met(over['met'])}",
    )


def _many_fits_details(results: Path) -> list[str]:
    d = _load(results, "many_fits")
    streamed = [
        f"{r['num_datasets']:,} | {r['compile_s']:.1f} | {r['seconds']:.1f} | "
        f"{r['datasets_per_s']:.0f} | {r['peak_rss_mb']:.0f} | {r['rss_growth_mb']:.0f} | "
        f"{r['ok_fraction']:.3f}"
        for r in d["streamed"]
    ]
    processes = [
        f"{r['processes']} | {r['num_datasets']:,} | {r['seconds']:.1f} | "
        f"{r['datasets_per_s']:.0f} | {', '.join(map(str, r['fitted_by_process']))}"
        for r in d["processes"]
    ]
    o = d["overhead"]
    return [
        *_table(
            "data sets | compile (s) | fit_many after compile (s) | data sets per s | "
            "peak RSS (MB) | RSS growth (MB) | status 0",
            streamed,
        ),
        "",
        *_table(
            "processes | data sets | seconds | data sets per s | fitted per process",
            processes,
        ),
        "",
        f"`fit_many` into a store: {o['fit_many_s']:.2f} s; one in-memory "
        f"`fit_batched` call: {o['fit_batched_s']:.2f} s ({o['num_datasets']:,} data "
        f"sets; the same `q` to {o['max_abs_difference_of_q']:g}).",
        "",
        *(f"- {note}" for note in d["notes"]),
    ]


def _results_lines(rows) -> list[str]:
    """The headline table; without the experiment column where all rows share one (a
    page's title names it)."""
    if len({experiment for experiment, _ in rows}) == 1:
        return _table(" | ".join(COLUMNS[1:]), [cells for _, cells in rows])
    return _table(" | ".join(COLUMNS), [" | ".join(row) for row in rows])


def table(results: Path = RESULTS) -> str:
    """The Markdown table (and its note), as printed and as put into the README."""
    rows = [r for page in PAGES.values() for r in page.rows(results)]
    lines = _results_lines(rows)
    lines += [
        "",
        "Generated by `python benchmarks/summary.py --write-readme` from "
        "`benchmarks/results/*.json`. *met*: whether the result meets the target set "
        "for it. Each benchmark's page in the documentation gives its settings, more "
        "of its numbers and its figures.",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------
# The documentation's benchmark pages, generated from the same JSON files.


def _toy_details(results: Path) -> list[str]:
    checks = _load(results, "exponential_toy")["checks"]
    neg = checks["negative_rates"]
    error = checks["joint_N4"]["max_rel_error_all"]
    rows = [
        f"Algorithm 1 (the same draw for `g` and `C`) | exact | max relative error {error:.1e}",
        *(" | ".join(rate) for rate in _toy_rates(checks)),
    ]
    return [
        "Rate after `N` steps (exact: 2), mean ± sd over the repeats:",
        "",
        *_table("estimator | paper | jaxvb", rows),
        "",
        "One-shot estimates from `S` draws of the optimal `q` (appendix D): the "
        "regression estimator is exact from `S = 2` (max error "
        f"{checks['est2_exact_for_S_ge_2']['max_abs_error']:.1e}); the fraction of "
        "negative (invalid) rates for `S < 10` is "
        f"{neg['est1']['fraction_S_lt_10']:.1%} with independent draws, "
        f"{neg['esta']['fraction_S_lt_10']:.1%} with the analytic `C` and "
        f"{neg['est2']['fraction_S_lt_10']:.1%} with the regression.",
    ]


def _beta_binomial_details(results: Path) -> list[str]:
    d = _load(results, "beta_binomial")
    quad = d["quadrature"]
    err = quad["error_estimate"]

    def mean(row, key):
        return _mean(r[key] for r in row["repeats"])

    rows = [
        f"{row['K']} | {mean(row, 'exact_kl'):.4f} | {mean(row, 'kl'):.4f} | "
        f"{mean(row, 'exact_r_squared'):.4f} / {mean(row, 'r_squared'):.4f} | "
        f"{mean(row, 'log_evidence_error'):+.4f} | {1e3 * row['median_s']:.0f}"
        for row in d["table"]
    ]
    return [
        "Means over the keys; *exact* values are from quadrature, *reported* ones are "
        "what the fit's own diagnostics say.",
        "",
        *_table(
            "K | exact KL | reported KL | R^2 exact / reported | log-evidence error "
            "(reported) | ms per fit after compile (median)",
            rows,
        ),
        "",
        f"Quadrature: `log Z = {quad['log_z']:.6f}`, of which the tail beyond "
        f"`log K = 30` holds a fraction {quad['tail_mass_fraction']:.1e}; halving both "
        f"grids changes `log Z` by {err['log_z']:.1e} and the exact scores by at most "
        f"{err['exact_scores']:.1e}.",
    ]


def _probit_details(results: Path) -> list[str]:
    d = _load(results, "probit")
    paper, rows = d["paper"], []
    for v in d["table"].values():
        if "num_steps" not in v:
            continue  # the NUTS reference's own row
        nuts = v.get("vs_nuts", {})
        rows.append(
            f"{v['label']} | {v['num_steps']} | {v['likelihood_evaluations']:.0f} | "
            f"{v['rmse']:.4f} | {v['log_score']:.3f} | {v['r_squared']:.3f} | "
            f"{nuts.get('kl', float('nan')):.4f} | {nuts.get('sme_max', float('nan')):.3f}"
        )
    return [
        "Means over the data sets. *KL to NUTS*: mean KL from the NUTS reference's "
        "Gaussian to `q`; *max SME*: the largest standardised error of the mean, in "
        "posterior sd.",
        "",
        *_table(
            "method | steps | likelihood evaluations | RMSE | log score | mean R^2 | "
            "KL to NUTS | max SME",
            rows,
        ),
        "",
        f"The paper reports a log score of {paper['log_score_fixed_form']} for the "
        f"fixed-form methods against {paper['log_score_vbem']} for VBEM, and a mean "
        f"R^2 of {paper['mean_r_squared']}.",
    ]


def _sv_details(results: Path) -> list[str]:
    d = _load(results, "stochastic_volatility")
    acc = d["accuracy"]["svapprox"]
    params = list(d["nuts"]["params"])
    rows = []
    for name, nuts in d["nuts"]["params"].items():
        first = acc["fits"][0]["posterior"][name]
        errors = [f["vs_nuts"][name]["mean_error_in_nuts_sd"] for f in acc["fits"]]
        ratios = [f["vs_nuts"][name]["sd_ratio"] for f in acc["fits"]]
        rows.append(
            f"`{name}` | {nuts['mean']:.4f} ({nuts['sd']:.4f}) | "
            f"{first['mean']:.4f} ({first['sd']:.4f}) | {max(errors, key=abs):+.3f} | "
            f"{max(ratios, key=lambda r: abs(r - 1)):.3f}"
        )
    settled = []
    for equation, c in d["converged"].items():
        over = c["over_fits"]
        settled.append(
            f"- eq. {equation}, the median of {c['num_fits']} fits of {c['num_steps']} "
            "steps (where it settles): mean error "
            + ", ".join(
                f"`{p}` {over[p]['mean_error_in_nuts_sd']['median']:+.3f}" for p in params
            )
            + "; sd ratio "
            + ", ".join(f"`{p}` {over[p]['sd_ratio']['median']:.3f}" for p in params)
        )
    speed = [
        f"eq. {equation} | {r['num_eval_draws']} | {r['first_call_s']:.1f} s | "
        f"{1e3 * r['run']['median_s']:.1f} ms"
        for equation, runs in d["speed"].items()
        for r in runs.values()
    ]
    return [
        f"Accuracy of {acc['num_fits']} fits with different keys against NUTS "
        "(errors in NUTS posterior sd):",
        "",
        *_table(
            "parameter | NUTS mean (sd) | first fit mean (sd) | mean error, worst fit | "
            "sd ratio, worst fit",
            rows,
        ),
        "",
        *settled,
        "",
        "Time of one fit, the first call (compile included) and the median after compile:",
        "",
        *_table("equation | diagnostic draws | first call | after compile", speed),
    ]


def _fmt(value) -> str:
    """A float to 2 significant digits; anything else (a missing value) as it is."""
    return f"{value:.2g}" if isinstance(value, float) else str(value)


def _latent_details(results: Path) -> list[str]:
    d = _load(results, "latent_gaussian")
    sc, rows = d["scaling"], []
    for name, p in d["problems"].items():
        j, nuts = p["jaxvb"], p["nuts"]
        imp = d["targets"][name].get("hyper_means_importance_corrected", {})
        rows.append(
            f"{p['title']} | {p['num_latent']} | "
            f"{j['diagnostics']['run']['median_s']:.3f} s "
            f"({j['no_diagnostics']['run']['median_s']:.3f} s) | {nuts['run_s']:.1f} s | "
            f"{j['diagnostics']['first_call_s']:.1f} s / {nuts['first_call_s']:.1f} s | "
            f"{_fmt(imp.get('value'))}, {_fmt(imp.get('khat'))}"
        )
    scaling = [
        f"{r['T']:,} | {r['first_call_s']:.2f} s | {r['run_s']:.3f} s"
        + (" (*)" if r["run_estimated"] else "")
        for r in sc["rows"]
    ]
    return [
        "Per model: the size of the latent field `T`, the default fit's time after "
        "compile with and without diagnostics, NUTS (500 + 1000) on the same log "
        "joint, and the importance-corrected draws' hyperparameter error.",
        "",
        *_table(
            "model | `T` | jaxvb after compile (no diagnostics) | NUTS after compile | "
            "first call jaxvb / NUTS | importance-corrected: worst mean error, k-hat",
            rows,
        ),
        "",
        f"SV fits of simulated series of length `T` ({sc['num_steps']} steps, no "
        "diagnostics); where no call is repeated, the time after compile is the first "
        "call less JAX's compile seconds (*).",
        "",
        *_table("`T` | first call | after compile", scaling),
    ]


def _hierarchical_details(results: Path) -> list[str]:
    d = _load(results, "hierarchical")

    def secs(v):
        return "—" if v is None else f"{v:.2f} s"

    rows = []
    for m in d["models"].values():
        fit, nuts, sc = m["fit"], m.get("nuts") or {}, m.get("score")
        route = fit.get("route", "—")
        if isinstance(route, dict):
            route = ", ".join(f"{k}={v!r}" for k, v in route.items())
        own = m.get("score_q")
        numbers = (
            f"{sc['max_mean_error_sd']:.2f} | {sc['sd_ratio'][0]:.2f}-"
            f"{sc['sd_ratio'][1]:.2f} | {own['sd_ratio'][0]:.2f}-{own['sd_ratio'][1]:.2f}"
            if sc
            else "— | — | —"
        )
        status = fit.get("flags", fit.get("error", {}).get("type", "—"))
        status = status.replace("|", ", ")  # a table's cell
        khat = fit.get("khat")
        rows.append(
            f"{m['title']} | `{route}` | **{m['verdict']}** | {status} | "
            f"{_fmt(khat)} | {numbers} | {secs(fit.get('first_call_s'))} / "
            f"{secs(fit.get('after_compile_s'))} | {secs(nuts.get('first_call_s'))} / "
            f"{secs(nuts.get('after_compile_s'))}"
        )
    return [
        "Per model: the route, the verdict, the status, `res.khat`, the worst mean "
        "error (in NUTS sd) and the range of sd ratios of the default draws "
        "(importance-resampled where k-hat allows), the sd ratios of `q`'s own draws "
        "(`sample(..., psis=False)`), and the first call (compile included) and a "
        "call after compile of the fit and of NUTS (one chain, 500 + 1000) in the "
        "same process.",
        "",
        *_table(
            "model | route | verdict | status | k-hat | mean error | sd ratios | "
            "sd ratios, q's own | jaxvb first / after | NUTS first / after",
            rows,
        ),
    ]


def _span(values, fmt: str = ".2f") -> str:
    """``lo-hi`` of a ``[lo, hi]`` range (``—`` where there is none)."""
    if not values:
        return "—"
    lo, hi = values
    return f"{lo:{fmt}}" if lo == hi else f"{lo:{fmt}}-{hi:{fmt}}"


def _verdicts_details(results: Path) -> list[str]:
    d = _load(results, "verdicts")
    per_model, per_dataset = [], []
    for name, m in d["models"].items():
        s = m.get("summary")
        if not s:
            continue
        truth = ", ".join(f"{k} = {v:.3g}" for k, v in (m["hyperparameters"] or {}).items())
        counts = ", ".join(f"{n} {v}" for v, n in s["verdicts_every_key"].items())
        a = s["agreement"]
        per_model.append(
            f"{name} | {truth} | {s['num_datasets']} x {s['num_fits'] // s['num_datasets']}"
            f" | {counts} | {_span(s['khat'])} ({_span(s['khat_every_key'])}) | "
            f"{_span(s['khat_sd'])} | {_span(s['log_weight_variance'])} | "
            f"{_span(s['sd_ratio_min'])} | {_span(s['sd_ratio_max'])} | "
            f"{_span(s['max_mean_error_sd'])} | {a['agree']} / {a['of']} | "
            f"{len(s['flag_changes_with_key'])}"
        )
        for r in m["datasets"]:
            first, ref = r["fits"][0], r["reference"]
            imp, sc = first.get("importance", {}), first.get("score")
            if "error" in first:  # its q can be anything: no numbers to show
                imp, sc = {}, None
            khats = ", ".join(_fmt(f.get("khat")) for f in r["fits"])
            flags = ", ".join(f.get("flags", "—").replace("|", " ") for f in r["fits"])
            per_dataset.append(
                f"{name} | {r['index']} ({r['origin']}) | "
                f"{', '.join(r['verdicts_over_keys'])} | {flags} | {khats} | "
                f"{_fmt(imp.get('khat', '—'))}, "
                f"{_fmt(imp.get('log_weight_variance', '—'))}, "
                f"{format(imp['ess'], '.0f') if imp else '—'} | "
                + (
                    f"{sc['sd_ratio'][0]:.2f}-{sc['sd_ratio'][1]:.2f} | "
                    f"{sc['max_mean_error_sd']:.2f}"
                    if sc
                    else f"{first.get('error', {}).get('type', '—')} | —"
                )
                + f" | {ref['max_r_hat']:.3f}, {ref['min_ess']:.0f}, {ref['divergences']}"
            )
    return [
        "Per model: the hyperparameters the simulated data sets are drawn at (the "
        "stored reference's posterior means on the benchmark's data, data set 0), the "
        "data sets and keys, the verdicts of every fit, and over the data sets: "
        "`res.khat` (first key; every key), its Monte Carlo sd where the result "
        "carries one, the log weights' variance, the smallest and the largest sd "
        "ratio, the worst mean error (in NUTS sd), how many fits the flag agrees with "
        "(flagged exactly where inaccurate) and on how many data sets the flag changes "
        "with the key. The ranges leave out fits that raised an error.",
        "",
        *_table(
            "model | simulated at | data sets x keys | verdicts | k-hat | k-hat sd | "
            "log-weight variance | smallest sd ratio | largest sd ratio | mean error | "
            "flag agrees | flag changes with key",
            per_model,
        ),
        "",
        "Per data set: each key's verdict, flags and `res.khat`; the first key's "
        "importance weights (`res.importance(key, 4000)`: k-hat, log-weight variance, "
        "ESS), sd ratios and worst mean error; the reference's largest R-hat, smallest "
        "ESS and divergences.",
        "",
        *_table(
            "model | data set | verdicts | flags | k-hat | importance k-hat, variance, "
            "ESS | sd ratios | mean error | NUTS R-hat, ESS, divergences",
            per_dataset,
        ),
    ]


class Page(NamedTuple):
    """One benchmark's page: its title, what it measures, its headline rows, its
    figures, its details and the JSON files it reads (if not ``<name>.json``)."""

    title: str
    intro: str
    rows: Callable[[Path], list[tuple[str, str]]] | None = None
    figures: tuple[tuple[str, str], ...] = ()
    details: Callable[[Path], list[str]] | None = None
    results: tuple[str, ...] = ()


PAGES = {
    "exponential_toy": Page(
        "Exponential toy",
        "The paper's first example (section 3.1 and appendix D): an exponential "
        "distribution fitted to an exponential target, where Algorithm 1 is exact "
        "after `2(k + 1)` steps, against the two weaker estimators of `C` the paper "
        "shows to be biased (*different randomness* and *analytic `C`*).",
        exponential_toy,
        (
            ("exponential_toy_iterations.png", "Algorithm 1 against the weaker estimators"),
            ("exponential_toy_estimators.png", "One-shot estimators from S draws"),
        ),
        _toy_details,
    ),
    "beta_binomial": Page(
        "Beta-binomial: mixtures of Gaussians",
        "Section 6.2: mixtures of `K = 1..8` Gaussians (`jaxvb.GaussianMixture`) "
        "fitted to the skewed beta-binomial posterior of the cancer mortality data, "
        "scored against two-dimensional quadrature (exact KL, R^2 and log normaliser).",
        beta_binomial,
        (
            ("beta_binomial_kl.png", "Exact and reported KL against K"),
            (
                "beta_binomial_contours.png",
                "Mixture approximations beside the exact posterior",
            ),
        ),
        _beta_binomial_details,
    ),
    "probit": Page(
        "Binary probit regression",
        "Section 5: 500 simulated data sets (N = 100, M = 5), every method from the "
        "prior with one draw per step: Algorithm 1, the factor (site) regressions, "
        "Algorithm 2 with and without minibatches, and VBEM; accuracy against NUTS "
        "references, and speed against NumPyro SVI at equal accuracy.",
        probit,
        (("probit.png", "RMSE against likelihood evaluations, per method"),),
        _probit_details,
    ),
    "stochastic_volatility": Page(
        "Stochastic volatility",
        "Section 6.1: the paper's hierarchical approximation of the stochastic "
        "volatility model on the 945 GBP/USD returns (Beta and conditional "
        "Inverse-Gamma blocks for the parameters, a Gaussian over the volatilities "
        "handled in O(T)), against a long NUTS reference: its time (eq. svapprox, the "
        "paper's, and eq. sv2) and its accuracy.",
        stochastic_volatility,
        (
            ("stochastic_volatility_posteriors.png", "Posteriors of beta, phi and s2"),
            ("stochastic_volatility_volatility.png", "Smoothed volatility with 90% bands"),
        ),
        _sv_details,
        ("stochastic_volatility", "stochastic_volatility_figures"),
    ),
    "latent_gaussian": Page(
        "Latent Gaussian models",
        "`jaxvb.LatentGaussian` (`q(theta) q(f | theta)`) on three public data sets — "
        "stochastic volatility of the S&P 500, a log-Gaussian Cox process on a 20 x 20 "
        "grid and a binomial GLMM — against long NUTS references, and NUTS run on the "
        "same log joint in the same process; and the time of the stochastic volatility "
        "fit against the length `T = 10^3 ... 10^6` of the series.",
        latent_gaussian,
        (
            ("latent_gaussian_accuracy.png", "Hyperparameter posteriors against NUTS"),
            ("latent_gaussian_speed.png", "Time against NUTS, and against T"),
        ),
        _latent_details,
        ("latent_gaussian", "latent_gaussian_figures"),
    ),
    "linalg_scaling": Page(
        "Banded and arrowhead linear algebra",
        "`jaxvb.linalg`'s Cholesky factor and selected inverse of the stochastic "
        "volatility model's precision (tridiagonal, with one dense border) for "
        "`T = 10^3 ... 10^6`: the time should grow linearly in `T`.",
        linalg_scaling,
    ),
    "robustness": Page(
        "Robustness on real posteriors",
        "Algorithm 2 from a new user's start (`N(0, I)`) and from the Laplace start, "
        "on real posteriors with several keys each: how many fits are accurate, and "
        "whether every inaccurate fit is flagged (never a silent NaN).",
        robustness,
    ),
    "dimension": Page(
        "Dimension",
        "A hierarchical logistic regression with `d = G + 2` parameters: what a step "
        "of the dense Gaussian's Algorithm 2 costs against the model's own value, "
        "gradient and Hessian.",
        dimension,
        (("dimension.png", "Time per step and peak memory against the dimension"),),
    ),
    "latent_gp_memory": Page(
        "Memory of a latent Gaussian process",
        "A Poisson model with a Gaussian-process prior written as a user would (a "
        "100 x 100 Cholesky inside `log_joint`, `d = 102`), fitted with every default: "
        "peak resident memory and time per step.",
        latent_gp_memory,
    ),
    "first_fit": Page(
        "First fit",
        "The first call of `jaxvb.fit` from a start point (compile included) on "
        "posteriordb posteriors, against NumPyro NUTS's first run on the same log "
        "density in the same process.",
        first_fit,
    ),
    "xla_options": Page(
        "Compile options",
        "The options jaxvb compiles its own CPU programs with (`cpu_compile_options` "
        "in `jaxvb/_platform.py`) against XLA's defaults, as a user's own programs "
        "compile: the first call, compile included, and the calls after it, each "
        "variant in a fresh process.",
        xla_options,
    ),
    "hierarchical": Page(
        "Hierarchical models",
        "Eleven hierarchical and heavy-tailed NumPyro models (eight schools centred "
        "and non-centred, radon's varying intercepts and slopes, crossed random "
        "effects, Gaussian process regression and classification, stochastic "
        "volatility with a Cauchy level, a regularised horseshoe, a Bayesian neural "
        "network, random effects with no group spread), each fitted the way the "
        "NumPyro guide recommends and scored marginal by marginal against a NUTS "
        "reference: is every fit accurate or flagged?",
        hierarchical,
        (("hierarchical.png", "Recommended route against NUTS, per model"),),
        _hierarchical_details,
    ),
    "verdicts": Page(
        "Verdicts across data sets",
        "Whether a fit's flag (`HIGH_KHAT` and the other status flags of "
        "`jaxvb.numpyro.fit`) tracks its accuracy rather than the data set or the "
        "key: several models of the hierarchical benchmark, each on its own data and "
        "on data sets simulated from it at fixed hyperparameters, fitted with several "
        "keys by the recommended route and scored against NUTS on each data set.",
        verdicts,
        (("verdicts.png", "k-hat against sd ratios, every fit, per model"),),
        _verdicts_details,
    ),
    "many_fits": Page(
        "Many fits, streamed",
        "`jaxvb.fit_many` on the paper's probit model: up to a million data sets "
        "streamed chunk by chunk into a store on disk in bounded memory, the "
        "throughput of 1, 2 and 4 `jax.distributed` processes on one machine, and "
        "the store's cost against an in-memory `jaxvb.fit_batched`.",
        many_fits,
        (("many_fits.png", "Throughput and resident memory while streaming"),),
        _many_fits_details,
    ),
    "gpu": Page(
        "On a GPU",
        "What a CPU cannot show: probit over up to 100,000 data sets in one call of "
        "`jaxvb.fit_batched`, the dense Gaussian at large `d`, and the stochastic "
        "volatility model on long series and many series at once.",
        gpu,
    ),
}


def pages(results: Path = RESULTS) -> dict[str, Page]:
    """Every benchmark's page: those of :data:`PAGES`, in that order, then one for each
    other script in ``benchmarks/`` (its docstring's first line as the title and intro,
    its ``<name>*.png`` figures), so that a new benchmark is on the site at once."""
    found = dict(PAGES)
    shown = {figure for page in PAGES.values() for figure, _ in page.figures}
    for script in sorted(BENCHMARKS.glob("*.py")):
        name = script.stem
        if name.startswith("_") or name == "summary" or name in found:
            continue
        doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or name
        title = doc.strip().splitlines()[0].rstrip(".")
        figures = tuple(
            (f.name, f.stem.replace("_", " "))
            for f in sorted(results.glob(f"{name}*.png"))
            if f.name not in shown
        )
        found[name] = Page(title, f"{title}.", figures=figures)
    return found


#: The environment keys shown on a page, in this order.
ENVIRONMENT = (
    "backend devices cpu_count x64 jax_version jaxlib_version numpyro_version "
    "numpy_version python xla_flags"
).split()


def _settings_table(rows: dict) -> list[str]:
    """A ``setting | value`` table of ``{key: text}`` (none if it is empty)."""
    rows = [f"{key.replace('_', ' ')} | `{text}`" for key, text in rows.items()]
    return _table("setting | value", rows) if rows else []


def _environment_lines(env: dict) -> list[str]:
    return _settings_table(
        {
            k: ", ".join(map(str, env[k])) if isinstance(env[k], list) else env[k]
            for k in ENVIRONMENT
            if env.get(k) not in (None, "", [])
        }
    )


def _settings_lines(settings: dict) -> list[str]:
    """The short settings of a results file, one row each (long lists are left out)."""
    texts = {k: json.dumps(v, ensure_ascii=False) for k, v in settings.items()}
    return _settings_table({k: text for k, text in texts.items() if len(text) <= 80})


def page(name: str, results: Path = RESULTS, figures: bool = True) -> str:
    """The Markdown page of the benchmark ``name`` (a script's stem), from its results:
    what the documentation shows and the notebooks display (there without the figures,
    which they draw themselves)."""
    found = pages(results)[name]
    return benchmark_page(name, found if figures else found._replace(figures=()), results)


def benchmark_page(name: str, page: Page, results: Path = RESULTS) -> str:
    """The Markdown page of one benchmark, from its results."""
    files = page.results or (name,)
    lines = [f"# {page.title}", "", page.intro, ""]
    if not (results / f"{files[0]}.json").exists() and page.rows is None:
        lines += [f"No results are recorded yet: run `python benchmarks/{name}.py`.", ""]
        return "\n".join(lines)
    data = _load(results, files[0])
    lines += [
        f"Run it with `python benchmarks/{name}.py` (`--quick` for a short smoke run); "
        "it writes its results to `benchmarks/results/` ("
        + ", ".join(f"`{f}.json`" for f in files)
        + (") and the figures below." if page.figures else ")."),
        "",
    ]
    if page.rows is not None:
        lines += ["## Headline results", "", *_results_lines(page.rows(results)), ""]
    if page.details is not None:
        lines += ["## Details", "", *page.details(results), ""]
    if page.figures:
        lines += ["## Figures", ""]
        for figure, caption in page.figures:
            lines += [f"![{caption}]({figure})", "", f"*{caption}.*", ""]
    settings = data.get("settings")
    if isinstance(settings, dict) and (rows := _settings_lines(settings)):
        lines += ["## Settings", "", *rows, ""]
    envs = (
        {run: r.get("environment", {}) for run, r in data["runs"].items()}
        if name == "gpu"
        else {"": data.get("environment", {})}
    )
    for run, env in envs.items():
        if rows := _environment_lines(env):
            lines += [f"## Environment{f': {run}' if run else ''}", "", *rows, ""]
    return "\n".join(lines)


def docs_pages(results: Path = RESULTS) -> dict[str, str | Path]:
    """The documentation's benchmark pages: ``{path under docs/: Markdown or a PNG}``.

    ``benchmarks/index.md`` holds the results table with a link to each benchmark's
    page, ``benchmarks/<name>.md`` the page, ``benchmarks/<figure>.png`` its figures
    (the files in ``results``).
    """
    every = pages(results)
    index = [
        "# Benchmarks",
        "",
        "Every number on these pages is read from the JSON files the scripts in "
        "`benchmarks/` write to `benchmarks/results/`; the pages are generated when "
        "the documentation is built, so a re-run benchmark shows here at the next "
        "build. Timings depend on the machine: each page lists the environment its "
        "numbers were measured in, and peers are timed in the same process. *met*: "
        "whether the result meets the target set for it.",
        "",
    ]
    for name, page in every.items():
        index += [f"## [{page.title}]({name}.md)", "", page.intro, ""]
        if page.rows is not None:
            index += [*_results_lines(page.rows(results)), ""]
    out: dict[str, str | Path] = {"benchmarks/index.md": "\n".join(index)}
    for name, page in every.items():
        out[f"benchmarks/{name}.md"] = benchmark_page(name, page, results)
        for figure, _ in page.figures:
            path = results / figure
            if not path.exists():
                raise SystemExit(
                    f"summary: {path} is missing; run `python benchmarks/{name}.py`"
                )
            out[f"benchmarks/{figure}"] = path
    return out


def readme_block(text: str) -> str:
    """What the README holds between the markers."""
    if text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(
            f"README.md must hold exactly one {START} and one {END} line, in that order"
        )
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def with_table(text: str, block: str) -> str:
    """``text`` with what is between the markers replaced by ``block``."""
    readme_block(text)  # checks the markers
    head, rest = text.split(START, 1)
    return f"{head}{START}\n{block}{END}{rest.split(END, 1)[1]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON folder")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument(
        "--write-readme", action="store_true", help="replace the README's table"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the README's table is out of date"
    )
    parser.add_argument("--quick", action="store_true", help="no effect (always quick)")
    parser.add_argument(
        "--docs", type=Path, metavar="DIR", help="write the benchmark pages into DIR"
    )
    args = parser.parse_args(argv)
    block = table(args.results)
    print(block, end="")
    if args.docs:
        for name, content in docs_pages(args.results).items():
            path = args.docs / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                path.write_bytes(content.read_bytes())
            else:
                path.write_text(content, encoding="utf-8")
        print(f"\nwrote the benchmark pages into {args.docs}", file=sys.stderr)
    if args.write_readme:
        text = args.readme.read_text(encoding="utf-8")
        args.readme.write_text(with_table(text, block), encoding="utf-8")
        print(f"\nwrote the table into {args.readme}", file=sys.stderr)
    if args.check and readme_block(args.readme.read_text(encoding="utf-8")) != block:
        print(
            f"\n{args.readme} is out of date: run python benchmarks/summary.py "
            "--write-readme",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
