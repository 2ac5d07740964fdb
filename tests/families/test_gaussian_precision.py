"""The dense Gaussian in precision-factor form, and chunked diagnostics.

``Gaussian`` stores ``mean`` and the upper factor ``U`` of the precision, ``P = U U'``;
everything else is checked here against the dense formulas it replaces, which would
form ``cov`` and factor it again.
"""

from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxvb
from jaxvb.families._base import build
from jaxvb.families.gaussian import precision_factor, solve_precision

ROOT = Path(__file__).resolve().parents[2]
TOL = dict(rtol=1e-11, atol=1e-12)


def random_gaussian(seed: int, d: int = 4):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    cov = a @ a.T + 0.5 * np.eye(d)
    return rng.normal(size=d), cov


@pytest.fixture(params=[1, 4, 7])
def dense(request):
    mean, cov = random_gaussian(request.param, d=request.param)
    return mean, cov, jaxvb.Gaussian(mean, cov)


def test_stored_form_is_the_precision_factor(dense):
    mean, cov, q = dense
    u = np.asarray(q.precision_factor)
    assert [leaf.shape for leaf in jax.tree_util.tree_leaves(q)] == [mean.shape, cov.shape]
    np.testing.assert_array_equal(u, np.triu(u))
    assert np.all(np.diag(u) > 0)
    np.testing.assert_allclose(u @ u.T, np.linalg.inv(cov), **TOL)
    # U^{-T} is the (unique) Cholesky factor of cov.
    np.testing.assert_allclose(q.scale_tril, np.linalg.cholesky(cov), **TOL)


def test_moments_and_densities_match_the_dense_formulas(dense):
    mean, cov, q = dense
    d = mean.shape[0]
    prec = np.linalg.inv(cov)
    np.testing.assert_allclose(q.mean, mean, **TOL)
    np.testing.assert_allclose(q.cov, cov, **TOL)
    np.testing.assert_array_equal(q.cov, np.asarray(q.cov).T)  # exactly symmetric
    np.testing.assert_allclose(q.precision, prec, **TOL)
    np.testing.assert_allclose(q.variance, np.diag(cov), **TOL)
    ref = stats.multivariate_normal(mean, cov)
    x = np.random.default_rng(0).normal(size=(5, d))
    np.testing.assert_allclose(jax.vmap(q.log_prob)(x), ref.logpdf(x).reshape(5), **TOL)
    np.testing.assert_allclose(q.entropy, ref.entropy(), **TOL)
    i, j = np.triu_indices(d)
    np.testing.assert_allclose(
        q.natural_params, np.concatenate([prec @ mean, prec[i, j]]), **TOL
    )


def test_draws_are_mean_plus_cholesky_of_cov_times_noise(dense):
    mean, cov, q = dense
    key = jax.random.key(3)
    z = q.noise(key)
    np.testing.assert_allclose(q.from_noise(z), mean + np.linalg.cholesky(cov) @ z, **TOL)
    keys = jax.random.split(key, 50)
    zs = jax.vmap(q.noise)(keys)
    want = mean + zs @ np.linalg.cholesky(cov).T
    np.testing.assert_allclose(q.sample(key, (50,)), want, **TOL)
    np.testing.assert_allclose(jax.vmap(q.from_noise)(zs), want, **TOL)


def test_from_precision_and_natural_params_round_trip(dense):
    mean, cov, q = dense
    prec = np.linalg.inv(cov)
    p = jaxvb.Gaussian.from_precision(mean, prec)
    np.testing.assert_allclose(p.precision, prec, **TOL)
    np.testing.assert_allclose(p.cov, cov, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p.precision_factor, q.precision_factor, rtol=1e-10)
    back = q.from_natural(q.natural_params)
    np.testing.assert_allclose(back.mean, mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(back.cov, cov, rtol=1e-10, atol=1e-12)
    # Building from a covariance without validation (what build() did before) agrees.
    built = build(jaxvb.Gaussian, mean=jnp.asarray(mean), cov=jnp.asarray(cov))
    np.testing.assert_array_equal(built.precision_factor, q.precision_factor)


def test_precision_helpers():
    mean, cov = random_gaussian(5, d=6)
    prec = jnp.asarray(np.linalg.inv(cov))
    u = precision_factor(prec)
    np.testing.assert_allclose(solve_precision(u, jnp.asarray(mean)), cov @ mean, **TOL)
    batched = precision_factor(jnp.stack([prec, 2.0 * prec]))
    np.testing.assert_allclose(batched[1], np.sqrt(2.0) * u, **TOL)
    assert np.all(np.isnan(np.diag(precision_factor(-prec))))  # not positive definite


def test_is_proper_reads_the_factor():
    mean, cov = random_gaussian(2, d=3)
    q = jaxvb.Gaussian(mean, cov)
    assert bool(q.is_proper)
    eta = np.array(q.natural_params)
    eta[3:] = -eta[3:]  # a negative-definite precision: the factorisation fails
    assert not bool(q.from_natural(jnp.asarray(eta)).is_proper)
    flipped = q.precision_factor.at[0, 0].multiply(-1.0)  # P = U U' still, but U is no
    assert not bool(build(jaxvb.Gaussian, mean=q.mean, precision_factor=flipped).is_proper)
    nan_mean = build(
        jaxvb.Gaussian, mean=q.mean.at[0].set(jnp.nan), precision_factor=q.precision_factor
    )
    assert not bool(nan_mean.is_proper)


@pytest.mark.parametrize(
    "precision, match",
    [
        (np.array([[1.0, 0.5], [0.2, 1.0]]), "symmetric"),
        (np.array([[1.0, 2.0], [2.0, 1.0]]), "positive definite"),
        (np.full((2, 2), np.nan), "finite"),
    ],
)
def test_from_precision_rejects_what_is_not_a_precision(precision, match):
    with pytest.raises(ValueError, match=match):
        jaxvb.Gaussian.from_precision(np.zeros(2), precision)


def test_constructor_contract_is_unchanged():
    with pytest.raises(ValueError, match="positive definite"):
        jaxvb.Gaussian(np.zeros(2), np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="shape"):
        jaxvb.Gaussian(np.zeros(2), np.eye(3))
    q = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    assert repr(q) == "Gaussian(mean=[0.0, 0.0], cov=[[1.0, 0.0], [0.0, 1.0]])"
    assert "cov=(3, 3)" in repr(jaxvb.Gaussian(jnp.zeros(3), jnp.eye(3)))
    q32 = jaxvb.Gaussian(np.zeros(2, np.float32), np.eye(2, dtype=np.float32))
    assert q32.precision_factor.dtype == jnp.float32 and q32.cov.dtype == jnp.float32


def test_jit_and_vmap():
    mean, cov = random_gaussian(8, d=3)
    q = jaxvb.Gaussian(mean, cov)
    x = jnp.asarray(mean) + 0.3

    @jax.jit
    def summary(q, x):
        return q.log_prob(x), q.entropy, q.cov, q.from_noise(jnp.ones(3)), q.is_proper

    for got, want in zip(
        summary(q, x),
        (q.log_prob(x), q.entropy, q.cov, q.from_noise(jnp.ones(3)), q.is_proper),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)

    # Built under vmap (tracers: no validation), used with batched leaves outside it.
    means = jnp.stack([jnp.asarray(mean), -jnp.asarray(mean)])
    covs = jnp.stack([jnp.asarray(cov), 2.0 * jnp.asarray(cov)])
    batch = jax.vmap(jaxvb.Gaussian)(means, covs)
    assert batch.precision_factor.shape == (2, 3, 3)
    np.testing.assert_allclose(batch.cov, covs, **TOL)
    np.testing.assert_allclose(batch.precision, np.linalg.inv(np.asarray(covs)), **TOL)
    np.testing.assert_allclose(batch.variance[1], 2.0 * np.diag(cov), **TOL)
    lp = jax.vmap(lambda g: g.log_prob(x))(batch)
    np.testing.assert_allclose(lp[1], stats.multivariate_normal(-mean, 2 * cov).logpdf(x))
    assert jax.vmap(lambda g: g.is_proper)(batch).tolist() == [True, True]


def test_hessian_solve_is_one_cholesky_and_vector_solves():
    """Algorithm 2's solve: one Cholesky of P, triangular solves with vectors only."""
    d = 6
    mean, cov = random_gaussian(4, d=d)
    q = jaxvb.Gaussian(mean, cov)
    method = jaxvb.methods.hessian()
    stats_ = method.init(jax.random.key(0), q, None)
    jaxpr = jax.make_jaxpr(lambda s: method.solve(s, q))(stats_)
    eqns = [e for e in jaxpr.jaxpr.eqns]

    def walk(eqns):
        for e in eqns:
            yield e
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                yield from walk(sub.eqns)

    prims = [e for e in walk(eqns)]
    names = [e.primitive.name for e in prims]
    assert names.count("cholesky") == 1
    solves = [e for e in prims if e.primitive.name == "triangular_solve"]
    assert len(solves) == 2
    for e in solves:  # right-hand sides are vectors, never an identity matrix
        b = e.invars[1].aval
        assert b.shape[-1] == 1 or b.ndim == 1 or min(b.shape) == 1, b.shape
    new = method.solve(stats_, q)
    np.testing.assert_allclose(new.mean, mean, **TOL)
    np.testing.assert_allclose(new.cov, cov, rtol=1e-10)


@pytest.mark.slow  # (test_draws_held_at_once_shrink_with_the_dimension stays fast)
def test_chunked_diagnostics_equal_unchunked():
    # Every layout of the chunks (evenly cut into c <= chunk_size): one chunk (200),
    # chunks of one draw (1), several without padding (50, 100, 199: two of 100) and
    # with padded repeats (7: 29 of 7 with 3 repeats; 67: 3 of 67 with 1; the Gamma's
    # 16: 13 of 16 with 8).
    num_draws = 200
    mean, cov = random_gaussian(6, d=3)
    q = jaxvb.Gaussian(mean, cov)

    def log_joint(x):  # a heavier-tailed target, not in the family
        return -jnp.sum(jnp.log1p(x**2)) - 0.1 * jnp.sum(x**2)

    key = jax.random.key(7)
    whole = jaxvb.diagnostics.evaluate(key, q, log_joint, num_draws, chunk_size=num_draws)
    # The draws are those of q.sample(key, (num_draws,)), as before chunking.
    x, log_q = q.sample_and_log_prob(key, (num_draws,))
    r = jax.vmap(log_joint)(x) - log_q
    np.testing.assert_allclose(whole.elbo, jnp.mean(r), rtol=1e-13)
    for chunk in (1, 7, 50, 67, 100, num_draws - 1):
        part = jaxvb.diagnostics.evaluate(key, q, log_joint, num_draws, chunk_size=chunk)
        for name, a, b in zip(part._fields, part, whole, strict=True):
            # the same draws, to the last bit or so: the normals' log and cos (and
            # k-hat's sort and fit, the fourth moments) run vectorised over another
            # batch length, where XLA may round a lane apart from the loop's tail
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-16, err_msg=name)
    gamma = jaxvb.Gamma(jnp.array([2.0, 3.0]), jnp.array([1.0, 0.5]))
    target = jaxvb.Gamma(jnp.array([2.5, 3.0]), jnp.array([1.0, 0.7])).log_prob
    a = jaxvb.diagnostics.evaluate(key, gamma, target, num_draws, chunk_size=num_draws)
    b = jaxvb.diagnostics.evaluate(key, gamma, target, num_draws, chunk_size=16)
    for u, v in zip(a, b, strict=True):
        # The same draws; XLA's vectorised special functions may round the last bit
        # differently for another batch length.
        np.testing.assert_allclose(u, v, rtol=1e-13, atol=1e-16)
    with pytest.raises(ValueError, match="chunk_size"):
        jaxvb.diagnostics.evaluate(key, q, log_joint, num_draws, chunk_size=0)


def test_draws_held_at_once_shrink_with_the_dimension():
    """Diagnostics' chunks and the check's kept draws are bounded in elements, so a
    long latent field (d ~ 10^6) needs no more memory than a moderate model."""
    from jaxvb.core import convergence

    assert convergence.chunk_size(5) == 100 and convergence.chunk_size(10_000) == 100
    assert convergence.chunk_size(100_000) == 10 and convergence.chunk_size(10**6) == 1
    assert convergence.chunk_size(10**6) * 10**6 <= convergence.MAX_CHUNK
    assert max(16, convergence.MAX_HELD // 10**6) == 16
