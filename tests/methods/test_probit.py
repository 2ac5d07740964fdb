"""The probit model of the paper (section 5.1.1) and the VBEM baseline it is compared to.

Statistical checks use fixed keys and tolerances of five Monte Carlo standard errors,
each estimated from independent replicates (data sets or draws); for a Gaussian
estimator a fresh key would fail such a check about once in 1.7 million runs.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal, norm, truncnorm

from jaxvb.baselines import vbem_probit
from jaxvb.models import probit

Z = 5.0  # tolerance in Monte Carlo standard errors


def _vbem_fixed_point_residual(mean, design, y):
    """``mu - Sigma V' mu_z`` with ``mu_z`` from Ormerod & Wand's update, in NumPy/SciPy."""
    sign = 2.0 * y - 1.0
    f = design @ mean
    mean_z = f + sign * norm.pdf(f) / norm.cdf(sign * f)
    precision = design.T @ design + np.eye(design.shape[1])
    return mean - np.linalg.solve(precision, design.T @ mean_z)


@pytest.fixture(scope="module")
def paper_data():
    """Six data sets of the paper's size (N = 100, M = 5), as NumPy arrays."""
    beta, design, y = probit.simulate(jax.random.key(0), num_datasets=6)
    return np.asarray(beta), np.asarray(design), np.asarray(y)


@pytest.fixture(scope="module")
def tiny_posterior():
    """A small problem (M = 2, N = 20), its VBEM fit and exact moments by 2-D quadrature
    (computed once: its tests run on one xdist worker, ``tiny_group``)."""
    _, design, y = probit.simulate(
        jax.random.key(3), num_datasets=1, num_obs=20, num_features=2
    )
    design, y = np.asarray(design[0]), np.asarray(y[0])
    res = vbem_probit.vbem(design, y)
    # The rectangle rule on a grid wide enough that the density vanishes at its edges is
    # spectrally accurate for this smooth integrand; the test checks the edges.
    grid = np.linspace(-7.0, 7.0, 421)
    step = grid[1] - grid[0]
    mode = np.asarray(res.q.mean)
    b1, b2 = np.meshgrid(grid + mode[0], grid + mode[1], indexing="ij")
    points = np.stack([b1.ravel(), b2.ravel()], axis=1)
    log_p = norm.logpdf(points).sum(1) + norm.logcdf((points @ design.T) * (2 * y - 1)).sum(
        1
    )
    peak = log_p.max()
    w = np.exp(log_p - peak)
    mean = w @ points / w.sum()
    centred = points - mean
    cov = (w[:, None] * centred).T @ centred / w.sum()
    w2 = w.reshape(b1.shape)
    edge = max(w2[[0, -1], :].max(), w2[:, [0, -1]].max())
    log_evidence = peak + math.log(w.sum() * step**2)
    return design, y, res, mean, cov, log_evidence, edge


# --- the model ----------------------------------------------------------------------


def test_simulate_shapes_and_distributions():
    d, n, m = 400, 100, 5
    beta, design, y = probit.simulate(jax.random.key(1), d, n, m)
    assert beta.shape == (d, m) and design.shape == (d, n, m) and y.shape == (d, n)
    beta, design, y = np.asarray(beta), np.asarray(design), np.asarray(y)
    assert set(np.unique(y)) == {0.0, 1.0}

    # Var(v_ij) = 3 / M; the sample variance of k normals has sd var * sqrt(2 / k).
    k = design.size
    assert abs(design.var() - 3 / m) < Z * (3 / m) * math.sqrt(2 / k)
    assert abs(design.mean()) < Z * math.sqrt(3 / m / k)
    assert abs(beta.var() - 1.0) < Z * math.sqrt(2 / beta.size)

    # The observations of one data set share beta, so replicates are data sets.
    def check_zero_mean(per_dataset):
        se = per_dataset.std(ddof=1) / math.sqrt(per_dataset.size)
        assert abs(per_dataset.mean()) < Z * se

    # P(y = 1) = 1/2 by the symmetry of beta and e.
    check_zero_mean(y.mean(1) - 0.5)
    # y_i = 1[f_i + e_i > 0] with e_i ~ N(0, 1) means E[y_i | f_i] = Phi(f_i): the
    # residual is uncorrelated with f_i (a noise sd other than 1 would break this).
    f = np.einsum("dnm,dm->dn", design, beta)
    resid = y - norm.cdf(f)
    check_zero_mean(resid.mean(1))
    check_zero_mean((resid * f).mean(1))


def test_simulate_scales_design_with_num_features():
    m = 15
    _, design, _ = probit.simulate(jax.random.key(2), 200, 50, m)
    design = np.asarray(design)
    assert abs(design.var() - 3 / m) < Z * (3 / m) * math.sqrt(2 / design.size)


def test_log_joint_matches_scipy():
    rng = np.random.default_rng(0)
    n, m = 30, 4
    design = rng.normal(size=(n, m))
    y = (rng.uniform(size=n) < 0.5).astype(float)
    for _ in range(5):
        x = rng.normal(size=m) * 2.0
        f = design @ x
        expected = norm.logpdf(x).sum() + np.sum(
            y * norm.logcdf(f) + (1 - y) * norm.logcdf(-f)
        )
        np.testing.assert_allclose(probit.log_joint(x, design, y), expected, rtol=1e-12)


def test_log_joint_is_finite_and_accurate_in_the_tails():
    # |v'x| ~ 40 on the wrong side: Phi(-40) underflows, log Phi(-40) ~ -804.6 does not.
    design = np.array([[40.0, 0.0], [0.0, -41.0], [-39.0, 0.0], [0.0, 42.0]])
    y = np.array([0.0, 1.0, 1.0, 0.0])
    x = np.array([1.0, 1.0])
    value = probit.log_joint(x, design, y)
    f = design @ x
    expected = norm.logpdf(x).sum() + np.sum(
        np.where(y == 1, norm.logcdf(f), norm.logcdf(-f))
    )
    assert np.isfinite(value) and value < -3000
    np.testing.assert_allclose(value, expected, rtol=1e-12)
    # The right side of the tail contributes log Phi(40) ~ -e^{-800}: zero, not NaN.
    assert probit.site_log_lik(40.0, 1.0) == 0.0


def test_factor_structure_rebuilds_the_log_joint():
    rng = np.random.default_rng(1)
    design = rng.normal(size=(12, 3))
    y = (rng.uniform(size=12) < 0.5).astype(float)
    x = rng.normal(size=3)
    fs = probit.factor_structure(design, y)
    prior = multivariate_normal(np.zeros(3), np.linalg.inv(fs.prior_precision)).logpdf(x)
    sites = probit.site_log_lik(fs.design @ x, fs.y)
    assert sites.shape == (12,)
    np.testing.assert_allclose(
        prior + sites.sum(), probit.log_joint(x, design, y), rtol=1e-12
    )


def test_rmse_and_log_score_by_hand():
    np.testing.assert_allclose(
        probit.rmse(jnp.array([1.0, 2.0]), jnp.zeros(2)), math.sqrt(2.5)
    )
    # N(b | m, diag(4, 1)) with b - m = (2, 1): -(1 + 1)/2 - log(2) - log(2 pi).
    value = probit.log_score(
        jnp.array([0.0, 1.0]), jnp.diag(jnp.array([4.0, 1.0])), jnp.array([2.0, 2.0])
    )
    np.testing.assert_allclose(
        value, -1.0 - math.log(2.0) - math.log(2 * math.pi), rtol=1e-14
    )

    # Batched over data sets, against SciPy, with one shared covariance broadcast.
    rng = np.random.default_rng(2)
    mean, beta = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    a = rng.normal(size=(3, 3))
    cov = a @ a.T + np.eye(3)
    expected = [
        multivariate_normal(mu, cov).logpdf(b) for mu, b in zip(mean, beta, strict=True)
    ]
    np.testing.assert_allclose(probit.log_score(mean, cov, beta), expected, rtol=1e-12)
    np.testing.assert_allclose(
        probit.rmse(mean, beta), np.sqrt(((mean - beta) ** 2).mean(1)), rtol=1e-14
    )


# --- VBEM (Ormerod & Wand 2010) -----------------------------------------------------


def test_vbem_bound_increases_monotonically_and_trace_matches(paper_data):
    _, design, y = paper_data
    # Data set 0 converges slowly (EM's rate is about 0.94 there): 440 iterations.
    res = vbem_probit.vbem(design[0], y[0], num_iters=600, trace=True)
    bound = np.asarray(res.trace.lower_bound)
    assert bound.shape == (601,) and res.trace.mean.shape == (601, 5)
    np.testing.assert_array_equal(res.trace.mean[0], np.zeros(5))  # starts at the prior
    assert np.all(np.diff(bound) >= -1e-12 * np.abs(bound[1:]))
    assert bound[-1] - bound[0] > 1.0
    assert int(res.num_iters) == 600 and bool(res.converged)
    # The scan and the while loop run the same iteration.
    stop = vbem_probit.vbem(design[0], y[0])
    assert bool(stop.converged) and int(stop.num_iters) < 600
    np.testing.assert_allclose(res.trace.mean[-1], stop.q.mean, atol=1e-12)
    np.testing.assert_allclose(
        res.trace.mean[int(stop.num_iters)], stop.q.mean, rtol=0, atol=0
    )
    np.testing.assert_allclose(
        res.trace.lower_bound[int(stop.num_iters)], stop.lower_bound, rtol=0, atol=0
    )


def test_vbem_fixed_point_solves_the_update_equations(paper_data):
    _, design, y = paper_data
    res = vbem_probit.vbem(design[0], y[0])
    mean, cov = np.asarray(res.q.mean), np.asarray(res.q.cov)
    assert np.abs(_vbem_fixed_point_residual(mean, design[0], y[0])).max() < 1e-10
    np.testing.assert_allclose(
        cov, np.linalg.inv(design[0].T @ design[0] + np.eye(5)), rtol=1e-12
    )
    # ...which makes the mean the posterior mode: the gradient of the log joint vanishes.
    f, sign = design[0] @ mean, 2 * y[0] - 1
    grad = design[0].T @ (sign * norm.pdf(f) / norm.cdf(sign * f)) - mean
    assert np.abs(grad).max() < 1e-10
    # L(mu) is Ormerod & Wand's bound: the log joint at mu plus a constant.
    _, logdet = np.linalg.slogdet(design[0].T @ design[0] + np.eye(5))
    expected = float(probit.log_joint(mean, design[0], y[0])) + 2.5 * math.log(2 * math.pi)
    np.testing.assert_allclose(res.lower_bound, expected - 0.5 * logdet, rtol=1e-12)


@pytest.mark.slow
def test_vbem_vmaps_over_data_sets(paper_data):
    _, design, y = paper_data
    batched = jax.vmap(vbem_probit.vbem)(design, y)
    assert batched.q.mean.shape == (6, 5) and batched.q.cov.shape == (6, 5, 5)
    for i in range(6):
        single = vbem_probit.vbem(design[i], y[i])
        assert int(batched.num_iters[i]) == int(single.num_iters)
        assert bool(batched.converged[i])
        np.testing.assert_allclose(batched.q.mean[i], single.q.mean, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(batched.q.cov[i], single.q.cov, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(batched.lower_bound[i], single.lower_bound, rtol=1e-12)


def test_vbem_in_float32(paper_data):
    _, design, y = paper_data
    res = vbem_probit.vbem(design[0].astype(np.float32), y[0].astype(np.float32))
    assert res.q.mean.dtype == jnp.float32 and res.q.cov.dtype == jnp.float32
    assert res.lower_bound.dtype == jnp.float32 and bool(res.converged)
    ref = vbem_probit.vbem(design[0], y[0])
    np.testing.assert_allclose(res.q.mean, ref.q.mean, atol=1e-4)


tiny_group = pytest.mark.xdist_group("probit_tiny_posterior")


@tiny_group
def test_vbem_against_the_exact_posterior(tiny_posterior):
    design, y, res, mean, cov, log_evidence, edge = tiny_posterior
    assert edge < 1e-20  # the grid holds all the mass
    sd = np.sqrt(np.diag(cov))
    # VBEM's mean is the posterior mode, which lies near the mean (here 0.1-0.25 sd away,
    # pulled towards the prior mean); its covariance (V'V + I)^{-1} drops the likelihood
    # curvature weights and is too small (here by factors of 2 and 4) -- the paper's point.
    vb_mean, vb_var = np.asarray(res.q.mean), np.diag(np.asarray(res.q.cov))
    assert np.all(np.abs(vb_mean - mean) < 0.3 * sd)
    assert np.all(np.abs(vb_mean) < np.abs(mean))
    assert np.all(vb_var < 0.75 * np.diag(cov))
    # A lower bound on the evidence, by a gap that a variance error this large implies.
    assert res.lower_bound < log_evidence - 0.1


@tiny_group
def test_vbem_bound_is_the_expected_log_ratio_of_the_factorised_q(tiny_posterior):
    """Monte Carlo of E_q[log p(y, z, x) - log q(z) - log q(x)] at the VBEM fit."""
    design, y, res, *_ = tiny_posterior
    mean, cov = np.asarray(res.q.mean), np.asarray(res.q.cov)
    rng = np.random.default_rng(3)
    s = 20_000
    x = rng.multivariate_normal(mean, cov, size=s)
    f = design @ mean
    # q(z_i) = N(f_i, 1) truncated to z > 0 (y = 1) or z <= 0 (y = 0); p(y | z) = 1 there.
    lower = np.where(y == 1, -f, -np.inf)
    upper = np.where(y == 1, np.inf, -f)
    z = truncnorm.rvs(lower, upper, loc=f, size=(s, y.size), random_state=rng)
    log_q_z = truncnorm.logpdf(z, lower, upper, loc=f).sum(1)
    log_p = norm.logpdf(x).sum(1) + norm.logpdf(z - x @ design.T).sum(1)
    log_q_x = multivariate_normal(mean, cov).logpdf(x)
    terms = log_p - log_q_z - log_q_x
    se = terms.std(ddof=1) / math.sqrt(s)
    assert abs(terms.mean() - float(res.lower_bound)) < Z * se
