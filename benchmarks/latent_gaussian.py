"""Latent Gaussian models: ``jaxvb.LatentGaussian`` against NUTS on three public data sets.

Three models with a few hyperparameters ``theta`` and a long latent Gaussian field ``f``
(``jaxvb.LatentGaussian``: ``q(theta) q(f | theta)``, the exact prior times Gaussian
sites), each on real data shipped in ``jaxvb.data`` (provenance in
``jaxvb/data/README.md``):

* ``sv_sp500``: stochastic volatility (Kim, Shephard & Chib 1998; the paper's priors) on
  the last 2500 daily % log-returns of the S&P 500 (2009-2018, demeaned), ``f_t = h_t``
  the log-variance, AR(1) prior: tridiagonal precision; reported as ``theta =
  (logit((phi+1)/2), log s2, mu = 2 log beta)``. jaxvb fits it with the library's own SV
  model (:mod:`jaxvb.models.stochastic_volatility`: a ``LatentGaussian`` with ``mu`` in
  the field and the paper's Beta and conditional Inverse-Gamma ``q(theta)``, 1000
  steps), and reports beside it the same ``LatentGaussian`` with a Gaussian ``q(theta)``
  (:func:`sv_model` with ``mu_in_field``; ``gaussian_theta`` in the results).
* ``lgcp_brambles``: a log-Gaussian Cox process for the 823 bramble canes of Hutchings
  (1979) / Diggle (1983) counted on a 20 x 20 grid, ``f_c`` the log-intensity of cell
  ``c``: ``beta0`` plus a Matern-like GMRF (the lattice SPDE with ``alpha = 2``, Lindgren,
  Rue & Lindstrom 2011), precision banded with ``w = 40``; reported as ``theta =
  (beta0, log sigma, log rho)``; jaxvb fits ``beta0`` as a fixed effect in the field
  (``design`` of ones, an arrowhead prior), ``theta = (log sigma, log rho)``.
* ``glmm_baseball``: a binomial logit-normal random-intercept GLMM for the hits in times
  at bat of 322 major-league hitters in 1986, one group per player, ``f_j ~ N(beta0 +
  beta1 x_j, tau^2)`` with ``x_j`` the standardised log years in the majors (diagonal
  precision, ``w = 0``); ``theta = (beta0, beta1, log tau)``.

For each, in one process:

1. **jaxvb** ``jaxvb.fit(model, theta0, key, num_steps=250)`` (the fit of ``Problem.
   fit_model`` or ``Problem.fit_fn`` where given, its draws mapped back to the
   reference's layout by ``Problem.to_reference``), with the default
   diagnostics and without (``num_eval_draws=2, num_check_draws=0``): the first call
   (Laplace start and fit compiled, then run) and the median of calls with new keys
   after compile (each ending in ``block_until_ready``); the Laplace start alone.
2. **Accuracy** of the fits after compile (10000 draws of each ``q``) against the
   stored reference: hyperparameter means in reference sd and sd ratios (natural scale),
   the latent field's rms standardised error ``sqrt(mean_t ((E_q f_t - E f_t) / sd_t)^2)``
   and median sd ratio.
3. **NUTS** (NumPyro, 500 warm-up + 1000 draws, one chain) on the same log joint, the
   centred ``bound(x)`` of ``model.start(theta0)[0]`` at flat ``x = (theta, f)``, from
   the Laplace start's point: the first run (compile included) and a second run of the
   same ``MCMC`` object; its draws against the reference too.
4. **The plain dense fit** ``jaxvb.fit(log_joint, x0, key, num_steps=250)`` with
   ``log_joint(x) = bound(x)``: one Gaussian over all ``k + T`` coordinates from the
   Laplace approximation at ``x0``, in a subprocess stopped after 120 s (300 s for the
   GLMM): its time, status and accuracy, for the users who would try it first. Where it
   raises (no joint mode: the funnel), also the same fit from ``N(x0, diag(v0))``,
   ``v0`` the structured start's marginal variances.

Then the **scaling** of the banded case: SV fits of simulated series (``phi = 0.95,
s2 = 0.05, beta = 0.65``) of length T = 10^3 .. 10^6, 20 steps without diagnostics,
after compile (at T = 10^6, one call of several minutes: its first call less the
lowering and XLA compile seconds of JAX's compile events; T = 10^5 records both, to
check that estimate); the log-log slope. The **targets** section says which of the
issue's targets are met, from these measurements.

**References** (``tests/data/latent_<model>_nuts.json``): one long NumPyro NUTS run per
model, 4 chains x (1000 warm-up + 5000 draws), in the non-centred parametrisation
``f = m(theta) + Q(theta)^{-1/2} z`` of the same posterior (:func:`noncentred`),
written once by ``--refs`` (never in a normal run): means, sds, quantiles, ESS and split
R-hat of the hyperparameters (natural and unconstrained), the latent field's means, sds,
5%/95% quantiles, smallest ESS and largest R-hat.

Outputs (``benchmarks/results/`` unless ``--out``; ``--quick`` writes to a temporary
directory): ``latent_gaussian.json`` (the report), ``latent_gaussian_figures.json`` (the
figures' densities and latent bands), ``latent_gaussian_accuracy.png`` and
``latent_gaussian_speed.png``. ``notebooks/latent_gaussian.ipynb`` draws the figures from
the stored files (:func:`read_result`, :func:`read_figures`, :func:`plot_accuracy`,
:func:`plot_speed`, :func:`print_summary`).

``--quick`` is a smoke test (~40 s on 2 CPUs): the GLMM only, 100 steps, NUTS 100 +
100, the dense fit with 100 steps, scaling at T = 500 and 1000 with 10 steps.
``--replot`` recomputes the targets and redraws the figures from stored results.

Usage::

    python benchmarks/latent_gaussian.py            # full run (~18 minutes on 2 CPUs)
    python benchmarks/latent_gaussian.py --quick    # smoke test
    python benchmarks/latent_gaussian.py --refs     # + new NUTS references (~15 min)
    python benchmarks/latent_gaussian.py --refs-only --problems glmm_baseball
"""

import argparse
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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

from jax.scipy.special import betaln, gammaln  # noqa: E402

import jaxvb.data  # noqa: E402
from jaxvb import linalg  # noqa: E402
from jaxvb.linalg import Arrowhead, Banded  # noqa: E402

REFERENCES = HERE.parent / "tests" / "data"
RESULTS = HERE / "results"
_LOG_2PI = math.log(2.0 * math.pi)


# --- the three models ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Problem:
    """One latent Gaussian model on one data set, and how it is reported.

    Attributes:
      name: short name, the key in the results and the reference's file name.
      title: one line for tables and figures.
      model: the :class:`jaxvb.LatentGaussian`.
      theta0: the start of the hyperparameters, shape ``(k,)``.
      theta_names: names of the unconstrained hyperparameters ``theta``.
      natural: ``theta (n, k) -> {name: (n,)}``, the hyperparameters as reported (on
        their natural scale).
      latent: what ``f`` is, in words.
      data: citation and shape of the data, in words.
      to_f: ``(theta, z) -> f`` for the non-centred NUTS reference, where a faster one
        than the generic :func:`noncentred` exists (``None``: the generic one).
      fit_fn: ``(key, num_steps, **options) -> result`` where jaxvb's fit is not
        ``jaxvb.fit(fit_model, fit_theta0, ...)``: the SV model's, the library's own
        (:mod:`jaxvb.models.stochastic_volatility`, the paper's ``q(theta)`` families);
        its result's ``sample`` gives draws in ``fit_model``'s layout.
      fit_model, fit_theta0, to_reference: the model jaxvb fits, when it is not
        ``model``: the same posterior with the fixed effects (a level, an intercept,
        regression coefficients) last in the field (``design``, an arrowhead prior),
        not in ``theta``; its start; and ``(theta, f) -> (theta, f)``, its draws as
        ``model``'s (the fixed effects back among the hyperparameters, ``f`` the
        linear predictor), for the comparison with the reference.
      closed_form: the same problem with priors that give their log normaliser in
        closed form (no factorisation of ``Q(theta)`` in the log joint, for jaxvb nor
        for NUTS), timed beside this one (:func:`time_closed_form`).
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
    closed_form: object | None = None  # a Problem (its own class: not yet defined here)

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
        """jaxvb's draws ``(theta, f)`` as ``model``'s."""
        if self.to_reference is None:
            return theta, f
        theta, f = self.to_reference(jnp.asarray(theta), jnp.asarray(f))
        return np.asarray(theta), np.asarray(f)

    @property
    def reference_path(self) -> Path:
        return REFERENCES / f"latent_{self.name}_nuts.json"


# Stochastic volatility (Kim, Shephard & Chib 1998; the paper's priors, section 6.1):
# y_t ~ N(0, exp(h_t)), h = mu + v, v an AR(1) with coefficient phi and innovation
# variance s2, stationary start; (phi + 1)/2 ~ Beta(20, 1.5), s2 ~ Inv-Gamma(5, 0.25),
# a flat prior on mu = 2 log beta. theta = (logit((phi + 1)/2), log s2, mu).


def _sv_log_prior(theta):
    u = jax.nn.sigmoid(theta[0])
    s2 = jnp.exp(theta[1])
    # Beta(20, 1.5) on u, times the Jacobian u (1 - u) of u = sigmoid(theta_0)
    lp_u = 20.0 * jnp.log(u) + 1.5 * jnp.log1p(-u) - betaln(20.0, 1.5)
    # Inv-Gamma(5, 0.25) on s2, times the Jacobian s2 of s2 = exp(theta_1)
    lp_s2 = -5.0 * theta[1] - 0.25 / s2 + 5.0 * math.log(0.25) - gammaln(5.0)
    return lp_u + lp_s2


def _sv_ar1_band(theta, T):
    """The AR(1) prior precision of ``v`` (stationary start) in lower band form, and
    ``log(1 - phi^2)``."""
    phi = 2.0 * jax.nn.sigmoid(theta[0]) - 1.0
    diag = jnp.full(T, 1.0 + phi**2).at[0].set(1.0).at[-1].set(1.0)
    off = jnp.full(T, -phi).at[-1].set(0.0)
    return jnp.stack([diag, off]) / jnp.exp(theta[1]), jnp.log1p(-(phi**2))


def _sv_prior(theta, T):
    """``p(h | theta)``, ``h = mu + v``: the AR(1) about ``mu = theta[2]``."""
    band, _ = _sv_ar1_band(theta, T)
    return theta[2] * jnp.ones(T), Banded(band)


def _sv_fixed_prior(theta, T):
    """``p(v, mu | theta)``: ``v`` the AR(1) (mean 0), ``mu`` flat (a zero corner), and
    the constant of that density (the AR(1)'s; ``mu``'s density is 1)."""
    band, log_1m_phi2 = _sv_ar1_band(theta, T)
    log_norm = 0.5 * (log_1m_phi2 - T * theta[1] - T * _LOG_2PI)
    corner = jnp.zeros((1, 1))
    return jnp.zeros(T + 1), Arrowhead(band, jnp.zeros((T, 1)), corner), log_norm


def _sv_log_lik(h, y):
    return -0.5 * (_LOG_2PI + h + y * y * jnp.exp(-h))


def _sv_natural(theta):
    return dict(
        phi=2.0 * jax.nn.sigmoid(theta[:, 0]) - 1.0,
        s2=jnp.exp(theta[:, 1]),
        beta=jnp.exp(theta[:, 2] / 2.0),
    )


def sv_model(y, mu_in_field: bool = False) -> tuple[jaxvb.LatentGaussian, jax.Array]:
    """The SV model of a (demeaned) series ``y`` and its start ``theta0``: ``theta =
    (logit((phi+1)/2), log s2, mu)`` and ``f = h``; or, ``mu_in_field``, ``mu`` last in
    the field, ``f = (v, mu)``, the sites on ``h_t = v_t + mu`` (the paper's
    construction: ``log beta`` is in its field) and ``theta = (logit((phi+1)/2), log
    s2)``."""
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


class SVPaperFit:
    """The result of :func:`jaxvb.models.stochastic_volatility.fit` (the SV model as a
    :class:`jaxvb.LatentGaussian`, with the paper's Beta and conditional Inverse-Gamma
    ``q(theta)``), its draws in the layout of :func:`sv_model` with ``mu_in_field``: ``theta = (logit((phi
    + 1)/2), log s2)``, ``f = (v, mu = 2 log beta)``. Every other field reads through
    to the :class:`jaxvb.Result`."""

    def __init__(self, fit):
        self.fit = fit

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


jax.tree_util.register_pytree_node(
    SVPaperFit, lambda r: ((r.fit,), None), lambda _, c: SVPaperFit(c[0])
)


def _sv_paper_fit(key, num_steps, y, **options):
    """``stochastic_volatility.fit`` with the benchmark's variants (its own default of
    200 diagnostic draws; it never runs the convergence check's draws)."""
    from jaxvb.models import stochastic_volatility as sv

    options = {k: v for k, v in options.items() if k != "num_check_draws"}
    return SVPaperFit(sv.fit(y, key, num_steps=num_steps, on_failure="ignore", **options))


def _level_last(theta, f, num_fixed: int, at: int):
    """``(theta with the field's last num_fixed values inserted at at, f[:n] + X f[n:])``
    for a design of ones (one level): the draws as the reference model's."""
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


# Log-Gaussian Cox process (Moller, Syversveen & Waagepetersen 1998) for the bramble
# canes: the counts y_c of the n x n cells of the unit square, y_c ~ Poisson(|c|
# exp(f_c)), f = beta0 + a Matern-like Gaussian Markov random field, the lattice
# version of the SPDE (kappa^2 - Laplacian) x = noise with alpha = 2 (Lindgren, Rue &
# Lindstrom 2011): precision tau^2 (kappa^2 h^2 I + L)^2 / h^2 with L the lattice graph
# Laplacian (4-neighbour, free boundary) and h the cell width, nominal marginal sd
# sigma (tau^2 = 1 / (4 pi kappa^2 sigma^2)) and range rho = sqrt(8) / kappa. Cells in
# row-major order: the precision is banded, w = 2n. theta = (beta0, log sigma, log rho);
# priors beta0 ~ N(0, 10^2), log sigma ~ N(0, 1), log rho ~ N(log 0.1, 1).

LGCP_GRID = 20


def _lattice_laplacian(n: int) -> np.ndarray:
    """The graph Laplacian ``L`` of the ``n x n`` lattice (row-major cells), dense."""
    lap = np.zeros((n * n, n * n))
    for i in range(n):
        for j in range(n):
            c = i * n + j
            for di, dj in ((1, 0), (0, 1)):
                if i + di < n and j + dj < n:
                    d = (i + di) * n + (j + dj)
                    lap[c, d] = lap[d, c] = -1.0
    lap[np.diag_indices(n * n)] = -lap.sum(1)
    return lap


def _lattice_bands(lap: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower band forms (``2n + 1`` rows) of ``L`` and of ``L @ L``."""
    w = 2 * n
    return (
        np.asarray(linalg.from_dense(lap, w)),
        np.asarray(linalg.from_dense(lap @ lap, w)),
    )


def _lgcp_log_prior(theta):
    return (
        -0.5 * (theta[0] / 10.0) ** 2
        - 0.5 * theta[1] ** 2
        - 0.5 * (theta[2] - math.log(0.1)) ** 2
        - 1.5 * _LOG_2PI
        - math.log(10.0)
    )


def _lgcp_prior(theta, bands, h, lam=None):
    """``(mean, Q)`` of the field given ``theta``, and with ``lam`` (the eigenvalues
    of the lattice Laplacian) the log normaliser too: ``Q = tau^2 / h^2 (kappa^2 h^2
    I + L)^2`` has ``log|Q| = T log(tau^2 / h^2) + 2 sum log(kappa^2 h^2 + lam)``,
    which spares jaxvb the prior's factorisation at every draw (NUTS's non-centred
    parameterisation, :func:`_lgcp_to_f`, uses the same eigenbasis)."""
    lap_ab, lap2_ab = bands
    sigma, rho = jnp.exp(theta[1]), jnp.exp(theta[2])
    kh2 = 8.0 * (h / rho) ** 2  # (kappa h)^2
    tau2 = 1.0 / (4.0 * math.pi * (8.0 / rho**2) * sigma**2)
    eye = jnp.zeros_like(lap_ab).at[0].set(1.0)
    ab = tau2 / h**2 * (kh2**2 * eye + 2.0 * kh2 * lap_ab + lap2_ab)
    mean = theta[0] * jnp.ones(lap_ab.shape[1])
    if lam is None:
        return mean, Banded(ab)
    t = lam.shape[0]
    logdet = t * jnp.log(tau2 / h**2) + 2.0 * jnp.sum(jnp.log(kh2 + lam))
    return mean, Banded(ab), 0.5 * (logdet - t * _LOG_2PI)


def _lgcp_fixed_log_prior(theta):
    """``(log sigma, log rho)``'s prior; ``beta0``'s is in the field's prior."""
    return -0.5 * theta[0] ** 2 - 0.5 * (theta[1] - math.log(0.1)) ** 2 - _LOG_2PI


def _lgcp_fixed_prior(theta, bands, h, lam=None):
    """``p(g, beta0 | theta)``: the GMRF ``g`` (mean 0) and ``beta0 ~ N(0, 10^2)``
    (with ``lam``, the log normaliser too: :func:`_lgcp_prior`)."""
    out = _lgcp_prior(jnp.concatenate([jnp.zeros(1), theta]), bands, h, lam)
    t = out[1].ab.shape[1]
    corner = jnp.full((1, 1), 1.0 / 100.0)
    precision = Arrowhead(out[1].ab, jnp.zeros((t, 1)), corner)
    if lam is None:
        return jnp.zeros(t + 1), precision
    # beta0's N(0, 10^2) factor: log normaliser -log(10) - log(2 pi) / 2
    return jnp.zeros(t + 1), precision, out[2] - math.log(10.0) - 0.5 * _LOG_2PI


def _poisson_log_lik(f, data):
    counts, exposure = data
    return counts * (f + jnp.log(exposure)) - exposure * jnp.exp(f) - gammaln(counts + 1.0)


def _lgcp_to_f(theta, z, eig, h):
    """The LGCP's ``f = m + Q^{-1/2} z`` through the eigenbasis ``U`` of the lattice
    Laplacian ``L = U diag(lam) U'``: ``Q^{-1/2} = U diag(h / (tau (kappa^2 h^2 + lam)))
    U'``, and ``U' z`` has the law of ``z``."""
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


def lgcp_problem(n: int = LGCP_GRID, closed_form: bool = False) -> Problem:
    """The LGCP; ``closed_form``: its priors give their log normaliser from the
    lattice's eigenvalues (``Problem.closed_form``, timed beside the plain one)."""
    counts = lgcp_counts(n)
    h = 1.0 / n
    lap = _lattice_laplacian(n)
    bands = tuple(jnp.asarray(b) for b in _lattice_bands(lap, n))
    eig = tuple(jnp.asarray(a) for a in np.linalg.eigh(lap))
    lam = eig[0] if closed_form else None
    model = jaxvb.LatentGaussian(
        log_prior=_lgcp_log_prior,
        prior=functools.partial(_lgcp_prior, bands=bands, h=h, lam=lam),
        log_lik=_poisson_log_lik,
        data=(jnp.asarray(counts), jnp.full(n * n, h * h)),
    )
    theta0 = jnp.array([math.log(counts.sum()), 0.0, math.log(0.1)])
    fit_model = jaxvb.LatentGaussian(
        log_prior=_lgcp_fixed_log_prior,
        prior=functools.partial(_lgcp_fixed_prior, bands=bands, h=h, lam=lam),
        log_lik=_poisson_log_lik,
        data=model.data,
        design=jnp.ones((n * n, 1)),
    )
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
        closed_form=None if closed_form else lgcp_problem(n, closed_form=True),
    )


# Binomial GLMM (a logit-normal random-intercept model) for the 1986 batting records:
# hits_j ~ Binomial(atbat_j, logistic(f_j)), f_j ~ N(beta0 + beta1 x_j, tau^2), x_j
# the standardised log of player j's years in the major leagues; one group per player.
# theta = (beta0, beta1, log tau); priors beta ~ N(0, 2.5^2), tau ~ Half-Normal(1).


def _glmm_log_prior(theta):
    tau = jnp.exp(theta[2])
    log_beta = -0.5 * jnp.sum((theta[:2] / 2.5) ** 2) - _LOG_2PI - 2.0 * math.log(2.5)
    # Half-Normal(1) on tau, times the Jacobian tau of tau = exp(theta_2)
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
        # the sites are narrow (sd ~0.1 on the logit scale, hundreds of at-bats each):
        # 10 Gauss-Hermite nodes give the default 20's fit to 4e-12 of a posterior sd
        # in two-thirds of the time after compile (quadrature_check in the results)
        num_quadrature=10,
    )
    theta0 = jnp.array([-1.0, 0.0, math.log(0.2)])
    return Problem(
        name="glmm_baseball",
        title=f"Binomial GLMM, 1986 batting ({hits.shape[0]} players)",
        model=model,
        theta0=theta0,
        theta_names=("beta0", "beta1", "log tau"),
        natural=_glmm_natural,
        latent="f_j = logit of player j's batting ability (random intercept + fixed part)",
        data="jaxvb.data.baseball_1986(): hits in times at bat of 322 MLB hitters in "
        "1986 (1988 ASA data exposition; R packages vcd, ISLR), one group per player",
        # beta in the field (design [1, x]; an arrowhead prior, beta's N(0, 2.5^2) in
        # its corner; theta = log tau) fits as well, measured beside this one (250
        # steps, same session): means within 0.014 NUTS sd, sd ratios 0.98-1.02, but
        # 0.127 s after compile against 0.087 s and a first call of 8.8 s against 6.2
        # s, so beta stays among the hyperparameters here
    )


PROBLEMS = {
    "sv_sp500": sv_problem,
    "lgcp_brambles": lgcp_problem,
    "glmm_baseball": glmm_problem,
}


# --- the NUTS references --------------------------------------------------------------------


def noncentred(problem: Problem) -> Callable:
    """``(theta, z) -> f``: the non-centred parametrisation ``f = m(theta) + R(theta) z``
    with ``R R' = Q(theta)^{-1}``, so that ``z ~ N(0, I)`` gives ``f ~ p(f | theta)``.

    ``R = chol(Q)^{-T}`` in general (a banded or dense Cholesky factor); the LGCP's
    lattice precision is diagonal in the fixed eigenbasis of the lattice Laplacian
    (:func:`_lgcp_to_f`), which is ``O(T^2)`` per gradient without a sequential scan.
    """
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
    """``u = (theta, z) -> log p(theta, z, y)``, the same posterior as ``problem.model``
    in the non-centred parametrisation (:func:`noncentred`), for NUTS."""
    model, to_f = problem.model, noncentred(problem)
    k = problem.theta0.shape[0]

    def log_joint(u):
        theta, z = u[:k], u[k:]
        f = to_f(theta, z)
        return (
            model.log_prior(theta)
            - 0.5 * jnp.dot(z, z)
            + jnp.sum(model.log_lik(f, model.data))
        )

    return log_joint


QUANTILES = (0.025, 0.05, 0.25, 0.5, 0.75, 0.95, 0.975)
THINNED_DRAWS = 2000  # per hyperparameter, stored in the reference for histograms
REFERENCE_SEED = 11
REFERENCE_SETTINGS = dict(num_warmup=1000, num_samples=5000, num_chains=4)


def _rounded(a, digits: int = 7) -> list:
    return [float(f"{x:.{digits}g}") for x in np.asarray(a, np.float64).ravel()]


def _summary(x: np.ndarray) -> dict:
    """Moments, quantiles and convergence of draws ``x`` of shape ``(chains, draws)``."""
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    flat = x.reshape(-1)
    ess = float(effective_sample_size(x))
    sd = float(np.std(flat))
    step = max(1, flat.size // THINNED_DRAWS)
    return dict(
        mean=float(np.mean(flat)),
        sd=sd,
        quantiles={str(q): float(np.quantile(flat, q)) for q in QUANTILES},
        ess=ess,
        r_hat=float(split_gelman_rubin(x)),
        mean_mc_error=sd / math.sqrt(ess),
        draws_thinned=_rounded(flat[::step][:THINNED_DRAWS]),
    )


def reference_record(problem: Problem, theta, f, info: dict) -> dict:
    """The stored reference from NUTS draws grouped by chain.

    Args:
      problem: the model.
      theta: ``(chains, draws, k)`` draws of the unconstrained hyperparameters.
      f: ``(chains, draws, T)`` draws of the latent field.
      info: ``settings``, ``wall_s``, ``commit``, ``num_divergent``,
        ``mean_num_steps`` of the run.
    """
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin

    theta, f = np.asarray(theta, np.float64), np.asarray(f, np.float64)
    natural = problem.natural(jnp.asarray(theta.reshape(-1, theta.shape[-1])))
    params = {
        name: _summary(np.asarray(v).reshape(theta.shape[:2]))
        for name, v in natural.items()
    }
    unconstrained = {
        name: {k: v for k, v in _summary(theta[..., i]).items() if k != "draws_thinned"}
        for i, name in enumerate(problem.theta_names)
    }
    flat_f = f.reshape(-1, f.shape[-1])
    ess_f = np.asarray(effective_sample_size(f))
    r_hat_f = np.asarray(split_gelman_rubin(f))
    r_hats = [p["r_hat"] for p in params.values()] + [float(r_hat_f.max())]
    r_hats += [p["r_hat"] for p in unconstrained.values()]
    esss = [p["ess"] for p in params.values()] + [float(ess_f.min())]
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
        r_hat_max=float(max(r_hats)),
        ess_min=float(min(esss)),
        params=params,
        theta=unconstrained,
        f=dict(
            mean=_rounded(flat_f.mean(0)),
            sd=_rounded(flat_f.std(0)),
            q05=_rounded(np.quantile(flat_f, 0.05, axis=0)),
            q95=_rounded(np.quantile(flat_f, 0.95, axis=0)),
            ess_min=float(ess_f.min()),
            ess_median=float(np.median(ess_f)),
            r_hat_max=float(r_hat_f.max()),
        ),
    )


def run_reference(problem: Problem, settings: dict = REFERENCE_SETTINGS, path=None) -> dict:
    """A long NUTS run on the non-centred model, summarised and written to ``path``
    (by default ``problem.reference_path``)."""
    from _common import git_state
    from numpyro.infer import MCMC, NUTS

    k = problem.theta0.shape[0]
    log_joint = jax.jit(noncentred_log_joint(problem))
    to_f = jax.jit(jax.vmap(noncentred(problem)))
    chains = settings["num_chains"]
    # Chains start near the Laplace start's hyperparameters with z = 0, jittered.
    _, q0, _ = problem.model.start(problem.theta0)
    key = jax.random.key(REFERENCE_SEED)
    init = jnp.concatenate([q0.theta.mean, jnp.zeros(problem.num_latent)])
    init = init + 0.1 * jax.random.normal(jax.random.fold_in(key, 1), (chains, init.size))
    mcmc = MCMC(
        NUTS(potential_fn=lambda u: -log_joint(u)),
        num_warmup=settings["num_warmup"],
        num_samples=settings["num_samples"],
        num_chains=chains,
        chain_method="sequential",
        progress_bar=False,
    )
    print(
        f"{problem.name}: NUTS reference {chains} x {settings['num_samples']} after "
        f"{settings['num_warmup']} ...",
        flush=True,
    )
    t0 = time.perf_counter()
    mcmc.run(key, init_params=init, extra_fields=("num_steps", "diverging"))
    u = np.asarray(mcmc.get_samples(group_by_chain=True))
    wall_s = time.perf_counter() - t0
    extra = mcmc.get_extra_fields()
    theta = u[..., :k]
    f = np.stack(
        [
            np.concatenate(
                [
                    np.asarray(
                        to_f(
                            jnp.asarray(c[i : i + 1000, :k]),
                            jnp.asarray(c[i : i + 1000, k:]),
                        )
                    )
                    for i in range(0, c.shape[0], 1000)
                ]
            )
            for c in u
        ]
    )
    info = dict(
        settings=dict(settings, chain_method="sequential", seed=REFERENCE_SEED),
        wall_s=wall_s,
        commit=git_state()["commit"],
        num_divergent=int(np.sum(extra["diverging"])),
        mean_num_steps=float(np.mean(extra["num_steps"])),
    )
    record = reference_record(problem, theta, f, info)
    path = Path(path or problem.reference_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n")
    print(
        f"{problem.name}: {wall_s:.0f} s, R-hat max {record['r_hat_max']:.4f}, ESS min "
        f"{record['ess_min']:.0f}, {info['num_divergent']} divergent; wrote {path}",
        flush=True,
    )
    return record


def read_reference(name: str) -> dict:
    """The stored NUTS reference of model ``name`` (``tests/data/latent_<name>_nuts.json``)."""
    return json.loads((REFERENCES / f"latent_{name}_nuts.json").read_text())


# --- jaxvb: the structured fit --------------------------------------------------------------

NUM_STEPS = 250
#: The fit as a user calls it (every default), and the iterations alone.
VARIANTS = {
    "diagnostics": {},
    "no_diagnostics": dict(num_eval_draws=2, num_check_draws=0),
}
SAMPLE_CHUNK = 2000  # draws of q per call (each carries a (chunk, T) array of f)


def _timed(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def _times(times: list[float]) -> dict:
    return dict(median_s=float(np.median(times)), min_s=float(min(times)), times_s=times)


def status_record(res) -> dict:
    """``res.status`` with its flag names and, when not 0, ``jaxvb.explain``'s text."""
    status = jaxvb.Status(int(res.status))
    out = dict(status=int(status), flags=status.name if status else "OK")
    if status:
        out["explanation"] = jaxvb.explain(
            getattr(getattr(res, "fit", None), "result", res)
        )[:600]
    return out


def fit_latent(
    problem: Problem, key, num_steps: int = NUM_STEPS, gaussian_theta=False, **options
):
    """jaxvb's fit: ``problem.fit_fn`` where there is one (unless ``gaussian_theta``),
    else ``jaxvb.fit`` of the (fixed-effects) ``LatentGaussian``, ``q(theta)``
    Gaussian."""
    if problem.fit_fn is not None and not gaussian_theta:
        return problem.fit_fn(key, num_steps, **options)
    model, theta0 = problem.jaxvb_model
    return jaxvb.fit(
        model,
        theta0,
        key,
        num_steps=num_steps,
        on_failure="ignore",
        **options,
    )


def time_latent(problem: Problem, settings: dict, seed: int = 0):
    """``jaxvb.fit(model, theta0, key)``: per variant the first call (the Laplace start
    and the fit compiled, then run) and ``repeats`` calls with new keys after compile;
    the start alone after compile. Returns the record and the fits after compile with
    the default diagnostics (keys ``seed + 1, ...``), for the accuracy."""
    out, fits = {}, []
    for variant, options in VARIANTS.items():
        res, first = _timed(
            lambda o=options: fit_latent(
                problem, jax.random.key(seed), settings["num_steps"], **o
            )
        )
        times = []
        for i in range(1, settings["repeats"] + 1):
            r, t = _timed(
                lambda i=i, o=options: fit_latent(
                    problem, jax.random.key(seed + i), settings["num_steps"], **o
                )
            )
            times.append(t)
            if variant == "diagnostics":
                fits.append((seed + i, r))
        out[variant] = dict(
            options=options,
            first_call_s=first,
            run=_times(times),
            r_squared=float(res.r_squared),
            elbo=float(res.elbo),
            log_evidence=float(res.log_evidence),
            **status_record(res),
        )
    model, theta0 = problem.jaxvb_model
    start = [_timed(lambda: model.start(theta0)[1])[1] for _ in range(3)]
    out["start_after_compile_s"] = float(np.median(start))
    return out, fits


def time_closed_form(problem: Problem, settings: dict, ref: dict, seed: int = 0):
    """``problem.closed_form``'s default jaxvb fit (:func:`time_latent`'s first call
    and repeats) and NUTS (:func:`time_nuts`) on it, with their speed-up; ``None``
    without one."""
    closed = problem.closed_form
    if closed is None:
        return None

    def run(i):
        return fit_latent(closed, jax.random.key(seed + i), settings["num_steps"])

    res, first = _timed(lambda: run(0))
    times = [_timed(lambda i=i: run(i))[1] for i in range(1, settings["repeats"] + 1)]
    jaxvb_record = dict(first_call_s=first, run=_times(times), **status_record(res))
    nuts = time_nuts(closed, settings, ref, seed)
    return dict(
        jaxvb=jaxvb_record,
        nuts={k: nuts[k] for k in ("first_call_s", "run_s", "mean_num_steps")},
        speedup_after_compile=nuts["run_s"] / jaxvb_record["run"]["median_s"],
    )


def draws_of_q(res, key, num_draws: int):
    """``(theta (n, k), f (n, T))`` drawn from a fitted ``q`` in chunks."""
    thetas, fs = [], []
    for done in range(0, num_draws, SAMPLE_CHUNK):
        n = min(SAMPLE_CHUNK, num_draws - done)
        theta, f = res.sample(jax.random.fold_in(key, done), n)
        thetas.append(np.asarray(theta))
        fs.append(np.asarray(f))
    return np.concatenate(thetas), np.concatenate(fs)


def summarise(problem: Problem, theta: np.ndarray, f: np.ndarray) -> dict:
    """Moments and quantiles of the hyperparameters (natural scale and ``theta``) and
    the latent field's mean, sd and 5%/95% quantiles, from draws."""

    def one(x):
        x = np.asarray(x)
        return dict(
            mean=float(x.mean()),
            sd=float(x.std()),
            quantiles={str(q): float(np.quantile(x, q)) for q in QUANTILES},
        )

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
    """``summary`` against the NUTS reference: hyperparameter errors in reference sd
    and sd ratios; the latent field's standardised errors and sd ratios."""
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
    ref_sd = np.asarray(ref["f"]["sd"])
    f = summary["f"]
    err = (np.asarray(f["mean"]) - np.asarray(ref["f"]["mean"])) / ref_sd
    ratio = np.asarray(f["sd"]) / ref_sd
    band = {
        q: float(
            np.sqrt(np.mean(((np.asarray(f[q]) - np.asarray(ref["f"][q])) / ref_sd) ** 2))
        )
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
    """:func:`compare` for draws of a fitted ``q``; also the summary and the draws of
    ``theta``."""
    theta, f = problem.reference_draws(*draws_of_q(res, key, num_draws))
    summary = summarise(problem, theta, f)
    return compare(summary, ref), summary, theta


# --- NUTS on the same log joint, and the dense Gaussian --------------------------------------


def start_point(problem: Problem):
    """The bound model (a log joint of flat ``x = (theta, f)``) and the Laplace start's
    point: ``q0``'s hyperparameter mean and the conditional mean of ``f`` there."""
    bound, q0, _ = problem.model.start(problem.theta0)
    mean = q0.theta.mean
    return bound, jnp.concatenate([mean, q0.conditional(mean)[0]])


def time_nuts(problem: Problem, settings: dict, ref: dict, seed: int = 0) -> dict:
    """NumPyro NUTS on the centred log joint ``bound(x)``, one chain of ``num_warmup``
    + ``num_samples`` from the Laplace start's point: the first run (compile included)
    and a second run of the same ``MCMC`` object (NumPyro reuses its compiled sampler);
    the second run's draws against the reference."""
    from numpyro.infer import MCMC, NUTS

    bound, x0 = start_point(problem)
    k = problem.theta0.shape[0]
    mcmc = MCMC(
        NUTS(potential_fn=lambda x: -bound(x)),
        progress_bar=False,
        **settings["nuts"],
    )

    def run(key):
        mcmc.run(key, init_params=x0, extra_fields=("num_steps", "diverging"))
        return mcmc.get_samples()

    _, first = _timed(lambda: run(jax.random.key(seed)))
    draws, second = _timed(lambda: run(jax.random.key(seed + 1)))
    extra = mcmc.get_extra_fields()
    draws = np.asarray(draws)
    summary = summarise(problem, draws[:, :k], draws[:, k:])
    return dict(
        settings=settings["nuts"],
        start="the Laplace start's point (q0's theta mean, E[f | theta] there)",
        first_call_s=first,
        run_s=second,
        mean_num_steps=float(np.mean(extra["num_steps"])),
        num_divergent=int(np.sum(extra["diverging"])),
        vs_reference=compare(summary, ref),
    )


def dense_worker(spec: dict) -> dict:
    """The plain ``jaxvb.fit(bound, x0, key)`` on the flat posterior (a dense Gaussian
    over ``(theta, f)``, Laplace start at ``x0``, Algorithm 2): the first call, and a
    second one when the first was quicker than ``spec["second_call_under_s"]``.

    Where the plain call raises (its Laplace search finds no mode: the joint density of
    a hierarchical model has none), what it raised, and then the same fit from
    ``q0 = N(x0, diag(v0))``, ``v0`` the structured start's marginal variances (a start
    a user of the plain fit would not have: the dense family's best chance)."""
    problem = PROBLEMS[spec["problem"]]()
    ref = read_reference(problem.name)
    bound, x0 = start_point(problem)
    k = problem.theta0.shape[0]

    # A plain function: given the bound model itself, jaxvb.fit would call its start()
    # and read the flat x0 as k + T hyperparameters.
    def log_joint(x):
        return bound(x)

    def fit(q0, key):
        return jaxvb.fit(
            log_joint, q0, key, num_steps=spec["num_steps"], on_failure="ignore"
        )

    def timed_fits(q0) -> tuple:
        res, first = _timed(lambda: fit(q0, jax.random.key(0)))
        out = dict(first_call_s=first, run_s=None)
        if first < spec["second_call_under_s"]:
            res, out["run_s"] = _timed(lambda: fit(q0, jax.random.key(1)))
        out.update(status_record(res), r_squared=float(res.r_squared))
        mean, cov = np.asarray(res.q.mean), np.asarray(res.q.cov)
        out["finite"] = bool(np.all(np.isfinite(mean)) and np.all(np.isfinite(cov)))
        if out["finite"]:
            draws = np.asarray(res.q.sample(jax.random.key(7), (spec["num_draws"],)))
            out["vs_reference"] = compare(
                summarise(problem, draws[:, :k], draws[:, k:]), ref
            )
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
        theta = q0.theta.mean
        _, chol, ops = q0.conditional(theta)
        v0 = jnp.concatenate([jnp.diagonal(q0.theta.cov), ops.marginal_var(chol)])
        out["from_gaussian_start"] = dict(
            q0="N(x0, diag(v0)), v0 the structured start's marginal variances",
            **timed_fits(jaxvb.Gaussian(mean=x0, cov=jnp.diag(v0))),
        )
    return out


def run_dense(problem: Problem, settings: dict) -> dict:
    """:func:`dense_worker` in a fresh process, stopped after ``timeout_s``: the dense
    fit's cost grows as ``(k + T)^3`` per step and is not bounded in advance."""
    spec = dict(problem=problem.name, **settings["dense"])
    timeout = settings["dense_timeout_s"][problem.name]
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--dense-worker",
        json.dumps(spec),
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(
            spec,
            error=f"stopped after {timeout:.0f} s (first call not finished)",
            timed_out=True,
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("DENSE ")]
    if proc.returncode or not lines:
        return dict(spec, error=f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
    out = json.loads(lines[-1][len("DENSE ") :])
    out["process_s"] = time.perf_counter() - t0
    return out


# --- scaling of the banded case -------------------------------------------------------------

SIMULATION = dict(phi=0.95, s2=0.05, beta=0.65)
SLOPE_TOLERANCE = 0.15  # "about 1"


def run_scaling(settings: dict) -> dict:
    """SV fits of simulated series of length ``T``: ``scaling_steps`` steps without
    diagnostics, the first call (compile seconds from JAX's compile events) and the
    median after compile; where no repeat is asked for (the largest ``T``), the time
    after compile is the first call less its compile seconds."""
    from _common import compile_log

    from jaxvb.models import stochastic_volatility as sv

    rows = []
    for T in settings["scaling_T"]:
        # Each T compiles its own programs anyway: dropping the earlier ones first keeps
        # jaxvb's guard on the process's memory maps (jaxvb._process.guard_maps) from
        # clearing the caches between this T's first call and its repeats (one run
        # timed a recompile as T = 10^5's "after compile": 16.7 s for 20 steps).
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

        with compile_log() as log:
            res, first = _timed(lambda call=call: call(0))
        # Lowering and XLA's compile: trace events nest (an inner jit's trace is
        # inside its caller's), so they are left out; tracing is seconds at most.
        compile_s = sum(s for e, _, s in log if not e.endswith("jaxpr_trace_duration"))
        repeats = settings["scaling_repeats"][T]
        times = [_timed(lambda i=i, call=call: call(i))[1] for i in range(1, repeats + 1)]
        row = dict(
            T=T,
            load_average_1min=_load(),
            first_call_s=first,
            compile_s=compile_s,
            run_s=float(np.median(times)) if times else first - compile_s,
            run_estimated=not times,
            first_call_less_compile_s=first - compile_s,
            repeats=repeats,
            **status_record(res),
        )
        rows.append(row)
        print(
            f"  T = {T:>8d}: first call {first:7.1f} s (compile {compile_s:.1f} s), "
            f"after compile {row['run_s']:8.3f} s"
            + (" (first call less compile)" if not times else ""),
            flush=True,
        )
    t, s = np.log10(np.array([(r["T"], r["run_s"]) for r in rows], float)).T
    return dict(
        simulation=SIMULATION,
        num_steps=settings["scaling_steps"],
        options=VARIANTS["no_diagnostics"],
        rows=rows,
        log_log_slope=float(np.polyfit(t, s, 1)[0]),
        consecutive_slopes=[
            float((s[i + 1] - s[i]) / (t[i + 1] - t[i])) for i in range(len(t) - 1)
        ],
    )


# --- the run ----------------------------------------------------------------------------------

FULL = dict(
    problems=tuple(PROBLEMS),
    num_steps=NUM_STEPS,
    # the 2500-day SV series: at 250 steps the paper's fit has not settled (s2's mean
    # -0.27 NUTS sd at 250 steps, -0.24 at 1000 and 4000: the approximation's own gap)
    num_steps_per_problem={"sv_sp500": 1000},
    # Fits after compile per problem (each also an accuracy fit); the LGCP's take ~30 s.
    repeats={"sv_sp500": 3, "lgcp_brambles": 2, "glmm_baseball": 3},
    num_draws=10_000,
    nuts=dict(num_warmup=500, num_samples=1000),
    # Tried with 600 s, the dense fits of the SV (d = 2503) and LGCP (d = 403) models
    # did not return; the GLMM's takes ~10 s (its Laplace search fails in ~2 s).
    dense=dict(num_steps=NUM_STEPS, num_draws=10_000, second_call_under_s=30.0),
    dense_timeout_s={"sv_sp500": 120.0, "lgcp_brambles": 120.0, "glmm_baseball": 300.0},
    scaling_T=(10**3, 10**4, 10**5, 10**6),
    scaling_steps=20,
    # T = 10^6 is timed once (minutes): its compile seconds come from JAX's events.
    scaling_repeats={10**3: 3, 10**4: 3, 10**5: 1, 10**6: 0},
)
QUICK = dict(
    problems=("glmm_baseball",),
    num_steps=100,
    repeats={"glmm_baseball": 1},
    num_draws=2000,
    nuts=dict(num_warmup=100, num_samples=100),
    # the plain dense fit runs in a process of its own (another start-up and compile,
    # ~15 s): left out of the quick run, which the test suite runs
    dense=None,
    dense_timeout_s={"glmm_baseball": 120.0},
    # the fits with the default nodes compile another program (~8 s): full runs only
    quadrature_check=False,
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
FIGURES = "latent_gaussian_figures.json"


def density_on_grid(ref_param: dict, draws) -> dict:
    """A Gaussian kernel density estimate of ``draws`` on a grid over the reference's
    thinned NUTS draws."""
    from scipy.stats import gaussian_kde

    nuts = np.asarray(ref_param["draws_thinned"])
    lo, hi = np.quantile(nuts, [0.0005, 0.9995])
    pad = 0.25 * (hi - lo)
    grid = np.linspace(lo - pad, hi + pad, 200)
    density = gaussian_kde(np.asarray(draws))(grid)
    return dict(grid=_rounded(grid, 6), density=_rounded(density, 6))


def run_problem(problem: Problem, settings: dict, seed: int = 0):
    """Everything for one model: the structured fit, its accuracy, NUTS, the dense fit.
    Returns the record and the figures' data."""
    ref = read_reference(problem.name)
    steps = settings.get("num_steps_per_problem", {}).get(problem.name)
    if steps is not None:
        settings = dict(settings, num_steps=steps)
    print(f"{problem.name}: {problem.title}, T = {problem.num_latent}", flush=True)
    load_before = _load()
    timing, fits = time_latent(
        problem, dict(settings, repeats=settings["repeats"][problem.name]), seed
    )
    for variant in VARIANTS:
        r = timing[variant]
        print(
            f"  jaxvb {variant:14s}: first call {r['first_call_s']:6.1f} s, after compile "
            f"{r['run']['median_s']:7.3f} s ({r['flags']})",
            flush=True,
        )
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
                f={q: _rounded(summary["f"][q], 6) for q in ("mean", "q05", "q95")},
            )
    worst = worst_accuracy(accuracy)
    print(
        f"  accuracy ({len(accuracy)} fits, worst): means {worst['max_abs_mean_error_in_ref_sd']:.3f} "
        f"sd, sd ratios {worst['sd_ratio_range'][0]:.2f}-{worst['sd_ratio_range'][1]:.2f}; "
        f"latent rms {worst['max_latent_rms_standardised_error']:.3f} sd, median sd ratio "
        f"{worst['latent_median_sd_ratio_range'][0]:.2f}-"
        f"{worst['latent_median_sd_ratio_range'][1]:.2f}",
        flush=True,
    )
    gaussian_theta = None
    if problem.fit_fn is not None:
        gaussian_theta = run_gaussian_theta(problem, settings, ref, seed)
    importance = run_importance(problem, settings, ref, seed)
    wi, wu = importance["worst"], importance["worst_uncorrected"]
    print(
        f"  importance-corrected ({IMPORTANCE['num_theta']} x {IMPORTANCE['num_f']}): "
        f"{importance['run_s']:.2f} s after compile (first {importance['first_call_s']:.1f}"
        f" s), k-hat {importance['khat']:.2f}, ESS {importance['ess']:.0f}; means "
        f"{wi['max_abs_mean_error_in_ref_sd']:.3f} sd (uncorrected "
        f"{wu['max_abs_mean_error_in_ref_sd']:.3f}), sd ratios "
        f"{wi['sd_ratio_range'][0]:.2f}-{wi['sd_ratio_range'][1]:.2f}",
        flush=True,
    )
    nuts = time_nuts(problem, settings, ref, seed)
    print(
        f"  NUTS {settings['nuts']['num_warmup']}+{settings['nuts']['num_samples']}: first "
        f"call {nuts['first_call_s']:.1f} s, after compile {nuts['run_s']:.1f} s "
        f"({nuts['mean_num_steps']:.0f} leapfrog steps per draw)",
        flush=True,
    )
    closed = time_closed_form(
        problem, dict(settings, repeats=settings["repeats"][problem.name]), ref, seed
    )
    if closed is not None:
        print(
            f"  log normaliser in closed form: jaxvb first call "
            f"{closed['jaxvb']['first_call_s']:.1f} s, after compile "
            f"{closed['jaxvb']['run']['median_s']:.3f} s; NUTS first call "
            f"{closed['nuts']['first_call_s']:.1f} s, after compile "
            f"{closed['nuts']['run_s']:.1f} s ({closed['speedup_after_compile']:.1f}x)",
            flush=True,
        )
    quadrature = None
    if settings.get("quadrature_check", True):
        quadrature = quadrature_check(problem, settings, seed)
    if quadrature is not None:
        print(
            f"  {quadrature['num_quadrature']} nodes against the default "
            f"{quadrature['default']}: q(theta) means {quadrature['theta_mean_diff_sd']:.1e}"
            f" sd apart, sds {quadrature['theta_sd_rel_diff']:.1e} relative, the field "
            f"{quadrature['field_mean_diff_sd']:.1e} sd; after compile "
            f"{quadrature['run_s']['model']:.3f} s against "
            f"{quadrature['run_s']['default']:.3f} s",
            flush=True,
        )
    dense = None
    if settings["dense"] is not None:
        dense = run_dense(problem, settings)
        print("  " + dense_line(dense), flush=True)
    reference = {
        k: ref[k]
        for k in (
            "settings",
            "wall_s",
            "r_hat_max",
            "ess_min",
            "num_divergent",
            "mean_num_steps",
        )
    }
    reference["path"] = os.path.relpath(problem.reference_path, HERE.parent)
    reference["params"] = {
        k: {f: p[f] for f in ("mean", "sd", "ess", "r_hat", "mean_mc_error")}
        for k, p in ref["params"].items()
    }
    reference["f"] = {k: ref["f"][k] for k in ("ess_min", "ess_median", "r_hat_max")}
    record = dict(
        title=problem.title,
        num_steps=settings["num_steps"],
        data=problem.data,
        latent_field=problem.latent,
        num_latent=problem.num_latent,
        num_hyper=int(problem.theta0.shape[0]),
        # jaxvb's theta: the hyperparameters less the fixed effects, which its model
        # has last in the field (Problem.fit_model)
        jaxvb_num_hyper=int(problem.jaxvb_model[1].shape[0]),
        theta_names=list(problem.theta_names),
        reference=reference,
        jaxvb=timing,
        accuracy=dict(num_draws=settings["num_draws"], fits=accuracy, worst=worst),
        nuts=nuts,
        dense=dense,
        gaussian_theta=gaussian_theta,
        importance=importance,
        closed_form_log_norm=closed,
        quadrature_check=quadrature,
        # other processes on the machine slow every timing above: the 1-minute load
        # average before and after this model's measurements
        load_average_1min=dict(before=load_before, after=_load()),
    )
    return record, figure


def quadrature_check(problem: Problem, settings: dict, seed: int = 0) -> dict | None:
    """Where the model sets fewer Gauss-Hermite nodes than ``LatentGaussian``'s default,
    the fits with its nodes and with the default, same keys (after compile): how far
    apart ``q(theta)`` (means in its sd, sds relative) and ``q(f | theta)`` at
    ``q(theta)``'s mean (means in the field's sd) are, and the time of each (median of
    ``repeats`` calls). ``None`` where the model keeps the default."""
    model, theta0 = problem.jaxvb_model
    fields = dataclasses.fields(jaxvb.LatentGaussian)
    default = next(f.default for f in fields if f.name == "num_quadrature")
    if model.num_quadrature == default:
        return None
    models = dict(model=model, default=dataclasses.replace(model, num_quadrature=default))
    repeats = settings["repeats"][problem.name]
    fits = {name: [] for name in models}
    run_s = {}
    for name, m in models.items():
        fit = functools.partial(
            jaxvb.fit, m, theta0, num_steps=settings["num_steps"], on_failure="ignore"
        )
        jax.block_until_ready(fit(key=jax.random.key(seed)))  # compile
        times = []
        for i in range(1, repeats + 1):
            res, t = _timed(lambda i=i, fit=fit: fit(key=jax.random.key(seed + i)))
            fits[name].append(res)
            times.append(t)
        run_s[name] = float(np.median(times))
    diffs = dict(
        theta_mean_diff_sd=0.0,
        theta_sd_rel_diff=0.0,
        field_mean_diff_sd=0.0,
        elbo_diff_max=0.0,
    )
    for a, b in zip(fits["model"], fits["default"], strict=True):
        sd = jnp.sqrt(jnp.diagonal(b.q.theta.cov))
        mu_a, _, _ = a.q.conditional(b.q.theta.mean)
        mu_b, chol, ops = b.q.conditional(b.q.theta.mean)
        field_sd = jnp.sqrt(ops.marginal_var(chol))
        now = dict(
            theta_mean_diff_sd=jnp.max(jnp.abs(a.q.theta.mean - b.q.theta.mean) / sd),
            theta_sd_rel_diff=jnp.max(
                jnp.abs(jnp.sqrt(jnp.diagonal(a.q.theta.cov)) / sd - 1)
            ),
            field_mean_diff_sd=jnp.max(jnp.abs(mu_a - mu_b) / field_sd),
            elbo_diff_max=jnp.abs(a.elbo - b.elbo),
        )
        diffs = {k: max(v, float(now[k])) for k, v in diffs.items()}
    return dict(
        num_quadrature=model.num_quadrature,
        default=default,
        keys=[seed + i for i in range(1, repeats + 1)],
        **diffs,
        run_s=run_s,
    )


IMPORTANCE = dict(num_theta=2000, num_f=32)


def run_importance(problem: Problem, settings: dict, ref: dict, seed: int = 0) -> dict:
    """The importance-corrected draws (:meth:`jaxvb.latent.LatentGaussianApproximation.
    importance_resample`, ``IMPORTANCE`` settings) of the Gaussian-``q(theta)`` fit
    (``jaxvb.fit(fit_model, fit_theta0, key)``, key ``seed + 1``): the first call
    (compile included) and a second one after compile, their k-hat and ESS, and the
    second call's draws against the reference."""
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
        out = res.q.importance_resample(key, n, warn=False, **IMPORTANCE)
        return jax.block_until_ready(out)

    _, first = _timed(lambda: correct(jax.random.key(seed + 2)))
    out, second = _timed(lambda: correct(jax.random.key(seed + 3)))
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


def run_gaussian_theta(problem: Problem, settings: dict, ref: dict, seed: int = 0):
    """Where jaxvb's fit keeps the paper's ``q(theta)`` families (``fit_fn``): the
    same ``LatentGaussian`` with a Gaussian ``q(theta)`` (``jaxvb.fit(fit_model,
    fit_theta0)``, the default diagnostics), its first call, one fit after compile and
    its accuracy, so that the table shows what the families buy."""
    num_steps = settings["num_steps"]
    _, first = _timed(
        lambda: fit_latent(problem, jax.random.key(seed), num_steps, gaussian_theta=True)
    )
    res, after = _timed(
        lambda: fit_latent(
            problem, jax.random.key(seed + 1), num_steps, gaussian_theta=True
        )
    )
    acc, _, _ = accuracy_of(
        problem, res, ref, jax.random.key(2000 + seed), settings["num_draws"]
    )
    worst = worst_accuracy([acc])
    print(
        f"  gaussian q(theta): first call {first:.1f} s, after compile {after:.3f} s; "
        f"means {worst['max_abs_mean_error_in_ref_sd']:.3f} sd, sd ratios "
        f"{worst['sd_ratio_range'][0]:.2f}-{worst['sd_ratio_range'][1]:.2f}",
        flush=True,
    )
    return dict(
        description="the same LatentGaussian, q(theta) Gaussian over the unconstrained "
        "hyperparameters (jaxvb.fit(fit_model, fit_theta0, key)), default diagnostics",
        first_call_s=first,
        run_s=after,
        **status_record(res),
        accuracy=acc,
        worst=worst,
    )


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


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


def targets(problems: dict, scaling: dict | None) -> dict:
    """Each target of the issue, met or not, from the measurements (nothing assumed)."""
    t = TARGETS
    out = {}
    for name, p in problems.items():
        w = p["accuracy"]["worst"]
        lo, hi = t["sd_ratio"]
        mlo, mhi = t["latent_median_sd_ratio"]
        default = p["jaxvb"]["diagnostics"]
        bare = p["jaxvb"]["no_diagnostics"]
        speedup = p["nuts"]["run_s"] / default["run"]["median_s"]
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
                value=p["importance"]["worst"]["max_abs_mean_error_in_ref_sd"],
                khat=p["importance"]["khat"],
                sd_ratio_range=p["importance"]["worst"]["sd_ratio_range"],
                extra_s_after_compile=p["importance"]["run_s"],
                met=p["importance"]["worst"]["max_abs_mean_error_in_ref_sd"]
                <= t["mean_error_sd"]
                and p["importance"]["khat"] <= 0.7,
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
                without_diagnostics=p["nuts"]["run_s"] / bare["run"]["median_s"],
                met=speedup >= t["speedup_after_compile"],
                met_without_diagnostics=p["nuts"]["run_s"] / bare["run"]["median_s"]
                >= t["speedup_after_compile"],
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
        out["sv_2500_days_after_compile"] = dict(
            target=f"<= {t['sv_after_compile_s']:g} s: the default fit of the 2500-day "
            f"series after compile, {problems['sv_sp500']['num_steps']} steps",
            value=value,
            without_diagnostics=sv_fit["no_diagnostics"]["run"]["median_s"],
            start_alone=sv_fit["start_after_compile_s"],
            met=value <= t["sv_after_compile_s"],
            met_without_diagnostics=sv_fit["no_diagnostics"]["run"]["median_s"]
            <= t["sv_after_compile_s"],
        )
    if scaling:
        out["scaling_slope"] = dict(
            target=f"log-log slope of the SV fit's time after compile against T within "
            f"1 +- {t['slope_tolerance']} over T = {[r['T'] for r in scaling['rows']]}",
            value=scaling["log_log_slope"],
            met=abs(scaling["log_log_slope"] - 1.0) <= t["slope_tolerance"],
        )
    return out


# --- tables -------------------------------------------------------------------------------------


SECTIONS = ("accuracy", "speed", "scaling", "targets")


def dense_line(d: dict) -> str:
    """What the plain dense fit did, in one line."""
    if "error" in d:
        return f"dense jaxvb.fit: {d['error']}"

    def timing(r):
        run = f", after compile {r['run_s']:.2f} s" if r.get("run_s") is not None else ""
        return f"first call {r['first_call_s']:.1f} s{run}, {r['flags']}"

    if "raised" in d:
        g = d["from_gaussian_start"]
        return (
            f"dense jaxvb.fit: raised after {d['first_call_s']:.1f} s "
            f"({d['raised'][:70]}...); from N(x0, diag(v0)): {timing(g)}"
        )
    return f"dense jaxvb.fit, {d['num_steps']} steps: {timing(d)}"


def print_summary(report: dict, sections=SECTIONS):
    """Print the report's tables: ``sections`` of accuracy, speed, scaling, targets."""
    problems = report["problems"]
    if "accuracy" in sections:
        print(
            "\n== accuracy against the NUTS reference (first accuracy fit; worst of all) =="
        )
        for p in problems.values():
            fit = p["accuracy"]["fits"][0]
            print(
                f"{p['title']}  [NUTS R-hat max {p['reference']['r_hat_max']:.4f}, ESS min "
                f"{p['reference']['ess_min']:.0f}]"
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
                d = dense["params"][k] if dense else None
                print(
                    f"  {k:8s} {a['mean']:11.4f} {p['reference']['params'][k]['mean']:11.4f} "
                    f"{a['mean_error_in_ref_sd']:+8.3f} {a['sd_ratio']:9.3f}   "
                    f"({n['mean_error_in_ref_sd']:+7.3f}, {n['sd_ratio']:6.3f})"
                    + (
                        f"   ({d['mean_error_in_ref_sd']:+.2f}, {d['sd_ratio']:.2f})"
                        if d
                        else ""
                    )
                )
            lat = fit["latent"]
            print(
                f"  latent f: rms err {lat['rms_standardised_error']:.3f} sd (max "
                f"{lat['max_abs_standardised_error']:.3f}), sd ratio median "
                f"{lat['median_sd_ratio']:.3f} ({lat['min_sd_ratio']:.2f}-{lat['max_sd_ratio']:.2f});"
                f" NUTS centred: rms {p['nuts']['vs_reference']['latent']['rms_standardised_error']:.3f}"
            )
            w = p["accuracy"]["worst"]
            print(
                f"  worst of {len(p['accuracy']['fits'])} fits: |err| "
                f"{w['max_abs_mean_error_in_ref_sd']:.3f} sd, sd ratios {w['sd_ratio_range'][0]:.3f}-"
                f"{w['sd_ratio_range'][1]:.3f}, latent rms {w['max_latent_rms_standardised_error']:.3f}"
                f", latent median sd ratio {w['latent_median_sd_ratio_range'][0]:.3f}-"
                f"{w['latent_median_sd_ratio_range'][1]:.3f}"
            )
    if "speed" in sections:
        print("\n== speed (seconds; after compile = median of repeated calls) ==")
        print(f"{'':34s} {'first call':>10s} {'after compile':>13s}")
        for p in problems.values():
            load = p.get("load_average_1min") or {}
            print(
                f"{p['title']}  [1-min load average {load.get('before', 0):.1f} before, "
                f"{load.get('after', 0):.1f} after]"
            )
            for variant in VARIANTS:
                r = p["jaxvb"][variant]
                print(
                    f"  jaxvb {p['num_steps']} steps, {variant:15s} {r['first_call_s']:10.2f} "
                    f"{r['run']['median_s']:13.3f}   {r['flags']}"
                )
            print(
                f"  {'  (the Laplace start alone)':32s} {'':10s} "
                f"{p['jaxvb']['start_after_compile_s']:13.3f}"
            )
            n = p["nuts"]
            print(
                f"  NUTS {n['settings']['num_warmup']}+{n['settings']['num_samples']} (centred)"
                f"{'':10s} {n['first_call_s']:10.2f} {n['run_s']:13.3f}   "
                f"{n['mean_num_steps']:.0f} steps/draw, {n['num_divergent']} divergent"
            )
            c = p.get("closed_form_log_norm")
            if c is not None:
                print(
                    f"  log normaliser in closed form: jaxvb "
                    f"{c['jaxvb']['first_call_s']:.2f} / {c['jaxvb']['run']['median_s']:.3f}"
                    f"; NUTS {c['nuts']['first_call_s']:.2f} / {c['nuts']['run_s']:.3f} "
                    f"({c['speedup_after_compile']:.1f}x)"
                )
            d = p.get("dense")
            if d is not None:
                print("  " + dense_line(d))
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
        for name, group in report["targets"].items():
            items = group.items() if "target" not in group else [("", group)]
            for label, t in items:
                v = t["value"]
                shown = (
                    {k: round(x, 3) for k, x in v.items()}
                    if isinstance(v, dict)
                    else [round(x, 3) for x in v]
                    if isinstance(v, list)
                    else round(v, 3)
                )
                extra = ""
                if "met_without_diagnostics" in t:
                    bare = "met" if t["met_without_diagnostics"] else "NOT met"
                    extra = (
                        f"  (without diagnostics: {bare}, {t['without_diagnostics']:.3g})"
                    )
                print(
                    f"  {name:28s} {label:24s} {'met' if t['met'] else 'NOT met':8s} "
                    f"{shown}{extra}"
                )


# --- figures ------------------------------------------------------------------------------------


def read_result(directory=RESULTS) -> dict:
    """The report ``latent_gaussian.json`` in ``directory`` (by default the stored one)."""
    return json.loads((Path(directory) / "latent_gaussian.json").read_text())


def read_figures(directory=RESULTS) -> dict:
    """The figures' data (densities and latent bands of the first accuracy fits)."""
    return json.loads((Path(directory) / FIGURES).read_text())


def _figure(**kw):
    """A plain Figure, not registered with pyplot (nothing here changes a backend)."""
    from matplotlib.figure import Figure

    return Figure(**kw)


def _save(fig, path, dpi=110):
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def plot_accuracy(report: dict, figures: dict, path=None):
    """Per model (rows): each hyperparameter's density under jaxvb's ``q`` against the
    NUTS reference's histogram, and the latent field's posterior means, jaxvb against
    NUTS. Saved to ``path`` if one is given, returned either way."""
    names = list(figures)
    fig = _figure(figsize=(15, 3.4 * len(names)))
    axes = np.atleast_2d(fig.subplots(len(names), 4))
    for row, name in zip(axes, names, strict=True):
        ref = read_reference(name)
        p = report["problems"][name]
        for ax, (k, d) in zip(row[:3], figures[name]["densities"].items(), strict=True):
            ax.hist(
                ref["params"][k]["draws_thinned"],
                bins=40,
                density=True,
                color="0.75",
                label="NUTS",
            )
            ax.plot(d["grid"], d["density"], color="C0", lw=1.8, label="jaxvb")
            acc = p["accuracy"]["fits"][0]["params"][k]
            ax.set_title(
                f"{k}: err {acc['mean_error_in_ref_sd']:+.2f} sd, "
                f"sd x{acc['sd_ratio']:.2f}",
                fontsize=9,
            )
            ax.set_yticks([])
        row[0].set_ylabel(p["title"], fontsize=9)
        row[0].legend(frameon=False, fontsize=8)
        ax = row[3]
        nuts_mean = np.asarray(ref["f"]["mean"])
        mine = np.asarray(figures[name]["f"]["mean"])
        lo, hi = (
            np.asarray(figures[name]["f"]["q05"]),
            np.asarray(figures[name]["f"]["q95"]),
        )
        ax.errorbar(
            nuts_mean,
            mine,
            yerr=[mine - lo, hi - mine],
            fmt="none",
            ecolor="C0",
            alpha=0.15,
            lw=0.8,
        )
        ax.plot(nuts_mean, mine, ".", ms=2, color="C0")
        span = [nuts_mean.min(), nuts_mean.max()]
        ax.plot(span, span, color="k", lw=0.7)
        lat = p["accuracy"]["fits"][0]["latent"]
        ax.set_title(
            f"E f_t (90% band): rms err {lat['rms_standardised_error']:.3f} sd, "
            f"sd x{lat['median_sd_ratio']:.2f}",
            fontsize=9,
        )
        ax.set_xlabel("NUTS", fontsize=8)
        ax.set_ylabel("jaxvb", fontsize=8)
    fig.suptitle("jaxvb.LatentGaussian against long NUTS runs")
    fig.tight_layout()
    return _save(fig, path)


def _dense_outcome(report: dict, name: str) -> tuple[float | None, str]:
    """Seconds the plain dense fit ran and how it ended, for the speed figure."""
    d = report["problems"][name].get("dense")
    if d is None:
        return None, ""
    if d.get("timed_out"):
        return report["settings"]["dense_timeout_s"][name], "stopped"
    if "error" in d:
        return None, "error"
    if "raised" in d:
        return d["first_call_s"], "raised"
    # a flagged fit: the flags are in the JSON; the figure says only that
    return d["first_call_s"], "flagged" if d["flags"] != "OK" else ""


def plot_speed(report: dict, path=None):
    """Seconds per method and model (first call and after compile, log scale; the plain
    dense fit until it returned, raised or was stopped), and the scaling of the SV fit
    in ``T``."""
    fig = _figure(figsize=(13, 4.6))
    axes = fig.subplots(1, 2)
    ax = axes[0]
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
        xs, ys, shown = [], [], []
        for i, name in enumerate(names):
            v = value(name, report["problems"][name])
            if v is not None:
                xs.append(i + (j - len(bars) / 2 + 0.5) * width)
                ys.append(v)
                shown.append(name)
        ax.bar(xs, ys, width, color=color, hatch=hatch, edgecolor="white", label=label)
        if label.startswith("plain dense"):
            for x, y, name in zip(xs, ys, shown, strict=True):
                ax.annotate(
                    _dense_outcome(report, name)[1],
                    (x, y),
                    fontsize=7,
                    ha="center",
                    va="bottom",
                )
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(
        [report["problems"][n]["title"].replace(", ", ",\n", 1) for n in names], fontsize=8
    )
    ax.set_ylabel("seconds")
    ax.legend(frameon=False, fontsize=7)
    ax.grid(alpha=0.3, axis="y", which="both")
    ax = axes[1]
    sc = report.get("scaling")
    if sc:
        T = np.array([r["T"] for r in sc["rows"]], float)
        s = np.array([r["run_s"] for r in sc["rows"]])
        ax.loglog(T, s, "o-", label=f"after compile (slope {sc['log_log_slope']:.2f})")
        ax.loglog(
            T, [r["first_call_s"] for r in sc["rows"]], "s:", color="C1", label="first call"
        )
        ax.loglog(T, s[0] * T / T[0], "--", color="0.6", label="slope 1")
        ax.set_xlabel("T")
        ax.set_ylabel(f"seconds per {sc['num_steps']}-step fit (no diagnostics)")
        ax.legend(frameon=False, fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.set_title("SV, banded precision: scaling in T", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


# --- main -----------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test, temp output")
    parser.add_argument("--out", default=None, help="output directory")
    parser.add_argument(
        "--refs",
        action="store_true",
        help="re-run the long NUTS references and rewrite tests/data/latent_*",
    )
    parser.add_argument("--refs-only", action="store_true", help="--refs, then stop")
    parser.add_argument(
        "--problems", nargs="*", default=None, help="a subset of the models"
    )
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--replot",
        action="store_true",
        help="no fits: recompute the targets and redraw the figures from the stored "
        "results in --out (default benchmarks/results/)",
    )
    parser.add_argument("--dense-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.dense_worker is not None:
        row = dense_worker(json.loads(args.dense_worker))
        print("DENSE " + json.dumps(row), flush=True)
        return row

    if args.replot:
        return replot(Path(args.out or RESULTS))

    settings = dict(QUICK if args.quick else FULL)
    if args.problems:
        settings["problems"] = tuple(args.problems)
    if args.refs or args.refs_only:
        for name in settings["problems"]:
            run_reference(PROBLEMS[name]())
        if args.refs_only:
            return None
    out = Path(
        args.out or (tempfile.mkdtemp(prefix="latent_gaussian_") if args.quick else RESULTS)
    )
    out.mkdir(parents=True, exist_ok=True)

    import matplotlib
    import numpyro
    from _common import environment

    env = environment(
        numpyro_version=numpyro.__version__, matplotlib_version=matplotlib.__version__
    )
    t_start = time.perf_counter()
    problems, figures = {}, {}
    for name in settings["problems"]:
        problems[name], figures[name] = run_problem(PROBLEMS[name](), settings, args.seed)
    scaling = None
    if not args.skip_scaling:
        print("scaling (SV, simulated)", flush=True)
        scaling = run_scaling(settings)
    report = dict(
        description=(
            "jaxvb.LatentGaussian (q(theta) q(f | theta), banded or diagonal prior "
            "precision) on three public data sets, against long NUTS references, NUTS "
            "(500 + 1000) on the same log joint, and the plain dense jaxvb.fit; all in "
            "one process (the dense fit in a subprocess with a time limit)."
        ),
        quick=bool(args.quick),
        environment=env,
        settings=dict(
            {k: v for k, v in settings.items() if k != "scaling_repeats"},
            scaling_repeats={str(k): v for k, v in settings["scaling_repeats"].items()},
            variants=VARIANTS,
            dtype="float64",
        ),
        problems=problems,
        scaling=scaling,
        targets=targets(problems, scaling),
        wall_s=time.perf_counter() - t_start,
        load_average_end=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    )
    path = out / "latent_gaussian.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    (out / FIGURES).write_text(json.dumps(figures) + "\n")
    # after the JSON: a plotting error loses no measurement
    plot_accuracy(report, figures, out / "latent_gaussian_accuracy.png")
    plot_speed(report, out / "latent_gaussian_speed.png")
    print_summary(report)
    print(f"\nwrote {path} ({report['wall_s']:.0f} s)", flush=True)
    return report


def replot(directory: Path) -> dict:
    """The targets recomputed and the figures redrawn from the stored measurements in
    ``directory`` (no fit is run)."""
    report, figures = read_result(directory), read_figures(directory)
    report["targets"] = targets(report["problems"], report.get("scaling"))
    (directory / "latent_gaussian.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_accuracy(report, figures, directory / "latent_gaussian_accuracy.png")
    plot_speed(report, directory / "latent_gaussian_speed.png")
    print_summary(report)
    return report


if __name__ == "__main__":
    main()
