"""Dimension: what a step of the dense Gaussian costs against the model's own derivatives.

A hierarchical logistic regression with ``G`` groups and ``n`` binary observations per
group, written as a user would (one Bernoulli term per observation, the group effect
picked by index)::

    mu ~ N(0, 2.5^2),  log tau ~ N(0, 1),  z_g ~ N(0, 1),  b_g = mu + tau z_g,
    y_gi ~ Bernoulli(sigmoid(b_g)),        x = (mu, log tau, z_1, ..., z_G),  d = G + 2,

non-centred (the centred form has no joint mode, so no Laplace start), data simulated
with a fixed key. For each ``G``, in a fresh process (its peak memory its own):

1. **Model.** ``N`` value/gradient/Hessian evaluations of the log joint at ``N`` draws
   of the start (``_common.hessian_scan``): first call and median after compile.
2. **Fit.** ``jaxvb.fit(log_joint, q0, key, num_steps=N, method="hessian",
   num_eval_draws=2)`` from ``q0 = jaxvb.laplace(log_joint, 0)``: the iterations alone
   (2 diagnostic draws also skip the convergence check); where the settings say so,
   also with the default diagnostics. First call and median after compile.
3. **Pieces.** One Cholesky of the ``d x d`` precision, ``cho_solve`` against the
   identity (forming ``cov``) and one triangular solve with a vector (a draw).
4. **Memory.** The process's peak resident memory after the model and after the fits.

The target: at ``d = 102`` and ``1002`` a fit of ``N`` steps costs at most 3x ``N``
value/gradient/Hessian evaluations. ``d = 5002`` runs fewer steps and 2 observations per
group (the dense Hessian of this per-observation model holds ``d x n G`` intermediates).

Outputs: ``dimension.json`` and ``dimension.png`` (time per step and memory against d).

Usage::

    python benchmarks/dimension.py            # full run
    python benchmarks/dimension.py --quick    # smoke test (G = 10, 30; 100 steps)
    python benchmarks/dimension.py --groups 100,1000   # chosen sizes only
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402

NAME = "dimension"
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
NOTES = [
    "Per step, method='hessian' on a dense Gaussian does one value/gradient/Hessian "
    "evaluation of the log joint (d forward passes over its gradient), one Cholesky of "
    "the d x d precision and O(d^2) triangular solves; the covariance is not formed in "
    "the loop ('linalg': cov_by_identity_solve is what forming it would add).",
    "Beyond the dense family: a posterior whose precision is mostly zeros (here an "
    "arrowhead: the group effects are independent given mu and tau) fits in O(d) with "
    "a structured approximation (jaxvb.composite.hierarchical, jaxvb.LatentGaussian); "
    "GLM-like models with jaxvb.Factors and method='sites'.",
]


def simulate(key: jax.Array, num_groups: int, obs_per_group: int) -> dict:
    """Binary responses ``y`` and their group index, ``obs_per_group`` per group."""
    k_b, k_y = jax.random.split(key)
    b = TRUTH["mu"] + TRUTH["tau"] * jax.random.normal(k_b, (num_groups,))
    group = jnp.repeat(jnp.arange(num_groups), obs_per_group)
    y = jax.random.bernoulli(k_y, jax.nn.sigmoid(b[group])).astype(jnp.float64)
    return dict(y=y, group=group)


def make_log_joint(data: dict):
    """``log p(x, y)`` for ``x = (mu, log tau, z_1..z_G)``, ``b = mu + tau z``."""
    y, group = data["y"], data["group"]

    def log_joint(x):
        mu, log_tau, z = x[0], x[1], x[2:]
        eta = mu + jnp.exp(log_tau) * z[group]
        log_lik = jnp.sum(y * eta - jax.nn.softplus(eta))
        return log_lik - 0.5 * (jnp.sum(z**2) + (mu / 2.5) ** 2 + log_tau**2)

    return log_joint


def linalg_pieces(precision: jax.Array, repeats: int) -> dict:
    """Seconds of one Cholesky, of forming ``cov`` from it, and of one draw's solve."""
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
        out[name] = common.time_calls(fn, lambda i, a=args: a, max(repeats, 5))
    return out


def worker(spec: dict) -> dict:
    """One size: simulate, start at the Laplace approximation, time model and fits."""
    G, n, N, repeats = spec["G"], spec["obs_per_group"], spec["num_steps"], spec["repeats"]
    d = G + 2
    row = dict(G=G, d=d, obs_per_group=n, num_observations=G * n, num_steps=N)
    log_joint = make_log_joint(simulate(jax.random.key(spec["seed"]), G, n))

    q0, row["laplace_first_call_s"] = common.timed(jaxvb.laplace, log_joint, jnp.zeros(d))
    xs = q0.sample(jax.random.key(1), (N,))
    run = common.hessian_scan(log_joint)
    _, timing = common.first_and_after(lambda i: run(xs), repeats)
    row["model"] = dict(timing, ms_per_eval=1e3 * timing["run"]["median_s"] / N)
    row["peak_rss_after_model_mb"] = common.peak_rss_mb()

    row["fit"] = {}
    variants = {"iterations": 2}
    if spec["default_diagnostics"]:
        variants["default_diagnostics"] = 1000
    for name, num_eval_draws in variants.items():

        def fit(i, num_eval_draws=num_eval_draws):
            return jaxvb.fit(
                log_joint,
                q0,
                jax.random.key(i),
                num_steps=N,
                method="hessian",
                num_eval_draws=num_eval_draws,
                on_failure="ignore",
            )

        res, timing = common.first_and_after(fit, repeats)
        row["fit"][name] = dict(
            num_eval_draws=num_eval_draws,
            **timing,
            ms_per_step=1e3 * timing["run"]["median_s"] / N,
            over_model=timing["run"]["median_s"] / row["model"]["run"]["median_s"],
            status=int(res.status),
            num_damped_steps=int(res.num_damped_steps),
            peak_rss_mb=common.peak_rss_mb(),
        )
    row["linalg"] = linalg_pieces(q0.precision, repeats)
    row["peak_rss_mb"] = common.peak_rss_mb()
    return row


def memory_needed_mb(spec: dict) -> float:
    """A rough upper bound of a size's peak memory: ~12 dense ``d x d`` arrays and ~8 of
    ``jax.hessian``'s ``d x (observations)`` intermediates."""
    d, n_obs = spec["G"] + 2, spec["G"] * spec["obs_per_group"]
    return (12 * d * d + 8 * d * n_obs) * 8 / 2**20 + 500


def run_size(spec: dict, timeout_s: float, env: dict) -> dict:
    """:func:`worker` in a fresh process; a size that would not fit in memory is
    reported, not run into the out-of-memory killer (which may pick another process)."""
    need, free = memory_needed_mb(spec), common.memory_available_mb()
    if free is not None and need > 0.8 * free:
        error = f"skipped: needs ~{need:.0f} MB, {free:.0f} MB available"
        return dict(G=spec["G"], d=spec["G"] + 2, error=error)
    rows, error = common.run_worker(__file__, spec, timeout_s, env)
    return rows[-1] if rows else dict(G=spec["G"], d=spec["G"] + 2, error=error)


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


def plot(rows: list[dict], path=None):
    """Time per step and peak memory against ``d``."""
    ok = [r for r in rows if "error" not in r]
    d = np.array([r["d"] for r in ok])
    fig = common.figure(figsize=(10, 4))
    ax, ax_mem = fig.subplots(1, 2)
    series = {
        "fit, per step (method='hessian')": [
            r["fit"]["iterations"]["ms_per_step"] for r in ok
        ],
        "model: value + gradient + Hessian": [r["model"]["ms_per_eval"] for r in ok],
        "one Cholesky of the precision": [
            1e3 * r["linalg"]["cholesky"]["median_s"] for r in ok
        ],
        "forming cov (cho_solve with I)": [
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
    return common.save(fig, path)


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="G = 10, 30; 100 steps")
    parser.add_argument("--groups", default=None, help="comma-separated G to run")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per size")
    parser.add_argument(
        "--single-thread",
        action="store_true",
        help="XLA:CPU on one thread in the size processes (steadier timings on a "
        "machine shared with other jobs)",
    )
    args = parser.parse_args(argv)
    if args.worker is not None:
        return common.emit(worker(json.loads(args.worker)))

    settings = QUICK if args.quick else FULL
    groups = settings["groups"]
    if args.groups:
        groups = tuple(int(g) for g in args.groups.split(","))
    out = common.output_dir(args, NAME)
    env = common.environment()
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
        r = run_size(spec, args.timeout, worker_env)
        rows.append(r)
        if "error" in r:
            print(f"G = {G}: {r['error']}", flush=True)
        else:
            it = r["fit"]["iterations"]
            print(
                f"d = {r['d']:>5d}: model {r['model']['ms_per_eval']:.3f} ms/eval, fit "
                f"{it['ms_per_step']:.3f} ms/step ({it['over_model']:.2f}x), peak "
                f"{r['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    report = dict(
        quick=bool(args.quick),
        environment=env,
        load_average_end=common.load_average(),
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
        notes=NOTES,
    )
    common.write_json(out, NAME, report)
    if any("error" not in r for r in rows):  # after the JSON: a plot error loses nothing
        plot(rows, out / f"{NAME}.png")
    return report


if __name__ == "__main__":
    main()
