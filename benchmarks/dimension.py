"""Dimension: what a step of the dense Gaussian costs against the model's own derivatives.

A hierarchical logistic regression with ``G`` groups and ``n`` binary observations per
group, written as a user would (one Bernoulli term per observation, the group effect
picked by index)::

    mu ~ N(0, 2.5^2),  log tau ~ N(0, 1),  z_g ~ N(0, 1),  b_g = mu + tau z_g,
    y_gi ~ Bernoulli(sigmoid(b_g)),        x = (mu, log tau, z_1, ..., z_G),  d = G + 2,

non-centred (the centred form has no joint mode, so no Laplace start), data simulated
with a fixed key (``mu = -0.5``, ``tau = 1``). For each ``G``, in a fresh
subprocess (so that its peak memory is its own):

1. **Model.** ``N`` value/gradient/Hessian evaluations of the log joint (forward over
   reverse, as ``method="hessian"`` computes them) at ``N`` draws of the start, in one
   jitted ``lax.scan`` that sums them: first call (compile included) and the median of
   repeated calls after compile, with ``block_until_ready``.
2. **Fit.** ``jaxvb.fit(log_joint, q0, key, num_steps=N, method="hessian",
   num_eval_draws=2)`` from the Laplace approximation ``q0 = jaxvb.laplace(log_joint,
   0)``: the iterations with the fewest diagnostic draws (2, which also skips the
   end-of-fit convergence check). First call and median after compile, new key each
   call. Where the settings say so, also with the default ``num_eval_draws=1000``
   (diagnostics in chunks, and the convergence check's 200 Hessian evaluations).
3. **Pieces.** One Cholesky of the ``d x d`` precision, what the old dense Gaussian did
   on top of it every step (``cho_solve`` against the identity to form ``cov``), and one
   triangular solve with a vector (a draw).
4. **Memory.** The subprocess's peak resident memory (``VmHWM``: compile included)
   after the model's timing and after the fits.

The issue's target (14): at ``d = 102`` and ``1002`` a fit of ``N`` steps costs at most
3x ``N`` value/gradient/Hessian evaluations, same process. ``d = 5002`` is measured with
fewer steps and 2 observations per group (the dense Hessian of the per-observation
model holds ``d x n G`` intermediates: with 10 per group, ~14 GB); the JSON's notes say
what it costs and what to use instead.

Outputs (in ``benchmarks/results/`` unless ``--out``; ``--quick`` writes to a temporary
directory): ``dimension.json`` and ``dimension.png`` (time per step against ``d``).

Usage::

    python benchmarks/dimension.py            # full run (~10 minutes on 2 CPUs)
    python benchmarks/dimension.py --quick    # smoke test (G = 10, 30; 100 steps)
    python benchmarks/dimension.py --groups 100,1000   # chosen sizes only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
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

#: Per number of groups G: observations per group, steps N and timed repeats.
FULL = dict(
    groups=(100, 1000, 5000),
    obs_per_group={100: 10, 1000: 10, 5000: 2},
    num_steps={100: 200, 1000: 200, 5000: 10},
    repeats={100: 5, 1000: 3, 5000: 1},
    default_diagnostics=(100,),
)
QUICK = dict(
    groups=(10, 30),
    obs_per_group={10: 10, 30: 10},
    num_steps={10: 100, 30: 100},
    repeats={10: 2, 30: 2},
    default_diagnostics=(),
)
TARGET_RATIO = 3.0
TARGET_DIMS = (102, 1002)
TRUTH = dict(mu=-0.5, tau=1.0)


# --- the model --------------------------------------------------------------------------


def simulate(key: jax.Array, num_groups: int, obs_per_group: int) -> dict:
    """Binary responses ``y`` and their group index, ``obs_per_group`` per group."""
    k_b, k_y = jax.random.split(key)
    b = TRUTH["mu"] + TRUTH["tau"] * jax.random.normal(k_b, (num_groups,))
    group = jnp.repeat(jnp.arange(num_groups), obs_per_group)
    y = jax.random.bernoulli(k_y, jax.nn.sigmoid(b[group])).astype(jnp.float64)
    return dict(y=y, group=group)


def make_log_joint(data: dict, num_groups: int):
    """``log p(x, y)`` for ``x = (mu, log tau, z_1..z_G)``, ``b = mu + tau z``."""
    y, group = data["y"], data["group"]
    del num_groups

    def log_joint(x):
        mu, log_tau, z = x[0], x[1], x[2:]
        eta = mu + jnp.exp(log_tau) * z[group]
        log_lik = jnp.sum(y * eta - jax.nn.softplus(eta))
        log_prior = -0.5 * (jnp.sum(z**2) + (mu / 2.5) ** 2 + log_tau**2)
        return log_lik + log_prior

    return log_joint


def value_grad_hessian(log_joint):
    """``x -> (log p, grad, hess)``: forward over reverse, as the hessian method does."""

    def value_and_grad(x):
        value, grad = jax.value_and_grad(log_joint)(x)
        return grad, (value, grad)

    def fn(x):
        hess, (value, grad) = jax.jacfwd(value_and_grad, has_aux=True)(x)
        return value, grad, hess

    return fn


def model_scan(log_joint):
    """Jitted: the sum of value, gradient and Hessian over the rows of ``xs``."""
    vgh = value_grad_hessian(log_joint)

    @jax.jit
    def run(xs):
        def body(total, x):
            v, g, h = vgh(x)
            return (total[0] + v, total[1] + g, total[2] + h), None

        d = xs.shape[1]
        zeros = (
            jnp.zeros((), xs.dtype),
            jnp.zeros(d, xs.dtype),
            jnp.zeros((d, d), xs.dtype),
        )
        return jax.lax.scan(body, zeros, xs)[0]

    return run


# --- one size, in its own process -----------------------------------------------------


def _peak_rss_mb() -> float:
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across fork + exec (see
    # stochastic_volatility.py); ru_maxrss (kB on Linux) is the fallback elsewhere.
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _first_call(fn, *args) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, out


def _linalg(precision: jax.Array, repeats: int) -> dict:
    """Seconds of one Cholesky, of the old per-step ``cov``, and of one draw's solve."""
    eye = jnp.eye(precision.shape[0], dtype=precision.dtype)
    chol = jax.jit(jnp.linalg.cholesky)
    cov = jax.jit(lambda c: jax.scipy.linalg.cho_solve((c, True), eye))
    draw = jax.jit(lambda c, z: jax.scipy.linalg.solve_triangular(c, z, lower=True))
    factor = chol(precision)
    z = jnp.ones(precision.shape[0], precision.dtype)
    out = {}
    for name, fn, args in (
        ("cholesky", chol, (precision,)),
        ("cov_by_identity_solve", cov, (factor,)),
        ("triangular_solve_vector", draw, (factor, z)),
    ):
        jax.block_until_ready(fn(*args))
        out[name] = time_calls(fn, lambda i, a=args: a, max(repeats, 5))
    return out


def worker(spec: dict) -> dict:
    """Simulate, start at the Laplace approximation, time the model and the fits."""
    G, n, N, repeats = spec["G"], spec["obs_per_group"], spec["num_steps"], spec["repeats"]
    d = G + 2
    row = dict(G=G, d=d, obs_per_group=n, num_observations=G * n, num_steps=N)
    data = simulate(jax.random.key(spec["seed"]), G, n)
    log_joint = make_log_joint(data, G)

    laplace_s, q0 = _first_call(lambda x: jaxvb.laplace(log_joint, x), jnp.zeros(d))
    row["laplace_first_call_s"] = laplace_s
    xs = q0.sample(jax.random.key(1), (N,))

    run = model_scan(log_joint)
    first, _ = _first_call(run, xs)
    timing = time_calls(run, lambda i: (xs,), repeats)
    row["model"] = dict(
        first_call_s=first, run=timing, ms_per_eval=1e3 * timing["median_s"] / N
    )
    row["peak_rss_after_model_mb"] = _peak_rss_mb()

    row["fit"] = {}
    variants = {"iterations": 2}
    if spec["default_diagnostics"]:
        variants["default_diagnostics"] = 1000
    for name, num_eval_draws in variants.items():

        def fit(key, num_eval_draws=num_eval_draws):
            return jaxvb.fit(
                log_joint,
                q0,
                key,
                num_steps=N,
                method="hessian",
                num_eval_draws=num_eval_draws,
                on_failure="ignore",
            )

        first, res = _first_call(fit, jax.random.key(0))
        timing = time_calls(fit, lambda i: (jax.random.key(i + 1),), repeats)
        row["fit"][name] = dict(
            num_eval_draws=num_eval_draws,
            first_call_s=first,
            run=timing,
            ms_per_step=1e3 * timing["median_s"] / N,
            over_model=timing["median_s"] / row["model"]["run"]["median_s"],
            status=int(res.status),
            num_damped_steps=int(res.num_damped_steps),
            peak_rss_mb=_peak_rss_mb(),
        )
        print(
            f"  G={G:>5d} fit ({name}): first {first:.1f} s, "
            f"{row['fit'][name]['ms_per_step']:.3f} ms/step, "
            f"{row['fit'][name]['over_model']:.2f}x the model",
            file=sys.stderr,
            flush=True,
        )
    row["linalg"] = _linalg(q0.precision, repeats)
    row["peak_rss_mb"] = _peak_rss_mb()
    return row


def _memory_needed_mb(spec: dict) -> float:
    """A rough upper bound on a size's peak memory, from the runs here: ~12 dense
    ``d x d`` arrays (statistics, sums, factor, Hessians, copies across the step
    control) and ~8 of ``jax.hessian``'s ``d x (observations)`` intermediates."""
    d, n_obs = spec["G"] + 2, spec["G"] * spec["obs_per_group"]
    return (12 * d * d + 8 * d * n_obs) * 8 / 2**20 + 500


def _memory_available_mb() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run_size(spec: dict, timeout_s: float, env: dict) -> dict:
    # On a shared machine, a size that would not fit is reported, not run into the
    # out-of-memory killer (which may pick another process).
    need, free = _memory_needed_mb(spec), _memory_available_mb()
    if free is not None and need > 0.8 * free:
        return dict(
            G=spec["G"],
            d=spec["G"] + 2,
            error=f"skipped: needs ~{need:.0f} MB, {free:.0f} MB available",
        )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env
        )
    except subprocess.TimeoutExpired:
        return dict(
            G=spec["G"], d=spec["G"] + 2, error=f"timed out after {timeout_s:.0f} s"
        )
    sys.stderr.write(proc.stderr[-3000:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("DIMENSION ")]
    if proc.returncode or not lines:
        err = f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}"
        return dict(G=spec["G"], d=spec["G"] + 2, error=err)
    return json.loads(lines[-1][len("DIMENSION ") :])


# --- report -----------------------------------------------------------------------------


def targets(rows: list[dict]) -> dict:
    out = {}
    for r in rows:
        if r["d"] in TARGET_DIMS and "error" not in r:
            ratio = r["fit"]["iterations"]["over_model"]
            out[f"fit_over_model_d{r['d']}"] = dict(
                target=f"a fit of N steps (method='hessian', num_eval_draws=2) <= "
                f"{TARGET_RATIO:g}x N value/gradient/Hessian evaluations, after compile",
                value=ratio,
                met=bool(ratio <= TARGET_RATIO),
            )
    return out


def notes(rows: list[dict]) -> list[str]:
    """What the numbers say, written from them, and what to use beyond the dense family."""
    out = [
        "Per step, method='hessian' on a dense Gaussian does one value/gradient/Hessian "
        "evaluation of the log joint (jax.hessian: d forward passes over the model's "
        "gradient), one Cholesky of the d x d precision (d^3/3 flops) and O(d^2) "
        "triangular solves (the mean, the next draw); the covariance is never formed "
        "in the loop. Before issue 14 each step also formed cov by cho_solve against "
        "the identity and factored it again for the draw and for is_proper (see "
        "'linalg' per size: cov_by_identity_solve is what that cost on top).",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"G = {r['G']} (d = {r['d']}): {r['error']}")
            continue
        it = r["fit"]["iterations"]
        out.append(
            f"d = {r['d']} ({r['num_observations']} observations): fit "
            f"{it['ms_per_step']:.3g} ms/step = {it['over_model']:.2f}x the model's "
            f"{r['model']['ms_per_eval']:.3g} ms per value/gradient/Hessian; one "
            f"Cholesky {1e3 * r['linalg']['cholesky']['median_s']:.3g} ms; Laplace start "
            f"(first call) {r['laplace_first_call_s']:.1f} s; peak memory "
            f"{r['peak_rss_mb']:.0f} MB."
        )
    out += [
        "Where the dense family stops being the right tool: its memory is a few d x d "
        "matrices (8 d^2 bytes each: 8 MB at d = 1000, 200 MB at d = 5000) plus what "
        "jax.hessian of the log joint holds (for this per-observation model, d x "
        "(number of observations) intermediates: the reason d = 5002 is run with 2 "
        "observations per group), and its time per step grows as d^3 (Cholesky) plus d "
        "gradient passes over the model. Up to d ~ 1000 a step costs about one dense "
        "Hessian of the model; by d ~ 5000 a step takes seconds and a fit of a few "
        "hundred steps many minutes, for a posterior whose precision is mostly zeros.",
        "What to use instead: (1) for this model, whose posterior precision is an "
        "arrowhead (the group effects are independent given mu and tau), a structured "
        "approximation q(mu, tau) q(b | mu, tau) with a diagonal-plus-border Gaussian "
        "block (jaxvb.composite.hierarchical, as in jaxvb.models.eight_schools and the "
        "stochastic volatility model; jaxvb.linalg.arrowhead does its algebra in O(d)); "
        "(2) for GLM-like models, x of moderate size M seen through N linear predictors "
        "f_i = v_i'x, jaxvb.Factors with method='sites': per step N scalar second "
        "derivatives and O(N M^2 + M^3) algebra instead of jax.hessian's M passes "
        "over the model (still an M x M Gaussian, so for M in the thousands the same "
        "d^3 applies); (3) if only the Hessian is expensive and it has known structure, "
        "jaxvb.methods.hessian(grad_and_hessian=...) takes an analytic or "
        "Hessian-vector-product version.",
    ]
    return out


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    d = np.array([r["d"] for r in ok])
    fig, (ax, ax_mem) = plt.subplots(1, 2, figsize=(10, 4))
    series = {
        "fit, per step (method='hessian')": [
            r["fit"]["iterations"]["ms_per_step"] for r in ok
        ],
        "model: value + gradient + Hessian": [r["model"]["ms_per_eval"] for r in ok],
        "one Cholesky of the precision": [
            1e3 * r["linalg"]["cholesky"]["median_s"] for r in ok
        ],
        "old per-step cov (cho_solve with I)": [
            1e3 * r["linalg"]["cov_by_identity_solve"]["median_s"] for r in ok
        ],
    }
    for (label, ms), marker in zip(series.items(), "osv^", strict=True):
        ax.loglog(d, ms, marker=marker, label=label)
    for r in ok:
        it = r["fit"]["iterations"]
        ax.annotate(
            f"{it['over_model']:.1f}x",
            (r["d"], it["ms_per_step"]),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=8,
        )
    ax.set_xlabel("dimension d")
    ax.set_ylabel("ms (after compile)")
    ax.set_title("time per step vs d (fit / model ratio annotated)")
    ax.legend(fontsize=7)
    ax_mem.loglog(d, [r["peak_rss_mb"] for r in ok], marker="o")
    ax_mem.set_xlabel("dimension d")
    ax_mem.set_ylabel("peak resident memory, MB")
    ax_mem.set_title("peak memory of the process (compile included)")
    fig.suptitle("Hierarchical logistic regression, dense Gaussian, Algorithm 2")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test, temp output")
    parser.add_argument("--out", default=None, help="output directory")
    parser.add_argument("--groups", default=None, help="comma-separated G to run")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per size")
    parser.add_argument(
        "--single-thread",
        action="store_true",
        help="run XLA:CPU on one thread in the size subprocesses: on a machine shared "
        "with other jobs, multi-threaded timings vary 10x from call to call",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker is not None:
        row = worker(json.loads(args.worker))
        print("DIMENSION " + json.dumps(row), flush=True)
        return row

    settings = QUICK if args.quick else FULL
    groups = settings["groups"]
    if args.groups:
        groups = tuple(int(g) for g in args.groups.split(","))
    out = Path(
        args.out
        or (tempfile.mkdtemp(prefix="dimension_") if args.quick else HERE / "results")
    )
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    worker_env = dict(os.environ)
    if args.single_thread:
        worker_env["XLA_FLAGS"] = (
            worker_env.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        ).strip()
    rows = []
    for G in groups:
        spec = dict(
            G=G,
            seed=0,
            obs_per_group=settings["obs_per_group"].get(G, 10),
            num_steps=settings["num_steps"].get(G, 200),
            repeats=settings["repeats"].get(G, 3),
            default_diagnostics=G in settings["default_diagnostics"],
        )
        rows.append(run_size(spec, args.timeout, worker_env))
        r = rows[-1]
        if "error" in r:
            print(f"G = {G}: {r['error']}", flush=True)
        else:
            print(
                f"G = {G:>5d} (d = {r['d']}): model {r['model']['ms_per_eval']:.3f} ms/eval, "
                f"fit {r['fit']['iterations']['ms_per_step']:.3f} ms/step "
                f"({r['fit']['iterations']['over_model']:.2f}x), "
                f"peak {r['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    report = dict(
        quick=bool(args.quick),
        environment=env,
        load_average_end=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        settings=dict(
            settings,
            groups=list(groups),
            dtype="float64",
            truth=TRUTH,
            model="hierarchical logistic regression, d = G + 2",
            single_thread=bool(args.single_thread),
            worker_xla_flags=worker_env.get("XLA_FLAGS", ""),
        ),
        rows=rows,
        targets=targets(rows),
        notes=notes(rows),
    )
    report["settings"] = json.loads(json.dumps(report["settings"], default=str))
    path = out / "dimension.json"
    path.write_text(json.dumps(report, indent=1))
    if any("error" not in r for r in rows):  # after the JSON: a plot error loses nothing
        plot(out / "dimension.png", rows)
    for name, t in report["targets"].items():
        print(f"{name:24s} {'met' if t['met'] else 'NOT met':8s} {t['value']:.2f}")
    print(f"wrote {path}", flush=True)
    return report


if __name__ == "__main__":
    main()
