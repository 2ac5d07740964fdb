"""Dimension: what a step of the dense Gaussian costs against the model's own derivatives.

A non-centred hierarchical logistic regression with ``G`` groups of ``n`` simulated
binary observations, written as a user would (one Bernoulli term per observation)::

    mu ~ N(0, 2.5^2),  log tau ~ N(0, 1),  z_g ~ N(0, 1),  b_g = mu + tau z_g,
    y_gi ~ Bernoulli(sigmoid(b_g)),        x = (mu, log tau, z_1, ..., z_G),  d = G + 2.

For each ``G``, in a fresh process (its peak memory its own): ``N`` value/gradient/
Hessian evaluations of the log joint (``_common.hessian_scan``) against
``jaxvb.fit(..., num_steps=N, method="hessian", num_eval_draws=2)`` from the Laplace
start (the iterations alone), both after compile; one Cholesky of the ``d x d``
precision; the peak resident memory. The target: at ``d = 102`` and ``1002`` a fit of
``N`` steps costs at most 3x the ``N`` evaluations. ``d = 5002`` runs fewer steps and 2
observations per group (the dense Hessian of this per-observation model holds
``d x n G`` intermediates). The size processes inherit ``XLA_FLAGS`` (one XLA:CPU
thread gives steadier timings on a shared machine).
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
)
QUICK = dict(
    groups=(10, 30),
    obs_per_group={10: 10, 30: 10},
    num_steps={10: 100, 30: 100},
    repeats={10: 1, 30: 1},
)
#: A size that ``--groups`` names and the settings do not.
DEFAULT = dict(obs_per_group=10, num_steps=200, repeats=3)
TARGET_RATIO = 3.0
TARGET_DIMS = (102, 1002)
TRUTH = dict(mu=-0.5, tau=1.0)


def make_log_joint(key: jax.Array, num_groups: int, obs_per_group: int):
    """``log p(x, y)`` for ``x = (mu, log tau, z_1..z_G)``, ``b = mu + tau z``, and
    ``y`` simulated from :data:`TRUTH` with ``key``."""
    k_b, k_y = jax.random.split(key)
    b = TRUTH["mu"] + TRUTH["tau"] * jax.random.normal(k_b, (num_groups,))
    group = jnp.repeat(jnp.arange(num_groups), obs_per_group)
    y = jax.random.bernoulli(k_y, jax.nn.sigmoid(b[group])).astype(jnp.float64)

    def log_joint(x):
        mu, log_tau, z = x[0], x[1], x[2:]
        eta = mu + jnp.exp(log_tau) * z[group]
        log_lik = jnp.sum(y * eta - jax.nn.softplus(eta))
        return log_lik - 0.5 * (jnp.sum(z**2) + (mu / 2.5) ** 2 + log_tau**2)

    return log_joint


def worker(spec: dict) -> dict:
    """One size: simulate, start at the Laplace approximation, time model and fit
    (``benchmarks/gpu.py`` runs it on an accelerator)."""
    G, n, N, repeats = spec["G"], spec["obs_per_group"], spec["num_steps"], spec["repeats"]
    d = G + 2
    row = dict(G=G, d=d, obs_per_group=n, num_observations=G * n, num_steps=N)
    log_joint = make_log_joint(jax.random.key(spec["seed"]), G, n)

    q0, row["laplace_first_call_s"] = common.timed(jaxvb.laplace, log_joint, jnp.zeros(d))
    xs = q0.sample(jax.random.key(1), (N,))
    run = common.hessian_scan(log_joint)
    _, timing = common.first_and_after(lambda i: run(xs), repeats)
    row["model"] = dict(timing, ms_per_eval=1e3 * timing["run"]["median_s"] / N)

    options = dict(num_steps=N, method="hessian", num_eval_draws=2, on_failure="ignore")
    res, timing = common.first_and_after(
        lambda i: jaxvb.fit(log_joint, q0, jax.random.key(i), **options), repeats
    )
    iterations = dict(
        num_eval_draws=options["num_eval_draws"],
        **timing,
        ms_per_step=1e3 * timing["run"]["median_s"] / N,
        over_model=timing["run"]["median_s"] / row["model"]["run"]["median_s"],
        status=int(res.status),
        num_damped_steps=int(res.num_damped_steps),
        peak_rss_mb=common.peak_rss_mb(),
    )
    row["fit"] = dict(iterations=iterations)
    # the step's own linear algebra: one Cholesky of the precision
    chol, precision = jax.jit(jnp.linalg.cholesky), q0.precision
    jax.block_until_ready(chol(precision))
    cholesky = common.time_calls(chol, lambda i: (precision,), max(repeats, 5))
    row["linalg"] = dict(cholesky=cholesky)
    row["peak_rss_mb"] = common.peak_rss_mb()
    return row


def run_size(spec: dict, timeout_s: float) -> dict:
    """:func:`worker` in a fresh process; a size that would not fit in memory (~12
    ``d x d`` arrays and ~8 of ``jax.hessian``'s ``d x nG`` intermediates) is
    reported, not run into the out-of-memory killer (which may pick another process)."""
    d, n_obs = spec["G"] + 2, spec["G"] * spec["obs_per_group"]
    need = (12 * d * d + 8 * d * n_obs) * 8 / 2**20 + 500
    free = common.memory_available_mb()
    if free is not None and need > 0.8 * free:
        error = f"skipped: needs ~{need:.0f} MB, {free:.0f} MB available"
        return dict(G=spec["G"], d=d, error=error)
    rows, error = common.run_worker(__file__, spec, timeout_s)
    return rows[-1] if rows else dict(G=spec["G"], d=d, error=error)


def targets(rows: list[dict]) -> dict:
    target = (
        f"a fit of N steps (method='hessian', num_eval_draws=2) <= {TARGET_RATIO:g}x "
        "N value/gradient/Hessian evaluations, after compile"
    )
    ratios = {
        r["d"]: r["fit"]["iterations"]["over_model"]
        for r in rows
        if r["d"] in TARGET_DIMS and "error" not in r
    }
    return {
        f"fit_over_model_d{d}": dict(target=target, value=v, met=bool(v <= TARGET_RATIO))
        for d, v in ratios.items()
    }


SERIES = (
    "fit, per step (method='hessian')",
    "model: value + gradient + Hessian",
    "one Cholesky of the precision",
)


def plot(rows: list[dict], path=None):
    """Time per step (:data:`SERIES`) and peak memory against ``d``."""
    ok = [r for r in rows if "error" not in r]
    d = [r["d"] for r in ok]
    ms = np.array(
        [
            [
                r["fit"]["iterations"]["ms_per_step"],
                r["model"]["ms_per_eval"],
                1e3 * r["linalg"]["cholesky"]["median_s"],
            ]
            for r in ok
        ]
    )
    fig = common.figure(figsize=(10, 4))
    ax, ax_mem = fig.subplots(1, 2)
    for label, marker, column in zip(SERIES, "osv", ms.T, strict=True):
        ax.loglog(d, column, marker=marker, label=label)
    for r, y in zip(ok, ms[:, 0], strict=True):
        ratio = f"{r['fit']['iterations']['over_model']:.1f}x"
        ax.annotate(
            ratio, (r["d"], y), textcoords="offset points", xytext=(4, 6), fontsize=8
        )
    ax.set(xlabel="dimension d", ylabel="ms (after compile)")
    ax.set_title("time per step vs d (fit / model ratio annotated)")
    ax.legend(fontsize=7)
    ax_mem.loglog(d, [r["peak_rss_mb"] for r in ok], marker="o")
    ax_mem.set(xlabel="dimension d", ylabel="peak resident memory, MB")
    ax_mem.set_title("peak memory of the process (compile included)")
    fig.suptitle("Hierarchical logistic regression, dense Gaussian, Algorithm 2")
    return common.save(fig, path)


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="G = 10, 30; 100 steps")
    parser.add_argument("--groups", default=None, help="comma-separated G to run")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per size")
    args = parser.parse_args(argv)
    if args.worker is not None:
        return common.emit(worker(json.loads(args.worker)))

    settings = QUICK if args.quick else FULL
    groups = settings["groups"]
    if args.groups:
        groups = tuple(int(g) for g in args.groups.split(","))
    out = common.output_dir(args, NAME)
    env = common.environment()
    rows = []
    for G in groups:
        spec = {k: settings[k].get(G, v) for k, v in DEFAULT.items()}
        rows.append(run_size(dict(spec, G=G, seed=0), args.timeout))
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
            worker_xla_flags=os.environ.get("XLA_FLAGS", ""),
        ),
        rows=rows,
        targets=targets(rows),
    )
    common.write_json(out, NAME, report)
    if any("error" not in r for r in rows):  # after the JSON: a plot error loses nothing
        plot(rows, out / f"{NAME}.png")
    return report


if __name__ == "__main__":
    main()
