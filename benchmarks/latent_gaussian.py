"""Latent Gaussian models: ``jaxvb.LatentGaussian`` against NUTS on three public data sets.

Three models with a few hyperparameters ``theta`` and a long latent Gaussian field ``f``
(``jaxvb.LatentGaussian``: ``q(theta) q(f | theta)``, the exact prior times Gaussian
sites), each on real data shipped in ``jaxvb.data`` (provenance in
``jaxvb/data/README.md``):

* ``sv_sp500``: stochastic volatility (Kim, Shephard & Chib 1998; the paper's priors) on
  the last 2500 daily % log-returns of the S&P 500, demeaned; ``f_t = h_t`` the
  log-variance, an AR(1) prior (tridiagonal precision); ``theta = (logit((phi+1)/2),
  log s2, mu = 2 log beta)``. jaxvb fits it with the library's SV model
  (:mod:`jaxvb.models.stochastic_volatility`: ``mu`` in the field, the paper's Beta and
  conditional Inverse-Gamma ``q(theta)``).
* ``lgcp_brambles``: a log-Gaussian Cox process for the 823 bramble canes of Hutchings
  (1979) / Diggle (1983) on a 20 x 20 grid: ``beta0`` plus a Matern-like GMRF (the
  lattice SPDE with ``alpha = 2``), banded precision (``w = 40``); ``theta = (beta0, log
  sigma, log rho)``, jaxvb fitting ``beta0`` as a fixed effect in the field.
* ``glmm_baseball``: a binomial logit-normal random-intercept GLMM for the hits in times
  at bat of 322 hitters in 1986, ``f_j ~ N(beta0 + beta1 x_j, tau^2)`` (diagonal
  precision); ``theta = (beta0, beta1, log tau)``.

For each, in one process: **jaxvb** ``jaxvb.fit(model, theta0, key)`` with the default
diagnostics and without, the first call (compile included) and calls with new keys
after compile; **accuracy** of those fits (10000 draws of each ``q``) and of the
importance-corrected draws against the stored reference; **NUTS** (500 warm-up + 1000
draws, one chain) on the same log joint from the Laplace start's point, its first and
second run; **the plain dense fit** ``jaxvb.fit(log_joint, x0, key)`` over all ``k + T``
coordinates, in a process stopped after a time limit. Then the **scaling** of the banded
case: SV fits of simulated series of length T = 10^3 .. 10^6 after compile (at the
largest T, one call: its first call less JAX's compile seconds).

**References** (``tests/data/latent_<model>_nuts.json``, written by ``--refs``): 4
chains x (1000 warm-up + 5000 draws) of NUTS in the non-centred parametrisation
``f = m(theta) + Q(theta)^{-1/2} z``.

Outputs: ``latent_gaussian.json``, ``latent_gaussian_figures.json`` (densities and latent
bands of the first accuracy fits), ``latent_gaussian_accuracy.png`` and
``latent_gaussian_speed.png``; ``notebooks/latent_gaussian.ipynb`` draws the stored
files with :func:`plot_accuracy`, :func:`plot_speed` and :func:`print_summary`.

Usage::

    python benchmarks/latent_gaussian.py            # full run
    python benchmarks/latent_gaussian.py --quick    # smoke test: the GLMM only
    python benchmarks/latent_gaussian.py --refs     # and new NUTS references
"""

import dataclasses
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import betaln, gammaln

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402
import jaxvb.data  # noqa: E402
from jaxvb import linalg  # noqa: E402
from jaxvb.linalg import Arrowhead, Banded  # noqa: E402

NAME = "latent_gaussian"
REFERENCES = common.ROOT / "tests" / "data"
_LOG_2PI = math.log(2.0 * math.pi)


# --- the three models ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Problem:
    """One latent Gaussian model on one data set, and how it is reported.

    Attributes:
      name, title: the key in the results (and the reference's file name); one line.
      model, theta0: the reference's :class:`jaxvb.LatentGaussian` and its start.
      theta_names: names of the unconstrained hyperparameters ``theta``.
      natural: ``theta (n, k) -> {name: (n,)}``, the hyperparameters as reported.
      latent, data: what ``f`` is and where the data come from, in words.
      to_f: ``(theta, z) -> f`` for the non-centred reference, where a faster one than
        the generic :func:`noncentred` exists.
      fit_model, fit_theta0, to_reference: the model jaxvb fits, where it is not
        ``model``: the same posterior with the fixed effects last in the field (a
        ``design``, an arrowhead prior); its start; and ``(theta, f) -> (theta, f)``,
        its draws in ``model``'s layout.
      fit_fn: ``(key, num_steps, **options) -> result`` where jaxvb's fit is not
        ``jaxvb.fit(fit_model, fit_theta0, ...)``; its ``sample`` gives draws in
        ``fit_model``'s layout.
    """

    name: str
    title: str
    model: jaxvb.LatentGaussian
    theta0: jax.Array
    theta_names: tuple[str, ...]
    natural: Callable
    latent: str
    data: str
    to_f: Callable | None = None
    fit_model: jaxvb.LatentGaussian | None = None
    fit_theta0: jax.Array | None = None
    to_reference: Callable | None = None
    fit_fn: Callable | None = None

    @property
    def num_latent(self) -> int:
        return int(self.model.check(self.theta0))

    @property
    def jaxvb_model(self) -> tuple[jaxvb.LatentGaussian, jax.Array]:
        """``(model, theta0)`` of the jaxvb fit."""
        if self.fit_model is None:
            return self.model, self.theta0
        return self.fit_model, self.fit_theta0

    def reference_draws(self, theta, f):
        """jaxvb's draws ``(theta, f)`` in ``model``'s layout."""
        if self.to_reference is None:
            return theta, f
        theta, f = self.to_reference(jnp.asarray(theta), jnp.asarray(f))
        return np.asarray(theta), np.asarray(f)

    @property
    def reference_path(self) -> Path:
        return REFERENCES / f"latent_{self.name}_nuts.json"


# Stochastic volatility: y_t ~ N(0, exp(h_t)), h = mu + v, v an AR(1) with coefficient
# phi and innovation variance s2, stationary start; (phi + 1)/2 ~ Beta(20, 1.5), s2 ~
# Inv-Gamma(5, 0.25), a flat prior on mu = 2 log beta.


def _sv_log_prior(theta):
    u = jax.nn.sigmoid(theta[0])
    # Beta(20, 1.5) on u and Inv-Gamma(5, 0.25) on s2, with the Jacobians of
    # u = sigmoid(theta_0) and s2 = exp(theta_1)
    lp_u = 20.0 * jnp.log(u) + 1.5 * jnp.log1p(-u) - betaln(20.0, 1.5)
    lp_s2 = -5.0 * theta[1] - 0.25 / jnp.exp(theta[1]) + 5.0 * math.log(0.25) - gammaln(5.0)
    return lp_u + lp_s2


def _sv_ar1_band(theta, T):
    """The AR(1) precision of ``v`` in lower band form, and ``log(1 - phi^2)``."""
    phi = 2.0 * jax.nn.sigmoid(theta[0]) - 1.0
    diag = jnp.full(T, 1.0 + phi**2).at[0].set(1.0).at[-1].set(1.0)
    off = jnp.full(T, -phi).at[-1].set(0.0)
    return jnp.stack([diag, off]) / jnp.exp(theta[1]), jnp.log1p(-(phi**2))


def _sv_prior(theta, T):
    """``p(h | theta)``: the AR(1) about ``mu = theta[2]``."""
    return theta[2] * jnp.ones(T), Banded(_sv_ar1_band(theta, T)[0])


def _sv_fixed_prior(theta, T):
    """``p(v, mu | theta)``: the AR(1) and a flat ``mu`` (a zero corner), with the
    AR(1)'s log normaliser."""
    band, log_1m_phi2 = _sv_ar1_band(theta, T)
    log_norm = 0.5 * (log_1m_phi2 - T * theta[1] - T * _LOG_2PI)
    return jnp.zeros(T + 1), Arrowhead(band, jnp.zeros((T, 1)), jnp.zeros((1, 1))), log_norm


def _sv_log_lik(h, y):
    return -0.5 * (_LOG_2PI + h + y * y * jnp.exp(-h))


def _sv_natural(theta):
    return dict(
        phi=2.0 * jax.nn.sigmoid(theta[:, 0]) - 1.0,
        s2=jnp.exp(theta[:, 1]),
        beta=jnp.exp(theta[:, 2] / 2.0),
    )


def sv_model(y, mu_in_field: bool = False) -> tuple[jaxvb.LatentGaussian, jax.Array]:
    """The SV model of a demeaned series ``y`` and its start: ``f = h``; or, with
    ``mu_in_field``, ``f = (v, mu)`` with the sites on ``h_t = v_t + mu``."""
    y = jnp.asarray(y, jnp.float64)
    T = int(y.shape[0])
    model = jaxvb.LatentGaussian(
        log_prior=_sv_log_prior,
        prior=functools.partial(_sv_fixed_prior if mu_in_field else _sv_prior, T=T),
        log_lik=_sv_log_lik,
        data=y,
        design=jnp.ones((T, 1)) if mu_in_field else None,
    )
    theta0 = [2.0, math.log(0.05)]
    if not mu_in_field:
        theta0.append(2.0 * math.log(float(jnp.std(y))))
    return model, jnp.array(theta0)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["fit"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class SVPaperFit:
    """:func:`jaxvb.models.stochastic_volatility.fit`'s result, its draws in the layout of
    :func:`sv_model` with ``mu_in_field``; every other field reads through to the
    :class:`jaxvb.Result`."""

    fit: object

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.fit.result, name)

    def sample(self, key, n):
        d = self.fit.sample(key, n)
        u = 0.5 * (d["phi"] + 1.0)
        theta = jnp.stack([jnp.log(u) - jnp.log1p(-u), jnp.log(d["s2"])], axis=1)
        mu = 2.0 * jnp.log(d["beta"])
        return theta, jnp.concatenate([d["v"], mu[:, None]], axis=1)


def _sv_paper_fit(key, num_steps, y, **options):
    """``stochastic_volatility.fit`` (its own diagnostics; it runs no convergence check)."""
    from jaxvb.models import stochastic_volatility as sv

    options = {k: v for k, v in options.items() if k != "num_check_draws"}
    return SVPaperFit(sv.fit(y, key, num_steps=num_steps, on_failure="ignore", **options))


def _level_last(theta, f, num_fixed: int, at: int):
    """The draws as the reference model's: the field's last ``num_fixed`` values back
    among the hyperparameters at ``at``, ``f`` the linear predictor (one level)."""
    fixed = f[:, -num_fixed:]
    theta = jnp.concatenate([theta[:, :at], fixed, theta[:, at:]], axis=1)
    return theta, f[:, :-num_fixed] + fixed[:, :1]


def sv_problem() -> Problem:
    y = jaxvb.data.sp500_returns()
    model, theta0 = sv_model(y - y.mean())
    fit_model, fit_theta0 = sv_model(y - y.mean(), mu_in_field=True)
    return Problem(
        name="sv_sp500",
        title=f"SV, S&P 500 ({y.shape[0]} days)",
        model=model,
        theta0=theta0,
        theta_names=("logit((phi+1)/2)", "log s2", "mu = 2 log beta"),
        natural=_sv_natural,
        latent="h_t = mu + v_t, the log-variance of day t's return",
        data="jaxvb.data.sp500_returns(): the last 2500 daily % log-returns of the "
        "S&P 500 (2009-01-27 .. 2018-12-31) from the arch package, demeaned",
        fit_model=fit_model,
        fit_theta0=fit_theta0,
        to_reference=functools.partial(_level_last, num_fixed=1, at=2),
        fit_fn=functools.partial(_sv_paper_fit, y=np.asarray(y - y.mean())),
    )


# Log-Gaussian Cox process for the bramble canes: y_c ~ Poisson(|c| exp(f_c)) on the n x
# n cells of the unit square (row-major: the precision is banded, w = 2n), f = beta0 +
# the lattice SPDE (kappa^2 - Laplacian) x = noise, alpha = 2 (Lindgren, Rue & Lindstrom
# 2011): precision tau^2 (kappa^2 h^2 I + L)^2 / h^2, L the 4-neighbour lattice
# Laplacian, h the cell width, marginal sd sigma (tau^2 = 1 / (4 pi kappa^2 sigma^2)),
# range rho = sqrt(8) / kappa. Priors beta0 ~ N(0, 10^2), log sigma ~ N(0, 1),
# log rho ~ N(log 0.1, 1).

LGCP_GRID = 20


def _lattice_laplacian(n: int) -> np.ndarray:
    """The graph Laplacian of the ``n x n`` lattice (row-major cells), dense."""
    lap = np.zeros((n * n, n * n))
    for i in range(n):
        for j in range(n):
            for di, dj in ((1, 0), (0, 1)):
                if i + di < n and j + dj < n:
                    c, d = i * n + j, (i + di) * n + (j + dj)
                    lap[c, d] = lap[d, c] = -1.0
    lap[np.diag_indices(n * n)] = -lap.sum(1)
    return lap


def _lgcp_log_prior(theta):
    return (
        -0.5 * (theta[0] / 10.0) ** 2
        - 0.5 * theta[1] ** 2
        - 0.5 * (theta[2] - math.log(0.1)) ** 2
        - 1.5 * _LOG_2PI
        - math.log(10.0)
    )


def _lgcp_prior(theta, bands, h):
    """``(mean, Q)`` of the field given ``theta``."""
    lap_ab, lap2_ab = bands
    sigma, rho = jnp.exp(theta[1]), jnp.exp(theta[2])
    kh2 = 8.0 * (h / rho) ** 2  # (kappa h)^2
    tau2 = 1.0 / (4.0 * math.pi * (8.0 / rho**2) * sigma**2)
    eye = jnp.zeros_like(lap_ab).at[0].set(1.0)
    ab = tau2 / h**2 * (kh2**2 * eye + 2.0 * kh2 * lap_ab + lap2_ab)
    return theta[0] * jnp.ones(lap_ab.shape[1]), Banded(ab)


def _lgcp_fixed_log_prior(theta):
    """``(log sigma, log rho)``'s prior; ``beta0``'s is in the field's prior."""
    return -0.5 * theta[0] ** 2 - 0.5 * (theta[1] - math.log(0.1)) ** 2 - _LOG_2PI


def _lgcp_fixed_prior(theta, bands, h):
    """``p(g, beta0 | theta)``: the GMRF ``g`` (mean 0) and ``beta0 ~ N(0, 10^2)``."""
    _, q = _lgcp_prior(jnp.concatenate([jnp.zeros(1), theta]), bands, h)
    t = q.ab.shape[1]
    precision = Arrowhead(q.ab, jnp.zeros((t, 1)), jnp.full((1, 1), 1.0 / 100.0))
    return jnp.zeros(t + 1), precision


def _poisson_log_lik(f, data):
    counts, exposure = data
    return counts * (f + jnp.log(exposure)) - exposure * jnp.exp(f) - gammaln(counts + 1.0)


def _lgcp_to_f(theta, z, eig, h):
    """``f = m + Q^{-1/2} z`` in the eigenbasis ``U`` of the lattice Laplacian ``L = U
    diag(lam) U'``: ``Q^{-1/2} = U diag(h / (tau (kappa^2 h^2 + lam))) U'`` (and ``U'z``
    has the law of ``z``)."""
    lam, u = eig
    sigma, rho = jnp.exp(theta[1]), jnp.exp(theta[2])
    kh2 = 8.0 * (h / rho) ** 2
    tau = 1.0 / jnp.sqrt(4.0 * math.pi * (8.0 / rho**2) * sigma**2)
    return theta[0] + u @ (h / (tau * (kh2 + lam)) * z)


def _lgcp_natural(theta):
    return dict(beta0=theta[:, 0], sigma=jnp.exp(theta[:, 1]), rho=jnp.exp(theta[:, 2]))


def lgcp_counts(n: int = LGCP_GRID) -> np.ndarray:
    """Counts of the bramble canes in the ``n x n`` cells, row-major (``y`` rows)."""
    x, y, _ = jaxvb.data.brambles()
    ix = np.minimum((x * n).astype(int), n - 1)
    iy = np.minimum((y * n).astype(int), n - 1)
    return np.bincount(iy * n + ix, minlength=n * n).astype(float)


def lgcp_problem(n: int = LGCP_GRID) -> Problem:
    counts = lgcp_counts(n)
    h = 1.0 / n
    lap = _lattice_laplacian(n)
    bands = tuple(jnp.asarray(linalg.from_dense(a, 2 * n)) for a in (lap, lap @ lap))
    eig = tuple(jnp.asarray(a) for a in np.linalg.eigh(lap))
    data = (jnp.asarray(counts), jnp.full(n * n, h * h))
    model = jaxvb.LatentGaussian(
        log_prior=_lgcp_log_prior,
        prior=functools.partial(_lgcp_prior, bands=bands, h=h),
        log_lik=_poisson_log_lik,
        data=data,
    )
    fit_model = jaxvb.LatentGaussian(
        log_prior=_lgcp_fixed_log_prior,
        prior=functools.partial(_lgcp_fixed_prior, bands=bands, h=h),
        log_lik=_poisson_log_lik,
        data=data,
        design=jnp.ones((n * n, 1)),
    )
    theta0 = jnp.array([math.log(counts.sum()), 0.0, math.log(0.1)])
    return Problem(
        name="lgcp_brambles",
        title=f"LGCP, bramble canes ({n}x{n} grid)",
        model=model,
        theta0=theta0,
        theta_names=("beta0", "log sigma", "log rho"),
        natural=_lgcp_natural,
        latent="f_c = log-intensity of cell c (row-major cells of the unit square)",
        data=f"jaxvb.data.brambles(): the 823 bramble canes (Hutchings 1979; Diggle "
        f"1983) counted in the {n} x {n} cells of the unit square",
        to_f=functools.partial(_lgcp_to_f, eig=eig, h=h),
        fit_model=fit_model,
        fit_theta0=theta0[1:],
        to_reference=functools.partial(_level_last, num_fixed=1, at=0),
    )


# Binomial GLMM for the 1986 batting records: hits_j ~ Binomial(atbat_j, logistic(f_j)),
# f_j ~ N(beta0 + beta1 x_j, tau^2), x_j the standardised log of player j's years in the
# major leagues; priors beta ~ N(0, 2.5^2), tau ~ Half-Normal(1).


def _glmm_log_prior(theta):
    tau = jnp.exp(theta[2])
    log_beta = -0.5 * jnp.sum((theta[:2] / 2.5) ** 2) - _LOG_2PI - 2.0 * math.log(2.5)
    # Half-Normal(1) on tau, with the Jacobian of tau = exp(theta_2)
    log_tau = 0.5 * math.log(2.0 / math.pi) - 0.5 * tau**2 + theta[2]
    return log_beta + log_tau


def _glmm_prior(theta, x):
    var = jnp.exp(2.0 * theta[2])
    return theta[0] + theta[1] * x, Banded(jnp.full((1, x.shape[0]), 1.0 / var))


def _binomial_log_lik(f, data):
    hits, atbat = data
    log_choose = gammaln(atbat + 1.0) - gammaln(hits + 1.0) - gammaln(atbat - hits + 1.0)
    return log_choose + hits * f - atbat * jnp.logaddexp(0.0, f)


def _glmm_natural(theta):
    return dict(beta0=theta[:, 0], beta1=theta[:, 1], tau=jnp.exp(theta[:, 2]))


def glmm_problem() -> Problem:
    hits, atbat, years = jaxvb.data.baseball_1986()
    x = np.log(years.astype(float))
    x = (x - x.mean()) / x.std()
    model = jaxvb.LatentGaussian(
        log_prior=_glmm_log_prior,
        prior=functools.partial(_glmm_prior, x=jnp.asarray(x)),
        log_lik=_binomial_log_lik,
        data=(jnp.asarray(hits, jnp.float64), jnp.asarray(atbat, jnp.float64)),
        # the sites are narrow (hundreds of at-bats each): fewer nodes than the
        # default serve them
        num_quadrature=10,
    )
    return Problem(
        name="glmm_baseball",
        title=f"Binomial GLMM, 1986 batting ({hits.shape[0]} players)",
        model=model,
        theta0=jnp.array([-1.0, 0.0, math.log(0.2)]),
        theta_names=("beta0", "beta1", "log tau"),
        natural=_glmm_natural,
        latent="f_j = logit of player j's batting ability (random intercept + fixed part)",
        data="jaxvb.data.baseball_1986(): hits in times at bat of 322 MLB hitters in "
        "1986 (1988 ASA data exposition; R packages vcd, ISLR), one group per player",
    )


PROBLEMS = {
    "sv_sp500": sv_problem,
    "lgcp_brambles": lgcp_problem,
    "glmm_baseball": glmm_problem,
}


# --- the NUTS references --------------------------------------------------------------------

QUANTILES = (0.025, 0.05, 0.25, 0.5, 0.75, 0.95, 0.975)
THINNED_DRAWS = 2000  # per hyperparameter, stored in the reference for histograms
REFERENCE_SEED = 11
REFERENCE_SETTINGS = dict(num_warmup=1000, num_samples=5000, num_chains=4)


def noncentred(problem: Problem) -> Callable:
    """``(theta, z) -> f = m(theta) + R(theta) z`` with ``R R' = Q(theta)^{-1}`` (``R =
    chol(Q)^{-T}``, banded or dense), so that ``z ~ N(0, I)`` gives ``f ~ p(f | theta)``;
    or the problem's own ``to_f``."""
    if problem.to_f is not None:
        return problem.to_f
    prior = problem.model.prior

    def to_f(theta, z):
        m, precision = prior(theta)
        if isinstance(precision, Banded):
            chol = linalg.cholesky_banded(precision.ab)
            return m + linalg.solve_triangular_banded(chol, z, transpose=True)
        chol = jnp.linalg.cholesky(precision)
        return m + jax.scipy.linalg.solve_triangular(chol, z, lower=True, trans="T")

    return to_f


def noncentred_log_joint(problem: Problem) -> Callable:
    """``u = (theta, z) -> log p(theta, z, y)``, ``problem.model``'s posterior in the
    non-centred parametrisation (:func:`noncentred`)."""
    model, to_f = problem.model, noncentred(problem)
    k = problem.theta0.shape[0]

    def log_joint(u):
        theta, z = u[:k], u[k:]
        f = to_f(theta, z)
        return model.log_prior(theta) - 0.5 * z @ z + jnp.sum(model.log_lik(f, model.data))

    return log_joint


def reference_record(problem: Problem, theta, f, info: dict) -> dict:
    """The stored reference from NUTS draws grouped by chain: ``theta (chains, draws,
    k)``, ``f (chains, draws, T)``; ``info`` the run's ``settings``, ``wall_s``,
    ``commit``, ``num_divergent`` and ``mean_num_steps``."""
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    theta, f = np.asarray(theta, np.float64), np.asarray(f, np.float64)
    natural = problem.natural(jnp.asarray(theta.reshape(-1, theta.shape[-1])))
    params = {
        name: common.draws_summary(np.reshape(v, theta.shape[:2]), QUANTILES, THINNED_DRAWS)
        for name, v in natural.items()
    }
    unconstrained = {
        name: {
            k: v
            for k, v in common.draws_summary(theta[..., i], QUANTILES).items()
            if k != "draws_thinned"
        }
        for i, name in enumerate(problem.theta_names)
    }
    flat_f = f.reshape(-1, f.shape[-1])
    ess_f = np.asarray(effective_sample_size(f))
    r_hat_f = np.asarray(split_gelman_rubin(f))
    summaries = [*params.values(), *unconstrained.values()]
    return dict(
        description=(
            f"NumPyro NUTS reference for {problem.title}: {problem.data}. Model as in "
            "benchmarks/latent_gaussian.py, sampled in the non-centred parametrisation "
            "(theta, z), f = m(theta) + Q(theta)^{-1/2} z; written by "
            "benchmarks/latent_gaussian.py --refs."
        ),
        model=problem.name,
        latent=problem.latent,
        **info,
        r_hat_max=float(max([p["r_hat"] for p in summaries] + [r_hat_f.max()])),
        ess_min=float(min([p["ess"] for p in params.values()] + [ess_f.min()])),
        params=params,
        theta=unconstrained,
        f=dict(
            mean=common.rounded(flat_f.mean(0)),
            sd=common.rounded(flat_f.std(0)),
            q05=common.rounded(np.quantile(flat_f, 0.05, axis=0)),
            q95=common.rounded(np.quantile(flat_f, 0.95, axis=0)),
            ess_min=float(ess_f.min()),
            ess_median=float(np.median(ess_f)),
            r_hat_max=float(r_hat_f.max()),
        ),
    )


def run_reference(problem: Problem, settings: dict = REFERENCE_SETTINGS) -> dict:
    """A long NUTS run on the non-centred model, written to ``problem.reference_path``;
    the chains start near the Laplace start's hyperparameters with ``z = 0``."""
    k = problem.theta0.shape[0]
    to_f = jax.jit(jax.vmap(noncentred(problem)))
    _, q0, _ = problem.model.start(problem.theta0)
    key = jax.random.key(REFERENCE_SEED)
    init = jnp.concatenate([q0.theta.mean, jnp.zeros(problem.num_latent)])
    init = init + 0.1 * jax.random.normal(
        jax.random.fold_in(key, 1), (settings["num_chains"], init.size)
    )
    run = common.nuts(
        jax.jit(noncentred_log_joint(problem)), **settings, chain_method="sequential"
    )
    mcmc, wall_s = common.timed(run, key, init)
    u = np.asarray(mcmc.get_samples(group_by_chain=True))
    extra = mcmc.get_extra_fields()
    f = np.stack(
        [
            np.concatenate(
                [
                    np.asarray(to_f(c[i : i + 1000, :k], c[i : i + 1000, k:]))
                    for i in range(0, len(c), 1000)
                ]
            )
            for c in u
        ]
    )
    info = dict(
        settings=dict(settings, chain_method="sequential", seed=REFERENCE_SEED),
        wall_s=wall_s,
        commit=common.git_state()["commit"],
        num_divergent=int(np.sum(extra["diverging"])),
        mean_num_steps=float(np.mean(extra["num_steps"])),
    )
    record = reference_record(problem, u[..., :k], f, info)
    problem.reference_path.write_text(json.dumps(record) + "\n")
    print(f"{problem.name}: R-hat max {record['r_hat_max']:.4f}", flush=True)
    return record


def read_reference(name: str) -> dict:
    """The stored NUTS reference of model ``name``."""
    return json.loads((REFERENCES / f"latent_{name}_nuts.json").read_text())


# --- jaxvb, NUTS and the dense fit ------------------------------------------------------------

NUM_STEPS = 250
#: The fit as a user calls it (every default), and the iterations alone.
VARIANTS = {
    "diagnostics": {},
    "no_diagnostics": dict(num_eval_draws=2, num_check_draws=0),
}
SAMPLE_CHUNK = 2000  # draws of q per call (each carries a (chunk, T) array of f)
IMPORTANCE = dict(num_theta=2000, num_f=32)


def status_record(res) -> dict:
    return common.status_record(res.fit.result if isinstance(res, SVPaperFit) else res)


def fit_latent(problem: Problem, key, num_steps: int = NUM_STEPS, **options):
    """jaxvb's fit: ``problem.fit_fn``, else ``jaxvb.fit`` of the ``LatentGaussian``."""
    if problem.fit_fn is not None:
        return problem.fit_fn(key, num_steps, **options)
    model, theta0 = problem.jaxvb_model
    return jaxvb.fit(
        model, theta0, key, num_steps=num_steps, on_failure="ignore", **options
    )


def time_latent(problem: Problem, num_steps: int, repeats: int, seed: int = 0):
    """Per variant the first call (the start and the fit compiled, then run) and
    ``repeats`` calls with new keys after compile; the start alone after compile.
    Returns the record and the fits with the default diagnostics (for the accuracy)."""
    out, fits = {}, []
    for variant, options in VARIANTS.items():
        calls = {}

        def call(i, options=options, calls=calls):
            calls[i] = fit_latent(problem, jax.random.key(seed + i), num_steps, **options)
            return calls[i]

        res, timing = common.first_and_after(call, repeats)
        if variant == "diagnostics":
            fits = [(seed + i, calls[i]) for i in range(1, repeats + 1)]
        out[variant] = dict(
            options=options,
            **timing,
            r_squared=float(res.r_squared),
            elbo=float(res.elbo),
            log_evidence=float(res.log_evidence),
            **status_record(res),
        )
    model, theta0 = problem.jaxvb_model
    start = [common.timed(lambda: model.start(theta0)[1])[1] for _ in range(3)]
    out["start_after_compile_s"] = float(np.median(start))
    return out, fits


def draws_of_q(res, key, num_draws: int):
    """``(theta (n, k), f (n, T))`` drawn from a fitted ``q`` in chunks."""
    parts = [
        res.sample(jax.random.fold_in(key, done), min(SAMPLE_CHUNK, num_draws - done))
        for done in range(0, num_draws, SAMPLE_CHUNK)
    ]
    return tuple(np.concatenate([np.asarray(p[i]) for p in parts]) for i in (0, 1))


def summarise(problem: Problem, theta: np.ndarray, f: np.ndarray) -> dict:
    """Moments and quantiles of the hyperparameters (natural scale and ``theta``), and
    the latent field's mean, sd and 5%/95% quantiles, from draws."""

    def one(x):
        x = np.asarray(x)
        quantiles = {str(q): float(np.quantile(x, q)) for q in QUANTILES}
        return dict(mean=float(x.mean()), sd=float(x.std()), quantiles=quantiles)

    natural = problem.natural(jnp.asarray(theta))
    return dict(
        params={k: one(v) for k, v in natural.items()},
        theta={k: one(theta[:, i]) for i, k in enumerate(problem.theta_names)},
        f=dict(
            mean=f.mean(0),
            sd=f.std(0),
            q05=np.quantile(f, 0.05, axis=0),
            q95=np.quantile(f, 0.95, axis=0),
        ),
    )


def compare(summary: dict, ref: dict) -> dict:
    """``summary`` against the reference: hyperparameter errors in reference sd and sd
    ratios; the latent field's standardised errors and sd ratios."""
    params = {}
    for k, r in ref["params"].items():
        s = summary["params"][k]
        params[k] = dict(
            mean=s["mean"],
            sd=s["sd"],
            mean_error_in_ref_sd=(s["mean"] - r["mean"]) / r["sd"],
            sd_ratio=s["sd"] / r["sd"],
            quantile_error_in_ref_sd={
                q: (s["quantiles"][q] - r["quantiles"][q]) / r["sd"] for q in s["quantiles"]
            },
        )
    theta = {
        k: dict(
            mean_error_in_ref_sd=(summary["theta"][k]["mean"] - r["mean"]) / r["sd"],
            sd_ratio=summary["theta"][k]["sd"] / r["sd"],
        )
        for k, r in ref["theta"].items()
    }
    ref_f = {k: np.asarray(v) for k, v in ref["f"].items() if isinstance(v, list)}
    f = summary["f"]
    err = (np.asarray(f["mean"]) - ref_f["mean"]) / ref_f["sd"]
    ratio = np.asarray(f["sd"]) / ref_f["sd"]
    band = {
        q: float(np.sqrt(np.mean(((np.asarray(f[q]) - ref_f[q]) / ref_f["sd"]) ** 2)))
        for q in ("q05", "q95")
    }
    return dict(
        params=params,
        theta=theta,
        latent=dict(
            rms_standardised_error=float(np.sqrt(np.mean(err**2))),
            max_abs_standardised_error=float(np.abs(err).max()),
            median_sd_ratio=float(np.median(ratio)),
            min_sd_ratio=float(ratio.min()),
            max_sd_ratio=float(ratio.max()),
            rms_quantile_error_in_ref_sd=band,
        ),
    )


def accuracy_of(problem: Problem, res, ref: dict, key, num_draws: int):
    """:func:`compare` for draws of a fitted ``q``; also the summary and ``theta``."""
    theta, f = problem.reference_draws(*draws_of_q(res, key, num_draws))
    summary = summarise(problem, theta, f)
    return compare(summary, ref), summary, theta


def worst_accuracy(fits: list[dict]) -> dict:
    """The worst of several fits' errors against the reference (each target's side)."""
    errs = [abs(p["mean_error_in_ref_sd"]) for f in fits for p in f["params"].values()]
    ratios = [p["sd_ratio"] for f in fits for p in f["params"].values()]
    medians = [f["latent"]["median_sd_ratio"] for f in fits]
    return dict(
        max_abs_mean_error_in_ref_sd=max(errs),
        sd_ratio_range=[min(ratios), max(ratios)],
        max_latent_rms_standardised_error=max(
            f["latent"]["rms_standardised_error"] for f in fits
        ),
        latent_median_sd_ratio_range=[min(medians), max(medians)],
    )


def run_importance(problem: Problem, settings: dict, ref: dict, seed: int = 0) -> dict:
    """The importance-corrected draws (``q.importance_resample``) of the Gaussian-
    ``q(theta)`` fit: first call and a call after compile, k-hat, ESS, and the draws
    against the reference beside the uncorrected ones."""
    model, theta0 = problem.jaxvb_model
    res = jaxvb.fit(
        model,
        theta0,
        jax.random.key(seed + 1),
        num_steps=settings["num_steps"],
        on_failure="ignore",
    )
    n = settings["num_draws"]

    def correct(key):
        return res.q.importance_resample(key, n, warn=False, **IMPORTANCE)

    _, first = common.timed(correct, jax.random.key(seed + 2))
    out, second = common.timed(correct, jax.random.key(seed + 3))
    theta, f = problem.reference_draws(np.asarray(out.theta), np.asarray(out.f))
    acc = compare(summarise(problem, theta, f), ref)
    plain = accuracy_of(problem, res, ref, jax.random.key(seed + 4), n)[0]
    return dict(
        settings=dict(IMPORTANCE, n=n),
        fit_key=seed + 1,
        first_call_s=first,
        run_s=second,
        khat=float(out.khat),
        ess=float(out.ess),
        log_evidence=float(out.log_evidence),
        fit_log_evidence=float(res.log_evidence),
        corrected=acc,
        uncorrected=plain,
        worst=worst_accuracy([acc]),
        worst_uncorrected=worst_accuracy([plain]),
    )


def start_point(problem: Problem):
    """The bound model (a log joint of flat ``x = (theta, f)``) and the Laplace start's
    point: ``q0``'s hyperparameter mean and the conditional mean of ``f`` there."""
    bound, q0, _ = problem.model.start(problem.theta0)
    mean = q0.theta.mean
    return bound, jnp.concatenate([mean, q0.conditional(mean)[0]])


def time_nuts(problem: Problem, settings: dict, ref: dict, seed: int = 0) -> dict:
    """NUTS on the centred log joint ``bound(x)`` from the Laplace start's point: the
    first run (compile included) and a second run of the same ``MCMC`` object; the
    second run's draws against the reference."""
    bound, x0 = start_point(problem)
    k = problem.theta0.shape[0]
    run = common.nuts(bound, **settings["nuts"])
    _, first = common.timed(run, jax.random.key(seed), x0)
    mcmc, second = common.timed(run, jax.random.key(seed + 1), x0)
    draws, extra = np.asarray(mcmc.get_samples()), mcmc.get_extra_fields()
    return dict(
        settings=settings["nuts"],
        start="the Laplace start's point (q0's theta mean, E[f | theta] there)",
        first_call_s=first,
        run_s=second,
        mean_num_steps=float(np.mean(extra["num_steps"])),
        num_divergent=int(np.sum(extra["diverging"])),
        vs_reference=compare(summarise(problem, draws[:, :k], draws[:, k:]), ref),
    )


def worker(spec: dict) -> dict:
    """The plain ``jaxvb.fit(log_joint, x0, key)`` of the flat posterior (a dense
    Gaussian over ``(theta, f)``, the Laplace start at ``x0``): the first call, and a
    second when the first was quick. Where it raises (no joint mode), what it raised,
    then the same fit from ``N(x0, diag(v0))``, ``v0`` the structured start's marginal
    variances (the dense family's best chance)."""
    problem = PROBLEMS[spec["problem"]]()
    ref = read_reference(problem.name)
    bound, x0 = start_point(problem)
    k = problem.theta0.shape[0]

    def log_joint(x):  # a plain function: given the bound model, fit would start it
        return bound(x)

    def fit(q0, i):
        return jaxvb.fit(
            log_joint,
            q0,
            jax.random.key(i),
            num_steps=spec["num_steps"],
            on_failure="ignore",
        )

    def timed_fits(q0) -> dict:
        res, first = common.timed(fit, q0, 0)
        out = dict(first_call_s=first, run_s=None)
        if first < spec["second_call_under_s"]:
            res, out["run_s"] = common.timed(fit, q0, 1)
        out.update(status_record(res), r_squared=float(res.r_squared))
        mean, cov = np.asarray(res.q.mean), np.asarray(res.q.cov)
        out["finite"] = bool(np.all(np.isfinite(mean)) and np.all(np.isfinite(cov)))
        if out["finite"]:
            draws = np.asarray(res.q.sample(jax.random.key(7), (spec["num_draws"],)))
            summary = summarise(problem, draws[:, :k], draws[:, k:])
            out["vs_reference"] = compare(summary, ref)
        return out

    out = dict(num_steps=spec["num_steps"])
    t0 = time.perf_counter()
    try:
        out.update(timed_fits(x0))
    except Exception as err:  # what a user of the plain fit meets: reported, not fatal
        out.update(
            first_call_s=time.perf_counter() - t0,
            raised=f"{type(err).__name__}: {str(err)[:500]}",
        )
        _, q0, _ = bound.start(problem.theta0)
        _, chol, ops = q0.conditional(q0.theta.mean)
        v0 = jnp.concatenate([jnp.diagonal(q0.theta.cov), ops.marginal_var(chol)])
        out["from_gaussian_start"] = dict(
            q0="N(x0, diag(v0)), v0 the structured start's marginal variances",
            **timed_fits(jaxvb.Gaussian(mean=x0, cov=jnp.diag(v0))),
        )
    return out


def run_dense(problem: Problem, settings: dict) -> dict:
    """:func:`worker` in a fresh process, stopped after a time limit: the dense fit's
    cost grows as ``(k + T)^3`` per step."""
    spec = dict(problem=problem.name, **settings["dense"])
    timeout = settings["dense_timeout_s"][problem.name]
    t0 = time.perf_counter()
    rows, error = common.run_worker(__file__, spec, timeout)
    if not rows:
        error = error or "no result"
        return dict(spec, error=error, timed_out=error.startswith("stopped"))
    return dict(rows[-1], process_s=time.perf_counter() - t0)


# --- scaling of the banded case -------------------------------------------------------------

SIMULATION = dict(phi=0.95, s2=0.05, beta=0.65)
SLOPE_TOLERANCE = 0.15  # "about 1"


def run_scaling(settings: dict) -> dict:
    """SV fits (:func:`sv_model`, ``mu`` in the field) of simulated series of length
    ``T`` without diagnostics: the first call and the median after compile; where no
    repeat is asked for (the largest ``T``), the first call less its lowering and XLA
    compile seconds (JAX's compile events; tracing, seconds at most, nests and is left
    out)."""
    from jaxvb.models import stochastic_volatility as sv

    rows = []
    for T in settings["scaling_T"]:
        # Each T compiles its own programs: the earlier ones are dropped first, so that
        # the process's compiled programs do not pile up over the sizes.
        jax.clear_caches()
        y, _ = sv.simulate_with_volatility(jax.random.key(1), T, **SIMULATION)
        model, theta0 = sv_model(y - y.mean(), mu_in_field=True)

        def call(i, model=model, theta0=theta0):
            return jaxvb.fit(
                model,
                theta0,
                jax.random.key(i),
                num_steps=settings["scaling_steps"],
                on_failure="ignore",
                **VARIANTS["no_diagnostics"],
            )

        with common.compile_log() as log:
            res, first = common.timed(call, 0)
        compile_s = sum(s for e, _, s in log if not e.endswith("jaxpr_trace_duration"))
        repeats = settings["scaling_repeats"][T]
        times = [common.timed(call, i)[1] for i in range(1, repeats + 1)]
        row = dict(
            T=T,
            load_average_1min=common.load_average(),
            first_call_s=first,
            compile_s=compile_s,
            run_s=float(np.median(times)) if times else first - compile_s,
            run_estimated=not times,
            first_call_less_compile_s=first - compile_s,
            repeats=repeats,
            **status_record(res),
        )
        rows.append(row)
        print(f"  T = {T:>8d}: after compile {row['run_s']:8.3f} s", flush=True)
    ts, secs = [r["T"] for r in rows], [r["run_s"] for r in rows]
    t, s = np.log10(ts), np.log10(secs)
    return dict(
        simulation=SIMULATION,
        num_steps=settings["scaling_steps"],
        options=VARIANTS["no_diagnostics"],
        rows=rows,
        log_log_slope=common.loglog_slope(ts, secs),
        consecutive_slopes=[
            float((s[i + 1] - s[i]) / (t[i + 1] - t[i])) for i in range(len(t) - 1)
        ],
    )


# --- the run ----------------------------------------------------------------------------------

FULL = dict(
    problems=tuple(PROBLEMS),
    num_steps=NUM_STEPS,
    # the 2500-day SV series settles later than the paper's 945 days
    num_steps_per_problem={"sv_sp500": 1000},
    repeats={"sv_sp500": 3, "lgcp_brambles": 2, "glmm_baseball": 3},
    num_draws=10_000,
    nuts=dict(num_warmup=500, num_samples=1000),
    dense=dict(num_steps=NUM_STEPS, num_draws=10_000, second_call_under_s=30.0),
    dense_timeout_s={"sv_sp500": 120.0, "lgcp_brambles": 120.0, "glmm_baseball": 300.0},
    scaling_T=(10**3, 10**4, 10**5, 10**6),
    scaling_steps=20,
    scaling_repeats={10**3: 3, 10**4: 3, 10**5: 1, 10**6: 0},
)
QUICK = dict(
    problems=("glmm_baseball",),
    num_steps=100,
    repeats={"glmm_baseball": 1},
    num_draws=2000,
    nuts=dict(num_warmup=100, num_samples=100),
    dense=None,  # a process of its own, another start-up and compile
    dense_timeout_s={"glmm_baseball": 120.0},
    scaling_T=(500, 1000),
    scaling_steps=10,
    scaling_repeats={500: 1, 1000: 1},
)
TARGETS = dict(
    mean_error_sd=0.25,
    sd_ratio=(0.7, 1.3),
    latent_rms_error_sd=0.15,
    latent_median_sd_ratio=(0.8, 1.2),
    speedup_after_compile=20.0,
    sv_after_compile_s=1.0,
    slope_tolerance=SLOPE_TOLERANCE,
)


def density_on_grid(ref_param: dict, draws) -> dict:
    """A kernel density estimate of ``draws`` on a grid over the reference's draws."""
    grid, density = common.kde_on_grid(ref_param["draws_thinned"], draws, 200, 0.25)
    return dict(grid=grid, density=density)


def run_problem(problem: Problem, settings: dict, seed: int = 0):
    """One model: the structured fit, its accuracy, NUTS, the dense fit. Returns the
    record and the figures' data."""
    ref = read_reference(problem.name)
    num_steps = settings.get("num_steps_per_problem", {}).get(
        problem.name, settings["num_steps"]
    )
    settings = dict(settings, num_steps=num_steps)
    print(f"{problem.name}: {problem.title}, T = {problem.num_latent}", flush=True)
    load_before = common.load_average()
    timing, fits = time_latent(problem, num_steps, settings["repeats"][problem.name], seed)
    accuracy, figure = [], None
    for key, res in fits:
        acc, summary, theta = accuracy_of(
            problem, res, ref, jax.random.key(1000 + key), settings["num_draws"]
        )
        accuracy.append(
            dict(key=key, **status_record(res), r_squared=float(res.r_squared), **acc)
        )
        if figure is None:
            natural = problem.natural(jnp.asarray(theta))
            figure = dict(
                key=key,
                densities={
                    k: density_on_grid(ref["params"][k], v) for k, v in natural.items()
                },
                f={q: common.rounded(summary["f"][q], 6) for q in ("mean", "q05", "q95")},
            )
    importance = run_importance(problem, settings, ref, seed)
    nuts = time_nuts(problem, settings, ref, seed)
    dense = None if settings["dense"] is None else run_dense(problem, settings)
    kept = ("settings", "wall_s", "r_hat_max", "ess_min", "num_divergent", "mean_num_steps")
    reference = {k: ref[k] for k in kept}
    reference["path"] = os.path.relpath(problem.reference_path, common.ROOT)
    reference["params"] = {
        k: {f: p[f] for f in ("mean", "sd", "ess", "r_hat", "mean_mc_error")}
        for k, p in ref["params"].items()
    }
    reference["f"] = {k: ref["f"][k] for k in ("ess_min", "ess_median", "r_hat_max")}
    record = dict(
        title=problem.title,
        num_steps=num_steps,
        data=problem.data,
        latent_field=problem.latent,
        num_latent=problem.num_latent,
        num_hyper=int(problem.theta0.shape[0]),
        # jaxvb's theta: the hyperparameters less the fixed effects in its field
        jaxvb_num_hyper=int(problem.jaxvb_model[1].shape[0]),
        theta_names=list(problem.theta_names),
        reference=reference,
        jaxvb=timing,
        accuracy=dict(
            num_draws=settings["num_draws"], fits=accuracy, worst=worst_accuracy(accuracy)
        ),
        nuts=nuts,
        dense=dense,
        importance=importance,
        # other processes slow every timing: the load before and after this model
        load_average_1min=dict(before=load_before, after=common.load_average()),
    )
    print_summary(dict(problems={problem.name: record}), ("accuracy", "speed"))
    return record, figure


def targets(problems: dict, scaling: dict | None) -> dict:
    """Each target, met or not, from the measurements."""
    t = TARGETS
    lo, hi = t["sd_ratio"]
    mlo, mhi = t["latent_median_sd_ratio"]
    out = {}
    for name, p in problems.items():
        w, imp = p["accuracy"]["worst"], p["importance"]
        default, bare = p["jaxvb"]["diagnostics"], p["jaxvb"]["no_diagnostics"]
        speedup = p["nuts"]["run_s"] / default["run"]["median_s"]
        bare_speedup = p["nuts"]["run_s"] / bare["run"]["median_s"]
        out[name] = dict(
            hyper_means=dict(
                target=f"|mean - NUTS mean| <= {t['mean_error_sd']} NUTS sd, every "
                "hyperparameter (natural scale), every accuracy fit",
                value=w["max_abs_mean_error_in_ref_sd"],
                met=w["max_abs_mean_error_in_ref_sd"] <= t["mean_error_sd"],
            ),
            hyper_means_importance_corrected=dict(
                target=f"(beside hyper_means) |mean - NUTS mean| <= {t['mean_error_sd']} "
                "NUTS sd for the importance-corrected draws of one fit, trusted only "
                "where their k-hat <= 0.7",
                value=imp["worst"]["max_abs_mean_error_in_ref_sd"],
                khat=imp["khat"],
                sd_ratio_range=imp["worst"]["sd_ratio_range"],
                extra_s_after_compile=imp["run_s"],
                met=imp["worst"]["max_abs_mean_error_in_ref_sd"] <= t["mean_error_sd"]
                and imp["khat"] <= 0.7,
            ),
            hyper_sd_ratios=dict(
                target=f"sd / NUTS sd in [{lo}, {hi}], every hyperparameter and fit",
                value=w["sd_ratio_range"],
                met=lo <= w["sd_ratio_range"][0] and w["sd_ratio_range"][1] <= hi,
            ),
            latent_rms_error=dict(
                target=f"rms over t of (E f_t - NUTS E f_t) / NUTS sd_t <= "
                f"{t['latent_rms_error_sd']}, every fit",
                value=w["max_latent_rms_standardised_error"],
                met=w["max_latent_rms_standardised_error"] <= t["latent_rms_error_sd"],
            ),
            latent_median_sd_ratio=dict(
                target=f"median over t of sd(f_t) / NUTS sd in [{mlo}, {mhi}], every fit",
                value=w["latent_median_sd_ratio_range"],
                met=mlo <= w["latent_median_sd_ratio_range"][0]
                and w["latent_median_sd_ratio_range"][1] <= mhi,
            ),
            speedup_after_compile=dict(
                target=f">= {t['speedup_after_compile']:g}x: NUTS "
                f"({p['nuts']['settings']['num_warmup']} + "
                f"{p['nuts']['settings']['num_samples']}) after compile over the default "
                "jaxvb fit (with diagnostics) after compile",
                value=speedup,
                without_diagnostics=bare_speedup,
                met=speedup >= t["speedup_after_compile"],
                met_without_diagnostics=bare_speedup >= t["speedup_after_compile"],
            ),
            first_call_quicker=dict(
                target="the first jaxvb fit (compile included) returns before NUTS's "
                "first run (compile included)",
                value=dict(
                    jaxvb_s=default["first_call_s"], nuts_s=p["nuts"]["first_call_s"]
                ),
                met=default["first_call_s"] < p["nuts"]["first_call_s"],
            ),
        )
    if "sv_sp500" in problems:
        sv_fit = problems["sv_sp500"]["jaxvb"]
        value = sv_fit["diagnostics"]["run"]["median_s"]
        bare = sv_fit["no_diagnostics"]["run"]["median_s"]
        out["sv_2500_days_after_compile"] = dict(
            target=f"<= {t['sv_after_compile_s']:g} s: the default fit of the 2500-day "
            f"series after compile, {problems['sv_sp500']['num_steps']} steps",
            value=value,
            without_diagnostics=bare,
            start_alone=sv_fit["start_after_compile_s"],
            met=value <= t["sv_after_compile_s"],
            met_without_diagnostics=bare <= t["sv_after_compile_s"],
        )
    if scaling:
        out["scaling_slope"] = dict(
            target=f"log-log slope of the SV fit's time after compile against T within "
            f"1 +- {t['slope_tolerance']} over T = {[r['T'] for r in scaling['rows']]}",
            value=scaling["log_log_slope"],
            met=abs(scaling["log_log_slope"] - 1.0) <= t["slope_tolerance"],
        )
    return out


# --- tables and figures ---------------------------------------------------------------------


SECTIONS = ("accuracy", "speed", "scaling", "targets")


def dense_line(d: dict) -> str:
    """What the plain dense fit did, in one line."""
    if "error" in d:
        return f"dense jaxvb.fit: {d['error']}"

    def timing(r):
        run = f", after compile {r['run_s']:.2f} s" if r.get("run_s") is not None else ""
        return f"first call {r['first_call_s']:.1f} s{run}, {r['flags']}"

    if "raised" in d:
        return (
            f"dense jaxvb.fit: raised after {d['first_call_s']:.1f} s "
            f"({d['raised'][:70]}...); from N(x0, diag(v0)): "
            + timing(d["from_gaussian_start"])
        )
    return f"dense jaxvb.fit, {d['num_steps']} steps: {timing(d)}"


def _print_accuracy(p: dict):
    fit, ref = p["accuracy"]["fits"][0], p["reference"]
    print(
        f"{p['title']}  [NUTS R-hat max {ref['r_hat_max']:.4f}, ESS min {ref['ess_min']:.0f}]"
    )
    print(
        f"  {'param':8s} {'jaxvb mean':>11s} {'NUTS mean':>11s} {'err/sd':>8s} "
        f"{'sd ratio':>9s}   (timed NUTS: err/sd, sd ratio)   (dense)"
    )
    d = p.get("dense") or {}
    dense = d.get("vs_reference") or (d.get("from_gaussian_start") or {}).get(
        "vs_reference"
    )
    for k, a in fit["params"].items():
        n = p["nuts"]["vs_reference"]["params"][k]
        line = (
            f"  {k:8s} {a['mean']:11.4f} {ref['params'][k]['mean']:11.4f} "
            f"{a['mean_error_in_ref_sd']:+8.3f} {a['sd_ratio']:9.3f}   "
            f"({n['mean_error_in_ref_sd']:+7.3f}, {n['sd_ratio']:6.3f})"
        )
        if dense:
            dk = dense["params"][k]
            line += f"   ({dk['mean_error_in_ref_sd']:+.2f}, {dk['sd_ratio']:.2f})"
        print(line)
    lat = fit["latent"]
    nuts_rms = p["nuts"]["vs_reference"]["latent"]["rms_standardised_error"]
    print(
        f"  latent f: rms err {lat['rms_standardised_error']:.3f} sd (max "
        f"{lat['max_abs_standardised_error']:.3f}), sd ratio median "
        f"{lat['median_sd_ratio']:.3f} ({lat['min_sd_ratio']:.2f}-{lat['max_sd_ratio']:.2f});"
        f" NUTS centred: rms {nuts_rms:.3f}"
    )
    w = p["accuracy"]["worst"]
    print(
        f"  worst of {len(p['accuracy']['fits'])} fits: |err| "
        f"{w['max_abs_mean_error_in_ref_sd']:.3f} sd, sd ratios "
        f"{w['sd_ratio_range'][0]:.3f}-{w['sd_ratio_range'][1]:.3f}, latent rms "
        f"{w['max_latent_rms_standardised_error']:.3f}, latent median sd ratio "
        f"{w['latent_median_sd_ratio_range'][0]:.3f}-"
        f"{w['latent_median_sd_ratio_range'][1]:.3f}"
    )


def _print_speed(p: dict):
    load = p.get("load_average_1min") or {}
    print(
        f"{p['title']}  [1-min load average {load.get('before') or 0:.1f} before, "
        f"{load.get('after') or 0:.1f} after]"
    )
    for variant in VARIANTS:
        r = p["jaxvb"][variant]
        print(
            f"  jaxvb {p['num_steps']} steps, {variant:15s} {r['first_call_s']:10.2f} "
            f"{r['run']['median_s']:13.3f}   {r['flags']}"
        )
    print(
        f"  {'  (the Laplace start alone)':43s} {p['jaxvb']['start_after_compile_s']:13.3f}"
    )
    n = p["nuts"]
    print(
        f"  NUTS {n['settings']['num_warmup']}+{n['settings']['num_samples']} (centred)"
        f"{'':19s} {n['first_call_s']:10.2f} {n['run_s']:13.3f}   "
        f"{n['mean_num_steps']:.0f} steps/draw, {n['num_divergent']} divergent"
    )
    if p.get("dense") is not None:
        print("  " + dense_line(p["dense"]))


def print_summary(report: dict, sections=SECTIONS):
    """Print the report's tables: ``sections`` of accuracy, speed, scaling, targets."""
    problems = report["problems"]
    if "accuracy" in sections:
        print(
            "\n== accuracy against the NUTS reference (first accuracy fit; worst of all) =="
        )
        for p in problems.values():
            _print_accuracy(p)
    if "speed" in sections:
        print("\n== speed (seconds; after compile = median of repeated calls) ==")
        print(f"{'':45s} {'first call':>10s} {'after compile':>13s}")
        for p in problems.values():
            _print_speed(p)
    if "scaling" in sections and report.get("scaling"):
        sc = report["scaling"]
        print(f"\n== scaling: SV, simulated, {sc['num_steps']} steps, no diagnostics ==")
        for r in sc["rows"]:
            est = " (first call less compile)" if r["run_estimated"] else ""
            print(
                f"  T = {r['T']:>8d}: first call {r['first_call_s']:8.2f} s, after compile "
                f"{r['run_s']:8.3f} s{est}"
            )
        print(f"  log-log slope {sc['log_log_slope']:.3f}")
    if "targets" in sections:
        print("\n== targets ==")
        common.print_targets(report["targets"])


def plot_accuracy(report: dict, figures: dict, path=None):
    """Per model (rows): each hyperparameter's density under jaxvb's ``q`` against the
    reference's histogram, and the latent field's means, jaxvb against NUTS."""
    names = list(figures)
    fig = common.figure(figsize=(15, 3.4 * len(names)))
    axes = np.atleast_2d(fig.subplots(len(names), 4))
    for row, name in zip(axes, names, strict=True):
        ref = read_reference(name)
        p = report["problems"][name]
        first = p["accuracy"]["fits"][0]
        for ax, (k, d) in zip(row[:3], figures[name]["densities"].items(), strict=True):
            nuts = ref["params"][k]["draws_thinned"]
            ax.hist(nuts, bins=40, density=True, color="0.75", label="NUTS")
            ax.plot(d["grid"], d["density"], color="C0", lw=1.8, label="jaxvb")
            acc = first["params"][k]
            ax.set_title(
                f"{k}: err {acc['mean_error_in_ref_sd']:+.2f} sd, sd x{acc['sd_ratio']:.2f}",
                fontsize=9,
            )
            ax.set_yticks([])
        row[0].set_ylabel(p["title"], fontsize=9)
        row[0].legend(frameon=False, fontsize=8)
        ax = row[3]
        nuts_mean = np.asarray(ref["f"]["mean"])
        mine, lo, hi = (np.asarray(figures[name]["f"][q]) for q in ("mean", "q05", "q95"))
        ax.errorbar(
            nuts_mean,
            mine,
            yerr=[mine - lo, hi - mine],
            fmt="none",
            ecolor="C0",
            alpha=0.15,
        )
        ax.plot(nuts_mean, mine, ".", ms=2, color="C0")
        span = [nuts_mean.min(), nuts_mean.max()]
        ax.plot(span, span, color="k", lw=0.7)
        lat = first["latent"]
        ax.set_title(
            f"E f_t (90% band): rms err {lat['rms_standardised_error']:.3f} sd, "
            f"sd x{lat['median_sd_ratio']:.2f}",
            fontsize=9,
        )
        ax.set_xlabel("NUTS", fontsize=8)
        ax.set_ylabel("jaxvb", fontsize=8)
    fig.suptitle("jaxvb.LatentGaussian against long NUTS runs")
    return common.save(fig, path, dpi=110)


def _dense_outcome(report: dict, name: str) -> tuple[float | None, str]:
    """Seconds the plain dense fit ran and how it ended, for the speed figure."""
    d = report["problems"][name].get("dense")
    if d is None or ("error" in d and not d.get("timed_out")):
        return None, "error" if d else ""
    if d.get("timed_out"):
        return report["settings"]["dense_timeout_s"][name], "stopped"
    if "raised" in d:
        return d["first_call_s"], "raised"
    return d["first_call_s"], "flagged" if d["flags"] != "OK" else ""


def plot_speed(report: dict, path=None):
    """Seconds per method and model (first call and after compile; the plain dense fit
    until it returned, raised or was stopped), and the SV fit's scaling in ``T``."""
    fig = common.figure(figsize=(13, 4.6))
    ax, ax_scaling = fig.subplots(1, 2)
    names = list(report["problems"])
    bars = [
        (
            "jaxvb first call",
            "C0",
            "//",
            lambda n, p: p["jaxvb"]["diagnostics"]["first_call_s"],
        ),
        (
            "jaxvb after compile",
            "C0",
            "",
            lambda n, p: p["jaxvb"]["diagnostics"]["run"]["median_s"],
        ),
        ("NUTS first call", "C3", "//", lambda n, p: p["nuts"]["first_call_s"]),
        ("NUTS after compile", "C3", "", lambda n, p: p["nuts"]["run_s"]),
        ("plain dense jaxvb.fit", "0.5", "xx", lambda n, p: _dense_outcome(report, n)[0]),
    ]
    width = 0.8 / len(bars)
    for j, (label, color, hatch, value) in enumerate(bars):
        shown = [
            (i + (j - len(bars) / 2 + 0.5) * width, v, name)
            for i, name in enumerate(names)
            if (v := value(name, report["problems"][name])) is not None
        ]
        xs, ys = [s[0] for s in shown], [s[1] for s in shown]
        ax.bar(xs, ys, width, color=color, hatch=hatch, edgecolor="white", label=label)
        if label.startswith("plain dense"):
            for x, y, name in shown:
                outcome = _dense_outcome(report, name)[1]
                ax.annotate(outcome, (x, y), fontsize=7, ha="center", va="bottom")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(
        [report["problems"][n]["title"].replace(", ", ",\n", 1) for n in names], fontsize=8
    )
    ax.set_ylabel("seconds")
    ax.legend(frameon=False, fontsize=7)
    ax.grid(alpha=0.3, axis="y", which="both")
    sc = report.get("scaling")
    if sc:
        T = np.array([r["T"] for r in sc["rows"]], float)
        s = np.array([r["run_s"] for r in sc["rows"]])
        label = f"after compile (slope {sc['log_log_slope']:.2f})"
        ax_scaling.loglog(T, s, "o-", label=label)
        first = [r["first_call_s"] for r in sc["rows"]]
        ax_scaling.loglog(T, first, "s:", color="C1", label="first call")
        ax_scaling.loglog(T, s[0] * T / T[0], "--", color="0.6", label="slope 1")
        ax_scaling.set_xlabel("T")
        ax_scaling.set_ylabel(f"seconds per {sc['num_steps']}-step fit (no diagnostics)")
        ax_scaling.legend(frameon=False, fontsize=8)
        ax_scaling.grid(alpha=0.3, which="both")
        ax_scaling.set_title("SV, banded precision: scaling in T", fontsize=9)
    return common.save(fig, path, dpi=110)


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="the GLMM only, short runs")
    parser.add_argument(
        "--refs", action="store_true", help="re-run the long NUTS references first"
    )
    parser.add_argument("--refs-only", action="store_true", help="--refs, then stop")
    parser.add_argument("--problems", nargs="*", default=None, help="a subset of models")
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args(argv)
    if args.worker is not None:
        return common.emit(worker(json.loads(args.worker)))

    settings = dict(QUICK if args.quick else FULL)
    if args.problems:
        settings["problems"] = tuple(args.problems)
    if args.refs or args.refs_only:
        for name in settings["problems"]:
            run_reference(PROBLEMS[name]())
        if args.refs_only:
            return None
    out = common.output_dir(args, NAME)
    env = common.environment()
    t_start = time.perf_counter()
    problems, figures = {}, {}
    for name in settings["problems"]:
        problems[name], figures[name] = run_problem(PROBLEMS[name](), settings, args.seed)
    scaling = None if args.skip_scaling else run_scaling(settings)
    report = dict(
        description=(
            "jaxvb.LatentGaussian (q(theta) q(f | theta), banded or diagonal prior "
            "precision) on three public data sets, against long NUTS references, NUTS "
            "(500 + 1000) on the same log joint, and the plain dense jaxvb.fit; all in "
            "one process (the dense fit in a subprocess with a time limit)."
        ),
        quick=bool(args.quick),
        environment=env,
        settings=dict(settings, variants=VARIANTS, dtype="float64"),
        problems=problems,
        scaling=scaling,
        targets=targets(problems, scaling),
        wall_s=time.perf_counter() - t_start,
        load_average_end=common.load_average(),
    )
    common.write_json(out, NAME, report)
    common.write_json(out, f"{NAME}_figures", figures, indent=None)
    # after the JSON: a plotting error loses no measurement
    plot_accuracy(report, figures, out / f"{NAME}_accuracy.png")
    plot_speed(report, out / f"{NAME}_speed.png")
    print_summary(report, ("scaling", "targets"))
    return report


if __name__ == "__main__":
    main()
