"""Verdicts across data sets: is a fit flagged where, and only where, it is inaccurate?

``jaxvb.numpyro.fit`` sets ``HIGH_KHAT`` from the Pareto k-hat of the importance
weights its draws rest on (``res.khat``). This benchmark asks whether that verdict is
a property of the fit's quality rather than of the data set or the key: several data
sets of one model, each fitted by the route the NumPyro guide recommends (the models,
routes and scored sites of ``hierarchical.py``, imported from it), each scored with
``hierarchical.score`` against a NUTS reference on that data set. A flag should fall
on the inaccurate fits (``flagged``, ``wrong``, ``silent narrow``), not on the accurate
ones (``accurate (flagged)``), and should not change with the fit's key.

The data sets. Data set 0 of a model is the hierarchical benchmark's own data. Data
sets 1, 2, ... are simulated from the model with its hyperparameters (its scalar
sample sites, e.g. ``mu`` and ``tau``) fixed at the stored reference's posterior means
on that data (``tests/data/hierarchical_nuts.json``): a generating process a user's
data plausibly come from. Every other latent site (the group effects, the Gaussian
process) and the observations are drawn from the model given those values, with the
benchmark's covariates and sizes (the schools' standard errors, radon's homes and
counties, the 30 x 20 crossed design, the GP's inputs). For the crossed model the
benchmark's data set is itself a simulation at other values (scales 0.6 and 0.4,
seed 1), so its data sets vary as in a user's report that a flag came and went from
one simulated data set of the same design to the next.

Per data set: the fit (``num_steps=1000``) with its status, ``res.khat``, its Monte
Carlo spread where the result has one (``khat_sd``), and ``res.importance(key,
4000)``'s k-hat, effective sample size and log-weight variance; the same fit with
other keys (does the flag change with the key?); NUTS (4 chains of 500 + 1000,
``target_accept_prob=0.9``, on ``hierarchical.reference_model``'s form); and the score
of the default draws (``res.sample``) and of ``q``'s own. Each model runs in a worker
process with a time limit. The targets, over every fit: no inaccurate fit without a
flag, no accurate fit with one, and no data set whose flag changes with the key.

Usage::

    python benchmarks/verdicts.py                    # every model, results + figure
    python benchmarks/verdicts.py --only crossed     # one model (updates its rows)
    python benchmarks/verdicts.py --quick            # eight schools, 2 data sets, short
"""

from __future__ import annotations

import collections
import functools
import json
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
import hierarchical  # noqa: E402
from numpyro import handlers  # noqa: E402
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from numpyro.primitives import Messenger  # noqa: E402

import jaxvb  # noqa: E402
import jaxvb.numpyro  # noqa: E402

NAME = "verdicts"
MODELS = (
    "eight_schools_noncentered",
    "eight_schools_centered",
    "crossed",
    "radon_intercepts",
    "gp_classification",
    "no_spread",
)
NUM_STEPS = 1000
#: The reference on each data set.
REFERENCE = dict(num_chains=4, num_warmup=500, num_samples=1000, target_accept=0.9)
FULL = dict(
    num_datasets=8, num_keys=3, num_draws=4000, worker_timeout_s=2400, models=MODELS
)
QUICK = dict(
    num_datasets=2,
    num_keys=2,
    num_draws=4000,
    worker_timeout_s=600,
    models=("eight_schools_noncentered",),
    reference=dict(REFERENCE, num_warmup=200, num_samples=400),
)
#: A reference is trusted where every reported marginal has at most this split R-hat
#: and at least this ESS, with no divergent transition.
REF_MAX_R_HAT, REF_MIN_ESS = 1.01, 400
#: The verdict classes of ``hierarchical.score``, and a fit with no result to score.
CLASSES = (
    "accurate",
    "accurate (flagged)",
    "flagged",
    "refused",
    "wrong",
    "silent narrow",
    "crash",
)


# --- the data sets ----------------------------------------------------------------------


class _Redrawn(Messenger):
    """Draws each observed site from its distribution instead of reading its ``obs``."""

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["is_observed"]:
            msg["value"], msg["is_observed"] = None, False


def hyperparameters(spec, data: dict, ref: dict) -> dict:
    """The model's scalar sample sites among the reference's reported sites, at the
    reference's posterior means: the values data sets are simulated at."""
    trace = handlers.trace(handlers.seed(spec.model, 0)).get_trace(**data)
    return {
        name: float(ref["sites"][name]["mean"][0])
        for name, site in trace.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and name in ref["sites"]
        and len(ref["sites"][name]["mean"]) == 1
    }


def simulate(spec, data: dict, truth: dict, key) -> dict:
    """``data`` with each observed site redrawn from the model at ``truth`` (the other
    latent sites drawn from their priors given it); covariates and sizes kept."""
    values = {k: jnp.asarray(v) for k, v in truth.items()}
    model = handlers.seed(handlers.substitute(_Redrawn(spec.model), data=values), key)
    trace = handlers.trace(model).get_trace(**data)
    out = dict(data)
    for name, site in trace.items():
        if site["type"] == "sample" and name in data and name not in truth:
            out[name] = jnp.asarray(site["value"], jnp.asarray(data[name]).dtype)
    return out


# --- one data set: the fits and the reference ---------------------------------------------


def _moments(draws: dict, sites) -> dict:
    m = hierarchical.marginals(draws, sites)
    return {
        s: dict(mean=common.rounded(v.mean(0)), sd=common.rounded(v.std(0)))
        for s, v in m.items()
    }


def _optional(value):
    """A float of ``value``, or ``None`` where the result does not carry it."""
    return None if value is None else float(np.asarray(value))


def _fit(spec, data: dict, key):
    """The recommended route's result (also from a ``FitError``) and its error."""
    try:
        res = jaxvb.numpyro.fit(spec.model, key, num_steps=NUM_STEPS, **spec.route, **data)
        return res, None
    except (jaxvb.FitError, ValueError) as err:  # the library's own refusals
        return getattr(err, "result", None), hierarchical._short_error(err)


def fit_record(spec, data: dict, key, num_draws: int) -> dict:
    """One fit: its status, k-hat (and spread), importance weights, and the marginals
    of its default draws and of ``q``'s own."""
    t0 = time.perf_counter()
    res, error = _fit(spec, data, key)
    out = dict(seconds=round(time.perf_counter() - t0, 3))
    if error:
        out["error"] = error
    if res is None:
        return out
    out.update(common.status_record(res, length=800))
    out["khat"] = float(res.khat)
    out["khat_sd"] = _optional(getattr(res, "khat_sd", None))
    out["r_squared"] = float(res.r_squared)
    k_imp, k_draws = jax.random.split(jax.random.fold_in(key, 7))
    imp = res.importance(k_imp, num_draws)
    out["importance"] = dict(
        khat=float(imp.khat),
        khat_sd=_optional(getattr(imp, "khat_sd", None)),
        ess=float(imp.ess),
        log_weight_variance=float(imp.log_weight_variance),
        num_proposals=imp.num_proposals,
    )
    out["sites"] = _moments(res.sample(k_draws, num_draws), spec.report)
    out["sites_q"] = _moments(res.sample(k_draws, num_draws, psis=False), spec.report)
    return out


def reference_runner(spec, settings: dict, sizes: dict):
    """``run(key, data) -> record``: NUTS on the reference's form, one ``MCMC`` for every
    data set (``jit_model_args``: new data of the same shapes reuse its compile; the
    model's integer ``sizes`` are bound, as a traced plate size is refused)."""
    model = functools.partial(hierarchical.reference_model(spec), **sizes)
    mcmc = MCMC(
        NUTS(model, target_accept_prob=settings["target_accept"]),
        num_warmup=settings["num_warmup"],
        num_samples=settings["num_samples"],
        num_chains=settings["num_chains"],
        chain_method="sequential",
        progress_bar=False,
        jit_model_args=True,
    )

    def run(key, data: dict) -> dict:
        t0 = time.perf_counter()
        arrays = {k: v for k, v in data.items() if k not in sizes}
        mcmc.run(key, **arrays, extra_fields=("diverging",))
        grouped = mcmc.get_samples(group_by_chain=True)
        sites, ess, r_hat = {}, [], []
        for s in spec.report:
            x = np.asarray(grouped[s], np.float64)
            x = x.reshape(x.shape[0], x.shape[1], -1)
            flat = x.reshape(-1, x.shape[-1])
            sites[s] = dict(
                mean=common.rounded(flat.mean(0)), sd=common.rounded(flat.std(0))
            )
            ess.append(np.atleast_1d(effective_sample_size(x)))
            r_hat.append(np.atleast_1d(split_gelman_rubin(x)))
        divergent = int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum())
        return dict(
            sites=sites,
            seconds=round(time.perf_counter() - t0, 2),
            divergences=divergent,
            max_r_hat=round(float(np.max(np.concatenate(r_hat))), 4),
            min_ess=round(float(np.min(np.concatenate(ess))), 1),
        )

    return run


def worker(spec_json: str) -> None:
    """One model: every data set in turn, each emitted as soon as it is done."""
    task = json.loads(spec_json)
    name, seed = task["name"], task["seed"]
    spec = hierarchical.MODELS[name]
    stored = json.loads(hierarchical.REFS.read_text())["models"][name]
    base = spec.data()
    truth = hyperparameters(spec, base, stored)
    common.emit(dict(truth=truth))
    sizes = {k: v for k, v in base.items() if isinstance(v, int)}
    reference = reference_runner(spec, task["reference"], sizes)
    for k in range(task["num_datasets"]):
        key = jax.random.fold_in(jax.random.key(seed), k)
        k_data, k_fit, k_nuts = jax.random.split(key, 3)
        data = base if k == 0 else simulate(spec, base, truth, k_data)
        row = dict(index=k, origin="benchmark" if k == 0 else "simulated", fits=[])
        for r in range(task["num_keys"]):
            k_r = k_fit if r == 0 else jax.random.fold_in(k_fit, r)
            try:
                row["fits"].append(fit_record(spec, data, k_r, task["num_draws"]))
            except Exception as err:  # recorded: a crash is a result too
                crash = hierarchical._short_error(err)
                row["fits"].append(
                    dict(crash=crash, traceback=traceback.format_exc()[-2000:])
                )
        row["reference"] = reference(k_nuts, data)
        common.emit(dict(row=row))


# --- scores and the summary -----------------------------------------------------------------


def flagged(fit: dict) -> bool:
    """The fit's verdict: a status other than 0, or an error (``hierarchical.score``'s)."""
    return fit.get("status", 0) != 0 or "error" in fit


def scored(row: dict, stored: dict | None) -> dict:
    """``row`` with each fit scored against the data set's reference (its default
    draws: ``score``; ``q``'s own: ``score_q``; its ``verdict``), whether the reference
    is trusted, and for the benchmark's data set the reference against the stored one.
    The data set's ``verdict`` is its first key's."""
    ref = row["reference"]
    for fit in row["fits"]:
        if "sites" in fit:
            fit["score"] = hierarchical.score(fit, ref)
            fit["score_q"] = hierarchical.score(dict(fit, sites=fit["sites_q"]), ref)
        fit["verdict"] = hierarchical.verdict(dict(fit=fit, score=fit.get("score")))
        # the scores keep each site's worst marginal; the marginals themselves go
        fit.pop("sites", None)
        fit.pop("sites_q", None)
    row["verdict"] = row["fits"][0]["verdict"]
    row["verdicts_over_keys"] = [f["verdict"] for f in row["fits"]]
    row["reference_trusted"] = bool(
        ref["max_r_hat"] <= REF_MAX_R_HAT
        and ref["min_ess"] >= REF_MIN_ESS
        and ref["divergences"] == 0
    )
    if row["origin"] == "benchmark" and stored is not None:
        vs = hierarchical.score(ref, stored)
        row["reference_vs_stored"] = dict(
            max_mean_error_sd=vs["max_mean_error_sd"], sd_ratio=vs["sd_ratio"]
        )
    return row


def _range(values) -> list | None:
    values = [v for v in values if v is not None and np.isfinite(v)]
    return [round(min(values), 3), round(max(values), 3)] if values else None


def _accurate(fit: dict) -> bool:
    return fit["verdict"].startswith("accurate")


def summary(rows: list[dict]) -> dict:
    """Per model: the verdicts' counts (of each data set's first key, and of every
    fit), the ranges of k-hat, its spread, the log weights' variance and the scores
    over the fits that returned (``errors``: the ``[data set, key]`` pairs that raised),
    and how the flag agrees with accuracy over every fit (the pairs where it does
    not)."""
    first = [r["fits"][0] for r in rows]
    every = [(r["index"], k, f) for r in rows for k, f in enumerate(r["fits"])]
    # the ranges are over the fits that returned: an error's q can be anything
    returned = [f for _, _, f in every if "error" not in f]
    scored_fits = [f for f in returned if "score" in f]
    imp = [f["importance"] for f in returned if "importance" in f]
    alarms = [[i, k] for i, k, f in every if "score" in f and _accurate(f) and flagged(f)]
    misses = [[i, k] for i, k, f in every if f["verdict"] in ("wrong", "silent narrow")]

    def counts(fits):
        c = collections.Counter(f["verdict"] for f in fits)
        return {v: c[v] for v in CLASSES if c[v]}

    return dict(
        num_datasets=len(rows),
        num_fits=len(every),
        verdicts=counts(first),
        verdicts_every_key=counts([f for _, _, f in every]),
        khat=_range(f.get("khat") for f in first),
        khat_every_key=_range(f.get("khat") for _, _, f in every),
        khat_sd=_range(f.get("khat_sd") for _, _, f in every),
        importance_khat=_range(i["khat"] for i in imp),
        log_weight_variance=_range(i["log_weight_variance"] for i in imp),
        ess=_range(i["ess"] for i in imp),
        sd_ratio_min=_range(f["score"]["sd_ratio"][0] for f in scored_fits),
        sd_ratio_max=_range(f["score"]["sd_ratio"][1] for f in scored_fits),
        max_mean_error_sd=_range(f["score"]["max_mean_error_sd"] for f in scored_fits),
        agreement=dict(
            agree=len(every) - len(alarms) - len(misses),
            of=len(every),
            accurate_but_flagged=alarms,
            inaccurate_without_flag=misses,
        ),
        flag_changes_with_key=[
            r["index"] for r in rows if len({flagged(f) for f in r["fits"]}) > 1
        ],
        accuracy_changes_with_key=[
            r["index"]
            for r in rows
            if len({_accurate(f) for f in r["fits"] if "score" in f}) > 1
        ],
        errors=[[i, k] for i, k, f in every if "error" in f],
        untrusted_references=[r["index"] for r in rows if not r["reference_trusted"]],
    )


# --- the figure ------------------------------------------------------------------------------


def plot(models: dict, path: Path) -> None:
    """Per model, each fit at its k-hat (the verdict's, ``res.khat``) against the range
    of its sd ratios (a vertical bar), coloured by verdict, filled where the fit is
    flagged; the first key's marker is the larger, and a grey line joins the fits of
    one data set over its keys."""
    names = [n for n, m in models.items() if m.get("datasets")]
    cols = min(3, len(names))
    nrows = -(-len(names) // cols)
    fig = common.figure(figsize=(4.2 * cols, 3.6 * nrows + 0.6))
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    lo_y, hi_y = 0.3, 3.0
    khats = [
        f["khat"]
        for n in names
        for r in models[n]["datasets"]
        for f in r["fits"]
        if "score" in f and np.isfinite(f["khat"])
    ]
    # one k-hat axis for every model, so that the threshold is where it is in each
    lo_x, hi_x = min([0.3, *khats]) - 0.05, max([1.0, *khats]) + 0.05
    for ax, name in zip(axes, names, strict=False):
        for r in models[name]["datasets"]:
            fits = [f for f in r["fits"] if "score" in f and np.isfinite(f["khat"])]
            points = [
                (
                    f["khat"],
                    float(np.clip(np.sqrt(np.prod(f["score"]["sd_ratio"])), lo_y, hi_y)),
                )
                for f in fits
            ]
            if len(points) > 1:
                ax.plot(*zip(*points, strict=True), color="0.7", lw=0.8, zorder=1)
            for k, (f, (x, mid)) in enumerate(zip(fits, points, strict=True)):
                colour = hierarchical.COLOURS[f["verdict"]]
                ax.plot(
                    [x, x], np.clip(f["score"]["sd_ratio"], lo_y, hi_y), color=colour, lw=2
                )
                face = colour if flagged(f) else "white"
                ax.plot(x, mid, "o", mfc=face, mec=colour, ms=7 if k == 0 else 4, mew=1.5)
        for y in (hierarchical.SD_LO, hierarchical.SD_HI):
            ax.axhline(y, color="grey", ls="--", lw=0.8)
        ax.axhline(hierarchical.SD_SILENT, color="tab:red", ls=":", lw=0.8)
        ax.axvline(0.7, color="grey", ls=":", lw=0.8)
        ax.set_xlim(lo_x, hi_x)
        ax.set_yscale("log")
        ax.minorticks_off()
        ax.set_ylim(lo_y * 0.95, hi_y * 1.05)
        ticks = [0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        s = models[name]["summary"]
        counts = ", ".join(f"{n} {c}" for c, n in s["verdicts_every_key"].items())
        ax.set_title(f"{name}: {s['num_datasets']} data sets\n{counts}", fontsize=9)
        ax.set_xlabel("k-hat (res.khat)")
        ax.set_ylabel("sd / NUTS sd, range over marginals")
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(
        "Each fit against its data set's NUTS (large: first key; filled: flagged)\n"
        "green: accurate, olive: accurate but flagged, orange: flagged, red: wrong",
        fontsize=10,
    )
    common.save(fig, path)


# --- main ------------------------------------------------------------------------------------


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="eight schools, 2 data sets, short NUTS"
    )
    parser.add_argument("--only", nargs="*", default=None, help="a subset of the models")
    parser.add_argument("--datasets", type=int, default=None, help="data sets per model")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    settings = dict(QUICK if args.quick else FULL)
    names = tuple(args.only or settings.pop("models"))
    settings.pop("models", None)
    settings.setdefault("reference", REFERENCE)
    if args.datasets:
        settings["num_datasets"] = args.datasets
    refs = json.loads(hierarchical.REFS.read_text())["models"]
    out = common.output_dir(args, NAME)
    report = dict(
        description=__doc__.split("\n\n")[0],
        settings=dict(
            settings,
            quick=args.quick,
            seed=args.seed,
            num_steps=NUM_STEPS,
            importance_draws=4000,
            tolerances=dict(
                mean_sd=hierarchical.MEAN_TOL,
                sd_ratio=[hierarchical.SD_LO, hierarchical.SD_HI],
                silent=hierarchical.SD_SILENT,
            ),
            reference_trusted=dict(max_r_hat=REF_MAX_R_HAT, min_ess=REF_MIN_ESS),
            dtype="float64",
        ),
        environment=common.environment(),
        models={},
    )
    report["models"] = common.stored_rows(out, NAME, args.only)
    t_all = time.perf_counter()
    for name in names:
        print(f"{name} ...", flush=True)
        spec = hierarchical.MODELS[name]
        task = dict(
            name=name,
            seed=args.seed,
            num_datasets=settings["num_datasets"],
            num_keys=settings["num_keys"],
            num_draws=settings["num_draws"],
            reference=settings["reference"],
        )
        t0 = time.perf_counter()
        payloads, error = common.run_worker(
            Path(__file__), task, settings["worker_timeout_s"]
        )
        truth = next((p["truth"] for p in payloads if "truth" in p), None)
        rows = [scored(p["row"], refs.get(name)) for p in payloads if "row" in p]
        model = dict(
            title=spec.title,
            route=dict(spec.route) or "dense (default)",
            hyperparameters=truth,
            datasets=rows,
            wall_s=round(time.perf_counter() - t0, 1),
        )
        if error:
            model["worker_error"] = error
        model["summary"] = summary(rows) if rows else None
        report["models"][name] = model
        for r in rows:
            for k, f in enumerate(r["fits"]):
                sc, imp = f.get("score", {}), f.get("importance", {})
                print(
                    f"  {r['index']}.{k} {f['verdict']:18s} status {f.get('status')} "
                    f"khat {f.get('khat', np.nan):.2f} importance khat "
                    f"{imp.get('khat', np.nan):.2f} lwv "
                    f"{imp.get('log_weight_variance', np.nan):.2f} sd ratio "
                    f"{sc.get('sd_ratio')} mean error {sc.get('max_mean_error_sd')}",
                    flush=True,
                )
        if error:
            print(f"  worker: {error[:300]}", flush=True)
        common.write_json(out, NAME, report, indent=1)
    report["settings"]["wall_s"] = round(time.perf_counter() - t_all, 1)
    return finish(report, out)


def finish(report: dict, out: Path) -> dict:
    """The targets over every model of ``report``, its JSON and its figure."""
    done = [m["summary"] for m in report["models"].values() if m.get("summary")]
    datasets = sum(s["num_datasets"] for s in done)
    fits = sum(s["num_fits"] for s in done)
    misses = sum(len(s["agreement"]["inaccurate_without_flag"]) for s in done)
    alarms = sum(len(s["agreement"]["accurate_but_flagged"]) for s in done)
    changes = sum(len(s["flag_changes_with_key"]) for s in done)
    report["targets"] = dict(
        no_inaccurate_fit_without_flag=dict(met=misses == 0, value=misses, of=fits),
        no_accurate_fit_flagged=dict(met=alarms == 0, value=alarms, of=fits),
        flag_same_over_keys=dict(met=changes == 0, value=changes, of=datasets),
    )
    common.write_json(out, NAME, report, indent=1)
    plot(report["models"], out / f"{NAME}.png")
    common.print_targets(report["targets"])
    return report


if __name__ == "__main__":
    main()
