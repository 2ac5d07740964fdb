r"""The stochastic-volatility model of the paper (section 6.1), fitted in ``O(T)``.

Model (Girolami & Calderhead 2011, as in the paper):

    y_t = eps_t beta exp(v_t / 2),   v_{t+1} = phi v_t + xi_{t+1},
    v_1 ~ N(0, s2 / (1 - phi^2)),    eps ~ N(0, 1),   xi ~ N(0, s2),
    p(beta) ∝ 1 / beta,   (phi + 1) / 2 ~ Beta(20, 1.5),   s2 ~ Inv-Gamma(5, 0.25).

Parameterisation of :func:`log_joint`: ``x = (u, s2, v_1..v_T, log beta)`` with
``u = (phi + 1) / 2`` in ``(0, 1)``, ``s2 > 0`` (the natural parameters of the
approximating families; the prior of ``u`` is the Beta(20, 1.5) density itself, and
the flat prior on ``log beta`` is ``p(beta) ∝ 1/beta``).

Approximation (the paper's): ``q(u) = Beta``, ``q(s2 | phi) = Inv-Gamma(eta3, eta4 +
eta5 phi^2)``, ``q(f | phi, s2) ∝ p(f | phi, s2) q(y | f)`` with ``f = (v, log beta)``.
The model is a :class:`jaxvb.LatentGaussian` (:func:`model_structure`): ``log beta`` is
a fixed effect last in the field, so that the prior's precision is an arrowhead
(tridiagonal AR(1), flat along ``log beta``) and the Gaussian sites sit on ``eta_t = v_t
+ 2 log beta``. Its ``q(f | phi, s2)`` is every ``LatentGaussian``'s (one
implementation); :mod:`jaxvb.composite` adds the paper's exponential-family blocks for
``(u, s2)``. The expectations over ``f`` are analytic: ``y_t^2 exp(-eta_t)`` is
log-normal under ``q(f | phi, s2)``, so they need only the mean and the selected
inverse (:mod:`jaxvb.linalg.arrowhead`).
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln
from jax.typing import ArrayLike

import jaxvb as _engine  # the public fit, Result and check
from jaxvb._special import betaln
from jaxvb.families._base import build, register_dataclass
from jaxvb.families.beta import Beta
from jaxvb.families.inverse_gamma import InverseGamma
from jaxvb.latent import LatentGaussian
from jaxvb.latent.hierarchical import (
    ConditionalBlock,
    GaussianSitesBlock,
    Hierarchical,
    hierarchical,
)
from jaxvb.linalg import Arrowhead

#: Prior hyperparameters: ``(phi + 1) / 2 ~ Beta(PHI_A, PHI_B)``, ``s2 ~ Inv-Gamma(S2_A, S2_B)``.
PHI_A, PHI_B = 20.0, 1.5
S2_A, S2_B = 5.0, 0.25
#: How close ``q(f | theta)`` lets ``|phi|`` come to 1 (see ``_ARPrior``).
PHI_EDGE = 1e-6
#: Moments of ``log chi^2_1``, for the initial sites (as in the authors' code).
LOG_CHI2_MEAN = -1.2704
LOG_CHI2_VAR = math.pi**2 / 2.0
_LOG_2PI = math.log(2.0 * math.pi)


def check_series(y: ArrayLike) -> np.ndarray:
    """``y`` as a float64 1-D array, or a ``ValueError`` naming what is wrong.

    Example:
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> sv.check_series([0.5, -1.2, 0.3]).dtype
      dtype('float64')
      >>> sv.check_series([0.5, 0.0, 0.3])
      Traceback (most recent call last):
      ValueError: y has 1 zeros, first at index 1: log y^2 = -inf there ...
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(
            f"y must be a 1-D series of returns, got an array of shape {y.shape}"
        )
    if not np.issubdtype(y.dtype, np.number) or np.issubdtype(y.dtype, np.complexfloating):
        raise ValueError(f"y must hold real numbers, got dtype {y.dtype}")
    y = y.astype(np.float64)
    if y.shape[0] < 3:
        raise ValueError(f"y must have at least 3 observations, got {y.shape[0]}")
    bad = ~np.isfinite(y)
    if bad.any():
        i = np.flatnonzero(bad)
        raise ValueError(
            f"y has {i.size} non-finite values (NaN or inf), first at index {i[0]}; "
            "drop or fill them before fitting"
        )
    zero = y == 0
    if zero.any():
        i = np.flatnonzero(zero)
        raise ValueError(
            f"y has {i.size} zeros, first at index {i[0]}: log y^2 = -inf there and the "
            "likelihood exp(-y^2 ...) carries no information on the volatility. Drop "
            "them or replace them with a small value (e.g. half the smallest |y|)."
        )
    return y


def _phi(u):
    return 2.0 * u - 1.0


def log_joint(x: ArrayLike, y: ArrayLike) -> jax.Array:
    """Log joint of ``x = ((phi + 1)/2, s2, v_1..v_T, log beta)``, shape ``(T + 3,)``.

    ``-inf`` outside the support (``u`` outside (0, 1), ``s2 <= 0``).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> y = jnp.array([0.5, -1.2, 0.3, 2.0, -0.7])
      >>> x = jnp.concatenate([jnp.array([0.975, 0.05]), jnp.zeros(6)])   # phi = 0.95
      >>> round(float(sv.log_joint(x, y)), 4), float(sv.log_joint(x.at[0].set(1.5), y))
      (-0.8268, -inf)
    """
    x = jnp.asarray(x)
    y = jnp.asarray(y, x.dtype)
    u, s2, v, lb = x[0], x[1], x[2:-1], x[-1]
    inside = (u > 0) & (u < 1) & (s2 > 0)
    u = jnp.where(inside, u, 0.5)
    s2 = jnp.where(inside, s2, 1.0)
    phi = _phi(u)
    lp_u = (PHI_A - 1) * jnp.log(u) + (PHI_B - 1) * jnp.log1p(-u) - betaln(PHI_A, PHI_B)
    lp_s2 = S2_A * jnp.log(S2_B) - gammaln(S2_A) - (S2_A + 1) * jnp.log(s2) - S2_B / s2
    t = v.shape[0]
    resid = v[1:] - phi * v[:-1]
    lp_v = (
        0.5 * jnp.log1p(-(phi**2))
        - 0.5 * t * jnp.log(s2)
        - 0.5 * t * _LOG_2PI
        - 0.5 * ((1 - phi**2) * v[0] ** 2 + jnp.sum(resid**2)) / s2
    )
    lp_y = jnp.sum(-0.5 * _LOG_2PI - lb - 0.5 * v - 0.5 * y**2 * jnp.exp(-v - 2.0 * lb))
    return jnp.where(inside, lp_u + lp_s2 + lp_v + lp_y, -jnp.inf)


def simulate(key: jax.Array, T: int, phi: float, s2: float, beta: float) -> np.ndarray:
    """A series ``y`` of length ``T`` from the model (stationary start).

    Returns ``y`` as a NumPy array (float64 where x64 is on); ``(y, v)`` via
    :func:`simulate_with_volatility`.

    Example:
      >>> import jax
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> y = sv.simulate(jax.random.key(0), T=100, phi=0.95, s2=0.05, beta=0.65)
      >>> type(y).__name__, y.shape
      ('ndarray', (100,))
    """
    return simulate_with_volatility(key, T, phi, s2, beta)[0]


def simulate_with_volatility(key, T, phi, s2, beta):
    """``(y, v)``, each of shape ``(T,)``.

    Example:
      >>> import jax
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> y, v = sv.simulate_with_volatility(jax.random.key(0), 100, 0.95, 0.05, 0.65)
      >>> y.shape, v.shape
      ((100,), (100,))
    """
    k1, k2, k3 = jax.random.split(key, 3)
    xi = jax.random.normal(k1, (T,)) * math.sqrt(s2)
    v1 = jax.random.normal(k2) * math.sqrt(s2 / (1 - phi**2))

    def step(v, e):
        nv = phi * v + e
        return nv, nv

    _, rest = jax.lax.scan(step, v1, xi[1:])
    v = jnp.concatenate([v1[None], rest])
    y = jax.random.normal(k3, (T,)) * beta * jnp.exp(v / 2)
    return np.asarray(y), np.asarray(v)


# --- the approximation ---------------------------------------------------------------


def _s2_design(parents):
    """``q(s2 | phi)``: Inv-Gamma natural params ``(a + 1, b) = A(phi) (eta3, eta4, eta5)``."""
    phi = _phi(parents[0])
    one, zero = jnp.ones_like(phi), jnp.zeros_like(phi)
    return jnp.stack([jnp.stack([one, zero, zero]), jnp.stack([zero, one, phi**2])])


def _s2_proper(eta):
    # shape > 0, and scale eta4 + eta5 phi^2 > 0 for every phi in (-1, 1).
    return (eta[0] > 1.0) & (eta[1] > 0.0) & (eta[1] + eta[2] > 0.0)


def _prior(theta, T: int):
    """``p(f | theta)`` of ``f = (v, log beta)``: the stationary AR(1) prior of ``v``
    (tridiagonal precision), ``log beta`` flat (a zero corner), and the constant of
    that density, ``(log(1 - phi^2) - T log s2 - T log(2 pi)) / 2``.

    ``phi`` is kept within ``PHI_EDGE`` of +-1. At ``|phi| = 1`` the prior loses the
    level of ``v``, which the sites cannot pin apart from ``log beta``, so ``q(f |
    theta)`` is singular; within ~1e-16 of it (an early ``q(u)`` iterate can draw ``u``
    that rounds to 1) its factorisation fails in float64. The clip changes ``q(f |
    theta)`` only where ``|phi| > 1 - 1e-6``, which no sane ``q(u)`` reaches but by
    rounding.
    """
    u, s2 = theta[0], theta[1]
    phi = jnp.clip(_phi(u), -1.0 + PHI_EDGE, 1.0 - PHI_EDGE)
    dtype = theta.dtype
    diag = jnp.full((T,), 1.0 + phi**2, dtype).at[0].set(1.0).at[-1].set(1.0) / s2
    off = jnp.full((T,), -phi / s2, dtype).at[-1].set(0.0)
    q = Arrowhead(
        jnp.stack([diag, off]), jnp.zeros((T, 1), dtype), jnp.zeros((1, 1), dtype)
    )
    log_norm = 0.5 * (jnp.log1p(-(phi**2)) - T * jnp.log(s2) - T * _LOG_2PI)
    return jnp.zeros(T + 1, dtype), q, log_norm


def _log_lik(eta, log_y2):
    """``log N(y_t | 0, exp(eta_t))`` with ``eta_t = v_t + 2 log beta``."""
    return -0.5 * (_LOG_2PI + eta + jnp.exp(log_y2 - eta))


def _log_prior(theta):
    u, s2 = theta[0], theta[1]
    return (
        (PHI_A - 1) * jnp.log(u)
        + (PHI_B - 1) * jnp.log1p(-u)
        - (S2_A + 1) * jnp.log(s2)
        - S2_B / s2
    )


@register_dataclass
class SVModel(LatentGaussian):
    """The SV model as a :class:`jaxvb.LatentGaussian` in the paper's parameters
    ``theta = ((phi + 1) / 2, s2)``, ``f = (v_1..v_T, log beta)``, the sites on ``eta_t
    = v_t + 2 log beta`` (``design = 2``), with the site expectations in closed form:
    ``y_t^2 exp(-eta_t)`` is log-normal under ``q(f | theta)``, so ``E log p(y_t |
    eta_t) = -(log 2 pi + m_t + y_t^2 exp(-m_t + s_t / 2)) / 2`` for ``eta_t ~ N(m_t,
    s_t)``, and its derivatives likewise (no quadrature).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> model = sv.model_structure(jnp.array([0.5, -1.2, 0.3]))
      >>> ell, d1, d2 = model.site_expectations(jnp.zeros(3), jnp.zeros(3), None)
      >>> d1.round(3).tolist()   # (y^2 exp(-eta) - 1) / 2
      [-0.375, 0.22, -0.455]
    """

    def site_expectations(self, mean, var, theta):
        del theta
        e = jnp.exp(self.data - mean + 0.5 * var)
        return -0.5 * (_LOG_2PI + mean + e), 0.5 * e - 0.5, -0.5 * e


def model_structure(y: jax.Array) -> SVModel:
    """The SV model of ``y`` as a bound :class:`jaxvb.LatentGaussian` (:class:`SVModel`).

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> model = sv.model_structure(jnp.array([0.5, -1.2, 0.3, 2.0, -0.7]))
      >>> _, Q, log_norm = model.prior_of_field(jnp.array([0.975, 0.05]))   # phi = 0.95
      >>> Q.band.shape, Q.corner.tolist(), model.num_field   # flat log beta
      ((2, 5), [[0.0]], 6)
      >>> round(float(2 * log_norm + 5 * jnp.log(2 * jnp.pi)), 4)   # log(1 - phi^2) - T log s2
      12.6508
    """
    y = jnp.asarray(y)
    t = int(y.shape[0])
    model = SVModel(
        log_prior=_log_prior,
        prior=partial(_prior, T=t),
        log_lik=_log_lik,
        data=jnp.log(jnp.square(y)),
        design=jnp.full((t, 1), 2.0, y.dtype),
    )
    return model.bind(jnp.array([0.975, 0.05], y.dtype))


def initial_q(y: jax.Array) -> Hierarchical:
    """The paper's start: the prior for ``phi`` and ``s2``; sites at the log-chi^2 moments.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> q0 = sv.initial_q(jnp.array([0.5, -1.2, 0.3, 2.0, -0.7]))
      >>> q0.scalars[1].given(jnp.array([0.975]))   # q(s2 | phi): the prior
      InverseGamma(concentration=5.0, scale=0.25)
      >>> q0.event_shape, bool(q0.is_proper)
      ((8,), True)
    """
    y = jnp.asarray(y)
    dtype = y.dtype
    t = y.shape[0]
    one = jnp.ones((), dtype)
    q_u = ConditionalBlock(
        eta=jnp.array([PHI_A - 1, PHI_B - 1], dtype),
        base=build(Beta, concentration1=one, concentration0=one),
    )
    q_s2 = ConditionalBlock(
        eta=jnp.array([S2_A + 1, S2_B, 0.0], dtype),
        base=build(InverseGamma, concentration=one, scale=one),
        design=_s2_design,
        proper=_s2_proper,
    )
    # log y_t^2 = eta_t + log chi^2_1: sites N(eta_t | log y_t^2 - E log chi^2, Var)
    tau = 1.0 / LOG_CHI2_VAR
    mu = jnp.log(jnp.square(y)) - LOG_CHI2_MEAN
    gaussian = GaussianSitesBlock(
        site_precision=jnp.full((t,), tau, dtype),
        site_shift=tau * mu,
        model=model_structure(y),
    )
    return Hierarchical(scalars=(q_u, q_s2), gaussian=gaussian)


@partial(jax.jit, static_argnums=2)
def _draw(q, key, n):
    return q.sample(key, (n,))


@partial(jax.tree_util.register_dataclass, data_fields=["result"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class SVFit:
    """What :func:`fit` returns: the engine's :class:`jaxvb.Result`, and ``sample``.

    Every field of the result reads through (``.q``, ``.elbo``, ``.log_evidence``,
    ``.kl``, ``.r_squared``, ``.status``, ``.ok``, ...); ``.q`` is the fitted
    :class:`~jaxvb.composite.Hierarchical` approximation.

    Attributes:
      result: the :class:`jaxvb.Result` of the fit.

    Example:
      Not run as a doctest (the fit is slow to compile;
      ``tests/latent/test_stochastic_volatility.py`` runs it):

      >>> import jax, jaxvb
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> res = sv.fit(jaxvb.data.sv_gbpusd(), jax.random.key(0))  # doctest: +SKIP
      >>> draws = res.sample(jax.random.key(1), 1000)  # doctest: +SKIP
      >>> {name: d.shape for name, d in draws.items()}  # doctest: +SKIP
      {'phi': (1000,), 's2': (1000,), 'beta': (1000,), 'v': (1000, 945)}
    """

    result: Any

    def __getattr__(self, name):
        # Only called for names the dataclass lacks: the Result's fields and properties.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.result, name)

    def sample(self, key: jax.Array, n: int) -> dict[str, jax.Array]:
        """``n`` joint draws: ``phi (n,)``, ``s2 (n,)``, ``beta (n,)``, ``v (n, T)``.

        Compiled once per ``(q, n)`` structure: run eagerly, every op of the samplers
        and scans would dispatch on its own, many times slower.
        """
        x = _draw(self.result.q, key, int(n))
        return {
            "phi": _phi(x[:, 0]),
            "s2": x[:, 1],
            "beta": jnp.exp(x[:, -1]),
            "v": x[:, 2:-1],
        }


@partial(
    jax.jit,
    static_argnames=("num_steps", "indirect_effects", "num_eval_draws", "max_backtracks"),
)
def _fit(y, key, *, num_steps, indirect_effects, num_eval_draws, max_backtracks):
    method = hierarchical(model_structure(y), indirect_effects=indirect_effects)
    return _engine.fit(
        partial(log_joint, y=y),
        initial_q(y),
        key,
        num_steps=num_steps,
        method=method,
        num_eval_draws=num_eval_draws,
        max_backtracks=max_backtracks,
        # Each of the convergence check's draws costs an O(T) factorisation: 200 of
        # them cost more than the 250-step fit itself.
        num_check_draws=0,
        on_failure="ignore",
    )


def fit(
    y: ArrayLike,
    key: jax.Array,
    *,
    num_steps: int = 250,
    indirect_effects: bool = False,
    num_eval_draws: int = 200,
    max_backtracks: int = 8,
    on_failure: str = "raise",
) -> SVFit:
    """Fits the paper's hierarchical approximation to the SV posterior of ``y``.

    One draw of ``(phi, s2)`` per step, ``f = (v, log beta)`` Rao-Blackwellised; every
    step is ``O(T)``. Compiled once per ``(T, num_steps, ...)``; later calls reuse it.
    Traceable: under ``jit`` or ``vmap`` (e.g. :func:`jaxvb.fit_batched` over many
    series) the series is not checked on the host, and the status flags tell.

    Args:
      y: the returns, shape ``(T,)``, ``T >= 3``, finite and non-zero.
      key: a JAX random key.
      num_steps: iterations (the paper: 250).
      indirect_effects: eq. sv2 (True) or eq. svapprox (False, the paper's choice).
      num_eval_draws: draws of ``q`` for the diagnostics (ELBO, KL, R^2, log evidence).
        Each costs two ``O(T)`` scans, so the default is 200 rather than ``jaxvb.fit``'s
        1000: on the shipped series (``s^2`` about 0.65) that gives the ELBO to about
        +-0.06 and ``s^2`` to about 10%, for a quarter of the cost.
      max_backtracks: ``jaxvb.fit``'s step control.
      on_failure: ``"raise"``, ``"warn"`` or ``"ignore"``, as in :func:`jaxvb.fit`.

    Returns:
      :class:`SVFit`; ``.sample(key, n)`` gives a dict of draws.

    Example:
      >>> import jax, jaxvb
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> res = sv.fit(jaxvb.data.sv_gbpusd(), jax.random.key(0))  # doctest: +SKIP
    """
    if not isinstance(y, jax.core.Tracer):  # under jit or vmap the values are not known
        y = check_series(y)
    if on_failure not in ("raise", "warn", "ignore"):
        raise ValueError(
            f"on_failure must be 'raise', 'warn' or 'ignore', got {on_failure!r}"
        )
    y = jnp.asarray(y, jnp.result_type(float))
    res = _fit(
        y,
        key,
        num_steps=int(num_steps),
        indirect_effects=bool(indirect_effects),
        num_eval_draws=int(num_eval_draws),
        max_backtracks=int(max_backtracks),
    )
    _engine.check(res, on_failure, who="stochastic_volatility.fit", stacklevel=2)
    return SVFit(res)


def nuts_reference(
    y: ArrayLike,
    key: jax.Array,
    *,
    num_warmup: int = 1000,
    num_samples: int = 2000,
    num_chains: int = 4,
    progress_bar: bool = False,
    group_by_chain: bool = False,
) -> dict[str, np.ndarray]:
    """A NumPyro NUTS run on the same model, non-centred volatilities, flat ``log beta``.

    ``v_1 = z_1 sqrt(s2 / (1 - phi^2))``, ``v_t = phi v_{t-1} + sqrt(s2) z_t`` with
    ``z ~ N(0, I)``. Chains run one after another (``chain_method="sequential"``).

    Returns:
      dict of draws ``phi, s2, beta`` (``(num_chains * num_samples,)``) and ``v``
      (``(num_chains * num_samples, T)``); with ``group_by_chain`` a leading chain axis
      ``(num_chains, num_samples, ...)`` instead, for R-hat and effective sample sizes.

    Example:
      Not run as a doctest (NUTS runs for minutes; its 4 x 10000 draws are the
      reference in ``tests/data/sv_nuts.json``):

      >>> import jax, jaxvb
      >>> from jaxvb.models import stochastic_volatility as sv
      >>> ref = sv.nuts_reference(jaxvb.data.sv_gbpusd(), jax.random.key(0))  # doctest: +SKIP
      >>> ref["phi"].shape, ref["v"].shape  # doctest: +SKIP
      ((8000,), (8000, 945))
    """
    import numpyro
    import numpyro.distributions as dist
    from numpyro.distributions import constraints
    from numpyro.infer import MCMC, NUTS

    y = jnp.asarray(check_series(y))

    def model(y):
        u = numpyro.sample("u", dist.Beta(PHI_A, PHI_B))
        s2 = numpyro.sample("s2", dist.InverseGamma(S2_A, S2_B))
        lb = numpyro.sample("log_beta", dist.ImproperUniform(constraints.real, (), ()))
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([y.shape[0]]).to_event(1))
        phi = _phi(u)
        s = jnp.sqrt(s2)
        v1 = z[0] * s / jnp.sqrt(1.0 - phi**2)

        def step(v, zt):
            nv = phi * v + s * zt
            return nv, nv

        _, rest = jax.lax.scan(step, v1, z[1:])
        v = numpyro.deterministic("v", jnp.concatenate([v1[None], rest]))
        numpyro.sample("y", dist.Normal(0.0, jnp.exp(lb + 0.5 * v)), obs=y)

    mcmc = MCMC(
        NUTS(model),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="sequential",
        progress_bar=progress_bar,
    )
    mcmc.run(key, y)
    s = mcmc.get_samples(group_by_chain=group_by_chain)
    return {
        "phi": np.asarray(_phi(s["u"])),
        "s2": np.asarray(s["s2"]),
        "beta": np.asarray(jnp.exp(s["log_beta"])),
        "v": np.asarray(s["v"]),
    }
