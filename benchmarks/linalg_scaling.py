"""Linear scaling of ``jaxvb.linalg`` in the number of time steps T.

The stochastic volatility posterior's precision (sec. 6.1): an AR(1) prior on T
log-volatilities (tridiagonal, phi = 0.98, sigma^2 = 0.02), Gaussian sites on the
diagonal and one dense border for ``log beta``. For T = 10^3 ... 10^6, the best of
``--repeats`` calls after compile of ``banded`` (Cholesky + selected inverse of the
T x T band) and ``arrowhead`` (the same of the whole), and the log-log slope of time
against T, which should be ~1 (also over T >= 10^4, where a call's fixed cost no
longer dominates).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

from jaxvb import linalg as la  # noqa: E402

NAME = "linalg_scaling"
SIZES = (10**3, 10**4, 10**5, 10**6)
QUICK_SIZES = (10**3, 10**4)


def sv_precision(t, phi=0.98, sigma2=0.02, seed=0):
    """AR(1) prior + likelihood Hessian sites, ``x = (v, log beta)``."""
    rng = np.random.default_rng(seed)
    h = rng.uniform(0.5, 1.5, t)
    band = np.zeros((2, t))
    band[0] = (1.0 + phi**2) / sigma2 + h / 2
    band[0, [0, -1]] = 1.0 / sigma2 + h[[0, -1]] / 2
    band[1, : t - 1] = -phi / sigma2
    return la.Arrowhead(band, h[:, None], np.array([[2.0 * h.sum()]]))


def banded(band):
    return la.selected_inverse_banded(la.cholesky_banded(band))


def arrowhead(p):
    return la.selected_inverse_arrowhead(la.cholesky_arrowhead(p))


def time_one(fn, arg, t, repeats) -> dict:
    arg = jax.device_put(arg)
    compiled, compile_s = common.lower_and_compile(fn, arg)
    res = jax.block_until_ready(compiled(arg))  # the first call may allocate
    runs = [common.timed(compiled, arg)[1] for _ in range(repeats)]
    band = res if isinstance(res, jax.Array) else res.band
    return dict(
        T=t,
        compile_s=compile_s,
        run_s_min=min(runs),
        run_s_median=float(np.median(runs)),
        ns_per_step=1e9 * min(runs) / t,
        finite=bool(np.all(np.isfinite(np.asarray(band)))),
    )


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="T <= 10^4 only")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    out = common.output_dir(args, NAME)

    rows = {"banded": [], "arrowhead": []}
    for t in QUICK_SIZES if args.quick else SIZES:
        p = sv_precision(t)
        rows["banded"].append(time_one(banded, p.band, t, args.repeats))
        rows["arrowhead"].append(time_one(arrowhead, p, t, args.repeats))
    slopes = {}
    for name, rs in rows.items():
        ts, secs = [r["T"] for r in rs], [r["run_s_min"] for r in rs]
        slopes[name] = dict(slope_all=common.loglog_slope(ts, secs))
        big = [(t, s) for t, s in zip(ts, secs, strict=True) if t >= 10**4]
        if len(big) >= 2:
            slopes[name]["slope_T_ge_1e4"] = common.loglog_slope(*zip(*big, strict=True))
    report = dict(
        description=(
            "Wall time after compilation of Cholesky + selected inverse for the SV-shaped "
            "precision (tridiagonal AR(1) + sites, w = 1; arrowhead adds k = 1 border)."
        ),
        dtype="float64",
        bandwidth=1,
        border=1,
        repeats=args.repeats,
        timings=rows,
        loglog_slope=slopes,
        environment=common.environment(),
    )
    common.write_json(out, NAME, report, indent=2)
    return report


if __name__ == "__main__":
    main()
