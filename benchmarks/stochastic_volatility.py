"""Stochastic volatility (Salimans & Knowles 2013, section 6.1): speed and accuracy.

On the shipped 945-point GBP/USD series (``jaxvb.data.sv_gbpusd()``):

1. **Speed.** ``jaxvb.models.stochastic_volatility.fit`` with the paper's settings (250
   steps, one ``(phi, s2)`` draw per step, ``f`` Rao-Blackwellised). Compile time is
   measured apart (first call); the time after compile is the median of repeated calls
   with new keys, each ending in ``block_until_ready``. Also the same with only 2
   diagnostic draws, to separate the fit from the 1000-draw diagnostics.
2. **Accuracy.** Posterior mean and sd of ``phi``, ``s2``, ``beta`` from the fit
   (100000 draws of ``q``) against a NumPyro NUTS run (non-centred volatilities, flat
   ``log beta``; 4 chains x 2000 draws after 1000 warm-up, run sequentially), whose wall
   time (compile included, as a user sees it) is reported too. Both ``indirect_effects``
   settings (eq. svapprox and eq. sv2) are fitted.

Output: ``benchmarks/results/stochastic_volatility.json`` (``--out DIR`` to change;
``--quick``: a short NUTS run into a temporary directory).

Usage::

    python benchmarks/stochastic_volatility.py
    python benchmarks/stochastic_volatility.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import jaxvb  # noqa: E402
from jaxvb.models import stochastic_volatility as sv  # noqa: E402

PARAMS = ("phi", "s2", "beta")


def _summary(draws):
    return {
        k: {"mean": float(np.mean(draws[k])), "sd": float(np.std(draws[k]))} for k in PARAMS
    }


def _time_fit(y, repeats, **kw):
    t0 = time.perf_counter()
    jax.block_until_ready(sv.fit(y, jax.random.key(0), **kw))
    compile_s = time.perf_counter() - t0
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        res = jax.block_until_ready(sv.fit(y, jax.random.key(i + 1), **kw))
        times.append(time.perf_counter() - t0)
    return compile_s, statistics.median(times), res


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--nuts", default="1000,2000,4", help="warmup,samples,chains")
    parser.add_argument("--skip-sv2", action="store_true", help="fit eq. svapprox only")
    args = parser.parse_args(argv)
    out = args.out or (
        tempfile.mkdtemp()
        if args.quick
        else os.path.join(os.path.dirname(__file__), "results")
    )
    y = jaxvb.data.sv_gbpusd()
    report = {"T": int(y.shape[0]), "num_steps": 250, "dtype": "float64"}

    fits = {}
    for indirect in (False,) if args.skip_sv2 else (False, True):
        name = "sv2" if indirect else "svapprox"
        compile_s, run_s, res = _time_fit(y, 5, indirect_effects=indirect)
        _, run_nodiag_s, _ = _time_fit(y, 5, indirect_effects=indirect, num_eval_draws=2)
        draws = res.sample(jax.random.key(123), 100_000)
        fits[name] = draws
        report[name] = {
            "compile_s": compile_s,
            "run_s": run_s,
            "run_without_diagnostics_s": run_nodiag_s,
            "elbo": float(res.elbo),
            "r_squared": float(res.r_squared),
            "kl": float(res.kl),
            "status": int(res.status),
            "posterior": _summary(draws),
        }
        print(name, json.dumps(report[name], indent=1), flush=True)

    nuts_kw = (
        {"num_warmup": 200, "num_samples": 200, "num_chains": 1}
        if args.quick
        else dict(
            zip(
                ("num_warmup", "num_samples", "num_chains"),
                map(int, args.nuts.split(",")),
                strict=True,
            )
        )
    )
    t0 = time.perf_counter()
    ref = sv.nuts_reference(y, jax.random.key(7), **nuts_kw)
    nuts_s = time.perf_counter() - t0
    report["nuts"] = {**nuts_kw, "wall_s": nuts_s, "posterior": _summary(ref)}
    for name in fits:
        r = report[name]
        r["speedup_vs_nuts"] = nuts_s / r["run_s"]
        r["mean_error_in_nuts_sd"] = {
            k: (r["posterior"][k]["mean"] - report["nuts"]["posterior"][k]["mean"])
            / report["nuts"]["posterior"][k]["sd"]
            for k in PARAMS
        }
        r["sd_ratio_to_nuts"] = {
            k: r["posterior"][k]["sd"] / report["nuts"]["posterior"][k]["sd"]
            for k in PARAMS
        }
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "stochastic_volatility.json")
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2)
    print(json.dumps(report, indent=2))
    print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    main()
