"""Binary probit regression (Salimans & Knowles 2013, section 5, fig:probitRMSE).

The paper's experiment with the authors' settings (``jaxvb/data/README.md``): 500
synthetic data sets of N = 100 observations and M = 5 regressors, prior N(0, I), every
method starting from the prior and using one draw per step.

1. **The paper's figure.** RMSE of the variational mean against the true coefficients
   as a function of the number of likelihood evaluations, for Basic (Algorithm 1,
   ``method="regression"``), Factor (``jaxvb.methods.sites("regression")``, sec. 5.1),
   FactorGradient (``sites("gradient")``, sec. 5.2), Hessian (Algorithm 2,
   ``method="hessian"``), Hessian + minibatches (``jaxvb.Minibatch``, 10 blocks of 10
   visited in a random order each pass, sec. 5.5) and VBEM (Ormerod & Wand 2010). The
   average over data sets depends on the number of steps N (the step size is 1/sqrt(N)
   and the second half is averaged), so every method runs at a grid of N, each grid
   point one jitted ``jax.vmap`` over the 500 data sets. Likelihood evaluations are
   counted as the paper does: one full-data evaluation per draw (a minibatch of K of N
   counts K/N; the 8 draws with which the regression methods estimate their first
   intercept count too); VBEM one per iteration. Per method at its largest N: mean
   RMSE, log score (``log N(beta_true | m, V)``), mean R^2 (1000 draws).
2. **Accuracy against the exact posterior.** On the first 20 data sets a long NUTS run
   (NumPyro, ``jaxvb.baselines.numpyro_probit``) gives the posterior mean and
   covariance; each method's Gaussian is scored by ``KL(N_method || N_nuts)`` (closed
   form) and the standardised mean error ``|m - m_nuts| / sd_nuts`` (max over the M
   coordinates, averaged over data sets; the mean over coordinates is in the JSON).
3. **Speed, in one run.** Times are after compile (compiled once with
   ``jit(...).lower(...).compile()``), with ``block_until_ready``, repeated, median.
   jaxvb's Hessian method (200 steps) on one data set against NumPyro SVI
   (``AutoMultivariateNormal`` + ``optax.adam``, started at the prior) with the
   smallest number of steps, from a grid, whose accuracy against NUTS is equal or
   better on the same 20 data sets; and the 500 data sets as one vmapped call against a
   Python loop over the same jitted single fit.

Outputs (in ``benchmarks/results/`` unless ``--out`` or ``--quick``): ``probit.json``
and ``probit.png``. ``notebooks/probit.ipynb`` reads the stored ``probit.json``
(:func:`read_result`) and draws its figure with :func:`plot`.

Usage::

    python benchmarks/probit.py            # full run (~15 minutes on 2 CPUs)
    python benchmarks/probit.py --quick    # smoke test, writes to a temp dir
    python benchmarks/probit.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

try:
    import jaxvb
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import jaxvb

from jaxvb.baselines import numpyro_probit, vbem_probit  # noqa: E402
from jaxvb.models import probit  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"  # the stored results
METHODS = ("basic", "factor", "factor_gradient", "hessian", "hessian_minibatch", "vbem")
LABELS = {
    "basic": "Basic (Algorithm 1)",
    "factor": "Factor (sec. 5.1)",
    "factor_gradient": "FactorGradient (sec. 5.2)",
    "hessian": "Hessian (Algorithm 2)",
    "hessian_minibatch": "Hessian + minibatches (sec. 5.5)",
    "vbem": "VBEM (Ormerod & Wand 2010)",
}
# The paper's colours (caption of fig:probitRMSE).
COLORS = {
    "basic": "green",
    "factor": "cyan",
    "factor_gradient": "blue",
    "hessian": "red",
    "hessian_minibatch": "magenta",
    "vbem": "black",
}
BATCH_SIZE = 10  # the paper's 10 minibatches of the N = 100 observations
NUM_INIT_DRAWS = 8  # regression's and sites("regression")'s first-intercept draws
INIT_EVALS = {"basic": NUM_INIT_DRAWS, "factor": NUM_INIT_DRAWS}
NUM_EVAL_DRAWS = 1000  # draws for R^2 of the final fits (fit's default)
# The figure runs the paper's plain iteration (no step control), as the exponential toy
# benchmark does; the timed fits use fit's default step control (max_backtracks=8).
CURVE_BACKTRACKS = 0
TIMED_STEPS = 200  # the speed target: Algorithm 2 with 200 steps
# Timed jaxvb variants: (method, num_eval_draws).
SPEED_VARIANTS = {
    "default": ("hessian", NUM_EVAL_DRAWS, jnp.float64),
    "no_diagnostics": ("hessian", 2, jnp.float64),
    "sites_hessian_no_diagnostics": ("sites_hessian", 2, jnp.float64),
    "float32_default": ("hessian", NUM_EVAL_DRAWS, jnp.float32),
    "float32_no_diagnostics": ("hessian", 2, jnp.float32),
}

FULL = dict(
    num_datasets=probit.PAPER_NUM_DATASETS,
    num_reference=20,
    num_eval_draws=NUM_EVAL_DRAWS,
    nuts=dict(num_warmup=1000, num_samples=4000, num_chains=4),
    grids=dict(
        basic=(50, 100, 200, 500, 1000, 2000, 5000, 10000),
        factor=(10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
        factor_gradient=(5, 10, 20, 50, 100, 200, 500, 1000, 2000),
        hessian=(2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
        hessian_minibatch=(10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
        vbem=(1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000),
    ),
    # (schedule, initial learning rate, particles); cosine decays to 0 over the run.
    svi_configs=(
        ("constant", 0.01, 1),
        ("cosine", 0.01, 1),
        ("cosine", 0.03, 1),
        ("cosine", 0.1, 1),
        ("cosine", 0.01, 10),
        ("cosine", 0.03, 10),
        ("cosine", 0.1, 10),
    ),
    svi_steps=(1000, 2000, 5000, 10000, 20000, 50000),
    repeats=dict(jaxvb=100, svi=7, vmapped=7),
    speed_variants=tuple(SPEED_VARIANTS),
)
QUICK = dict(
    num_datasets=20,
    num_reference=2,
    num_eval_draws=200,
    nuts=dict(num_warmup=150, num_samples=300, num_chains=1),
    grids=dict(
        basic=(50,),
        factor=(20,),
        factor_gradient=(20,),
        hessian=(50,),
        hessian_minibatch=(50,),
        vbem=(1, 5, 50),
    ),
    svi_configs=(("cosine", 0.03, 10),),
    svi_steps=(3000,),
    repeats=dict(jaxvb=5, svi=2, vmapped=2),
    speed_variants=("no_diagnostics",),
)

PAPER = dict(
    log_score_fixed_form=0.193,
    log_score_vbem=-4.46,
    mean_r_squared=0.97,
    vmp_rmse=0.265,
    vmp_log_score=-4.56,
    basic_ms_to_converge=15,
)

NOTES = [
    "Likelihood evaluations (x axis): one per draw of x (each evaluates all N sites), "
    "K/N per minibatch draw, one per VBEM iteration; the 8 draws with which "
    "regression() and sites('regression') estimate their first intercept are counted. "
    "Diagnostics draws (R^2) are not counted for any method.",
    "The curves run the paper's plain iteration (max_backtracks=0, as the exponential "
    "toy benchmark does), with num_eval_draws=2 (the minimum); R^2 of the final fits is "
    "then computed with jaxvb.diagnostics.evaluate. The timed fits use jaxvb.fit's "
    "defaults (step control max_backtracks=8). One draw per step, w = 1/sqrt(N) "
    "throughout. 'flagged' counts fits with status != 0 (mostly IMPROPER_PROPOSAL in "
    "the first steps of Basic); 'error_fraction' those with Result.ok False. The mean "
    "RMSE (the paper's measure) is sensitive to a few failed fits; the median is in the "
    "JSON too.",
    "SME = |m - m_nuts| / sd_nuts per coordinate; 'sme_max' is the max over the M = 5 "
    "coordinates, averaged over the reference data sets; 'sme_mean' the mean over "
    "coordinates and data sets. KL is KL(N(m, V) || N(m_nuts, V_nuts)). The NUTS "
    "moments carry Monte Carlo error: the standard error of the NUTS mean in sd units "
    "is 1/sqrt(ESS), reported under reference.",
    "Equal or better accuracy: the SVI run must have mean KL <= jaxvb's and mean "
    "sme_max <= jaxvb's on the same reference data sets. Constant-step Adam has a "
    "noise floor well above jaxvb's 200-step accuracy, so the SVI grid also has "
    "cosine-decayed step sizes and 10-particle ELBO gradients; every configuration "
    "stops at the first step count of the grid that matches, and the ratio uses the "
    "fastest matching configuration (the most favourable to NumPyro).",
    "Speed rows 'default' run jaxvb.fit as a user would (num_eval_draws=1000 draws for "
    "the diagnostics elbo, kl, r_squared, log_evidence); 'no diagnostics' uses "
    "num_eval_draws=2 (the minimum), i.e. Algorithm 2 alone, which is what NumPyro's "
    "SVI computes. 'sites(hessian)' is Algorithm 2 with the Hessian assembled from N "
    "scalar second derivatives (jaxvb.methods.sites('hessian')) instead of "
    "jax.hessian of the whole log joint.",
]


# --------------------------------------------------------------------------- models


def _prior(num_features, dtype):
    """The paper's prior N(0, I), which is also every method's start."""
    return jaxvb.Gaussian(
        jnp.zeros(num_features, dtype), jnp.eye(num_features, dtype=dtype)
    )


def _obs_log_lik(x, obs):
    v, y = obs
    return probit.site_log_lik(v @ x, y)


def make_fit(name, num_steps, num_eval_draws=2, max_backtracks=8):
    """``(design, y, key) -> jaxvb.Result`` for one data set, starting at the prior."""

    def run(design, y, key):
        q0 = _prior(design.shape[-1], design.dtype)
        common = dict(
            num_steps=num_steps,
            num_eval_draws=num_eval_draws,
            max_backtracks=max_backtracks,
            on_failure="ignore",
        )
        if name == "basic":
            log_joint = partial(probit.log_joint, design=design, y=y)
            return jaxvb.fit(log_joint, q0, key, method="regression", **common)
        if name in ("factor", "factor_gradient", "sites_hessian"):
            estimator = {
                "factor": "regression",
                "factor_gradient": "gradient",
                "sites_hessian": "hessian",
            }[name]
            model = jaxvb.Factors(q0, probit.site_log_lik, design, y)
            return jaxvb.fit(
                model, q0, key, method=jaxvb.methods.sites(estimator), **common
            )
        if name == "hessian":
            log_joint = partial(probit.log_joint, design=design, y=y)
            return jaxvb.fit(log_joint, q0, key, method="hessian", **common)
        if name == "hessian_minibatch":
            model = jaxvb.Minibatch(
                q0.log_prob,
                _obs_log_lik,
                (design, y),
                batch_size=BATCH_SIZE,
                schedule="sweep",
            )
            return jaxvb.fit(model, q0, key, method="hessian", **common)
        raise ValueError(name)

    return run


def evals_per_step(name, num_obs):
    return BATCH_SIZE / num_obs if name == "hessian_minibatch" else 1.0


# --------------------------------------------------------------------------- measures


def gaussian_kl(m0, s0, m1, s1):
    """``KL(N(m0, s0) || N(m1, s1))``, batched over leading axes (numpy, float64)."""
    m0, s0, m1, s1 = (np.asarray(a, dtype=np.float64) for a in (m0, s0, m1, s1))
    d = m0.shape[-1]
    s1_inv = np.linalg.inv(s1)
    dm = (m1 - m0)[..., None]
    trace = np.einsum("...ij,...ji->...", s1_inv, s0)
    maha = (np.swapaxes(dm, -1, -2) @ s1_inv @ dm)[..., 0, 0]
    logdet = np.linalg.slogdet(s1)[1] - np.linalg.slogdet(s0)[1]
    return 0.5 * (trace + maha - d + logdet)


def accuracy(mean, cov, ref):
    """KL and standardised mean errors of Gaussians against the NUTS moments ``ref``."""
    n = len(ref["mean"])
    mean, cov = np.asarray(mean)[:n], np.asarray(cov)[:n]
    kl = gaussian_kl(mean, cov, ref["mean"], ref["cov"])
    sme = np.abs(mean - ref["mean"]) / np.sqrt(np.diagonal(ref["cov"], axis1=-2, axis2=-1))
    return dict(
        kl=float(np.mean(kl)),
        kl_median=float(np.median(kl)),
        kl_max=float(np.max(kl)),
        sme_max=float(np.mean(sme.max(-1))),
        sme_mean=float(np.mean(sme)),
    )


def scores(mean, cov, beta):
    r = np.asarray(probit.rmse(mean, beta))
    ls = np.asarray(probit.log_score(mean, cov, beta))
    return dict(
        rmse=float(r.mean()),
        rmse_se=float(r.std(ddof=1) / np.sqrt(r.size)) if r.size > 1 else 0.0,
        log_score=float(ls.mean()),
        log_score_se=float(ls.std(ddof=1) / np.sqrt(ls.size)) if ls.size > 1 else 0.0,
    )


@partial(jax.jit, static_argnames="num_draws")
def _r_squared_batch(keys, mean, cov, design, y, num_draws):
    def one(key, mean, cov, design, y):
        q = jaxvb.Gaussian(mean, cov)
        log_joint = partial(probit.log_joint, design=design, y=y)
        return jaxvb.diagnostics.evaluate(key, q, log_joint, num_draws).r_squared

    return jax.vmap(one)(keys, mean, cov, design, y)


def r_squared(key, mean, cov, design, y, num_draws):
    """Section 4's R^2 of each Gaussian ``N(mean, cov)`` for its data set."""
    keys = jax.random.split(key, len(mean))
    return np.asarray(_r_squared_batch(keys, mean, cov, design, y, num_draws))


def _timings(fn, args, repeats):
    """Median (and spread) of ``repeats`` calls of a compiled ``fn``, in seconds."""
    jax.block_until_ready(fn(*args))  # warm: the first call may allocate
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    ts = np.asarray(ts)
    return dict(
        median_s=float(np.median(ts)),
        min_s=float(ts.min()),
        q25_s=float(np.quantile(ts, 0.25)),
        q75_s=float(np.quantile(ts, 0.75)),
        repeats=int(repeats),
    )


def _head_to_head(fns, args, repeats, inner):
    """Median seconds per call of each compiled function, timed alternately.

    Each of ``repeats`` rounds calls the function named ``"svi"`` once and every other
    function ``inner`` times.
    """
    for fn in fns.values():
        jax.block_until_ready(fn(*args))
    times = {label: [] for label in fns}
    for _ in range(repeats):
        for label, fn in fns.items():
            for _ in range(1 if label == "svi" else inner):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times[label].append(time.perf_counter() - t0)
    return {label: float(np.median(ts)) for label, ts in times.items()}


def _compile(fn, *args):
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t0


_COMPILED = {}


def compiled_fit(name, num_steps, num_eval_draws, args, batched, max_backtracks=8):
    """:func:`make_fit` compiled for ``args`` (vmapped if ``batched``), compiled once.

    Returns the compiled function and the seconds its compilation took.
    """
    shapes = tuple((a.shape, str(a.dtype)) for a in jax.tree_util.tree_leaves(args))
    cache_key = (name, num_steps, num_eval_draws, max_backtracks, batched, shapes)
    if cache_key not in _COMPILED:
        fn = make_fit(name, num_steps, num_eval_draws, max_backtracks)
        _COMPILED[cache_key] = _compile(jax.vmap(fn) if batched else fn, *args)
    return _COMPILED[cache_key]


# --------------------------------------------------------------------------- parts


def reference_moments(design, y, settings, seed):
    """NUTS posterior moments on the first ``num_reference`` data sets."""
    nuts = settings["nuts"]
    mcmc = numpyro_probit.make_mcmc(**nuts)
    means, covs, ess, rhat, div = [], [], [], [], []
    t0 = time.perf_counter()
    for i in range(settings["num_reference"]):
        key = jax.random.fold_in(jax.random.key(seed + 1), i)
        r = numpyro_probit.nuts(design[i], y[i], key, mcmc=mcmc)
        means.append(r.mean)
        covs.append(r.cov)
        ess.append(r.ess)
        rhat.append(r.r_hat)
        div.append(r.num_divergent)
    seconds = time.perf_counter() - t0
    ess = np.asarray(ess)
    print(
        f"  NUTS on {len(means)} data sets: min ESS {ess.min():.0f}, max R-hat "
        f"{np.max(rhat):.4f}, divergences {sum(div)} ({seconds:.0f} s)",
        flush=True,
    )
    return dict(
        mean=np.asarray(means),
        cov=np.asarray(covs),
        summary=dict(
            num_datasets=len(means),
            **nuts,
            chain_method="vectorized",
            ess_min=float(ess.min()),
            ess_median=float(np.median(ess)),
            r_hat_max=float(np.max(rhat)),
            num_divergent=int(sum(div)),
            mean_mc_error_sd_units_max=float(np.max(1.0 / np.sqrt(ess))),
            seconds=seconds,
        ),
    )


def run_curves(beta, design, y, ref, settings, seed):
    """Every method at its grid of step counts, vmapped over the data sets."""
    num_obs = design.shape[1]
    out, finals = {}, {}
    base = jax.random.key(seed + 2)
    for i, name in enumerate(METHODS[:-1]):
        rows = []
        for n in settings["grids"][name]:
            keys = jax.random.split(
                jax.random.fold_in(jax.random.fold_in(base, i), n), len(y)
            )
            t0 = time.perf_counter()
            fit_all, compile_s = compiled_fit(
                name, n, 2, (design, y, keys), batched=True, max_backtracks=CURVE_BACKTRACKS
            )
            res = fit_all(design, y, keys)
            mean, cov = np.asarray(res.q.mean), np.asarray(res.q.cov)
            status = np.asarray(res.status)
            seconds = time.perf_counter() - t0
            evals = n * evals_per_step(name, num_obs) + INIT_EVALS.get(name, 0)
            row = dict(
                num_steps=int(n),
                likelihood_evaluations=float(evals),
                **scores(mean, cov, beta),
                rmse_median=float(np.median(np.asarray(probit.rmse(mean, beta)))),
                flagged_fraction=float(np.mean(status != 0)),
                error_fraction=float(np.mean(~np.asarray(res.ok))),
                damped_steps_mean=float(np.mean(np.asarray(res.num_damped_steps))),
                vs_nuts=accuracy(mean, cov, ref),
                compile_s=compile_s,
                seconds_incl_compile=seconds,
            )
            rows.append(row)
            finals[name] = (mean, cov)
            print(
                f"  {name:18s} N={n:6d} evals={evals:8.1f}  RMSE {row['rmse']:.4f}  "
                f"log score {row['log_score']:7.3f}  KL {row['vs_nuts']['kl']:.4f}  "
                f"flagged {row['flagged_fraction']:.2f}  ({seconds:.1f} s)",
                flush=True,
            )
        out[name] = rows

    # VBEM: one traced run gives the mean after every iteration (the covariance is
    # fixed); the converged fit is a separate run to its tolerance.
    iters = settings["grids"]["vbem"]
    t0 = time.perf_counter()
    traced = jax.vmap(partial(vbem_probit.vbem, num_iters=max(iters), trace=True))(
        design, y
    )
    conv = jax.vmap(vbem_probit.vbem)(design, y)
    cov = np.asarray(conv.q.cov)
    means = np.asarray(traced.trace.mean)
    rows = []
    for n in iters:
        rows.append(
            dict(
                num_steps=int(n),
                likelihood_evaluations=float(n),
                **scores(means[:, n], cov, beta),
                vs_nuts=accuracy(means[:, n], cov, ref),
            )
        )
    out["vbem"] = rows
    finals["vbem"] = (np.asarray(conv.q.mean), cov)
    print(
        f"  vbem               converged in {int(np.max(conv.num_iters))} iterations at most "
        f"({np.mean(np.asarray(conv.converged)):.2f} converged; "
        f"{time.perf_counter() - t0:.1f} s)",
        flush=True,
    )
    return (
        out,
        finals,
        dict(
            max_iters=int(np.max(conv.num_iters)),
            median_iters=float(np.median(np.asarray(conv.num_iters))),
            converged_fraction=float(np.mean(np.asarray(conv.converged))),
        ),
    )


def summarise(curves, finals, beta, design, y, ref, seed, num_eval_draws):
    """Per method: RMSE, log score, R^2 and accuracy against NUTS."""
    table = {}
    for i, name in enumerate(METHODS):
        mean, cov = finals[name]
        last = curves[name][-1]
        key = jax.random.fold_in(jax.random.key(seed + 3), i)
        r2 = r_squared(key, mean, cov, design, y, num_eval_draws)
        table[name] = dict(
            label=LABELS[name],
            num_steps=last["num_steps"],
            likelihood_evaluations=last["likelihood_evaluations"],
            **scores(mean, cov, beta),
            r_squared=float(np.mean(r2)),
            r_squared_median=float(np.median(r2)),
            vs_nuts=accuracy(mean, cov, ref),
        )
        if name == "vbem":
            table[name]["note"] = (
                "converged run (tolerance 10 eps), not the last grid point"
            )
    # The reference itself on its data sets: the best any Gaussian summary can do there.
    n = len(ref["mean"])
    table["nuts_reference"] = dict(
        label=f"NUTS moments (first {n} data sets only)",
        **scores(ref["mean"], ref["cov"], beta[:n]),
    )
    for name in METHODS:
        mean, cov = finals[name]
        table[name]["on_reference_datasets"] = scores(mean[:n], cov[:n], beta[:n])
    return table


def run_speed(design, y, ref, settings, seed):
    """jaxvb's Hessian method against NumPyro SVI; vmapped against a Python loop."""
    reps = settings["repeats"]
    n_ref = len(ref["mean"])
    d = len(y)
    key = jax.random.key(seed + 4)
    keys = jax.random.split(jax.random.fold_in(key, 7), d)
    out = dict(load_average_before=list(os.getloadavg()))

    def data(dtype):
        return design.astype(dtype), y.astype(dtype)

    # jaxvb, 200 steps: one data set, all data sets vmapped, and a Python loop over the
    # jitted single fit. Accuracy against NUTS from the vmapped run's first data sets.
    jaxvb_rows, batch = {}, {}
    for label in settings["speed_variants"]:
        name, ned, dtype = SPEED_VARIANTS[label]
        v, yy = data(dtype)
        one = (v[0], yy[0], keys[0])
        single, compile_s = compiled_fit(name, TIMED_STEPS, ned, one, batched=False)
        t = _timings(single, one, reps["jaxvb"])
        vmapped, vcompile_s = compiled_fit(name, TIMED_STEPS, ned, (v, yy, keys), True)
        tv = _timings(vmapped, (v, yy, keys), reps["vmapped"])
        res = vmapped(v, yy, keys)
        acc = accuracy(res.q.mean, res.q.cov, ref)
        parts = [(v[i], yy[i], keys[i]) for i in range(d)]
        jax.block_until_ready(parts)
        t0 = time.perf_counter()
        jax.block_until_ready([single(*p) for p in parts])
        loop_s = time.perf_counter() - t0
        jaxvb_rows[label] = dict(
            method=name,
            num_steps=TIMED_STEPS,
            num_eval_draws=ned,
            dtype=np.dtype(dtype).name,
            compile_s=compile_s,
            **t,
            vs_nuts=acc,
            flagged_fraction=float(np.mean(np.asarray(res.status) != 0)),
        )
        batch[label] = dict(
            num_datasets=d,
            dtype=np.dtype(dtype).name,
            vmapped_compile_s=vcompile_s,
            vmapped=tv,
            python_loop_s=loop_s,
            speedup=loop_s / tv["median_s"],
        )
        print(
            f"  jaxvb {label:36s} {1e3 * t['median_s']:7.2f} ms (min "
            f"{1e3 * t['min_s']:.2f})  KL {acc['kl']:.4f}  SME {acc['sme_max']:.4f}; "
            f"{d} data sets vmapped {tv['median_s']:.3f} s, Python loop {loop_s:.3f} s",
            flush=True,
        )
    out["jaxvb_single"] = jaxvb_rows
    out["all_datasets"] = batch
    target = jaxvb_rows["no_diagnostics"]["vs_nuts"]
    dtypes = sorted({SPEED_VARIANTS[label][2] for label in jaxvb_rows}, key=str)

    # NumPyro SVI: for each configuration the smallest step count of the grid whose
    # accuracy on the reference data sets (float64) is at least that of jaxvb's
    # float64 fit; that run is then timed in every precision jaxvb was timed in.
    import optax

    svi_rows, svi_compiled = [], {}
    for schedule, lr, particles in settings["svi_configs"]:
        row = dict(schedule=schedule, learning_rate=lr, num_particles=particles, grid=[])
        for n in settings["svi_steps"]:
            rate = optax.cosine_decay_schedule(lr, n) if schedule == "cosine" else lr
            fn = partial(
                numpyro_probit.svi, num_steps=n, learning_rate=rate, num_particles=particles
            )
            ref_keys = jax.random.split(jax.random.fold_in(key, n), n_ref)
            res = jax.jit(jax.vmap(fn))(design[:n_ref], y[:n_ref], ref_keys)
            acc = accuracy(res.mean, res.cov, ref)
            matched = acc["kl"] <= target["kl"] and acc["sme_max"] <= target["sme_max"]
            row["grid"].append(dict(num_steps=n, vs_nuts=acc, matches=matched))
            print(
                f"  svi {schedule:8s} lr={lr:<5g} particles={particles:<3d} steps={n:6d}  "
                f"KL {acc['kl']:.4f}  SME {acc['sme_max']:.4f}  "
                f"{'matches' if matched else ''}",
                flush=True,
            )
            if matched:
                row["matching"] = dict(num_steps=n, vs_nuts=acc)
                for dtype in dtypes:
                    v, yy = data(dtype)
                    one = (v[0], yy[0], keys[0])
                    compiled, compile_s = _compile(fn, *one)
                    svi_compiled[(id(row), np.dtype(dtype).name)] = compiled
                    t = _timings(compiled, one, reps["svi"])
                    row["matching"][np.dtype(dtype).name] = dict(compile_s=compile_s, **t)
                    if dtype != jnp.float64:  # the same run's accuracy in this precision
                        r = jax.jit(jax.vmap(fn))(v[:n_ref], yy[:n_ref], ref_keys)
                        row["matching"][np.dtype(dtype).name]["vs_nuts"] = accuracy(
                            r.mean, r.cov, ref
                        )
                    print(
                        f"      -> {np.dtype(dtype).name}: {1e3 * t['median_s']:.1f} ms "
                        "after compile",
                        flush=True,
                    )
                break
        svi_rows.append(row)
    out["svi"] = svi_rows

    # The ratio compares like with like (the same precision; jaxvb without and with its
    # diagnostics draws), timed head to head: the fastest matching SVI run and the
    # jaxvb fits alternate, so that other load on the machine falls on both alike.
    ratios = {}
    matching = [r for r in svi_rows if "matching" in r]
    for dtype in dtypes:
        name = np.dtype(dtype).name
        if not matching:
            ratios[name] = None
            continue
        best = min(matching, key=lambda r: r["matching"][name]["median_s"])
        labels = [label for label, row in jaxvb_rows.items() if row["dtype"] == name]
        v, yy = data(dtype)
        one = (v[0], yy[0], keys[0])
        fns = {"svi": svi_compiled[(id(best), name)]}
        for label in labels:
            fn_name, ned, _ = SPEED_VARIANTS[label]
            fns[label] = compiled_fit(fn_name, TIMED_STEPS, ned, one, batched=False)[0]
        times = _head_to_head(fns, one, reps["svi"], inner=10)
        entry = dict(
            schedule=best["schedule"],
            learning_rate=best["learning_rate"],
            num_particles=best["num_particles"],
            num_steps=best["matching"]["num_steps"],
            head_to_head_median_s=times,
        )
        for label in labels:
            entry[f"ratio_to_jaxvb_{label}"] = times["svi"] / times[label]
        ratios[name] = entry
        print(
            f"  head to head, {name}: SVI {1e3 * times['svi']:.1f} ms; "
            + ", ".join(f"{label} {times['svi'] / times[label]:.0f}x" for label in labels),
            flush=True,
        )
    out["svi_fastest_matching"] = ratios
    out["load_average_after"] = list(os.getloadavg())
    return out


# --------------------------------------------------------------------------- figure


def read_result(directory=RESULTS):
    """The report in ``directory/probit.json`` (by default the stored one)."""
    return json.loads((Path(directory) / "probit.json").read_text())


def plot(result, path=None):
    """The figure of a report (as :func:`main` returns it or :func:`read_result` reads it).

    Saved to ``path`` (``probit.png``) if one is given; returned either way. The figure
    is a plain :class:`matplotlib.figure.Figure`, not registered with pyplot: nothing
    here selects or changes a matplotlib backend.
    """
    curves = result["curves"]
    num_datasets = result["settings"]["num_datasets"]
    ref_n = len(result["reference"]["mean"])
    fig = Figure(figsize=(13, 5.2))
    ax, axk = fig.subplots(1, 2)
    for name in METHODS:
        rows = curves[name]
        ev = [r["likelihood_evaluations"] for r in rows]
        ax.plot(
            ev,
            [r["rmse"] for r in rows],
            "-o",
            color=COLORS[name],
            ms=3,
            lw=1.6,
            label=LABELS[name],
        )
        axk.plot(
            ev,
            [max(r["vs_nuts"]["kl"], 1e-5) for r in rows],
            "-o",
            color=COLORS[name],
            ms=3,
            lw=1.6,
            label=LABELS[name],
        )
    ax.set_xscale("log")
    ax.set_xlabel("number of likelihood evaluations")
    ax.set_ylabel("RMSE of the posterior mean vs true coefficients")
    ax.set_title(
        f"Probit regression, N = 100, M = 5: mean over {num_datasets} data sets\n"
        "(after fig:probitRMSE of Salimans & Knowles 2013)"
    )
    ax.set_ylim(top=min(ax.get_ylim()[1], 1.0))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8.5)
    axk.set_xscale("log")
    axk.set_yscale("log")
    axk.set_xlabel("number of likelihood evaluations")
    axk.set_ylabel("KL(q || N(NUTS mean, NUTS cov))")
    axk.set_title(f"Distance to the exact posterior (NUTS), mean over {ref_n} data sets")
    axk.grid(alpha=0.3, which="both")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
    return fig


def table_lines(table):
    """The table of a report (largest N of each method), one line per method."""
    lines = []
    for name in (*METHODS, "nuts_reference"):
        r = table[name]
        extra = (
            f"  R^2 {r['r_squared']:.3f}  KL {r['vs_nuts']['kl']:.4f}  "
            f"SME {r['vs_nuts']['sme_max']:.4f}"
            if "vs_nuts" in r
            else ""
        )
        lines.append(
            f"  {r['label']:40s} RMSE {r['rmse']:.4f}  log score {r['log_score']:7.3f}{extra}"
        )
    return lines


# --------------------------------------------------------------------------- main


def _environment():
    import numpyro
    import optax

    return environment(numpyro_version=numpyro.__version__, optax_version=optax.__version__)


def _targets(speed):
    """Each target, for every timed jaxvb variant (precision, with/without diagnostics)."""
    single, batch = speed["jaxvb_single"], speed["all_datasets"]
    out = dict(
        single_fit_200_steps_ms=dict(target="<= 5 ms after compile"),
        faster_than_svi=dict(
            target=">= 100x faster than NumPyro SVI at equal or better accuracy "
            "(ratio of median times, same precision)"
        ),
        all_datasets_vmapped_s=dict(
            target="<= 1 s for all data sets in one vmapped call",
            num_datasets=batch["no_diagnostics"]["num_datasets"],
        ),
    )
    for label, row in single.items():
        ms = 1e3 * row["median_s"]
        out["single_fit_200_steps_ms"][label] = dict(value=ms, met=ms <= 5.0)
        s = batch[label]["vmapped"]["median_s"]
        out["all_datasets_vmapped_s"][label] = dict(value=s, met=s <= 1.0)
        best = speed["svi_fastest_matching"].get(row["dtype"])
        ratio = best.get(f"ratio_to_jaxvb_{label}") if best else None
        out["faster_than_svi"][label] = dict(
            value=ratio, met=bool(ratio is not None and ratio >= 100)
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke-test run")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--speed-only",
        action="store_true",
        help="re-measure only the speed section (e.g. on a quieter machine) and update "
        "the speed results and targets of an existing probit.json in the output "
        "directory; the NUTS reference is read from it",
    )
    args = parser.parse_args(argv)

    jax.config.update("jax_enable_x64", True)
    settings = dict(QUICK if args.quick else FULL)
    if args.out is not None:
        out = args.out
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="probit_"))
    else:
        out = RESULTS
    out.mkdir(parents=True, exist_ok=True)

    t_start = time.perf_counter()
    beta, design, y = probit.simulate(jax.random.key(args.seed), settings["num_datasets"])
    if args.speed_only:
        return _rerun_speed(out, design, y, settings, args)
    print("Reference: NUTS", flush=True)
    ref = reference_moments(design, y, settings, args.seed)
    # Speed first: the timings are the part most sensitive to other load on the machine.
    print("Speed", flush=True)
    speed = run_speed(design, y, ref, settings, args.seed)
    print("Accuracy against likelihood evaluations", flush=True)
    curves, finals, vbem_info = run_curves(beta, design, y, ref, settings, args.seed)
    table = summarise(
        curves, finals, beta, design, y, ref, args.seed, settings["num_eval_draws"]
    )
    targets = _targets(speed)
    wall = time.perf_counter() - t_start

    report = dict(
        description=(
            "Salimans & Knowles (2013) binary probit regression (section 5, "
            "fig:probitRMSE): RMSE against likelihood evaluations for six methods, "
            "accuracy against NUTS, and speed against NumPyro SVI."
        ),
        settings=dict(
            quick=args.quick,
            seed=args.seed,
            num_datasets=settings["num_datasets"],
            num_obs=int(design.shape[1]),
            num_features=int(design.shape[2]),
            start="the prior N(0, I) for every method",
            draws_per_step=1,
            batch_size=BATCH_SIZE,
            minibatch_schedule="sweep",
            grids={k: list(v) for k, v in settings["grids"].items()},
            svi_configs=[list(c) for c in settings["svi_configs"]],
            svi_steps=list(settings["svi_steps"]),
            timed_steps=TIMED_STEPS,
            repeats=settings["repeats"],
            num_eval_draws_final=settings["num_eval_draws"],
        ),
        paper=PAPER,
        table=table,
        curves=curves,
        vbem=vbem_info,
        reference=dict(ref["summary"], mean=ref["mean"].tolist(), cov=ref["cov"].tolist()),
        speed=speed,
        targets=targets,
        notes=NOTES,
        environment=_environment(),
        wall_time_s=wall,
    )
    plot(report, out / "probit.png")
    (out / "probit.json").write_text(json.dumps(report, indent=2) + "\n")

    print("\nTable (largest N of each method):")
    print("\n".join(table_lines(table)))
    print("\nTargets:")
    print(json.dumps(targets, indent=2))
    print(f"\nwall time {wall:.1f} s; results in {out}")
    return report


def _rerun_speed(out, design, y, settings, args):
    """``--speed-only``: the speed section again, into an existing ``probit.json``."""
    path = out / "probit.json"
    report = json.loads(path.read_text())
    old = report["settings"]
    if old["seed"] != args.seed or old["quick"] != args.quick:
        raise SystemExit(f"--speed-only: {path} was written with other settings")
    t0 = time.perf_counter()
    if "mean" in report["reference"]:
        ref = dict(
            mean=np.asarray(report["reference"]["mean"]),
            cov=np.asarray(report["reference"]["cov"]),
        )
    else:  # NUTS again: the same keys give the same draws
        print("Reference: NUTS", flush=True)
        ref = reference_moments(design, y, settings, args.seed)
        report["reference"].update(mean=ref["mean"].tolist(), cov=ref["cov"].tolist())
    print("Speed", flush=True)
    speed = run_speed(design, y, ref, settings, args.seed)
    speed["measured_separately"] = dict(
        note="re-measured with --speed-only; the accuracy sections are from the "
        "earlier full run with the same seed and settings",
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        seconds=time.perf_counter() - t0,
        # the top-level environment stays the accuracy run's
        environment=_environment(),
    )
    report["speed"] = speed
    report["targets"] = _targets(speed)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print("\nTargets:")
    print(json.dumps(report["targets"], indent=2))
    return report


if __name__ == "__main__":
    main()
