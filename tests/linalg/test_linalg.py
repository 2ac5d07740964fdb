"""``jaxvb.linalg`` against dense NumPy / SciPy on small ``T``.

Exact checks (factor, solves, log-determinant, selected inverse, gradients) are asserted
to ``RTOL = 1e-10`` relative to the largest entry of the dense reference, over
``T in {1, 2, 5, 50}``, bandwidths ``w in {0, 1, 2}`` and borders ``k in {1, 2}``, plus one
matrix shaped like the paper's stochastic-volatility posterior (``T = 945``).

Speed: compilation is the cost, and every new shape is a new compilation (eager ``jnp``
calls included), so each case is one jitted function and the references -- band layout
included -- are built and compared in NumPy.

The Monte Carlo checks of the samplers use a fixed key, so they are deterministic; each
compares a sample moment with its exact value to within ``N_SE = 5`` standard errors.
For a fresh key the false-alarm rate of one such (approximately normal) comparison is
P(|Z| > 5) ~ 5.7e-7, ~1e-4 over the ~200 moments compared here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
from helpers import tiered
from jax.test_util import check_grads
from scipy import stats

from jaxvb import linalg as la
from jaxvb.linalg import _small as small

RTOL = 1e-10
N_SE = 5.0
N_MC = 20_000
SIZES = (1, 2, 5, 50)
# 0, 1 and 2 take the row recurrences, 5 the blocks (w >= 4: blocks of max(w, 8) rows;
# T = 50 is not a whole number of them, T = 1, 2, 5 are less than one)
BANDWIDTHS = (0, 1, 2, 5)
# Every (T, w) once, with k in {1, 2} in a checkerboard: each T and each w meets both k.
# The full cross product would double the compilations for little: k only sizes the
# dense k x k algebra, the same code for every (T, w).
ARROWHEAD_CASES = [
    (t, w, 1 + (i + j) % 2) for i, t in enumerate(SIZES) for j, w in enumerate(BANDWIDTHS)
]
# The fast tier takes the grid's diagonal, each T and each w once: (1, 0), (2, 1),
# (5, 2) and (50, 5) (the row recurrences, and the blocks over several of them); the
# other twelve are slow.
FAST_GRID = set(zip(SIZES, BANDWIDTHS, strict=True))


def grid(cases):
    """``cases`` (tuples led by ``(t, w)``) for ``parametrize``, off the diagonal slow."""
    return [
        c if c[:2] in FAST_GRID else pytest.param(*c, marks=pytest.mark.slow) for c in cases
    ]


# --- dense references (NumPy) -------------------------------------------------------


def band_mask(t, w):
    i = np.arange(t)
    return np.abs(i[:, None] - i[None, :]) <= w


def np_band(a, w):
    """The lower band form of ``a``, written independently of ``jaxvb.linalg``."""
    t = a.shape[0]
    ab = np.zeros((w + 1, t))
    for r in range(min(w + 1, t)):
        ab[r, : t - r] = np.diagonal(a, -r)
    return ab


def np_dense(ab, symmetric=True):
    ab = np.asarray(ab)
    t = ab.shape[1]
    lower = np.zeros((t, t))
    for r in range(min(ab.shape[0], t)):
        lower += np.diag(ab[r, : t - r], -r)
    return lower + np.tril(lower, -1).T if symmetric else lower


def np_arrowhead(p, w, k):
    t = p.shape[0] - k
    return la.Arrowhead(np_band(p[:t, :t], w), p[:t, t:], p[t:, t:])


def random_banded_factor(rng, t, w):
    """A lower-triangular ``L`` of bandwidth ``w``, diagonal in [0.5, 1.5]: ``L L'`` is
    SPD with bandwidth ``w`` and a moderate condition number."""
    chol = np.tril(rng.normal(0.0, 0.4, (t, t))) * band_mask(t, w)
    chol[np.diag_indices(t)] = rng.uniform(0.5, 1.5, t)
    return chol


def random_banded(rng, t, w):
    chol = random_banded_factor(rng, t, w)
    return chol @ chol.T


def random_arrowhead(rng, t, w, k):
    """An SPD arrowhead ``[[A, B], [B', C]]``, built from its (unique) Cholesky factor."""
    chol = np.zeros((t + k, t + k))
    chol[:t, :t] = random_banded_factor(rng, t, w)
    chol[t:, :] = rng.normal(0.0, 0.5, (k, t + k))
    chol[t:, t:] = np.tril(chol[t:, t:])
    chol[np.arange(t, t + k), np.arange(t, t + k)] = rng.uniform(0.5, 1.5, k)
    return chol @ chol.T


def sv_shaped(t=945, phi=0.98, sigma2=0.02, seed=0):
    """The shape of the SV posterior precision (paper, sec. 6.1), ``x = (v, log beta)``.

    A stationary AR(1) prior on ``v`` (tridiagonal) and, per time step, the negative
    Hessian of ``log N(y_t; 0, beta^2 exp(v_t))``, which depends on ``v_t + 2 log beta``
    only: with ``h_t = y_t^2 / (beta^2 exp(v_t))`` it is ``h_t [[1/2, 1], [1, 2]]`` in
    ``(v_t, log beta)``. The flat prior on ``log beta`` adds nothing.
    """
    rng = np.random.default_rng(seed)
    h = rng.uniform(0.5, 1.5, t)
    band = np.zeros((2, t))
    band[0] = (1.0 + phi**2) / sigma2 + h / 2
    band[0, [0, -1]] = 1.0 / sigma2 + h[[0, -1]] / 2
    band[1, : t - 1] = -phi / sigma2
    return la.Arrowhead(band, h[:, None], np.array([[2.0 * h.sum()]]))


def close(actual, expected, rtol=RTOL):
    """Largest absolute error at most ``rtol`` times the largest entry of ``expected``."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-300)
    err = float(np.max(np.abs(actual - expected), initial=0.0)) / scale
    assert err <= rtol, f"relative error {err:.3g} > {rtol:.3g}"


# --- banded --------------------------------------------------------------------------


@jax.jit
def banded_everything(ab, rhs):
    chol = la.cholesky_banded(ab)
    return dict(
        chol=chol,
        is_pd=la.is_pd_banded(chol),
        logdet=la.logdet_banded(chol),
        solve=la.solve_banded(chol, rhs),
        matvec=la.matvec_banded(ab, rhs),
        selinv=la.selected_inverse_banded(chol),
        dense=la.to_dense(ab),
        dense_chol=la.to_dense(chol, symmetric=False),
    )


@pytest.mark.parametrize(
    ("t", "w"),
    grid([(t, w) for t in SIZES for w in BANDWIDTHS])
    + [pytest.param(*c, marks=pytest.mark.slow) for c in ((50, 9), (23, 11), (7, 9))],
)
def test_banded_against_dense(t, w):
    """Every size and bandwidth, and blocks of exactly ``w`` rows (``w = 9, 11``; 50 and
    23 rows are not whole blocks; 7 rows are fewer than ``w``)."""
    rng = np.random.default_rng(100 * t + w)
    a = random_banded(rng, t, w)
    rhs = rng.normal(size=(t, 3))
    ab = np_band(a, w)
    padding = np.arange(t)[None, :] >= t - np.arange(w + 1)[:, None]
    out = banded_everything(np.where(padding, 7.0, ab), rhs)

    close(out["dense"], a)  # garbage in the padding is ignored
    close(out["chol"], sla.cholesky_banded(ab, lower=True))
    close(out["dense_chol"], np.linalg.cholesky(a))
    assert bool(out["is_pd"])
    assert abs(out["logdet"] - np.linalg.slogdet(a)[1]) < RTOL * t
    close(out["solve"], np.linalg.solve(a, rhs))
    close(out["matvec"], a @ rhs)
    close(np_dense(out["selinv"]), np.where(band_mask(t, w), np.linalg.inv(a), 0.0))
    # Outputs have zero padding.
    for r in range(1, w + 1):
        assert np.all(np.asarray(out["chol"])[r, max(t - r, 0) :] == 0)
        assert np.all(np.asarray(out["selinv"])[r, max(t - r, 0) :] == 0)


def test_dense_conversions_vector_right_hand_sides_and_eager_equals_jit():
    rng = np.random.default_rng(2)
    t, w = 7, 2
    a = random_banded(rng, t, w)
    b = rng.normal(size=t)
    chol = np.linalg.cholesky(a)

    def f(a, b):
        ab = la.from_dense(a, w)
        c = la.cholesky_banded(ab)
        return (
            ab,
            la.to_dense(ab),
            la.solve_triangular_banded(c, b),
            la.solve_triangular_banded(c, b, transpose=True),
            la.solve_banded(c, b),
            la.matvec_banded(ab, b),
        )

    jitted = jax.jit(f)(a, b)
    eager = la.solve_banded(la.cholesky_banded(np_band(a, w)), b)
    close(eager, jitted[4], rtol=1e-12)
    close(jitted[0], np_band(a, w))
    close(jitted[1], a)
    close(jitted[2], sla.solve_triangular(chol, b, lower=True))
    close(jitted[3], sla.solve_triangular(chol, b, lower=True, trans="T"))
    close(jitted[4], np.linalg.solve(a, b))
    close(jitted[5], a @ b)


def test_wide_band_uses_the_library_triangular_solve():
    rng = np.random.default_rng(1)
    t, w = 30, 12  # w > _UNROLL_MAX
    a = random_banded(rng, t, w)
    sel = jax.jit(lambda ab: la.selected_inverse_banded(la.cholesky_banded(ab)))
    close(np_dense(sel(np_band(a, w))), np.where(band_mask(t, w), np.linalg.inv(a), 0))


# --- arrowhead ----------------------------------------------------------------------


@jax.jit
def arrowhead_everything(p, rhs):
    factor = la.cholesky_arrowhead(p)
    return dict(
        factor=factor,
        is_pd=la.is_pd_arrowhead(factor),
        logdet=la.logdet_arrowhead(factor),
        solve=la.solve_arrowhead(factor, rhs),
        matvec=la.matvec_arrowhead(p, rhs),
        selinv=la.selected_inverse_arrowhead(factor),
        dense=la.to_dense_arrowhead(p),
    )


def check_arrowhead(p_dense, rhs, t, w, out):
    chol = np.linalg.cholesky(p_dense)
    factor = out["factor"]
    assert isinstance(factor, la.ArrowheadCholesky)
    close(out["dense"], p_dense)
    # The factor's blocks are the blocks of the dense Cholesky factor.
    close(np_dense(factor.band, symmetric=False), chol[:t, :t])
    close(factor.border, chol[t:, :t].T)
    close(factor.corner, chol[t:, t:])
    assert bool(out["is_pd"])
    assert abs(out["logdet"] - np.linalg.slogdet(p_dense)[1]) < RTOL * p_dense.shape[0]
    close(out["solve"], np.linalg.solve(p_dense, rhs))
    close(out["matvec"], p_dense @ rhs)
    sigma = np.linalg.inv(p_dense)
    sel = out["selinv"]
    assert isinstance(sel, la.Arrowhead)
    close(np_dense(sel.band), np.where(band_mask(t, w), sigma[:t, :t], 0.0))
    close(sel.border, sigma[:t, t:])
    close(sel.corner, sigma[t:, t:])


@jax.jit
def arrowhead_routines(p, rhs, h, x):
    """Every arrowhead routine at ``p``, in one program: the three tests of a grid case
    read one compilation (not three)."""
    factor, y = la.cholesky_forward_arrowhead(p, h)
    f = x[:, 0]
    log_q = (
        la.logdet_arrowhead(factor) / 2
        - 0.5
        * jnp.sum((la.matvec_triangular_arrowhead(factor, f, transpose=True) - y) ** 2)
        - 0.5 * f.shape[0] * jnp.log(2 * jnp.pi)
    )
    return dict(
        everything=arrowhead_everything(p, rhs),
        gaussian=la.gaussian_arrowhead(p, h),
        forward=(factor, y),
        lower_x=la.matvec_triangular_arrowhead(factor, x),
        upper_f=la.matvec_triangular_arrowhead(factor, f, transpose=True),
        log_q=log_q,
    )


@functools.cache
def arrowhead_case(t, w, k):
    """A random SPD arrowhead of the grid (its dense form), right-hand sides ``rhs``
    (two columns), ``h`` and ``x``, and :func:`arrowhead_routines` at them."""
    rng = np.random.default_rng(1000 * t + 10 * w + k)
    p_dense = random_arrowhead(rng, t, w, k)
    rhs, h, x = (
        rng.normal(size=(t + k, 2)),
        rng.normal(size=t + k),
        rng.normal(size=(t + k, 2)),
    )
    p = np_arrowhead(p_dense, w, k)
    return p_dense, p, rhs, h, x, arrowhead_routines(p, rhs, h, x)


def arrowhead_grid():
    """``grid(ARROWHEAD_CASES)``, the three tests of a case on one xdist worker (where
    their shared computation is)."""
    out = []
    for c in grid(ARROWHEAD_CASES):
        values, marks = (c.values, list(c.marks)) if hasattr(c, "values") else (c, [])
        group = pytest.mark.xdist_group("linalg_arrowhead_{}_{}_{}".format(*values))
        out.append(pytest.param(*values, marks=[*marks, group]))
    return out


@pytest.mark.parametrize(("t", "w", "k"), arrowhead_grid())
def test_arrowhead_against_dense(t, w, k):
    p_dense, _, rhs, _, _, out = arrowhead_case(t, w, k)
    check_arrowhead(p_dense, rhs, t, w, out["everything"])


@pytest.mark.parametrize(("t", "w", "k"), arrowhead_grid())
def test_gaussian_arrowhead_is_factor_mean_and_selected_inverse(t, w, k):
    """The fused two-scan path (w = 1) and the composed one (other w) against dense."""
    p_dense, _, _, h, _, out = arrowhead_case(t, w, k)
    factor, mean, sel = out["gaussian"]
    expected = out["everything"]["factor"]  # la.cholesky_arrowhead
    for a, b in zip(factor, expected, strict=True):
        close(a, b)
    close(mean, np.linalg.solve(p_dense, h))
    sigma = np.linalg.inv(p_dense)
    close(np_dense(sel.band), np.where(band_mask(t, w), sigma[:t, :t], 0.0))
    close(sel.border, sigma[:t, t:])
    close(sel.corner, sigma[t:, t:])


@pytest.mark.parametrize(("t", "w", "k"), arrowhead_grid())
def test_cholesky_forward_and_triangular_matvec_against_dense(t, w, k):
    """The one-scan factor and ``L^{-1} h`` (w = 1; composed otherwise), ``L x``, ``L' x``,
    and the density they give, ``log N(f; P^{-1} h, P^{-1})``, against dense NumPy/SciPy."""
    p_dense, p, _, h, x, out = arrowhead_case(t, w, k)
    factor, y = out["forward"]
    for a, b in zip(factor, out["everything"]["factor"], strict=True):  # cholesky_arrowhead
        close(a, b)
    low = np.linalg.cholesky(p_dense)
    close(y, np.linalg.solve(low, h))
    close(out["lower_x"], low @ x)
    close(out["upper_f"], low.T @ x[:, 0])
    cov = np.linalg.inv(p_dense)
    close(out["log_q"], stats.multivariate_normal(cov @ h, cov).logpdf(x[:, 0]))
    with pytest.raises(ValueError, match="h must have shape"):
        la.cholesky_forward_arrowhead(p, h[:-1])


def test_stochastic_volatility_shaped_arrowhead():
    """T = 945 as in the paper's data, AR(1) with phi = 0.98; also the dense round trip."""
    p = sv_shaped()
    t = p.band.shape[1]
    p_dense = np_dense(p.band)
    p_dense = np.block([[p_dense, p.border], [p.border.T, p.corner]])
    rhs = np.random.default_rng(3).normal(size=(t + 1, 2))
    out = arrowhead_everything(p, rhs)
    check_arrowhead(p_dense, rhs, t, 1, out)
    back = jax.jit(la.from_dense_arrowhead, static_argnums=(1, 2))(p_dense, 1, 1)
    for a, b in zip(back, p, strict=True):
        close(a, b, rtol=0)


# --- sampling -------------------------------------------------------------------------


def check_moments(draws, mean, cov):
    """Sample mean and covariance (about the known mean) within N_SE standard errors."""
    n = draws.shape[0]
    sd = np.sqrt(np.diag(cov))
    z_mean = (draws.mean(0) - mean) / (sd / np.sqrt(n))
    assert np.max(np.abs(z_mean)) < N_SE, np.max(np.abs(z_mean))
    centred = draws - mean
    sample_cov = centred.T @ centred / n
    # Var[(x_i - m_i)(x_j - m_j)] = S_ii S_jj + S_ij^2 for a Gaussian.
    se = np.sqrt((np.outer(sd**2, sd**2) + cov**2) / n)
    z_cov = (sample_cov - cov) / se
    assert np.max(np.abs(z_cov)) < N_SE, np.max(np.abs(z_cov))


def test_sample_banded_moments():
    rng = np.random.default_rng(4)
    t, w = 6, 2
    a = random_banded(rng, t, w)
    mean = rng.normal(size=t)

    @jax.jit
    def draw(key, ab, mean):
        chol = la.cholesky_banded(ab)
        return (
            la.sample_banded(key, chol, mean, (N_MC,)),
            la.sample_banded(key, chol, None, (N_MC,)),
        )

    draws, centred = draw(jax.random.key(0), np_band(a, w), mean)
    assert draws.shape == (N_MC, t)
    check_moments(np.asarray(draws), mean, np.linalg.inv(a))
    close(np.asarray(centred) + mean, draws, rtol=1e-14)  # the mean is a shift


def test_sample_arrowhead_moments():
    rng = np.random.default_rng(5)
    t, w, k = 6, 1, 2
    p_dense = random_arrowhead(rng, t, w, k)
    mean = rng.normal(size=t + k)

    @jax.jit
    def draw(key, p, mean):
        factor = la.cholesky_arrowhead(p)
        return la.sample_arrowhead(key, factor, mean, (100, N_MC // 100))

    draws = draw(jax.random.key(1), np_arrowhead(p_dense, w, k), mean)
    assert draws.shape == (100, N_MC // 100, t + k)
    check_moments(np.asarray(draws).reshape(N_MC, t + k), mean, np.linalg.inv(p_dense))


# --- gradients ------------------------------------------------------------------------


def symmetric_grad(g_dense, w):
    """d f / d ab from d f / d A (symmetric): an off-diagonal band entry sets A[i, j]
    and A[j, i], so it collects both."""
    return np_band(2 * g_dense - np.diag(np.diag(g_dense)), w)


@pytest.mark.parametrize("w", (0, 2, 5))
def test_banded_gradients_match_dense_formulas(w):
    rng = np.random.default_rng(6 + w)
    t = 9
    a = random_banded(rng, t, w)
    b = rng.normal(size=t)

    @jax.jit
    def grads(ab, b):
        def logdet(ab):
            return la.logdet_banded(la.cholesky_banded(ab))

        def quad(ab, b):
            return b @ la.solve_banded(la.cholesky_banded(ab), b)

        sel = la.selected_inverse_banded(la.cholesky_banded(ab))
        return jax.grad(logdet)(ab), jax.grad(quad, argnums=(0, 1))(ab, b), sel

    g_logdet, (g_quad_ab, g_quad_b), sel = grads(np_band(a, w), b)
    sigma = np.linalg.inv(a)
    x = sigma @ b
    # d log|A| / dA = A^{-1};  d b'A^{-1}b / dA = -x x',  d / db = 2 x.
    close(g_logdet, symmetric_grad(sigma, w))
    close(g_quad_ab, symmetric_grad(-np.outer(x, x), w))
    close(g_quad_b, 2 * x)
    # The selected inverse is the gradient of the log-determinant.
    close(g_logdet, symmetric_grad(np_dense(sel), w))


def test_arrowhead_gradients_match_dense_formulas():
    rng = np.random.default_rng(9)
    t, w, k = 8, 1, 2
    p_dense = random_arrowhead(rng, t, w, k)
    b = rng.normal(size=t + k)

    def f(p):
        factor = la.cholesky_arrowhead(p)
        return la.logdet_arrowhead(factor) - 0.5 * b @ la.solve_arrowhead(factor, b)

    g = jax.jit(jax.grad(f))(np_arrowhead(p_dense, w, k))
    sigma = np.linalg.inv(p_dense)
    x = sigma @ b
    gd = sigma + 0.5 * np.outer(x, x)  # d/dP of log|P| - b'P^{-1}b / 2
    close(g.band, symmetric_grad(gd[:t, :t], w))
    close(g.border, 2 * gd[:t, t:])  # B appears twice (B and B')
    close(g.corner, gd[t:, t:])  # C is a full (k, k) array: each entry once


def test_gradients_against_finite_differences():
    """Forward and reverse mode through the factor, solve and selected inverse scans,
    against central differences (the arrowhead reuses these scans)."""
    rng = np.random.default_rng(8)
    t, w = 6, 2
    ab = np_band(random_banded(rng, t, w), w)
    b = rng.normal(size=t)

    def f(ab, b):
        chol = la.cholesky_banded(ab)
        sel = la.selected_inverse_banded(chol)
        return la.logdet_banded(chol) + b @ la.solve_banded(chol, b) + jnp.sum(sel)

    check_grads(
        jax.jit(f), (ab, b), order=1, modes=("fwd", "rev"), eps=1e-6, atol=1e-6, rtol=1e-6
    )


# --- w = 1 by prefix compositions (what accelerators run) ---------------------------------


@pytest.fixture
def parallel_tridiagonal(monkeypatch):
    """``w = 1`` through the log-depth prefix compositions, as on a GPU (the default
    on CPU is the scan over rows; the choice is read when a function is traced)."""
    monkeypatch.setenv("JAXVB_TRIDIAGONAL", "parallel")


@pytest.mark.parametrize("t", tiered((1, 2, 3, 5, 50, 1000), slow=(50, 1000)))
def test_parallel_tridiagonal_against_dense_and_the_row_scan(t, parallel_tridiagonal):
    """Factor, solves, selected inverse, sampling and gradients by prefix compositions
    equal the dense results (and the row scan's, to rounding); ``T = 3, 5, 1000`` are not
    powers of two (the last round is partial)."""
    rng = np.random.default_rng(200 + t)
    a = random_banded(rng, t, 1)
    rhs = rng.normal(size=(t, 3))
    ab = np_band(a, 1)

    def everything(ab, rhs):
        out = banded_everything.__wrapped__(ab, rhs)
        chol = out["chol"]
        out["draws"] = la.sample_banded(jax.random.key(0), chol, None, (4,))
        out["grad"] = jax.grad(
            lambda ab: (
                la.logdet_banded(la.cholesky_banded(ab))
                + jnp.sum(la.solve_banded(la.cholesky_banded(ab), rhs) ** 2)
            )
        )(ab)
        return out

    out = jax.jit(everything)(ab, rhs)
    close(out["chol"], sla.cholesky_banded(ab, lower=True))
    assert bool(out["is_pd"])
    assert abs(out["logdet"] - np.linalg.slogdet(a)[1]) < RTOL * t
    close(out["solve"], np.linalg.solve(a, rhs))
    close(np_dense(out["selinv"]), np.where(band_mask(t, 1), np.linalg.inv(a), 0.0))
    assert np.asarray(out["chol"])[1, -1] == 0 and np.asarray(out["selinv"])[1, -1] == 0
    sigma = np.linalg.inv(a)
    x = sigma @ rhs
    # d/dA of log|A| + |A^{-1} R|^2: A^{-1} - 2 sym(A^{-1} X X'), X = A^{-1} R.
    xx = sigma @ x @ x.T
    close(out["grad"], symmetric_grad(sigma - xx - xx.T, 1))
    # The draws are L'^{-1} z with the row scan's z: the same numbers to rounding.
    os_env = pytest.MonkeyPatch()
    os_env.setenv("JAXVB_TRIDIAGONAL", "sequential")
    try:
        rows = jax.jit(everything)(ab, rhs)
    finally:
        os_env.undo()
    close(out["draws"], rows["draws"], rtol=1e-12)
    close(out["grad"], rows["grad"], rtol=1e-12)


@pytest.mark.slow
def test_parallel_tridiagonal_is_accurate_on_long_ill_conditioned_chains(
    parallel_tridiagonal,
):
    """``T = 10^5``: a random-walk precision with small diagonal terms (condition number
    ~1e6) and an AR(1) one near the unit root, against the row scan (float64 and
    float32). The composed pivots are ratios of rescaled 2 x 2 products: no overflow,
    and errors grow like ``log T``, not ``T``."""
    t = 100_000
    rng = np.random.default_rng(13)
    rw = np.stack([np.full(t, 2.0 + 1e-6), -np.ones(t)])
    rw[0, [0, -1]] = 1.0 + 1e-6
    phi = 0.995
    ar = np.stack([np.full(t, 1.0 + phi**2 + 0.05), np.full(t, -phi)])
    ar[0, [0, -1]] = 1.05
    rhs = rng.normal(size=t)

    def run(ab, rhs):
        chol = la.cholesky_banded(ab)
        return chol, la.solve_banded(chol, rhs), la.selected_inverse_banded(chol)

    for ab, tol64, tol32 in ((rw, 1e-6, None), (ar, 1e-11, 1e-4)):
        ab[1, -1] = 0.0
        par = jax.jit(run)(ab, rhs)
        par32 = jax.jit(run)(ab.astype(np.float32), rhs.astype(np.float32))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("JAXVB_TRIDIAGONAL", "sequential")
            rows = jax.jit(run)(ab, rhs)
        for p, r, p32 in zip(par, rows, par32, strict=True):
            close(p, r, rtol=tol64)
            assert p32.dtype == np.float32
            if tol32 is not None:
                close(p32, r, rtol=tol32)


def test_tridiagonal_mode_must_be_known(monkeypatch):
    monkeypatch.setenv("JAXVB_TRIDIAGONAL", "fast")
    with pytest.raises(ValueError, match="JAXVB_TRIDIAGONAL must be one of"):
        la.cholesky_banded(np.array([[2.0, 2.0], [1.0, 0.0]]))


# --- vmap, dtypes, not positive definite, bad input ----------------------------------


def test_vmap_over_a_batch_equals_a_loop():
    rng = np.random.default_rng(10)
    t, w, k = 5, 2, 1
    ps = [np_arrowhead(random_arrowhead(rng, t, w, k), w, k) for _ in range(3)]
    batch = la.Arrowhead(*(np.stack(xs) for xs in zip(*ps, strict=True)))
    rhs = rng.normal(size=(3, t + k, 2))
    batched = jax.jit(jax.vmap(arrowhead_everything))(batch, rhs)
    for i, p in enumerate(ps):
        single = arrowhead_everything(p, rhs[i])
        for a, b in zip(
            jax.tree_util.tree_leaves(batched),
            jax.tree_util.tree_leaves(single),
            strict=True,
        ):
            close(np.asarray(a)[i], b, rtol=1e-13)


def test_float32_keeps_dtype_and_is_accurate():
    rng = np.random.default_rng(11)
    t, w, k = 50, 1, 1
    p_dense = random_arrowhead(rng, t, w, k)
    p32 = la.Arrowhead(*(x.astype(np.float32) for x in np_arrowhead(p_dense, w, k)))
    rhs = rng.normal(size=(t + k, 2)).astype(np.float32)

    @jax.jit
    def run(key, p, rhs):
        out = arrowhead_everything(p, rhs)
        draws = la.sample_arrowhead(key, out["factor"], None, (3,))
        chol = la.cholesky_banded(p.band)
        banded = la.selected_inverse_banded(chol), la.solve_banded(chol, rhs[:t])
        return out, draws, banded

    out, draws, banded = run(jax.random.key(0), p32, rhs)
    for leaf in jax.tree_util.tree_leaves((out, draws, banded)):
        assert leaf.dtype in (jnp.float32, jnp.bool_), leaf.dtype
    sigma = np.linalg.inv(p_dense)
    close(out["solve"], np.linalg.solve(p_dense, rhs), rtol=1e-4)
    close(out["selinv"].corner, sigma[t:, t:], rtol=1e-4)
    close(out["selinv"].band[0], np.diag(sigma)[:t], rtol=1e-4)
    a = p_dense[:t, :t]
    close(banded[0][0], np.diag(np.linalg.inv(a)), rtol=1e-4)
    close(banded[1], np.linalg.solve(a, rhs[:t]), rtol=1e-4)


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_not_positive_definite_gives_nan_not_a_number(mode, monkeypatch):
    """NaN at the first bad pivot and after it, by the row scan and by the prefix
    compositions of ``w = 1`` (whose later pivots would recover: they are masked)."""
    monkeypatch.setenv("JAXVB_TRIDIAGONAL", mode)
    t = 6
    bad = np.zeros((2, t))
    bad[0], bad[1, : t - 1] = 1.0, 0.6  # tridiagonal (1, 0.6): pivot 4 is negative
    good = np.stack([np.full(t, 2.0), np.full(t, 0.6)])
    zero_pivot = np.array([[1.0, 1.0], [1.0, 0.0]])  # [[1, 1], [1, 1]]
    # A positive definite, the Schur complement C - B'A^{-1}B = 1 - 6 not.
    bad_schur = la.Arrowhead(np.ones((1, t)), np.ones((t, 1)), np.array([[1.0]]))
    assert np.linalg.eigvalsh(np_dense(bad)).min() < 0

    @jax.jit
    def run(bad, good, zero_pivot, bad_schur):
        chol = la.cholesky_banded(bad)
        factor = la.cholesky_arrowhead(bad_schur)
        flags = jax.vmap(lambda ab: la.is_pd_banded(la.cholesky_banded(ab)))
        return dict(
            chol=chol,
            is_pd=la.is_pd_banded(chol),
            logdet=la.logdet_banded(chol),
            selinv=la.selected_inverse_banded(chol),
            solve=la.solve_banded(chol, jnp.ones(t)),
            zero_pivot=la.is_pd_banded(la.cholesky_banded(zero_pivot)),
            factor=factor,
            band_is_pd=la.is_pd_banded(factor.band),
            arrow_is_pd=la.is_pd_arrowhead(factor),
            arrow_logdet=la.logdet_arrowhead(factor),
            batch=flags(jnp.stack([good, bad])),
        )

    out = run(bad, good, zero_pivot, bad_schur)
    assert not bool(out["is_pd"])
    assert np.all(np.isnan(np.asarray(out["chol"])[0, 4:]))  # from the bad pivot on
    assert np.all(np.isfinite(np.asarray(out["chol"])[0, :4]))
    assert np.isnan(out["logdet"])
    assert np.isnan(out["selinv"][0, -1])
    assert np.any(np.isnan(out["solve"]))
    assert not bool(out["zero_pivot"])
    assert bool(out["band_is_pd"])  # only the corner fails
    assert np.all(np.isnan(out["factor"].corner))
    assert not bool(out["arrow_is_pd"])
    assert np.isnan(out["arrow_logdet"])
    assert out["batch"].tolist() == [True, False]  # flagged per element under vmap


def test_not_positive_definite_by_blocks_gives_nan_from_the_bad_block_on():
    """``w >= 4`` factors in blocks of ``max(w, 8)`` rows: a negative pivot in row 12
    (block 1 of 3) gives NaN from that block's first row (8) on, finite rows before it,
    and a NaN log-determinant, selected inverse and solve."""
    t, w = 20, 4
    rng = np.random.default_rng(3)
    a = random_banded(rng, t, w)
    a[12, 12] = -1.0
    ab = np_band(a, w)

    @jax.jit
    def run(ab):
        chol = la.cholesky_banded(ab)
        return dict(
            chol=chol,
            is_pd=la.is_pd_banded(chol),
            logdet=la.logdet_banded(chol),
            selinv=la.selected_inverse_banded(chol),
            solve=la.solve_banded(chol, jnp.ones(t)),
        )

    out = run(ab)
    chol = np.asarray(out["chol"])
    assert not bool(out["is_pd"])
    assert np.all(np.isfinite(chol[:, :8])) and np.all(np.isnan(chol[0, 8:]))
    assert np.isnan(out["logdet"])
    assert np.all(np.isnan(np.asarray(out["selinv"])[0]))
    assert np.all(np.isnan(np.asarray(out["solve"])))


def test_bad_shapes_raise():
    def trace(f, *args):
        return jax.eval_shape(f, *args)

    with pytest.raises(ValueError, match=r"\(w \+ 1, T\)"):
        trace(la.cholesky_banded, np.ones(4))
    with pytest.raises(ValueError, match="right-hand side"):
        trace(la.solve_banded, np.ones((1, 4)), np.ones(5))
    with pytest.raises(ValueError, match="border"):
        trace(
            la.cholesky_arrowhead, la.Arrowhead(np.ones((1, 4)), np.ones((3, 1)), np.eye(1))
        )
    with pytest.raises(ValueError, match="corner"):
        trace(
            la.cholesky_arrowhead, la.Arrowhead(np.ones((1, 4)), np.ones((4, 2)), np.eye(1))
        )


# --- jaxvb.linalg._small: the unrolled k x k routines -------------------------------


@pytest.mark.parametrize("n", tiered([1, 2, 3, 4], slow=[3, 4]))
def test_small_routines_against_lapack(n):
    """``small.solve/cholesky/inv_lower`` agree with NumPy/SciPy to rounding.

    The test matrices have columns scaled over 10 orders of magnitude and rows of
    mixed size, so that the pivoting matters (without it the 3 x 3 solves lose ~6
    digits on these); the error is taken relative to ``cond(a) * eps``.
    """
    rng = np.random.default_rng(n)
    fn = jax.jit(lambda a, b, s: (small.solve(a, b), small.cholesky(s)))
    for _ in range(50):
        a = rng.normal(size=(n, n)) * np.exp(rng.normal(size=(1, n)) * 4.0)
        b = rng.normal(size=(n, 2))
        s = a @ a.T + 1e-3 * np.eye(n)
        x, chol = fn(jnp.asarray(a), jnp.asarray(b), jnp.asarray(s))
        x_ref = np.linalg.solve(a, b)
        scale = np.linalg.cond(a) * np.finfo(float).eps * np.abs(x_ref).max()
        assert np.abs(np.asarray(x) - x_ref).max() <= 100 * scale
        # Cholesky of an ill-conditioned s: the backward error is at rounding level
        chol = np.asarray(chol)
        assert np.abs(chol @ chol.T - s).max() <= 1e-14 * np.abs(s).max()
        # and of a well-conditioned one, the factor equals LAPACK's
        g = rng.normal(size=(n, n))
        s_good = g @ g.T + n * np.eye(n)
        np.testing.assert_allclose(
            small.cholesky(jnp.asarray(s_good)), np.linalg.cholesky(s_good), rtol=1e-13
        )
        inv = np.asarray(small.inv_lower(jnp.asarray(np.linalg.cholesky(s_good))))
        np.testing.assert_allclose(
            inv @ np.linalg.cholesky(s_good), np.eye(n), atol=1e-14 * n
        )
        # a vector right-hand side is solved as a column
        np.testing.assert_allclose(
            small.solve(jnp.asarray(a), jnp.asarray(b[:, 0])), x[:, 0], rtol=1e-11
        )


def test_small_routines_flag_bad_matrices_and_fall_back_above_order_4():
    # not positive definite: NaN, as jnp.linalg.cholesky
    assert np.isnan(small.cholesky(-jnp.eye(2))[0, 0])
    assert np.isnan(small.cholesky(jnp.array([[1.0, 2.0], [2.0, 1.0]]))[1, 1])
    # singular: not finite, which fit flags as an improper update
    x = small.solve(jnp.array([[1.0, 2.0], [2.0, 4.0]]), jnp.ones(2))
    assert not np.all(np.isfinite(x))
    # a zero leading entry needs the row swap
    np.testing.assert_allclose(
        small.solve(jnp.array([[0.0, 1.0], [1.0, 0.0]]), jnp.array([2.0, 3.0])), [3.0, 2.0]
    )
    # order 5 and batches go to jnp.linalg
    a = jnp.eye(5) * 2.0
    np.testing.assert_allclose(small.solve(a, jnp.ones(5)), 0.5 * np.ones(5))
    np.testing.assert_allclose(small.cholesky(a), np.sqrt(2.0) * np.eye(5))
    np.testing.assert_allclose(small.inv_lower(a), 0.5 * np.eye(5))
    np.testing.assert_allclose(
        small.cholesky(jnp.stack([a, a])[:, :2, :2])[1], np.sqrt(2.0) * np.eye(2)
    )
