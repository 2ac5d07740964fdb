"""Hierarchical and heavy-tailed models: the route the docs recommend against NUTS.

Eleven NumPyro models a Bayesian user writes (eight schools centred and non-centred,
radon's varying intercepts and varying slopes, crossed random effects, a Gaussian
process regression and classification with kernel hyperparameters, stochastic
volatility with a weakly identified level under a Cauchy prior, a regularised horseshoe,
a small Bayesian neural network, and random effects whose group sd is near zero), each
fitted by ``jaxvb.numpyro.fit`` the way the NumPyro guide recommends for its shape.
Every reported marginal (each scalar of each reported site, on the model's own scale,
from ``res.sample``) is scored against a stored NUTS reference
(``tests/data/hierarchical_nuts.json``, written by ``--refs``): its mean error in
reference sds and its sd ratio. The verdict of a model is *accurate* (every mean within
0.25 sd, every sd ratio in [0.8, 1.2]), *flagged* (a status other than 0, or an error
that names the cause) or *wrong* (status 0 and not accurate; *silent narrow* where an
sd ratio is below 0.7). NUTS (one chain, 500 + 1000) runs in the same worker process
as the fit, each timed on its first call (compile included) and after compile.

Usage::

    python benchmarks/hierarchical.py --refs          # the NUTS references (long)
    python benchmarks/hierarchical.py                 # every model, results + figure
    python benchmarks/hierarchical.py --only radon_intercepts
    python benchmarks/hierarchical.py --quick         # eight schools, short runs
"""

from __future__ import annotations

import functools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.handlers import reparam  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from numpyro.infer.reparam import LocScaleReparam  # noqa: E402

import jaxvb  # noqa: E402
import jaxvb.numpyro  # noqa: E402
from jaxvb import data  # noqa: E402

NAME = "hierarchical"
REFS = common.ROOT / "tests" / "data" / "hierarchical_nuts.json"
#: The reference: long NUTS runs on the non-centred form (the same posterior).
REFERENCE = dict(num_chains=4, num_warmup=1000, num_samples=2000, target_accept=0.95)
#: NUTS beside the fit in the same process, timed.
PEER = dict(num_warmup=500, num_samples=1000)
FULL = dict(num_draws=4000, worker_timeout_s=1200)
QUICK = dict(num_draws=1000, worker_timeout_s=600, models=("eight_schools_centered",))
#: The verdict's bounds on every reported marginal.
MEAN_TOL, SD_LO, SD_HI, SD_SILENT = 0.25, 0.8, 1.2, 0.7


# --- the models -------------------------------------------------------------------------


def eight_schools(y, sigma):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def eight_schools_nc(y, sigma):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", y.shape[0]):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * eta)
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def radon_intercepts(y, floor, county, num_counties):
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(2.0))
    b = numpyro.sample("b", dist.Normal(0.0, 10.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(2.0))
    with numpyro.plate("county", num_counties):
        a = numpyro.sample("a", dist.Normal(mu_a, sigma_a))
    with numpyro.plate("home", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[county] + b * floor, sigma_y), obs=y)


def radon_slopes(y, floor, county, num_counties):
    """Varying intercepts and floor slopes, both non-centred: two sets of group
    effects that enter each observation together are not one field."""
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(2.0))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, 10.0))
    sigma_b = numpyro.sample("sigma_b", dist.HalfNormal(2.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(2.0))
    with numpyro.plate("county", num_counties):
        z_a = numpyro.sample("z_a", dist.Normal(0.0, 1.0))
        z_b = numpyro.sample("z_b", dist.Normal(0.0, 1.0))
        a = numpyro.deterministic("a", mu_a + sigma_a * z_a)
        b = numpyro.deterministic("b", mu_b + sigma_b * z_b)
    with numpyro.plate("home", y.shape[0]):
        mean = a[county] + b[county] * floor
        numpyro.sample("y", dist.Normal(mean, sigma_y), obs=y)


def crossed(y, subject, item, num_subjects, num_items):
    """Subjects crossed with items, both sets of effects non-centred."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma_s = numpyro.sample("sigma_s", dist.HalfNormal(2.0))
    sigma_i = numpyro.sample("sigma_i", dist.HalfNormal(2.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(2.0))
    with numpyro.plate("item", num_items):
        z_b = numpyro.sample("z_b", dist.Normal(0.0, 1.0))
        b = numpyro.deterministic("b", sigma_i * z_b)
    with numpyro.plate("subject", num_subjects):
        z_a = numpyro.sample("z_a", dist.Normal(0.0, 1.0))
        a = numpyro.deterministic("a", mu + sigma_s * z_a)
    with numpyro.plate("trial", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[subject] + b[item], sigma_y), obs=y)


def _kernel(x, amplitude, lengthscale):
    d2 = (x[:, None] - x[None, :]) ** 2
    k = amplitude**2 * jnp.exp(-0.5 * d2 / lengthscale**2)
    return k + 1e-6 * jnp.eye(x.shape[0])


def gp_regression(x, y):
    amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 1.0))
    lengthscale = numpyro.sample("lengthscale", dist.InverseGamma(5.0, 5.0))
    noise = numpyro.sample("noise", dist.HalfNormal(1.0))
    f = numpyro.sample(
        "f", dist.MultivariateNormal(0.0, _kernel(x, amplitude, lengthscale))
    )
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(f, noise), obs=y)


def _gp_whitened(x, y, link):
    """The GP models' reference form for NUTS: ``f = L z`` with ``z ~ N(0, I)``."""
    amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 1.0))
    lengthscale = numpyro.sample("lengthscale", dist.InverseGamma(5.0, 5.0))
    noise = numpyro.sample("noise", dist.HalfNormal(1.0)) if link == "normal" else None
    z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([x.shape[0]]).to_event(1))
    f = numpyro.deterministic(
        "f", jnp.linalg.cholesky(_kernel(x, amplitude, lengthscale)) @ z
    )
    with numpyro.plate("obs", y.shape[0]):
        if link == "normal":
            numpyro.sample("y", dist.Normal(f, noise), obs=y)
        else:
            numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def gp_classification(x, y):
    amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 1.0))
    lengthscale = numpyro.sample("lengthscale", dist.InverseGamma(5.0, 5.0))
    f = numpyro.sample(
        "f", dist.MultivariateNormal(0.0, _kernel(x, amplitude, lengthscale))
    )
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)


def stochastic_volatility(y):
    level = numpyro.sample("level", dist.Cauchy(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(0.5))
    h = numpyro.sample("h", dist.GaussianRandomWalk(sigma, num_steps=y.shape[0]))
    with numpyro.plate("day", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, jnp.exp(0.5 * (level + h))), obs=y)


def stochastic_volatility_nc(y):
    """The reference form for NUTS: the random walk's increments non-centred."""
    level = numpyro.sample("level", dist.Cauchy(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(0.5))
    z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([y.shape[0]]).to_event(1))
    h = numpyro.deterministic("h", jnp.cumsum(sigma * z))
    with numpyro.plate("day", y.shape[0]):
        numpyro.sample("y", dist.Normal(0.0, jnp.exp(0.5 * (level + h))), obs=y)


def horseshoe(X, y):
    """A regularised horseshoe logistic regression (Piironen & Vehtari 2017), with
    the coefficients non-centred as their Stan code writes them."""
    d = X.shape[1]
    tau = numpyro.sample("tau", dist.HalfCauchy(0.1))
    c2 = numpyro.sample("c2", dist.InverseGamma(2.0, 8.0))
    with numpyro.plate("coef", d):
        lam = numpyro.sample("lambda", dist.HalfCauchy(1.0))
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
    lam_t = jnp.sqrt(c2 * lam**2 / (c2 + tau**2 * lam**2))
    beta = numpyro.deterministic("beta", tau * lam_t * z)
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 2.0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=alpha + X @ beta), obs=y)


def bnn(x, y, hidden):
    """One hidden layer of tanh units, a Gaussian likelihood."""
    w1 = numpyro.sample("w1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
    w2 = numpyro.sample("w2", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0.0, 1.0))
    noise = numpyro.sample("noise", dist.HalfNormal(1.0))
    # the fitted function at the inputs: unchanged by the network's symmetries (the
    # sign flips and permutations of hidden units), so a reference can pin it down
    mean = numpyro.deterministic("fx", jnp.tanh(x[:, None] * w1 + b1) @ w2 + b2)
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mean, noise), obs=y)


def no_spread(y, group, num_groups):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    with numpyro.plate("group", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma_a))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(a[group], 1.0), obs=y)


# --- the data -----------------------------------------------------------------------------


def _eight_schools_data():
    from jaxvb.models.eight_schools import SIGMA, Y

    return dict(y=jnp.array(Y), sigma=jnp.array(SIGMA))


def _radon_data():
    y, floor, county, _ = data.radon()
    return dict(
        y=jnp.asarray(y),
        floor=jnp.asarray(floor, jnp.float64),
        county=jnp.asarray(county),
        num_counties=int(county.max()) + 1,
    )


def _crossed_data():
    """30 subjects x 20 items, one trial each (simulated, seed 1): scales 0.6 and 0.4
    against a residual sd of 1, as in a small psycholinguistics experiment."""
    rng = np.random.default_rng(1)
    s, i = np.meshgrid(np.arange(30), np.arange(20), indexing="ij")
    s, i = s.ravel(), i.ravel()
    y = (
        1.0
        + rng.normal(0, 0.6, 30)[s]
        + rng.normal(0, 0.4, 20)[i]
        + rng.normal(0, 1, s.size)
    )
    return dict(
        y=jnp.asarray(y),
        subject=jnp.asarray(s),
        item=jnp.asarray(i),
        num_subjects=30,
        num_items=20,
    )


def _gp_data(classify: bool):
    """30 inputs on [0, 10] (simulated, seed 2): a smooth function, observed with noise
    or through a logistic link."""
    rng = np.random.default_rng(2)
    x = np.sort(rng.uniform(0.0, 10.0, 30))
    f = 1.5 * np.sin(x) + 0.5 * np.cos(2.3 * x)
    if classify:
        y = (rng.uniform(size=x.size) < 1.0 / (1.0 + np.exp(-2.0 * f))).astype(float)
    else:
        y = f + rng.normal(0.0, 0.4, x.size)
    return dict(x=jnp.asarray(x), y=jnp.asarray(y))


def _sv_data():
    """The first 100 days of the S&P 500's daily % returns (``jaxvb.data``)."""
    return dict(y=jnp.asarray(data.sp500_returns()[:100]))


def _horseshoe_data():
    """n = 100, d = 20 standardised predictors, three non-zero coefficients (seed 3)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(100, 20))
    beta = np.zeros(20)
    beta[:3] = (2.0, -1.5, 1.0)
    y = (rng.uniform(size=100) < 1.0 / (1.0 + np.exp(-(X @ beta)))).astype(float)
    return dict(X=jnp.asarray(X), y=jnp.asarray(y))


def _bnn_data():
    rng = np.random.default_rng(4)
    x = np.sort(rng.uniform(-2.0, 2.0, 40))
    y = np.tanh(2.0 * x) + 0.5 * x + rng.normal(0.0, 0.2, x.size)
    return dict(x=jnp.asarray(x), y=jnp.asarray(y), hidden=4)


def _no_spread_data():
    """8 groups of 10 observations with no spread between groups (seed 5)."""
    rng = np.random.default_rng(5)
    group = np.repeat(np.arange(8), 10)
    return dict(
        y=jnp.asarray(rng.normal(0.5, 1.0, 80)), group=jnp.asarray(group), num_groups=8
    )


class Spec(NamedTuple):
    title: str
    model: Callable
    data: Callable
    #: ``jaxvb.numpyro.fit``'s arguments: the route the NumPyro guide recommends
    route: dict
    #: the sites scored (each scalar of each)
    report: tuple[str, ...]
    #: sites the reference's NUTS non-centres (``LocScaleReparam``)
    decentre: tuple[str, ...] = ()
    #: the reference's own form of the model for NUTS, where it is not ``model``
    reference: Callable | None = None


MODELS = {
    "eight_schools_centered": Spec(
        "Eight schools, centred (latent='theta')",
        eight_schools,
        _eight_schools_data,
        dict(latent="theta"),
        ("mu", "tau", "theta"),
        ("theta",),
    ),
    "eight_schools_noncentered": Spec(
        "Eight schools, non-centred (dense)",
        eight_schools_nc,
        _eight_schools_data,
        dict(),
        ("mu", "tau", "theta"),
    ),
    "radon_intercepts": Spec(
        "Radon, varying intercepts (latent='a')",
        radon_intercepts,
        _radon_data,
        dict(latent="a"),
        ("mu_a", "sigma_a", "b", "sigma_y", "a"),
        ("a",),
    ),
    "radon_slopes": Spec(
        "Radon, varying intercepts and slopes (non-centred, dense)",
        radon_slopes,
        _radon_data,
        dict(),
        ("mu_a", "sigma_a", "mu_b", "sigma_b", "sigma_y", "a", "b"),
    ),
    "crossed": Spec(
        "Crossed random effects, 30 x 20 (non-centred, dense)",
        crossed,
        _crossed_data,
        dict(),
        ("mu", "sigma_s", "sigma_i", "sigma_y", "a", "b"),
    ),
    "gp_regression": Spec(
        "GP regression, 30 points (latent='f')",
        gp_regression,
        lambda: _gp_data(classify=False),
        dict(latent="f"),
        ("amplitude", "lengthscale", "noise", "f"),
        reference=functools.partial(_gp_whitened, link="normal"),
    ),
    "gp_classification": Spec(
        "GP classification, 30 points (latent='f')",
        gp_classification,
        lambda: _gp_data(classify=True),
        dict(latent="f"),
        ("amplitude", "lengthscale", "f"),
        reference=functools.partial(_gp_whitened, link="bernoulli"),
    ),
    "stochastic_volatility": Spec(
        "Stochastic volatility, S&P 500, 100 days (latent='h')",
        stochastic_volatility,
        _sv_data,
        dict(latent="h"),
        ("level", "sigma", "h"),
        reference=stochastic_volatility_nc,
    ),
    "horseshoe": Spec(
        "Regularised horseshoe logistic regression, d = 20 (dense)",
        horseshoe,
        _horseshoe_data,
        dict(),
        ("tau", "c2", "alpha", "beta"),
    ),
    "bnn": Spec(
        "Bayesian neural network, 4 tanh units (dense)",
        bnn,
        _bnn_data,
        dict(),
        ("b2", "noise", "fx"),
    ),
    "no_spread": Spec(
        "Random effects with no group spread (latent='a')",
        no_spread,
        _no_spread_data,
        dict(latent="a"),
        ("mu", "sigma_a", "a"),
        ("a",),
    ),
}


# --- the reference --------------------------------------------------------------------


def reference_model(spec: Spec):
    """The model NUTS samples: non-centred where ``spec.decentre`` says so."""
    if spec.reference is not None:
        return spec.reference
    if not spec.decentre:
        return spec.model
    config = {site: LocScaleReparam(centered=0) for site in spec.decentre}
    return reparam(spec.model, config=config)


def marginals(draws: dict, sites) -> dict:
    """``{site: (num_draws, size)}`` of the reported sites, flattened per draw."""
    return {s: np.asarray(draws[s], np.float64).reshape(len(draws[s]), -1) for s in sites}


def run_reference(name: str, seed: int) -> dict:
    spec = MODELS[name]
    mcmc = MCMC(
        NUTS(reference_model(spec), target_accept_prob=REFERENCE["target_accept"]),
        num_warmup=REFERENCE["num_warmup"],
        num_samples=REFERENCE["num_samples"],
        num_chains=REFERENCE["num_chains"],
        chain_method="sequential",
        progress_bar=False,
    )
    t0 = time.perf_counter()
    mcmc.run(jax.random.key(seed), **spec.data(), extra_fields=("diverging",))
    wall = time.perf_counter() - t0
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    grouped = mcmc.get_samples(group_by_chain=True)
    sites = {}
    for s in spec.report:
        x = np.asarray(grouped[s], np.float64)
        x = x.reshape(x.shape[0], x.shape[1], -1)
        flat = x.reshape(-1, x.shape[-1])
        sites[s] = dict(
            mean=common.rounded(flat.mean(0)),
            sd=common.rounded(flat.std(0)),
            ess=[
                round(float(effective_sample_size(x[..., j])), 1)
                for j in range(x.shape[-1])
            ],
            r_hat=[
                round(float(split_gelman_rubin(x[..., j])), 4) for j in range(x.shape[-1])
            ],
            # a few draws of each scalar site, for the figure
            draws=common.rounded(flat[:: max(1, len(flat) // 1000), 0], 5)
            if x.shape[-1] == 1
            else None,
        )
    divergent = int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum())
    return dict(
        sites=sites,
        divergences=divergent,
        wall_s=round(wall, 1),
        max_r_hat=max(max(v["r_hat"]) for v in sites.values()),
        min_ess=min(min(v["ess"]) for v in sites.values()),
    )


def write_references(names, seed: int) -> None:
    refs = json.loads(REFS.read_text()) if REFS.exists() else {}
    refs.setdefault("settings", dict(REFERENCE, sampler="numpyro NUTS", seed=seed))
    refs.setdefault("models", {})
    for name in names:
        print(f"reference {name} ...", flush=True)
        refs["models"][name] = run_reference(name, seed)
        r = refs["models"][name]
        print(
            f"  {r['wall_s']} s, max R-hat {r['max_r_hat']}, min ESS {r['min_ess']}, "
            f"{r['divergences']} divergences",
            flush=True,
        )
        REFS.write_text(json.dumps(refs, indent=1) + "\n")


# --- one model in a worker: the fit and NUTS, in the same process -----------------------


def _short_error(err: BaseException) -> dict:
    text = str(err)
    return dict(type=type(err).__name__, message=text[:1500], lines=text.count("\n") + 1)


def run_fit(name: str, num_draws: int, seed: int) -> dict:
    """The recommended route, first call and after compile, and its draws' marginals."""
    spec = MODELS[name]
    kwargs = spec.data()

    def call(i):
        return jaxvb.numpyro.fit(
            spec.model, jax.random.key(seed + i), num_steps=1000, **spec.route, **kwargs
        )

    out = dict(route=dict(spec.route) or "dense (default)")
    t0 = time.perf_counter()
    try:
        res, first = common.timed(call, 0)
    except (jaxvb.FitError, ValueError) as err:  # the library's own refusals
        first = time.perf_counter() - t0  # to the error
        out["error"] = _short_error(err)
        out["first_call_s"] = first
        res = getattr(err, "result", None)
        if res is None:
            return out
    out["first_call_s"] = first
    # after compile: the quicker of two calls with new keys (a verdict can differ
    # between keys, and with it the programs a call runs: the importance weights')
    after = []
    for i in (1, 2):
        try:
            after.append(common.timed(call, i)[1])
        except jaxvb.FitError:
            pass
    out["after_compile_s"] = min(after, default=None)
    out.update(common.status_record(res, length=1500))
    out["message"] = res.message[:1500]
    out["khat"] = float(res.khat)
    out["r_squared"] = float(res.r_squared)
    imp = res.importance(jax.random.key(seed + 7), num_draws)
    out["importance"] = dict(
        khat=float(imp.khat),
        ess=float(imp.ess),
        log_weight_variance=float(imp.log_weight_variance),
    )
    out["importance"]["num_proposals"] = imp.num_proposals
    # the default draws (resampled where k-hat allows), and q's own
    for field, psis in (("sites", None), ("sites_q", False)):
        draws = res.sample(jax.random.key(seed + 7), num_draws, psis=psis)
        m = marginals(draws, spec.report)
        out[field] = {
            s: dict(mean=common.rounded(v.mean(0)), sd=common.rounded(v.std(0)))
            for s, v in m.items()
        }
        if field == "sites":
            out["draws"] = {
                s: common.rounded(v[:1000, 0], 5) for s, v in m.items() if v.shape[1] == 1
            }
    return out


def run_peer(name: str, seed: int) -> dict:
    """NUTS (one chain) on the reference's form, its first run and a second."""
    spec = MODELS[name]
    mcmc = MCMC(NUTS(reference_model(spec)), **PEER, progress_bar=False)

    def call(i):
        mcmc.run(jax.random.key(seed + i), **spec.data())
        return mcmc.last_state

    _, first = common.timed(call, 0)
    _, after = common.timed(call, 1)
    return dict(first_call_s=first, after_compile_s=after, **PEER)


def worker(spec_json: str) -> None:
    task = json.loads(spec_json)
    name, seed = task["name"], task["seed"]
    try:
        fit = run_fit(name, task["num_draws"], seed)
    except Exception as err:  # recorded: a crash is a result too
        fit = dict(crash=_short_error(err), traceback=traceback.format_exc()[-2000:])
    common.emit(dict(fit=fit))
    peer = run_peer(name, seed) if task["nuts"] else None
    common.emit(dict(nuts=peer))


# --- scores and verdicts ----------------------------------------------------------------


def score(fit: dict, ref: dict) -> dict:
    """Worst mean error (in reference sds) and sd ratio range over every reported
    marginal, and the verdict."""
    errors, ratios, worst = [], [], {}
    for s, r in ref["sites"].items():
        got = fit["sites"][s]
        rm, rs = np.asarray(r["mean"]), np.asarray(r["sd"])
        err = np.abs(np.asarray(got["mean"]) - rm) / rs
        ratio = np.asarray(got["sd"]) / rs
        errors.append(err)
        ratios.append(ratio)
        worst[s] = dict(
            mean_error_sd=round(float(err.max()), 3),
            sd_ratio=[round(float(ratio.min()), 3), round(float(ratio.max()), 3)],
        )
    err, ratio = np.concatenate(errors), np.concatenate(ratios)
    accurate = bool(err.max() <= MEAN_TOL and SD_LO <= ratio.min() and ratio.max() <= SD_HI)
    flagged = fit.get("status", 0) != 0 or "error" in fit
    if accurate:
        verdict = "accurate" + (" (flagged)" if flagged else "")
    elif flagged:
        verdict = "flagged"
    else:
        verdict = "silent narrow" if ratio.min() < SD_SILENT else "wrong"
    return dict(
        max_mean_error_sd=round(float(err.max()), 3),
        sd_ratio=[round(float(ratio.min()), 3), round(float(ratio.max()), 3)],
        by_site=worst,
        verdict=verdict,
    )


def verdict(row: dict) -> str:
    fit = row["fit"]
    if "crash" in fit:
        return "crash"
    if "sites" not in fit:
        return "refused"  # an error with no result to score
    return row["score"]["verdict"]


# --- the figure ---------------------------------------------------------------------------

COLOURS = {
    "accurate": "tab:green",
    "accurate (flagged)": "tab:olive",
    "flagged": "tab:orange",
    "refused": "tab:orange",
    "wrong": "tab:red",
    "silent narrow": "tab:red",
    "crash": "black",
    "timeout": "black",
}


def plot(models: dict, path: Path) -> None:
    """Per model: the range of sd ratios of the default draws (coloured by verdict)
    and of ``q``'s own (grey), and the worst mean error; values off the axes are drawn
    at its edge as triangles."""
    lo_x, hi_x, top_err = 0.25, 4.0, 3.0
    fig = common.figure(figsize=(10, 5.2))
    ax1, ax2 = fig.subplots(1, 2, sharey=True, gridspec_kw=dict(width_ratios=(3, 2)))
    names = [n for n, r in models.items() if "score" in r]
    for k, name in enumerate(names):
        r = models[name]
        c = COLOURS[r["verdict"]]
        if "score_q" in r:
            q_lo, q_hi = np.clip(r["score_q"]["sd_ratio"], lo_x, hi_x)
            ax1.plot([q_lo, q_hi], [k + 0.22] * 2, color="0.6", lw=2)
        lo, hi = r["score"]["sd_ratio"]
        ax1.plot(np.clip([lo, hi], lo_x, hi_x), [k, k], color=c, lw=4)
        for v, marker in ((lo, "<"), (hi, ">")):
            if not lo_x <= v <= hi_x:
                ax1.plot(np.clip(v, lo_x, hi_x), k, marker, color=c, ms=8)
        err = r["score"]["max_mean_error_sd"]
        ax2.plot(min(err, top_err), k, ">" if err > top_err else "o", color=c, ms=7)
    for x in (SD_LO, SD_HI):
        ax1.axvline(x, color="grey", ls="--", lw=0.8)
    ax1.axvline(SD_SILENT, color="tab:red", ls=":", lw=0.8)
    ax2.axvline(MEAN_TOL, color="grey", ls="--", lw=0.8)
    ax1.set_xscale("log")
    ax1.minorticks_off()
    ax1.set_xlim(lo_x * 0.9, hi_x * 1.1)
    ax1.set_xticks(
        [0.25, 0.5, 0.7, 1.0, 1.5, 2.0, 4.0], ["0.25", "0.5", "0.7", "1", "1.5", "2", "4"]
    )
    ax2.set_xlim(0.0, top_err * 1.05)
    ax1.set_yticks(range(len(names)), [f"{n} ({models[n]['verdict']})" for n in names])
    ax1.set_xlabel("sd / NUTS sd, range over the marginals (grey: q's own)")
    ax2.set_xlabel("worst |mean error| / NUTS sd")
    ax1.invert_yaxis()
    fig.suptitle(
        "Recommended route against NUTS (green: accurate, orange: flagged, red: wrong)"
    )
    common.save(fig, path)


# --- main -----------------------------------------------------------------------------------


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="eight schools only, short")
    parser.add_argument("--refs", action="store_true", help="write the NUTS references")
    parser.add_argument("--only", nargs="*", default=None, help="a subset of the models")
    parser.add_argument("--no-nuts", action="store_true", help="no NUTS beside the fits")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    settings = dict(QUICK if args.quick else FULL)
    names = tuple(args.only or settings.pop("models", MODELS))
    settings.pop("models", None)
    if args.refs:
        return write_references(names, args.seed)
    refs = json.loads(REFS.read_text())
    out = common.output_dir(args, NAME)
    report = dict(
        description=__doc__.split("\n\n")[0],
        settings=dict(
            settings,
            quick=args.quick,
            seed=args.seed,
            num_steps=1000,
            nuts_beside=None if args.no_nuts else PEER,
            reference=refs["settings"],
            tolerances=dict(mean_sd=MEAN_TOL, sd_ratio=[SD_LO, SD_HI], silent=SD_SILENT),
            dtype="float64",
        ),
        environment=common.environment(),
        models={},
    )
    report["models"] = common.stored_rows(out, NAME, args.only)
    for name in names:
        print(f"{name} ...", flush=True)
        task = dict(name=name, seed=args.seed, num_draws=settings["num_draws"])
        task["nuts"] = not args.no_nuts
        t0 = time.perf_counter()
        payloads, error = common.run_worker(
            Path(__file__), task, settings["worker_timeout_s"]
        )
        got = {k: v for p in payloads for k, v in p.items()}
        row = dict(title=MODELS[name].title, fit=got.get("fit", {}), nuts=got.get("nuts"))
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        if error:
            row["worker_error"] = error
        if "sites" in row["fit"]:
            row["score"] = score(row["fit"], refs["models"][name])
            q_own = dict(row["fit"], sites=row["fit"]["sites_q"])
            row["score_q"] = score(q_own, refs["models"][name])
        row["verdict"] = "timeout" if not row["fit"] else verdict(row)
        report["models"][name] = row
        s = row.get("score", {})
        print(
            f"  {row['verdict']}: status {row['fit'].get('status')}, khat "
            f"{row['fit'].get('khat')}, sd ratio {s.get('sd_ratio')}, mean error "
            f"{s.get('max_mean_error_sd')}, first {row['fit'].get('first_call_s')} s, "
            f"after {row['fit'].get('after_compile_s')} s",
            flush=True,
        )
        common.write_json(out, NAME, report, indent=1)
    return finish(report, out)


def finish(report: dict, out: Path) -> dict:
    """The targets over every model of ``report``, its JSON and its figure."""
    verdicts = [r["verdict"] for r in report["models"].values()]
    sound = ("accurate", "accurate (flagged)", "flagged", "refused")
    report["targets"] = dict(
        every_model_accurate_or_flagged=dict(
            met=all(v in sound for v in verdicts),
            value=sum(v in sound for v in verdicts),
            of=len(verdicts),
        ),
        no_silent_narrow=dict(met="silent narrow" not in verdicts),
    )
    common.write_json(out, NAME, report, indent=1)
    plot(report["models"], out / f"{NAME}.png")
    common.print_targets(report["targets"])
    return report


if __name__ == "__main__":
    main()
