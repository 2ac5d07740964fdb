"""The contract every approximating family in ``jaxvb.families`` must satisfy.

Each test is parametrised over ``CASES``: every scalar family with scalar parameters,
scalar families with array parameters (independent components), and dense Gaussians of
dimension 1, 2 and 3 (non-diagonal covariances). The checks, numbered as in the spec:

1. pytree round trip;            2. jit == eager;            3. vmap over families;
4. dtype preservation;           5. natural <-> usual parameters, improper ``eta``,
   constructor validation;       6. ``log_prob`` integrates to one;
7. ``log_prob`` / ``entropy`` agree with ``scipy.stats``;
8. sample moments agree with ``mean`` / ``variance`` / ``cov``;
9. ``mean_sufficient_stats`` and ``fisher_information`` agree with Monte Carlo;
10. ``T(x) . eta - U(eta) == log_prob(x)``, ``-inf`` outside the support;
11. antithetic sampling.

Monte Carlo checks use a fixed key, so they are deterministic. Each compares an estimate
with its expectation to within 5 standard errors; for a fresh random key the false-alarm
rate of one such (approximately normal) comparison would be P(|Z| > 5) ~ 5.7e-7.

Speed: compiling a gamma-based sampler (Gamma, InverseGamma, Beta) takes seconds and
every new sample shape is a new compilation, so all draws share one shape and are cached
(``draws``); derived quantities are computed by one jitted function per family structure
(``summary``) rather than op by op; dtypes are read off ``jax.eval_shape``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from jaxvb.families import (
    Beta,
    Exponential,
    ExponentialFamily,
    Gamma,
    Gaussian,
    InverseGamma,
)

N_MC = 20_000  # draws for the moment checks
N_ANTITHETIC = 5_000  # pairs for the antithetic check
N_SE = 5.0  # tolerance, in standard errors


# --- the family instances under test -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    cls: type
    params: tuple[tuple[str, object], ...]

    def make(self, dtype=np.float64):
        return self.cls(**{k: np.asarray(v, dtype) for k, v in self.params})


CASES = [
    Case("exponential", Exponential, (("rate", 2.0),)),
    Case("exponential-2x2", Exponential, (("rate", [[0.5, 1.0], [2.0, 4.0]]),)),
    Case("gamma", Gamma, (("concentration", 3.0), ("rate", 2.0))),
    # concentration 0.5: a density that is infinite at 0.
    Case("gamma-3", Gamma, (("concentration", [0.5, 2.0, 7.5]), ("rate", [1.0, 3.0, 0.5]))),
    # concentration > 4, so that the 4th moment (for the variance check) exists.
    Case("inverse_gamma", InverseGamma, (("concentration", 6.0), ("scale", 3.0))),
    Case("beta", Beta, (("concentration1", 2.5), ("concentration0", 4.0))),
    Case("gaussian-1", Gaussian, (("mean", [0.3]), ("cov", [[2.0]]))),
    Case(
        "gaussian-2", Gaussian, (("mean", [1.0, -2.0]), ("cov", [[1.5, -0.6], [-0.6, 0.8]]))
    ),
    Case(
        "gaussian-3",
        Gaussian,
        (
            ("mean", [0.5, -1.0, 2.0]),
            ("cov", [[2.0, 0.6, -0.4], [0.6, 1.0, 0.3], [-0.4, 0.3, 0.5]]),
        ),
    ),
]

ANTITHETIC = (Gaussian, Exponential)  # the others raise NotImplementedError


# The fast tier leaves out two cases whose families it covers otherwise (the slowest):
# the vector Gamma (the scalar one stays) and the 2-D Gaussian (1-D and 3-D stay).
SLOW_CASES = ("gamma-3", "gaussian-2")


@pytest.fixture(
    params=[
        pytest.param(c, marks=pytest.mark.slow) if c.id in SLOW_CASES else c for c in CASES
    ],
    ids=[c.id for c in CASES],
)
def case(request):
    return request.param


@pytest.fixture
def q(case):
    return case.make(np.float64)


# --- helpers -------------------------------------------------------------------------


def fields(q) -> dict:
    return {f.name: np.asarray(getattr(q, f.name)) for f in dataclasses.fields(q)}


def is_scalar_family(q) -> bool:
    return not isinstance(q, Gaussian)


_DRAWS: dict = {}


def draws(case: Case, seed: int = 1) -> jax.Array:
    """``N_MC`` float64 draws of ``case`` (eager), shape ``(N_MC,) + event_shape``."""
    if (case.id, seed) not in _DRAWS:
        _DRAWS[case.id, seed] = case.make().sample(jax.random.key(seed), (N_MC,))
    return _DRAWS[case.id, seed]


def points(case: Case, n: int = 5) -> jax.Array:
    """``n`` points inside the support, shape ``(n,) + event_shape``."""
    return draws(case)[:n]


@jax.jit
def summary(q) -> dict:
    """Everything derived from the parameters, in one compilation per structure."""
    eta = q.natural_params
    back = q.from_natural(eta)
    return {
        "natural_params": eta,
        "log_normalizer": q.log_normalizer,
        "mean_sufficient_stats": q.mean_sufficient_stats,
        "fisher_information": q.fisher_information,
        "entropy": q.entropy,
        "mean": q.mean,
        "variance": q.variance,
        "is_proper": q.is_proper,
        "round_trip": back,
        "round_trip_is_proper": back.is_proper,
    }


@jax.jit
def log_prob_jit(q, x):
    return q.log_prob(x)


@jax.jit
def log_prob_batch(q, xs):
    return jax.vmap(q.log_prob)(xs)


@jax.jit
@jax.grad
def log_prob_grad(q, x):
    return q.log_prob(x)


@jax.jit
def sample_jit(q, key):
    """``N_MC`` draws, and the noise of ``N_MC`` keys split from ``key``."""
    return q.sample(key, (N_MC,)), jax.vmap(q.noise)(jax.random.split(key, N_MC))


def noise_eager(q, key):
    """As the noise of ``sample_jit``, eagerly (reusing the compiled sampler of ``draws``)."""
    return jax.vmap(q.noise)(jax.random.split(key, N_MC))


@jax.jit
def from_natural_is_proper(q, eta):
    return q.from_natural(eta).is_proper


@jax.jit
def evaluate(q, xs):
    """``log_prob`` and ``T(x) . eta - U(eta) + log nu(x)`` for a batch of ``x``."""
    t = jax.vmap(q.sufficient_stats)(xs)
    form = t @ q.natural_params - q.log_normalizer + jax.vmap(q.log_base_measure)(xs)
    return jax.vmap(q.log_prob)(xs), form


def scipy_dist(q):
    """The scipy.stats frozen distribution of ``q`` (elementwise for scalar families)."""
    f = fields(q)
    if isinstance(q, Exponential):
        return stats.expon(scale=1.0 / f["rate"])
    if isinstance(q, Gamma):
        return stats.gamma(f["concentration"], scale=1.0 / f["rate"])
    if isinstance(q, InverseGamma):
        return stats.invgamma(f["concentration"], scale=f["scale"])
    if isinstance(q, Beta):
        return stats.beta(f["concentration1"], f["concentration0"])
    if isinstance(q, Gaussian):
        return stats.multivariate_normal(f["mean"], np.asarray(q.cov))
    raise TypeError(type(q))


def components(q):
    """The scalar (event shape ``()``) families a scalar family is a product of."""
    n = math.prod(q.event_shape)
    return [jax.tree_util.tree_map(lambda v, i=i: v.reshape(-1)[i], q) for i in range(n)]


def improper_eta(q):
    """Natural parameters outside the natural parameter space."""
    eta = np.array(q.natural_params)
    if isinstance(q, Gaussian):
        eta[q.dim :] = -eta[q.dim :]  # a negative-definite precision
    else:
        # The last flat entry belongs to the last component's second (or only) part:
        # rate (Exponential, Gamma), scale (InverseGamma) or concentration0 - 1 (Beta).
        # -1.5 makes that one component improper; the others stay proper.
        eta[-1] = -1.5
    return jnp.asarray(eta)


def as_array(noise):
    """Noise as plain arrays (some families' noise is the PRNG key itself)."""
    if jnp.issubdtype(noise.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(noise))
    return np.asarray(noise)


def assert_within_se(estimate, target, se, what):
    estimate, target, se = (np.asarray(a, np.float64) for a in (estimate, target, se))
    err = np.abs(estimate - target)
    assert np.all(err < N_SE * se), f"{what}: |error| / standard error = {err / se}"


# --- 1. pytrees ----------------------------------------------------------------------


def test_pytree_round_trip(case, q):
    leaves, treedef = jax.tree_util.tree_flatten(q)
    assert len(leaves) == len(dataclasses.fields(q))
    q2 = jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(q)))
    assert type(q2) is type(q)
    for a, b in zip(leaves, jax.tree_util.tree_leaves(q2), strict=True):
        np.testing.assert_array_equal(a, b)

    q3 = jax.tree_util.tree_map(lambda v: v, q)
    assert type(q3) is type(q)
    assert q3.event_shape == q.event_shape
    for name, value in fields(q).items():
        np.testing.assert_array_equal(getattr(q3, name), value)
    x = points(case, n=1)[0]
    np.testing.assert_array_equal(log_prob_jit(q3, x), log_prob_jit(q, x))


# --- 2. jit == eager -----------------------------------------------------------------


def test_jit_matches_eager(case, q):
    x = points(case, n=1)[0]
    tol = {"rtol": 1e-12, "atol": 1e-12}
    np.testing.assert_allclose(log_prob_jit(q, x), q.log_prob(x), **tol)
    np.testing.assert_allclose(summary(q)["entropy"], q.entropy, **tol)
    np.testing.assert_allclose(summary(q)["natural_params"], q.natural_params, **tol)

    # The same key gives the same draws.
    key = jax.random.key(1)
    eager = draws(case, seed=1)
    jitted, jitted_noise = sample_jit(q, key)
    assert jitted.shape == eager.shape == (N_MC,) + q.event_shape
    # The noise to a few ulp: bit for bit with XLA's default settings, but with the
    # tests' (tests/conftest.py: the fusion emitters off) the jitted normal sampler's
    # fused arithmetic can differ from the eager one's in its last bit.
    noise = as_array(noise_eager(q, key))
    np.testing.assert_allclose(
        as_array(jitted_noise),
        noise,
        rtol=4 * np.finfo(noise.dtype).eps
        if np.issubdtype(noise.dtype, np.floating)
        else 0,
        atol=0,
    )
    if is_scalar_family(q):
        # As below, fused arithmetic may differ from the eager one in the last bits:
        # the gamma samplers work in log space, so a draw's relative error is the
        # absolute error of its log (a few ulp of |log x|, doubled by a boost U^(1/a)).
        np.testing.assert_allclose(jitted, eager, rtol=1e-13, atol=0)
    else:
        # The noise is identical to a few ulp (above), and under jit XLA fuses
        # ``mean + L @ z`` into one loop whose multiply-add may be contracted (FMA), so a
        # draw can differ from the eager one in its last bit.
        scale = float(jnp.max(jnp.abs(eager)))
        np.testing.assert_allclose(
            jitted, eager, rtol=0, atol=8 * np.finfo(float).eps * scale
        )

    # Other sample shapes and raw (uint32) keys, without compiling more samplers.
    for k in (jax.random.key(0), jax.random.PRNGKey(0)):
        for shape in ((), (1,), (2, 3)):
            out = jax.eval_shape(lambda k, s=shape: q.sample(k, s), k)
            assert out.shape == shape + q.event_shape
            assert out.dtype == q.dtype


def test_sample_on_its_own_compiles_one_program_per_structure():
    """``q.sample`` outside a trace is one compiled program per family type, shape and
    sample shape: new parameters reuse it, and its draws are those under ``jit``."""
    from jaxvb.families import _base

    q = Gamma(jnp.array([2.0, 3.0]), jnp.array([1.0, 0.5]))
    first = q.sample(jax.random.key(0), (4,))
    size = _base._sample_compiled._cache_size()
    Gamma(jnp.array([5.0, 1.5]), jnp.array([2.0, 2.0])).sample(jax.random.key(1), (4,))
    assert _base._sample_compiled._cache_size() == size
    traced = jax.jit(lambda q, k: q.sample(k, (4,)))(q, jax.random.key(0))
    np.testing.assert_allclose(first, traced, rtol=1e-13, atol=0)


# --- 3. vmap over a batch of families ------------------------------------------------


@jax.jit
@jax.vmap
def batch_natural_params(q):
    return q.natural_params, q.is_proper


def test_vmap_over_families(case, q):
    scales = (1.0, 1.1, 0.9)  # positive rescalings keep every family proper
    batch = jax.tree_util.tree_map(lambda v: jnp.stack([v * s for s in scales]), q)
    members = [jax.tree_util.tree_map(lambda v, i=i: v[i], batch) for i in range(3)]
    xs = points(case, n=len(scales))

    got = jax.vmap(lambda q, x: q.log_prob(x))(batch, xs)
    want = [log_prob_jit(m, x) for m, x in zip(members, xs, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-12)

    # (vmapping the whole ``summary`` would work too, but compiling it is slow.)
    eta, proper = batch_natural_params(batch)
    want = [summary(m)["natural_params"] for m in members]
    np.testing.assert_allclose(eta, want, rtol=1e-12)
    assert bool(jnp.all(proper))


# --- 4. dtypes -----------------------------------------------------------------------


def _everything(q, key):
    x = jnp.asarray(q.mean)  # inside the support for every case
    return {
        "sample": q.sample(key, (3,)),
        "sample()": q.sample(key),
        "from_noise": q.from_noise(q.noise(key)),
        "natural_params": q.natural_params,
        "sufficient_stats": q.sufficient_stats(x),
        "log_prob": q.log_prob(x),
        "entropy": q.entropy,
        "mean": q.mean,
        "variance": q.variance,
        "log_normalizer": q.log_normalizer,
        "mean_sufficient_stats": q.mean_sufficient_stats,
        "fisher_information": q.fisher_information,
        "from_natural": q.from_natural(q.natural_params),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_dtype_preserved(case, dtype):
    q = case.make(dtype)
    assert q.dtype == dtype
    for leaf in jax.tree_util.tree_leaves(q):
        assert leaf.dtype == dtype
    assert q.natural_params.dtype == dtype  # concretely, for the cheapest one
    # Tracing decides every dtype, so eval_shape gives exactly the dtypes a run gives.
    out = jax.eval_shape(_everything, q, jax.random.key(0))
    assert out["sufficient_stats"].shape == (q.num_stats,)
    wrong = {
        f"{name}: {leaf.dtype}"
        for name, value in out.items()
        for leaf in jax.tree_util.tree_leaves(value)
        if leaf.dtype != dtype
    }
    assert not wrong, f"outputs that lost the {np.dtype(dtype)} dtype: {sorted(wrong)}"


# --- 5. natural <-> usual parameters, properness, validation -------------------------


def test_natural_round_trip(q):
    s = summary(q)
    k = q.num_stats
    assert s["natural_params"].shape == (k,)
    assert s["mean_sufficient_stats"].shape == (k,)
    assert s["fisher_information"].shape == (k, k)
    q2 = s["round_trip"]
    assert type(q2) is type(q)
    assert bool(s["is_proper"]) and bool(s["round_trip_is_proper"])
    for name, value in fields(q).items():
        got = np.asarray(getattr(q2, name))
        assert got.shape == value.shape, name
        atol = 1e-12 * np.max(np.abs(value))
        np.testing.assert_allclose(got, value, rtol=1e-10, atol=atol, err_msg=name)
    # Eagerly too, as a user would call it.
    q3 = q.from_natural(q.natural_params)
    for name, value in fields(q).items():
        atol = 1e-12 * np.max(np.abs(value))
        np.testing.assert_allclose(getattr(q3, name), value, rtol=1e-10, atol=atol)


def test_from_natural_improper_is_flagged(q):
    eta = improper_eta(q)
    bad = q.from_natural(eta)  # must not raise
    assert type(bad) is type(q)
    assert not bool(bad.is_proper)
    # ... nor under jit, where nothing can be checked concretely.
    assert not bool(from_natural_is_proper(q, eta))
    assert bool(from_natural_is_proper(q, q.natural_params))


INVALID = [
    ("exponential-zero", lambda: Exponential(rate=0.0)),
    ("exponential-negative", lambda: Exponential(rate=-1.0)),
    ("exponential-nan", lambda: Exponential(rate=np.nan)),
    ("exponential-inf", lambda: Exponential(rate=np.inf)),
    ("exponential-one-bad-element", lambda: Exponential(rate=[1.0, -2.0, 3.0])),
    ("gamma-concentration", lambda: Gamma(concentration=0.0, rate=1.0)),
    ("gamma-rate", lambda: Gamma(concentration=2.0, rate=-1.0)),
    ("gamma-array", lambda: Gamma(concentration=[1.0, 2.0], rate=[1.0, 0.0])),
    ("inverse_gamma-concentration", lambda: InverseGamma(concentration=-1.0, scale=1.0)),
    ("inverse_gamma-scale", lambda: InverseGamma(concentration=3.0, scale=0.0)),
    ("beta-concentration1", lambda: Beta(concentration1=0.0, concentration0=1.0)),
    ("beta-concentration0", lambda: Beta(concentration1=1.0, concentration0=-0.5)),
    (
        "gaussian-indefinite",
        lambda: Gaussian(np.zeros(2), np.array([[1.0, 2.0], [2.0, 1.0]])),
    ),
    ("gaussian-singular", lambda: Gaussian(np.zeros(2), np.ones((2, 2)))),
    ("gaussian-negative-1d", lambda: Gaussian(np.zeros(1), -np.eye(1))),
    ("gaussian-zero-1d", lambda: Gaussian(np.zeros(1), np.zeros((1, 1)))),
    (
        "gaussian-nonsymmetric",
        lambda: Gaussian(np.zeros(2), np.array([[1.0, 0.5], [0.2, 1.0]])),
    ),
    ("gaussian-nan", lambda: Gaussian(np.zeros(2), np.full((2, 2), np.nan))),
    ("gaussian-shape", lambda: Gaussian(np.zeros(2), np.eye(3))),
    ("gaussian-mean-ndim", lambda: Gaussian(0.0, np.eye(1))),
]


@pytest.mark.parametrize("make", [m for _, m in INVALID], ids=[i for i, _ in INVALID])
def test_constructor_rejects_invalid(make):
    with pytest.raises(ValueError):
        make()


# --- 6. normalisation ----------------------------------------------------------------


def _quad_scalar(qi) -> float:
    """The integral of exp(log_prob) of one scalar component, by adaptive quadrature."""

    def density(x):
        return math.exp(float(log_prob_jit(qi, x)))

    opts = {"epsabs": 1e-11, "epsrel": 1e-11, "limit": 200}
    if isinstance(qi, Beta):
        return integrate.quad(density, 0.0, 1.0, **opts)[0]
    split = float(qi.mean)  # finite for every case here
    return (
        integrate.quad(density, 0.0, split, **opts)[0]
        + integrate.quad(density, split, np.inf, **opts)[0]
    )


def _gaussian_mass(q) -> float:
    m = np.asarray(q.mean)
    sd = np.sqrt(np.diag(np.asarray(q.cov)))
    if q.dim == 1:

        def density(x):
            return math.exp(float(log_prob_jit(q, jnp.array([x]))))

        opts = {"epsabs": 1e-11, "epsrel": 1e-11}
        return (
            integrate.quad(density, -np.inf, m[0], **opts)[0]
            + integrate.quad(density, m[0], np.inf, **opts)[0]
        )
    # d >= 2: a regular grid over +-9 marginal sds (the mass outside is < 1e-15 here).
    # The integrand and all its derivatives vanish at the box edges, so the trapezoidal
    # (here: plain sum) rule converges spectrally; its error is the aliasing term
    # ~exp(-2 pi^2 lambda_min(R) / c^2), R the correlation matrix, c the spacing in sds:
    # ~exp(-40) for these cases.
    g = 64
    axes = [np.linspace(m[i] - 9 * sd[i], m[i] + 9 * sd[i], g) for i in range(q.dim)]
    cell = np.prod([a[1] - a[0] for a in axes])
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, q.dim)
    return float(np.sum(np.exp(np.asarray(log_prob_batch(q, jnp.asarray(grid))))) * cell)


def test_log_prob_integrates_to_one(case, q):
    if is_scalar_family(q):
        for qi in components(q):
            assert _quad_scalar(qi) == pytest.approx(1.0, abs=1e-6)
        # A product family's log_prob is the sum of its components'.
        x = points(case, n=1)[0]
        parts = [
            log_prob_jit(qi, xi)
            for qi, xi in zip(components(q), x.reshape(-1), strict=True)
        ]
        np.testing.assert_allclose(log_prob_jit(q, x), sum(parts), rtol=1e-12)
    else:
        assert _gaussian_mass(q) == pytest.approx(1.0, abs=1e-6)


# --- 7. scipy.stats ------------------------------------------------------------------


def test_matches_scipy(case, q):
    ref = scipy_dist(q)
    s = summary(q)
    if is_scalar_family(q):
        # Quantiles of every component, so that both tails are exercised.
        u = np.array([0.001, 0.3, 0.5, 0.8, 0.999]).reshape(
            (-1,) + (1,) * len(q.event_shape)
        )
        xs = ref.ppf(np.broadcast_to(u, (5,) + q.event_shape))
        want = ref.logpdf(xs).reshape(5, -1).sum(1)
        np.testing.assert_allclose(s["mean"], ref.mean(), rtol=1e-12)
        np.testing.assert_allclose(s["variance"], ref.var(), rtol=1e-12)
    else:
        xs = np.array(points(case, n=5))
        xs[0] = np.asarray(q.mean) + 4.0 * np.sqrt(np.diag(np.asarray(q.cov)))
        want = ref.logpdf(xs)
        np.testing.assert_allclose(s["mean"], ref.mean, rtol=1e-12)
        np.testing.assert_allclose(s["variance"], np.diag(ref.cov), rtol=1e-12)
    np.testing.assert_allclose(evaluate(q, jnp.asarray(xs))[0], want, rtol=1e-10)
    # Eager, one point: the path a user takes.
    np.testing.assert_allclose(q.log_prob(xs[1]), want[1], rtol=1e-10)
    np.testing.assert_allclose(s["entropy"], np.sum(ref.entropy()), rtol=1e-10)
    np.testing.assert_allclose(q.entropy, np.sum(ref.entropy()), rtol=1e-10)


# --- 8. sample moments ---------------------------------------------------------------


def test_sample_moments(case, q):
    x = np.asarray(draws(case, seed=1)).reshape(N_MC, -1)
    n = x.shape[0]
    assert np.all(np.isfinite(x))
    if isinstance(q, Beta):
        assert np.all((x > 0) & (x < 1))
    elif is_scalar_family(q):
        assert np.all(x > 0)
    s = summary(q)
    mean = np.asarray(s["mean"]).reshape(-1)
    var = np.asarray(s["variance"]).reshape(-1)

    # The sample mean has standard error sqrt(var / n).
    assert_within_se(x.mean(0), mean, np.sqrt(var / n), "mean")

    # A sample (co)variance is a mean of products of centred draws; its standard error
    # is estimated from those products, i.e. from the 4th central moment of the draws.
    c = x - x.mean(0)
    if is_scalar_family(q):
        prods, target, what = c**2, var, "variance"
    else:
        prods = (c[:, :, None] * c[:, None, :]).reshape(n, -1)
        target, what = np.asarray(q.cov).reshape(-1), "cov"
        np.testing.assert_allclose(var, np.diag(np.asarray(q.cov)))
    assert_within_se(prods.mean(0), target, prods.std(0) / np.sqrt(n), what)


# --- 9. moments of the sufficient statistics ------------------------------------------


def test_sufficient_stat_moments(case, q):
    t = np.asarray(jax.jit(jax.vmap(q.sufficient_stats))(draws(case, seed=2)))
    n, k = t.shape
    assert k == q.num_stats
    s = summary(q)

    mst = np.asarray(s["mean_sufficient_stats"])
    assert_within_se(t.mean(0), mst, t.std(0) / np.sqrt(n), "E[T]")

    fisher = np.asarray(s["fisher_information"])
    np.testing.assert_allclose(fisher, fisher.T, rtol=1e-12, atol=1e-14)
    assert np.linalg.eigvalsh(fisher).min() > 0

    # Cov[T] is the Fisher information; standard errors as for the variance above.
    c = t - t.mean(0)
    prods = (c[:, :, None] * c[:, None, :]).reshape(n, -1)
    assert_within_se(prods.mean(0), fisher.reshape(-1), prods.std(0) / np.sqrt(n), "Cov[T]")


def _overrides_moments(cls) -> bool:
    base = ExponentialFamily
    return (
        cls.mean_sufficient_stats is not base.mean_sufficient_stats
        or cls.fisher_information is not base.fisher_information
    )


@jax.jit
def log_normalizer_derivatives(q):
    eta = q.natural_params
    return jax.grad(q._log_normalizer)(eta), jax.hessian(q._log_normalizer)(eta)


OVERRIDING = [c for c in CASES if _overrides_moments(c.cls)]


@pytest.mark.parametrize("case", OVERRIDING, ids=[c.id for c in OVERRIDING])
def test_closed_form_moments_match_log_normalizer(case):
    """A family may give E[T] and Cov[T] in closed form; they must be U's derivatives."""
    q = case.make()
    s = summary(q)
    grad, hess = log_normalizer_derivatives(q)
    np.testing.assert_allclose(s["mean_sufficient_stats"], grad, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(s["fisher_information"], hess, rtol=1e-10, atol=1e-12)


def test_entropy_is_exponential_family(q):
    """H = U(eta) - eta . E[T] (log nu = 0 for every family here)."""
    s = summary(q)
    want = s["log_normalizer"] - s["natural_params"] @ s["mean_sufficient_stats"]
    np.testing.assert_allclose(s["entropy"], want, rtol=1e-10, atol=1e-12)


# --- 10. exponential-family identity and support ---------------------------------------


def test_log_prob_is_exponential_family(case, q):
    xs = points(case, n=5)
    want, form = evaluate(q, xs)
    assert np.all(np.isfinite(want))
    np.testing.assert_allclose(form, want, rtol=1e-10, atol=1e-10)
    # Eagerly, one point.
    x = xs[0]
    lp = q.sufficient_stats(x) @ q.natural_params - q.log_normalizer
    np.testing.assert_allclose(lp, q.log_prob(x), rtol=1e-10, atol=1e-10)


def _outside_support(case, q):
    inside = np.asarray(points(case, n=1)[0])
    if isinstance(q, Beta):
        bad_values = [-0.2, 0.0, 1.0, 1.3]
    elif isinstance(q, Exponential):
        bad_values = [-1e-3, -2.0]  # the support is [0, inf)
    else:
        bad_values = [-1e-3, -2.0, 0.0]  # the support is (0, inf)
    out = []
    for v in bad_values:
        out.append(np.full(q.event_shape, v))
        one = inside.copy()  # a single component outside is enough
        one.reshape(-1)[-1] = v
        out.append(one)
    return out


SCALAR_CASES = [c for c in CASES if c.cls is not Gaussian]  # Gaussian: support is R^d


@pytest.mark.parametrize("case", SCALAR_CASES, ids=[c.id for c in SCALAR_CASES])
def test_log_prob_outside_support(case):
    q = case.make()
    xs = _outside_support(case, q)
    assert float(q.log_prob(xs[0])) == -np.inf  # eagerly
    for x in xs:
        assert float(log_prob_jit(q, x)) == -np.inf, x
        # The masked branch must not leak NaN into gradients.
        for g in jax.tree_util.tree_leaves(log_prob_grad(q, jnp.asarray(x))):
            assert np.all(np.isfinite(g)), x
    if isinstance(q, Exponential):
        zero = jnp.zeros(q.event_shape)
        np.testing.assert_allclose(log_prob_jit(q, zero), np.sum(np.log(fields(q)["rate"])))


# --- 11. antithetic sampling -----------------------------------------------------------


def test_antithetic(q):
    key = jax.random.key(3)
    if not isinstance(q, ANTITHETIC):
        with pytest.raises(NotImplementedError):
            q.antithetic(q.noise(key))
        return

    # Noise for N_MC keys (the shape whose sampler is already compiled), first pairs.
    noise = noise_eager(q, key)[:N_ANTITHETIC]
    x = jax.vmap(q.from_noise)(noise)
    xa = jax.vmap(lambda z: q.from_noise(q.antithetic(z)))(noise)
    x, xa = (np.asarray(a).reshape(N_ANTITHETIC, -1) for a in (x, xa))
    assert np.all(np.isfinite(xa))
    for i in range(x.shape[1]):
        assert np.corrcoef(x[:, i], xa[:, i])[0, 1] < 0, i
    # The antithetic draws have the same distribution; check their mean.
    mean = np.asarray(q.mean).reshape(-1)
    var = np.asarray(q.variance).reshape(-1)
    assert_within_se(xa.mean(0), mean, np.sqrt(var / N_ANTITHETIC), "antithetic mean")
