"""First-fit latency: ``jaxvb.fit`` from a start point against NumPyro NUTS, compile included.

On posteriordb posteriors (:mod:`jaxvb.models.posteriors`: ARMA(1, 1), a Poisson GLM,
the capture-recapture model M0, the non-centred eight schools), in one process:
``jaxvb.fit(log_joint, 0, key, num_steps=1000)`` with every default (Laplace start,
Algorithm 2, the convergence check, the diagnostics) and one NUTS chain of 1000 warm-up
+ 1000 draws from the same point, each one's first call (its compile seconds by
program) and a call after compile, and each one's means and sds against a long NUTS
run (4 x 5000 draws). The target: the first fit returns 3x sooner than NUTS's first run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402
from jaxvb.models import posteriors  # noqa: E402

NAME = "first_fit"
FULL = dict(
    models=("arma11", "glm_poisson", "m0", "eight_schools_noncentered"),
    num_steps=1000,
    nuts=dict(num_warmup=1000, num_samples=1000),
    reference=dict(num_warmup=1000, num_samples=5000, num_chains=4),
    repeats=5,
)
QUICK = dict(
    models=("m0",),
    num_steps=200,
    nuts=dict(num_warmup=200, num_samples=200),
    reference=None,
    repeats=2,
)
TARGET_SPEEDUP = 3.0


def model(name):
    """``(log_joint, x0)``: the posterior and the unconstrained origin (a new log
    joint each call: jaxvb and NUTS compile their own)."""
    factory, dim, _ = posteriors.POSTERIORS[name]
    return factory(), jnp.zeros(dim)


def moments(draws) -> dict:
    draws = np.asarray(draws)
    return dict(mean=draws.mean(0).tolist(), sd=draws.std(0).tolist())


def first_and_after(call, repeats):
    """``call(0)``'s output, and its seconds (compile included, by program) and the
    median of ``call(1) .. call(repeats)``'s."""
    load = common.load_average()
    with common.compile_log() as log:
        out, first = common.timed(call, 0)
    run = common.time_calls(call, lambda i: (i + 1,), repeats)["median_s"]
    timing = dict(first_call_s=round(first, 3), run_s=round(run, 4))
    return out, dict(timing, **common.compile_summary(log), load_average_1min=load)


def run_jaxvb(name, settings, seed) -> dict:
    log_joint, x0 = model(name)

    def fit(i):
        key = jax.random.key(seed + i)
        return jaxvb.fit(log_joint, x0, key, num_steps=settings["num_steps"])

    res, timing = first_and_after(fit, settings["repeats"])
    return dict(
        timing,
        mean=np.asarray(res.q.mean).tolist(),
        sd=np.sqrt(np.diagonal(np.asarray(res.q.cov))).tolist(),
        r_squared=float(res.r_squared),
        status=int(res.status),
    )


def run_nuts(name, settings, seed) -> dict:
    log_joint, x0 = model(name)
    run = common.nuts(log_joint, **settings["nuts"])
    # a second run of the same sampler: NumPyro reuses what it compiled
    draws, timing = first_and_after(
        lambda i: run(jax.random.key(seed + i), x0).get_samples(), 1
    )
    return dict(timing, **moments(draws))


def accuracy(got: dict, ref: dict) -> dict:
    """Largest standardised errors of the mean and of the sd, against ``ref``."""
    m, s = np.asarray(got["mean"]), np.asarray(got["sd"])
    rm, rs = np.asarray(ref["mean"]), np.asarray(ref["sd"])
    return dict(
        max_mean_error_sd=float(np.max(np.abs(m - rm) / rs)),
        max_sd_rel_error=float(np.max(np.abs(s / rs - 1.0))),
    )


def run_model(name, settings, seed, jaxvb_first: bool) -> dict:
    """jaxvb and NUTS on one posterior, in the order given, and each one's accuracy
    against the reference (``--quick``: the timed NUTS run)."""
    order = ("jaxvb", "nuts") if jaxvb_first else ("nuts", "jaxvb")
    row = {"order": list(order)}
    for which in order:
        row[which] = (run_jaxvb if which == "jaxvb" else run_nuts)(name, settings, seed)
    if (ref := settings["reference"]) is not None:
        log_joint, x0 = model(name)
        init = jnp.broadcast_to(x0, (ref["num_chains"], *x0.shape))
        mcmc = common.nuts(log_joint, **ref)(jax.random.key(seed + 1000), init)
        row["reference"] = dict(**moments(mcmc.get_samples()), **ref)
    else:
        row["reference"] = dict(row["nuts"], note="the timed NUTS run (--quick)")
    for which in ("jaxvb", "nuts"):
        row[which]["accuracy"] = accuracy(row[which], row["reference"])
    speedup = row["nuts"]["first_call_s"] / row["jaxvb"]["first_call_s"]
    row["speedup_first_call"] = round(speedup, 2)
    return row


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="M0 only, short runs")
    parser.add_argument("--models", nargs="*", default=None, help="a subset of models")
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    if args.models:
        settings["models"] = tuple(args.models)
    out = common.output_dir(args, NAME)

    t_start = time.perf_counter()
    environment = common.environment()
    # Alternate which goes first: the first pays for the small programs both share.
    models = {
        name: run_model(name, settings, args.seed, jaxvb_first=i % 2 == 0)
        for i, name in enumerate(settings["models"])
    }
    speedups = [row["speedup_first_call"] for row in models.values()]
    report = dict(
        description=__doc__.split("\n\n")[0],
        settings=dict(
            settings,
            quick=args.quick,
            seed=args.seed,
            start="x0 = 0 (the unconstrained origin) for both",
            dtype="float64",
        ),
        environment=environment,
        models=models,
        targets=dict(
            speedup_first_call=TARGET_SPEEDUP,
            models_meeting=sum(s >= TARGET_SPEEDUP for s in speedups),
            min_speedup=min(speedups),
        ),
        wall_s=round(time.perf_counter() - t_start, 1),
    )
    common.write_json(out, NAME, report, indent=2)
    return report


if __name__ == "__main__":
    main()
