"""Algorithm 2 from a new user's start and from the Laplace start, on five real posteriors.

``jaxvb.fit(..., method="hessian")`` on Longley's flat-prior regression (posterior
condition number ~2e19), GARCH(1,1) on the GBP/USD returns, the non-centred and the
centred (no mode) eight schools and a Poisson GP with 112 latent log rates, from
``Gaussian(0, I)`` and from the Laplace start at ``x0 = 0``, with and without the step
control, for several numbers of steps and keys. A run is ``accurate`` (no error flag,
moments within the model's tolerance of the reference), ``flagged`` (an error flag, or
the Laplace start's ``ValueError``), ``silent_wrong``, ``silent_nan`` or, for the
centred eight schools without a flag, ``unrated``.

References: NIST's certified values for Longley (the KL-optimal Gaussian, exactly),
NUTS for the others (``--refs`` writes ``tests/data/robustness_nuts.json``). A
tolerance is ``gap + 4 * noise`` (largest over coordinates; in reference sds for means,
relative for sds): ``gap`` is how far the KL-optimal Gaussian (a long fit from x0) is
from the reference, ``noise`` the spread of fits over other keys combined with the
reference's Monte Carlo error.
"""

from __future__ import annotations

import itertools
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


def mean_sd(q):
    return np.asarray(q.mean), np.sqrt(np.abs(np.diagonal(np.asarray(q.cov))))


# --- the references ---------------------------------------------------------------------


def moments(draws) -> dict:
    """Mean, sd and their Monte Carlo errors of draws ``(chains, draws, d)``."""
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    flat = draws.reshape(-1, draws.shape[-1])
    mean, sd = flat.mean(0), flat.std(0, ddof=1)
    ess = np.asarray(effective_sample_size(draws))
    # A normal marginal's sd has standard error sd / sqrt(2 ESS); heavier tails make it
    # a little larger, which the tolerances' 4 standard errors absorb.
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
    """NUTS moments of garch, both eight schools and the GP, in the fit's coordinates;
    Longley's from NIST."""
    keys = iter(jax.random.split(jax.random.key(seed), 6))
    chains = NUTS_SETTINGS["num_chains"]

    def draws(log_joint, init):
        mcmc = common.nuts(log_joint, **NUTS_SETTINGS)(next(keys), init)
        return np.asarray(mcmc.get_samples(group_by_chain=True))

    def overdispersed(log_joint, d):
        q = jaxvb.laplace(log_joint, jnp.zeros(d))
        z = jax.random.normal(next(keys), (chains, d))
        return q.mean + 2.0 * z @ jnp.linalg.cholesky(q.cov).T

    out = {}
    lj = garch.gbpusd_log_joint()
    out["garch"] = moments(draws(lj, overdispersed(lj, 4)))
    lj = eight_schools.log_joint_noncentered
    eight = draws(lj, overdispersed(lj, 10))
    out["eight_schools_noncentered"] = moments(eight)
    out["eight_schools_centered"] = moments(np.asarray(eight_schools.to_centered(eight)))
    # The GP in v = L^{-1} (f - m), the same posterior (log|L| is a constant).
    _, chol, mean = latent_gp.coal_mining()
    lj = latent_gp.coal_mining_log_joint()
    v_mode = latent_gp.whiten(jaxvb.laplace(lj, jnp.full(112, mean)).mean, chol, mean)
    gp = draws(
        lambda v: lj(mean + jnp.asarray(chol) @ v),
        jnp.asarray(v_mode) + 0.5 * jax.random.normal(next(keys), (chains, 112)),
    )
    out["latent_gp"] = moments(np.asarray(latent_gp.unwhiten(gp, chol, mean)))
    r = flat_regression.longley_reference()
    out["longley"] = dict(
        mean=r.mean.tolist(),
        sd=r.sd.tolist(),
        source="NIST StRD certified values (the KL-optimal Gaussian, exactly)",
    )
    return out


def reference(refs, name) -> dict:
    """Mean, sd and their Monte Carlo errors (zero for NIST's exact values)."""
    zero = [0.0] * len(refs[name]["mean"])
    fields = ("mean", "sd", "mcse_mean", "mcse_sd")
    return {k: np.asarray(refs[name].get(k, zero)) for k in fields}


# --- the runs --------------------------------------------------------------------------------


def one_run(log_joint, q0, num_steps, max_backtracks, key, ref, tol) -> dict:
    """One fit, timed and classified (``tol`` None: a model without a mode)."""
    options = dict(num_steps=num_steps, max_backtracks=max_backtracks, on_failure="ignore")
    t = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = jax.block_until_ready(jaxvb.fit(log_joint, q0, key, **options))
    except ValueError as e:  # the Laplace start refused, with its reason
        error = str(e).split(".")[0]
        return dict(error=error, seconds=time.perf_counter() - t, outcome="flagged")
    seconds = time.perf_counter() - t
    mean, sd = mean_sd(res.q)
    nan = bool(np.isnan(mean).any() or np.isnan(np.asarray(res.q.cov)).any())
    err_mean, err_sd = np.abs(mean - ref["mean"]) / ref["sd"], np.abs(sd / ref["sd"] - 1)
    if not bool(res.ok):
        outcome = "flagged"
    elif nan:
        outcome = "silent_nan"
    elif tol is None:
        outcome = "unrated"
    elif np.all(err_mean <= tol["mean"]) and np.all(err_sd <= tol["sd"]):
        outcome = "accurate"
    else:
        outcome = "silent_wrong"
    return dict(
        seconds=seconds,
        status=int(res.status),
        message=res.message if int(res.status) else "ok",
        nan=nan,
        max_err_mean_sd=None if nan else float(np.nanmax(err_mean)),
        max_err_sd_rel=None if nan else float(np.nanmax(err_sd)),
        r_squared=float(res.r_squared),
        num_damped_steps=int(res.num_damped_steps),
        fixed_point_shift=float(res.fixed_point_shift),
        outcome=outcome,
    )


def optimal_gaussian_gap(log_joint, d, ref, seed, settings):
    """The optimal Gaussian (a long fit from x0) against the reference, in its sds."""
    if not ref["mcse_mean"].any():  # NIST's: the optimal Gaussian itself
        return np.zeros(d), np.zeros(d), None
    long = jaxvb.fit(
        log_joint,
        jnp.zeros(d),
        jax.random.key(seed + 7),
        num_steps=settings["gap_steps"],
        num_draws=settings["gap_draws"],
        on_failure="ignore",
    )
    mean, sd = mean_sd(long.q)
    return np.abs(mean - ref["mean"]) / ref["sd"], np.abs(sd / ref["sd"] - 1), long.status


def tolerance(log_joint, d, ref, gap, num_steps, seed, settings) -> dict:
    """``gap + 4 * noise`` (the largest over coordinates): ``noise`` is the spread of
    fits from x0 with ``num_steps`` steps over other keys, combined with the reference's
    Monte Carlo error."""
    keys = range(seed + 100, seed + 100 + max(settings["num_keys"], 2))
    fits = [
        mean_sd(
            jaxvb.fit(log_joint, jnp.zeros(d), jax.random.key(k), num_steps=num_steps).q
        )
        for k in keys
    ]
    means, sds = (np.stack(m) for m in zip(*fits, strict=True))
    noise_mean = np.hypot(means.std(0, ddof=1), ref["mcse_mean"]) / ref["sd"]
    noise_sd = np.hypot(sds.std(0, ddof=1), ref["mcse_sd"]) / ref["sd"]
    gap_mean, gap_sd, status = gap
    return dict(
        mean=float(gap_mean.max() + 4.0 * noise_mean.max()),
        sd=float(gap_sd.max() + 4.0 * noise_sd.max()),
        gap_mean_max=float(gap_mean.max()),
        gap_sd_max=float(gap_sd.max()),
        noise_mean_max=float(noise_mean.max()),
        noise_sd_max=float(noise_sd.max()),
        gap_fit_status=None if status is None else int(status),
    )


def run_table(refs, seed, settings):
    table, tols = [], {}
    for name, (log_joint, d) in models().items():
        ref = reference(refs, name)
        # The centred eight schools has no mode: no Laplace start, and no long fit from
        # x0 to size a tolerance.
        rated = name != "eight_schools_centered"
        gap = optimal_gaussian_gap(log_joint, d, ref, seed, settings) if rated else None
        for n in settings["num_steps"]:
            tol = None
            if rated:
                tol = tolerance(log_joint, d, ref, gap, n, seed, settings)
                tols.setdefault(name, {})[str(n)] = tol
            for start, mb in itertools.product(("gaussian01", "x0"), (8, 0)):
                q0 = jnp.zeros(d)
                if start == "gaussian01":
                    q0 = jaxvb.Gaussian(q0, jnp.eye(d))
                keys = (
                    jax.random.key(seed + 1000 * i) for i in range(settings["num_keys"])
                )
                runs = [one_run(log_joint, q0, n, mb, key, ref, tol) for key in keys]
                cell = dict(model=name, start=start, max_backtracks=mb, num_steps=n)
                table.append(
                    dict(
                        cell,
                        counts={k: sum(r["outcome"] == k for r in runs) for k in OUTCOMES},
                        seconds_median=float(np.median([r["seconds"] for r in runs])),
                        runs=runs,
                    )
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
        REFS.write_text(json.dumps(nuts_references(args.seed), indent=1) + "\n")
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
