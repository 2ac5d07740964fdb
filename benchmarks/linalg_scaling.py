"""Linear scaling of ``jaxvb.linalg`` in the number of time steps T.

The matrix is the stochastic-volatility posterior precision of the paper (sec. 6.1): a
stationary AR(1) prior on T log-volatilities (tridiagonal, ``w = 1``, phi = 0.98,
sigma^2 = 0.02), Gaussian sites on the diagonal and one dense border column for
``log beta`` (``k = 1``). For T = 10^3 ... 10^6 it times, after compilation,

* ``banded``: ``cholesky_banded`` + ``selected_inverse_banded`` of the T x T block,
* ``arrowhead``: ``cholesky_arrowhead`` + ``selected_inverse_arrowhead`` of the whole,

each one jitted function, ``block_until_ready``, the best of ``--repeats`` runs (the
machine is shared; the minimum is the least disturbed). Compile time is recorded apart.
The log-log slope of time against T (least squares) should be ~1; it is also fitted
over T >= 10^4 only, where fixed per-call overhead no longer dominates.

**Bandwidths** (``bandwidths`` in the JSON): for wider bands ``jaxvb.linalg`` factors
by blocks of ``max(w, 8)`` rows (``w >= 4``) rather than row by row. For ``T = 400``
and ``10^4`` and ``w = 2 ... 40`` (a random SPD band), the value and the gradient of
``log|A| + y'A^{-1}y + sum(diag A^{-1})`` (factor, solve, selected inverse and their
reverse pass, what a latent Gaussian model's step differentiates) by either path,
after compile, and each path's compile time.

Output: ``linalg_scaling.json`` in ``benchmarks/results/`` (or ``--out``; ``--quick``
runs T <= 10^4 into a temporary directory).

Usage::

    python benchmarks/linalg_scaling.py            # ~1 minute on 2 CPUs
    python benchmarks/linalg_scaling.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

try:
    from jaxvb import linalg as la
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from jaxvb import linalg as la

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import git_state as _git_state  # noqa: E402

SIZES = (10**3, 10**4, 10**5, 10**6)
QUICK_SIZES = (10**3, 10**4)


def sv_precision(t, phi=0.98, sigma2=0.02, seed=0):
    """AR(1) prior + likelihood Hessian sites, ``x = (v, log beta)``; see the tests."""
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


def time_it(fn, arg, repeats):
    arg = jax.device_put(arg)
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(arg).compile()
    compile_s = time.perf_counter() - t0
    out = jax.block_until_ready(compiled(arg))  # warm-up
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(arg))
        runs.append(time.perf_counter() - t0)
    return out, compile_s, runs


BAND_SIZES = (400, 10**4)
BAND_WIDTHS = (2, 4, 8, 16, 40)


def random_band(t, w, dtype, seed=0):
    """A diagonally dominant SPD matrix of bandwidth ``w`` in lower band form."""
    rng = np.random.default_rng(seed)
    ab = np.concatenate([np.full((1, t), w + 2.0), rng.uniform(-0.5, 0.5, (w, t))])
    ab[np.arange(t)[None, :] >= t - np.arange(w + 1)[:, None]] = 0.0
    return ab.astype(dtype)


def band_objective(ab, y):
    chol = la.cholesky_banded(ab)
    return (
        la.logdet_banded(chol)
        + y @ la.solve_banded(chol, y)
        + jnp.sum(la.selected_inverse_banded(chol)[0])
    )


def time_bandwidths(sizes, widths, repeats, dtype):
    """Rows against blocks (the switch ``banded._BLOCK_MIN_W`` set for each trace)."""
    from jaxvb.linalg import banded as banded_module

    default = banded_module._BLOCK_MIN_W
    rows = []
    for t in sizes:
        y = np.random.default_rng(1).normal(size=t).astype(dtype)
        for w in widths:
            ab = random_band(t, w, dtype)
            row = dict(T=t, w=w)
            values = {}
            for path, min_w in (("rows", 10**9), ("blocks", 0)):
                banded_module._BLOCK_MIN_W = min_w
                try:
                    grad = jax.value_and_grad(band_objective)
                    out, compile_s, runs = time_it(
                        lambda a, g=grad, y=y: g(a, y), ab, repeats
                    )
                finally:
                    banded_module._BLOCK_MIN_W = default
                values[path] = out
                row[path] = dict(compile_s=compile_s, run_s_min=min(runs))
            row["default"] = "blocks" if w >= default else "rows"
            row["rows_over_blocks"] = row["rows"]["run_s_min"] / row["blocks"]["run_s_min"]
            row["max_rel_diff"] = float(
                np.max(np.abs(values["rows"][1] - values["blocks"][1]))
                / np.max(np.abs(values["rows"][1]))
            )
            rows.append(row)
            print(
                f"bands     T={t:>6d} w={w:>3d}  rows {row['rows']['run_s_min'] * 1e3:8.3f} ms"
                f" (compile {row['rows']['compile_s']:.2f} s)  blocks "
                f"{row['blocks']['run_s_min'] * 1e3:8.3f} ms (compile "
                f"{row['blocks']['compile_s']:.2f} s)  default {row['default']}",
                flush=True,
            )
    return rows


def slope(sizes, seconds):
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="T <= 10^4 only")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--float32", action="store_true", help="single precision")
    args = parser.parse_args(argv)

    jax.config.update("jax_enable_x64", not args.float32)
    dtype = np.float32 if args.float32 else np.float64
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.out is not None:
        out = args.out
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="linalg_scaling_"))
    else:
        out = Path(__file__).resolve().parent / "results"
    out.mkdir(parents=True, exist_ok=True)

    rows = {"banded": [], "arrowhead": []}
    for t in sizes:
        p = la.Arrowhead(*(x.astype(dtype) for x in sv_precision(t)))
        for name, fn, arg in (("banded", banded, p.band), ("arrowhead", arrowhead, p)):
            res, compile_s, runs = time_it(fn, arg, args.repeats)
            band = res if name == "banded" else res.band
            ok = bool(np.all(np.isfinite(np.asarray(band))))
            rows[name].append(
                dict(
                    T=t,
                    compile_s=compile_s,
                    run_s_min=min(runs),
                    run_s_median=float(np.median(runs)),
                    ns_per_step=1e9 * min(runs) / t,
                    finite=ok,
                )
            )
            print(
                f"{name:9s} T={t:>8d}  compile {compile_s:6.3f} s  "
                f"run {min(runs) * 1e3:9.3f} ms (min of {args.repeats})  "
                f"{1e9 * min(runs) / t:6.1f} ns/step",
                flush=True,
            )

    band_sizes = BAND_SIZES[:1] if args.quick else BAND_SIZES
    band_widths = (4, 16) if args.quick else BAND_WIDTHS
    bandwidths = time_bandwidths(band_sizes, band_widths, args.repeats, dtype)

    fits = {}
    for name, rs in rows.items():
        ts = [r["T"] for r in rs]
        secs = [r["run_s_min"] for r in rs]
        fits[name] = dict(slope_all=slope(ts, secs))
        big = [(t, s) for t, s in zip(ts, secs, strict=True) if t >= 10**4]
        if len(big) >= 2:
            fits[name]["slope_T_ge_1e4"] = slope(*zip(*big, strict=True))
        print(f"{name}: log-log slope {fits[name]}")

    result = dict(
        description=(
            "Wall time after compilation of Cholesky + selected inverse for the SV-shaped "
            "precision (tridiagonal AR(1) + sites, w = 1; arrowhead adds k = 1 border)."
        ),
        dtype=np.dtype(dtype).name,
        bandwidth=1,
        border=1,
        repeats=args.repeats,
        timings=rows,
        loglog_slope=fits,
        bandwidths=dict(
            description=(
                "value and gradient of log|A| + y'A^{-1}y + sum(diag A^{-1}) for a random "
                "SPD band, by rows and by blocks of max(w, 8) rows, after compile (min of "
                "repeats); default: the path jaxvb.linalg takes"
            ),
            rows=bandwidths,
        ),
        environment=dict(
            jax=jax.__version__,
            backend=jax.default_backend(),
            devices=[str(d) for d in jax.devices()],
            cpu_count=os.cpu_count(),
            xla_flags=os.environ.get("XLA_FLAGS", ""),
            python=platform.python_version(),
            platform=platform.platform(),
            git=_git_state(),
        ),
    )
    path = out / "linalg_scaling.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
