"""Algorithm 2 from a new user's start and from the Laplace start, on five real posteriors.

What ``jaxvb.fit(..., method="hessian")`` does on

- ``longley``: Gaussian regression with flat priors on the raw NIST Longley design
  (:mod:`jaxvb.models.flat_regression`; posterior covariance condition number ~2e19);
- ``garch``: GARCH(1,1) on the paper's GBP/USD returns (:mod:`jaxvb.models.garch`);
- ``eight_schools_noncentered`` and ``eight_schools_centered``: the hierarchical model
  with a half-Cauchy scale (the centred one is the funnel, which has no mode);
- ``latent_gp``: a Poisson GP for the coal-mining disasters, 112 latent log rates,

started from ``Gaussian(0, I)`` and from the point ``x0 = 0`` (the Laplace approximation
there), with fit's step control (``max_backtracks=8``) and without it (the paper's plain
iteration), for several numbers of steps and keys. Each run is

- ``accurate``: no error flag, and mean and standard deviations within the model's
  tolerance of the reference;
- ``flagged``: an error flag (``Result.ok`` False: among them the fit's own convergence
  check, ``NOT_CONVERGED``), or a ``ValueError`` from the Laplace start that names the
  cause;
- ``silent_wrong``: no error flag but not accurate; ``silent_nan``: no error flag and a
  NaN in ``q``.

References (``--refs`` writes ``tests/data/robustness_nuts.json``): Longley's is the
KL-optimal Gaussian, which NIST's certified values give exactly; the others NUTS (4
chains of 2000 draws after 1000 warm-up, in the non-centred coordinates for the eight
schools and the whitened ones for the GP, mapped back), with the Monte Carlo errors of
their means and sds. A model's tolerance is ``gap + 4 * noise`` (largest over
coordinates; in reference sds for means, relative for sds): ``gap`` is how far the
KL-optimal Gaussian (a long fit from x0) is from the reference, ``noise`` the spread of
fits from x0 over other keys combined with the reference's Monte Carlo error.

Output: ``robustness.json``.

Usage::

    python benchmarks/robustness.py --refs   # NUTS references too
    python benchmarks/robustness.py          # the table, with the stored references
    python benchmarks/robustness.py --quick  # smoke test, writes to a temp dir
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402
from jaxvb.models import eight_schools, flat_regression, garch, latent_gp  # noqa: E402

NAME = "robustness"
REFS = common.ROOT / "tests" / "data" / "robustness_nuts.json"
FULL = dict(num_steps=(200, 1000), num_keys=8, gap_steps=4000, gap_draws=4)
QUICK = dict(num_steps=(200,), num_keys=1, gap_steps=400, gap_draws=1)
NUTS_SETTINGS = dict(num_warmup=1000, num_samples=2000, num_chains=4)
OUTCOMES = ("accurate", "flagged", "silent_wrong", "silent_nan", "unrated")


def models():
    """name -> (log_joint, dimension); built once so that compiled programs are reused."""
    return {
        "longley": (flat_regression.longley_log_joint(), 8),
        "garch": (garch.gbpusd_log_joint(), 4),
        "eight_schools_noncentered": (eight_schools.log_joint_noncentered, 10),
        "eight_schools_centered": (eight_schools.log_joint_centered, 10),
        "latent_gp": (latent_gp.coal_mining_log_joint(), 112),
    }


# --- the references ---------------------------------------------------------------------


def nuts_draws(log_joint, init, key) -> np.ndarray:
    """NUTS from ``init`` (one row per chain): draws ``(chains, draws, d)``."""
    mcmc = common.nuts(log_joint, **NUTS_SETTINGS)(key, init)
    return np.asarray(mcmc.get_samples(group_by_chain=True))


def moments(draws) -> dict:
    """Mean, sd and their Monte Carlo errors of draws grouped by chain."""
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    flat = draws.reshape(-1, draws.shape[-1])
    mean, sd = flat.mean(0), flat.std(0, ddof=1)
    ess = np.asarray(effective_sample_size(draws))
    # A normal marginal's sd has standard error sd / sqrt(2 ESS); heavier tails make it
    # a little larger, which the tests' 4 standard errors absorb.
    return dict(
        mean=mean.tolist(),
        sd=sd.tolist(),
        mcse_mean=(sd / np.sqrt(ess)).tolist(),
        mcse_sd=(sd / np.sqrt(2.0 * ess)).tolist(),
        ess_min=float(ess.min()),
        rhat_max=float(np.max(split_gelman_rubin(draws))),
        num_draws=int(flat.shape[0]),
        settings=NUTS_SETTINGS,
    )


def nuts_references(seed) -> dict:
    """NUTS moments of garch, both eight schools and the GP, in the fit's coordinates."""
    keys = iter(jax.random.split(jax.random.key(seed), 6))
    chains = NUTS_SETTINGS["num_chains"]

    def overdispersed(log_joint, d):
        q = jaxvb.laplace(log_joint, jnp.zeros(d))
        z = jax.random.normal(next(keys), (chains, d))
        return q.mean + 2.0 * z @ jnp.linalg.cholesky(q.cov).T

    out = {}
    lj = garch.gbpusd_log_joint()
    out["garch"] = moments(nuts_draws(lj, overdispersed(lj, 4), next(keys)))
    lj = eight_schools.log_joint_noncentered
    draws = nuts_draws(lj, overdispersed(lj, 10), next(keys))
    out["eight_schools_noncentered"] = moments(draws)
    out["eight_schools_centered"] = moments(np.asarray(eight_schools.to_centered(draws)))
    # The GP in v = L^{-1} (f - m), the same posterior (log|L| is a constant).
    _, chol, mean = latent_gp.coal_mining()
    lj = latent_gp.coal_mining_log_joint()
    q = jaxvb.laplace(lj, jnp.full(112, mean))
    v_mode = jnp.asarray(latent_gp.whiten(q.mean, chol, mean))
    draws = nuts_draws(
        lambda v: lj(mean + jnp.asarray(chol) @ v),
        v_mode + 0.5 * jax.random.normal(next(keys), (chains, 112)),
        next(keys),
    )
    out["latent_gp"] = moments(np.asarray(latent_gp.unwhiten(draws, chol, mean)))
    for name, m in out.items():
        print(f"  {name}: min ESS {m['ess_min']:.0f}, max R-hat {m['rhat_max']:.3f}")
    return out


def reference(name, refs):
    """Mean, sd and the reference's Monte Carlo errors (zero for Longley)."""
    if name == "longley":
        r = flat_regression.longley_reference()
        zero = np.zeros_like(r.mean)
        return dict(mean=r.mean, sd=r.sd, mcse_mean=zero, mcse_sd=zero, source="NIST")
    fields = ("mean", "sd", "mcse_mean", "mcse_sd")
    return dict({k: np.asarray(refs[name][k]) for k in fields}, source="NUTS")


# --- the runs --------------------------------------------------------------------------------


def one_run(log_joint, d, start, num_steps, max_backtracks, key):
    q0 = jaxvb.Gaussian(jnp.zeros(d), jnp.eye(d)) if start == "gaussian01" else jnp.zeros(d)
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = jaxvb.fit(
                log_joint,
                q0,
                key,
                num_steps=num_steps,
                max_backtracks=max_backtracks,
                on_failure="ignore",
            )
        jax.block_until_ready(res.q)
    except ValueError as e:  # the Laplace start refused, with its reason
        return dict(error=str(e).split(".")[0], seconds=time.perf_counter() - t), None
    return dict(seconds=time.perf_counter() - t), res


def classify(res, ref, tol):
    if res is None:
        return "flagged", {}
    mean, cov = np.asarray(res.q.mean), np.asarray(res.q.cov)
    nan = bool(np.isnan(mean).any() or np.isnan(cov).any())
    err_mean = np.abs(mean - ref["mean"]) / ref["sd"]
    err_sd = np.abs(np.sqrt(np.abs(np.diagonal(cov))) / ref["sd"] - 1.0)
    info = dict(
        status=int(res.status),
        message=res.message if int(res.status) else "ok",
        nan=nan,
        max_err_mean_sd=None if nan else float(np.nanmax(err_mean)),
        max_err_sd_rel=None if nan else float(np.nanmax(err_sd)),
        r_squared=float(res.r_squared),
        num_damped_steps=int(res.num_damped_steps),
        fixed_point_shift=float(res.fixed_point_shift),
    )
    if not bool(res.ok):
        return "flagged", info
    if nan:
        return "silent_nan", info
    accurate = np.all(err_mean <= tol["mean"]) and np.all(err_sd <= tol["sd"])
    return ("accurate" if accurate else "silent_wrong"), info


def optimal_gaussian_gap(log_joint, d, ref, seed, settings):
    """The optimal Gaussian (a long fit from x0) against the reference, in its sds."""
    if ref["source"] == "NIST":  # the reference is the optimal Gaussian itself
        return dict(mean=np.zeros(d), sd=np.zeros(d), status=None)
    long = jaxvb.fit(
        log_joint,
        jnp.zeros(d),
        jax.random.key(seed + 7),
        num_steps=settings["gap_steps"],
        num_draws=settings["gap_draws"],
        on_failure="ignore",
    )
    sd_long = np.sqrt(np.diagonal(np.asarray(long.q.cov)))
    return dict(
        mean=np.abs(np.asarray(long.q.mean) - ref["mean"]) / ref["sd"],
        sd=np.abs(sd_long / ref["sd"] - 1.0),
        status=int(long.status),
    )


def tolerances(log_joint, d, ref, gap, num_steps, seed, settings):
    """``gap + 4 * noise`` (the largest over coordinates): ``noise`` is the spread of
    fits from x0 with ``num_steps`` steps over other keys, combined with the reference's
    Monte Carlo error."""
    runs = [
        jaxvb.fit(
            log_joint, jnp.zeros(d), jax.random.key(seed + 100 + i), num_steps=num_steps
        )
        for i in range(max(settings["num_keys"], 2))
    ]
    means = np.stack([np.asarray(r.q.mean) for r in runs])
    sds = np.stack([np.sqrt(np.diagonal(np.asarray(r.q.cov))) for r in runs])
    noise_mean = np.hypot(means.std(0, ddof=1), ref["mcse_mean"]) / ref["sd"]
    noise_sd = np.hypot(sds.std(0, ddof=1), ref["mcse_sd"]) / ref["sd"]
    return dict(
        mean=float(gap["mean"].max() + 4.0 * noise_mean.max()),
        sd=float(gap["sd"].max() + 4.0 * noise_sd.max()),
        gap_mean_max=float(gap["mean"].max()),
        gap_sd_max=float(gap["sd"].max()),
        noise_mean_max=float(noise_mean.max()),
        noise_sd_max=float(noise_sd.max()),
        gap_fit_status=gap["status"],
    )


def run_table(refs, seed, settings):
    table, tols = [], {}
    for name, (log_joint, d) in models().items():
        ref = reference(name, refs)
        # The centred eight schools has no mode, so no Laplace start and no long fit
        # from x0 to size a tolerance: its runs are "unrated".
        rated = name != "eight_schools_centered"
        if rated:
            gap = optimal_gaussian_gap(log_joint, d, ref, seed, settings)
            tols[name] = {}
        for n in settings["num_steps"]:
            tol = dict(mean=np.inf, sd=np.inf)
            if rated:
                tol = tols[name][str(n)] = tolerances(
                    log_joint, d, ref, gap, n, seed, settings
                )
            for start in ("gaussian01", "x0"):
                for mb in (8, 0):
                    rows = []
                    for i in range(settings["num_keys"]):
                        key = jax.random.key(seed + 1000 * i)
                        run, res = one_run(log_joint, d, start, n, mb, key)
                        outcome, info = classify(res, ref, tol)
                        if outcome == "accurate" and not rated:
                            outcome = "unrated"
                        rows.append(dict(run, **info, outcome=outcome))
                    counts = {k: sum(r["outcome"] == k for r in rows) for k in OUTCOMES}
                    table.append(
                        dict(
                            model=name,
                            start=start,
                            max_backtracks=mb,
                            num_steps=n,
                            counts=counts,
                            seconds_median=float(np.median([r["seconds"] for r in rows])),
                            runs=rows,
                        )
                    )
                    print(
                        f"  {name:26s} {start:10s} mb={mb} N={n:5d} "
                        + " ".join(f"{k}={v}" for k, v in counts.items() if v),
                        flush=True,
                    )
    return table, tols


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="200 steps, one key")
    parser.add_argument("--refs", action="store_true", help="recompute the NUTS references")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    out = common.output_dir(args, NAME)

    t0 = time.perf_counter()
    environment = common.environment()
    if args.refs:
        refs = nuts_references(args.seed)
        r = flat_regression.longley_reference()
        refs["longley"] = dict(
            mean=r.mean.tolist(),
            sd=r.sd.tolist(),
            source="NIST StRD certified values (the KL-optimal Gaussian, exactly)",
        )
        REFS.write_text(json.dumps(refs, indent=1) + "\n")
    table, tols = run_table(json.loads(REFS.read_text()), args.seed, settings)
    report = dict(
        description=__doc__.split("\n\n")[0],
        settings=settings,
        tolerances=tols,
        table=table,
        environment=dict(environment, seconds=time.perf_counter() - t0),
    )
    common.write_json(out, NAME, report)
    return report


if __name__ == "__main__":
    main()
