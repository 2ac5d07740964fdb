"""Mixtures of Gaussians through an auxiliary label (``jaxvb.GaussianMixture``, sec. 6.2).

Compiling a mixture fit takes seconds, so the fits share their compilations: every fit
on the two-bump target ``TWO`` uses the same log joint, ``K = 2`` and ``num_steps``, and
differs only in ``q0`` (a traced argument).

Exact checks: where the target is itself a mixture of well-separated Gaussians, every
draw's statistics are exact at the optimum (``log p + log r_i`` is then quadratic), so
the fit converges to the target to near machine precision. Statistical checks (the
beta-binomial fit against 2-D quadrature) compare Monte Carlo estimates with their exact
values to within 5 standard errors, the errors computed by quadrature too; for a fresh
key the false-alarm rate of one such comparison would be P(|Z| > 5) ~ 6e-7.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb
from jaxvb.methods.mixture import mixture
from jaxvb.models import beta_binomial

KEY = jax.random.key(3)
STEPS = 300
BB = beta_binomial.cancer_mortality_log_joint()  # one function: its compilations are shared

# The target: 30% / 70% of two 2-D Gaussians 8 units apart (about 10 sds), unnormalised.
TRUE = jaxvb.GaussianMixture(
    jnp.array([0.3, 0.7]),
    jnp.array([[-4.0, 0.0], [4.0, 1.0]]),
    jnp.array([[[1.0, 0.3], [0.3, 0.5]], [[0.6, -0.2], [-0.2, 1.2]]]),
)
LOG_Z = 3.7
_MEANS = np.asarray(TRUE.means)
_PREC = np.linalg.inv(np.asarray(TRUE.covs))
_CONST = (
    np.log(np.asarray(TRUE.weights)) + 0.5 * np.linalg.slogdet(_PREC)[1] - np.log(2 * np.pi)
)


def two(x):
    """``log p(x) = log(0.3 N_1(x) + 0.7 N_2(x)) + 3.7``, written out (cheap to compile)."""
    terms = []
    for i in range(2):
        d = x - _MEANS[i].astype(x.dtype)
        quad = d @ _PREC[i].astype(x.dtype) @ d
        terms.append(_CONST[i].astype(x.dtype) - 0.5 * quad)
    return jnp.logaddexp(*terms) + np.asarray(LOG_Z, x.dtype)


def start(dtype=jnp.float64, order=(0, 1)):
    """Two unit Gaussians, each a little off one of the target's bumps."""
    order = np.asarray(order)
    return jaxvb.GaussianMixture(
        jnp.full((2,), 0.5, dtype),
        jnp.array([[-3.0, 0.5], [3.0, 0.5]], dtype)[order],
        jnp.stack([jnp.eye(2, dtype=dtype)] * 2),
    )


def fit_two(q0, key=KEY):
    return jaxvb.fit(two, q0, key, num_steps=STEPS)


def by_first_coordinate(q):
    order = np.argsort(np.asarray(q.means[:, 0]))
    return jax.tree_util.tree_map(lambda v: np.asarray(v)[order], q)


# --- the fit --------------------------------------------------------------------------


@pytest.mark.slow
def test_two_separated_gaussians_are_recovered_by_two_components():
    res = fit_two(start())
    assert int(res.status) == 0
    # The weights approach theirs as (1 - w)^t (w = 1/sqrt(300)), and the average over
    # the second half keeps a little of that transient: ~1e-6 here.
    np.testing.assert_allclose(res.q.weights, TRUE.weights, atol=1e-5)
    np.testing.assert_allclose(res.q.means, TRUE.means, atol=1e-8)
    np.testing.assert_allclose(res.q.covs, TRUE.covs, atol=1e-8)
    # q = p: no residual, the evidence is exact.
    assert float(res.kl) < 1e-10
    assert float(res.log_evidence) == pytest.approx(LOG_Z, abs=1e-6)
    assert float(res.r_squared) == pytest.approx(1.0, abs=1e-10)


@pytest.mark.slow
def test_relabelled_components_give_the_same_fit():
    """Relabelling the components relabels the statistics and the update, nothing else.

    One step exactly: the statistics of permuted components (with their draws'
    noise permuted alike) are the permuted statistics. A whole fit draws its noise by
    index, so relabelled runs see other draws; on the exact target both still end at
    the target (to the weights' transient, see above).
    """
    log_joint = two
    q = jaxvb.GaussianMixture.around(
        jaxvb.Gaussian(jnp.array([0.0, 0.5]), 9 * jnp.eye(2)), 3
    )
    perm = np.array([2, 0, 1])
    q_perm = jax.tree_util.tree_map(lambda v: v[perm], q)
    method = mixture()
    noise = method.noise(KEY, q)

    @jax.jit
    def update(q, noise):
        stats, _, _ = method.estimate(noise, q, log_joint)
        return stats, method.solve(stats, q, None)

    stats, new = update(q, noise)
    rows = noise[:-1].reshape(3, 2)[perm]
    stats_perm, new_perm = update(q_perm, jnp.concatenate([rows.ravel(), noise[-1:]]))
    for a, b in zip(
        jax.tree_util.tree_leaves((stats, new)),
        jax.tree_util.tree_leaves((stats_perm, new_perm)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(a)[perm], b, rtol=1e-12, atol=1e-300)

    a = by_first_coordinate(fit_two(start()).q)
    b = by_first_coordinate(fit_two(start(order=(1, 0))).q)
    np.testing.assert_allclose(a.weights, b.weights, atol=2e-5)
    np.testing.assert_allclose(a.means, b.means, atol=1e-8)
    np.testing.assert_allclose(a.covs, b.covs, atol=1e-8)


@pytest.mark.slow
def test_a_component_whose_weight_goes_to_zero_gives_no_nan():
    """A component started 40 sds away loses its weight at once; the fit carries on.

    Its weight becomes exactly zero (its share of the responsibilities is below
    rounding), its Gaussian stays where it was, and the other component fits the bump
    it started on: ``N_1``, whose ELBO is the evidence of that bump, ``3.7 + log 0.3``.
    """
    q0 = dataclasses.replace(start(), means=jnp.array([[-3.0, 0.5], [60.0, 60.0]]))
    res = fit_two(q0)
    # (NaN by design: reachable_variance, as a mixture has no sufficient statistics;
    # khat_sd, which a plain fit does not compute)
    leaves = jax.tree_util.tree_leaves(res._replace(reachable_variance=0.0, khat_sd=0.0))
    assert all(np.all(np.isfinite(v)) for v in leaves if np.asarray(v).dtype.kind == "f")
    # q is exactly 0.3 of p's mass: its ELBO is that bump's evidence. The evidence's
    # wide draws (diagnostics.mixture_evidence) reach the bump q misses, and their
    # ratios' k-hat says the estimate cannot be trusted: HIGH_KHAT, not status 0.
    assert jaxvb.Status(int(res.status)) == jaxvb.Status.HIGH_KHAT
    np.testing.assert_array_equal(res.q.weights, [1.0, 0.0])
    # N_1 to ~1e-5, not exactly: the draws' tails reach where the other bump's mass
    # bends log p (how far depends on the key: 4e-6 in the mean, 3e-5 in the cov here)
    np.testing.assert_allclose(res.q.means[0], TRUE.means[0], atol=1e-4)
    np.testing.assert_allclose(res.q.covs[0], TRUE.covs[0], atol=1e-4)
    assert float(res.elbo) == pytest.approx(LOG_Z + np.log(0.3), abs=1e-6)
    assert float(res.khat) > 0.7 and "k-hat" in jaxvb.explain(res)

    # A weight that is zero from the start stays zero, with the same result.
    q0 = dataclasses.replace(start(), weights=jnp.array([1.0, 0.0]))
    res = fit_two(q0)
    assert jaxvb.Status(int(res.status)) == jaxvb.Status.HIGH_KHAT
    np.testing.assert_array_equal(res.q.weights, [1.0, 0.0])
    np.testing.assert_array_equal(res.q.means[1], q0.means[1])
    np.testing.assert_allclose(res.q.means[0], TRUE.means[0], atol=1e-4)


@pytest.mark.slow
def test_one_component_is_algorithm_2():
    """K = 1: the same draws and the same updates as the Gaussian Hessian fit.

    The target is not Gaussian where the draws start (between the bumps), so the two
    runs agree only if every step does.
    """
    g0 = jaxvb.Gaussian(jnp.array([-2.0, 1.5]), jnp.array([[2.0, 0.5], [0.5, 1.0]]))
    m0 = jaxvb.GaussianMixture(jnp.ones(1), g0.mean[None], g0.cov[None])
    kw = dict(num_steps=STEPS, num_eval_draws=200)
    gauss = jaxvb.fit(two, g0, KEY, method="hessian", **kw)
    mix = jaxvb.fit(two, m0, KEY, **kw)  # the mixture method is the default
    # q covers one of the two bumps: the Gaussian's own draws never reach the other,
    # but its start's do (g0 widened 4x: MISSED_MASS); the mixture's evidence draws do
    # too, and its k-hat flags its evidence as not to be trusted
    assert jaxvb.Status(int(gauss.status)) == jaxvb.Status.MISSED_MASS
    assert jaxvb.Status(int(mix.status)) == jaxvb.Status.HIGH_KHAT
    assert int(mix.num_damped_steps) == int(gauss.num_damped_steps)
    np.testing.assert_array_equal(mix.q.weights, [1.0])
    np.testing.assert_allclose(mix.q.means[0], gauss.q.mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(mix.q.covs[0], gauss.q.cov, rtol=1e-10)
    for name in ("elbo", "r_squared", "residual_variance"):
        np.testing.assert_allclose(getattr(mix, name), getattr(gauss, name), atol=1e-9)
    # It has found the first bump (the fit is mode seeking).
    np.testing.assert_allclose(mix.q.means[0], TRUE.means[0], atol=1e-4)


@pytest.mark.parametrize("sampling", ["stratified", "marginal"])
def test_at_the_optimum_the_draws_give_it_back(sampling):
    """Where q = p (up to the normaliser), every draw's statistics solve to q itself.

    ``log p + log q(u = i | x)`` is then ``log w_i q_i(x)`` plus a constant, so the
    Rao-Blackwellised statistics are exact: the average over 64 draws (the paper's
    single draws from q, or one draw per component) reproduces the weights, means and
    covariances to rounding.
    """
    method = mixture(sampling)

    @jax.jit
    def update(key):
        noise = jax.vmap(method.noise, (0, None))(jax.random.split(key, 64), TRUE)
        stats, _, _ = jax.vmap(method.estimate, (0, None, None))(noise, TRUE, two)
        mean = jax.tree_util.tree_map(lambda v: v.mean(0), stats)
        return method.solve(mean, TRUE, None)

    new = update(KEY)
    for a, b in zip(
        jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(TRUE), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_vmap_over_keys_in_float32():
    """float32 throughout (log-sum-exp keeps the 10-sd-apart bumps finite), vmapped."""
    keys = jax.random.split(KEY, 3)
    res = jax.vmap(lambda k: fit_two(start(jnp.float32), k))(keys)
    for leaf in jax.tree_util.tree_leaves(res.q):
        assert leaf.dtype == jnp.float32
    assert res.elbo.dtype == jnp.float32
    np.testing.assert_array_equal(res.status, 0)
    np.testing.assert_allclose(
        res.q.weights, np.broadcast_to(TRUE.weights, (3, 2)), atol=1e-4
    )
    np.testing.assert_allclose(
        res.q.means, np.broadcast_to(TRUE.means, (3, 2, 2)), atol=1e-4
    )
    np.testing.assert_allclose(
        res.q.covs, np.broadcast_to(TRUE.covs, (3, 2, 2, 2)), atol=1e-4
    )
    np.testing.assert_allclose(res.log_evidence, LOG_Z, atol=1e-3)


# --- the beta-binomial posterior against quadrature ---------------------------------


@pytest.fixture(scope="module")
def beta_binomial_fit():
    log_joint = BB
    # Around the authors' one-Gaussian fit (the Laplace start, init_mixture, costs a
    # compilation more; it is tested below on the cheap target). BB, K = 8 and 500
    # steps (the step size is traced) are test_mixture_diagnostics' K = 8 program.
    paper = jaxvb.Gaussian.from_precision(
        jnp.array(beta_binomial.PAPER_GAUSSIAN_MEAN),
        jnp.array(beta_binomial.PAPER_GAUSSIAN_PRECISION),
    )
    q0 = jaxvb.GaussianMixture.around(paper, 8)
    res = jaxvb.fit(log_joint, q0, KEY, num_steps=500, step_size=0.1)
    return log_joint, res


def _simpson(n, lo, hi):
    x = np.linspace(lo, hi, n)
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return x, w * (x[1] - x[0]) / 3.0


@pytest.mark.slow
@pytest.mark.xdist_group("mixture_diagnostics_fits")  # beside the program it shares
def test_beta_binomial_with_eight_components_against_quadrature(beta_binomial_fit):
    log_joint, res = beta_binomial_fit
    assert int(res.status) == 0
    log_p = jax.jit(jax.vmap(log_joint))

    # log Z on a wide grid (the posterior has a long ridge towards small log K); the
    # tail beyond log K = 30, where log p falls as -log K, is added in closed form.
    x1, w1 = _simpson(241, -11.0, 1.0)
    x2, w2 = _simpson(361, -6.0, 30.0)
    grid = np.stack(np.meshgrid(x1, x2, indexing="ij"), -1).reshape(-1, 2)
    lp = np.asarray(log_p(grid)).reshape(len(x1), len(x2))
    top = lp.max()
    mass = w1 @ np.exp(lp - top) @ w2 + w1 @ np.exp(lp[:, -1] - top)
    log_z = top + np.log(mass)
    assert log_z == pytest.approx(-570.7086105, abs=1e-6)  # a 4x finer grid's value

    # Expectations under q on a finer grid where q lives.
    x1, w1 = _simpson(321, -9.0, -4.2)
    x2, w2 = _simpson(601, 1.0, 31.0)
    grid = np.stack(np.meshgrid(x1, x2, indexing="ij"), -1).reshape(-1, 2)
    weights = np.outer(w1, w2).ravel()
    log_q = np.asarray(jax.jit(jax.vmap(res.q.log_prob))(grid))
    q = np.exp(log_q) * weights
    assert q.sum() == pytest.approx(1.0, abs=1e-6)
    r = np.asarray(log_p(grid)) - log_q
    elbo = q @ r
    s2 = q @ (r - elbo) ** 2
    kl = log_z - elbo
    n = 1000  # fit's num_eval_draws
    se_elbo = np.sqrt(s2 / n)
    se_s2 = np.sqrt((q @ (r - elbo) ** 4 - s2**2) / n)

    # The paper: eight Gaussians are close to exact (the target, KL <= 0.01).
    assert kl < 0.01
    # The fit's Monte Carlo diagnostics agree with their exact values.
    assert abs(float(res.elbo) - elbo) < 5 * se_elbo
    assert abs(float(res.residual_variance) - s2) < 5 * se_s2
    # log p(y) ~ ELBO + s^2/2: its error is Monte Carlo plus the exact KL - s^2/2.
    bias = abs(kl - s2 / 2)
    assert abs(float(res.log_evidence) - log_z) < bias + 5 * (se_elbo + se_s2 / 2)
    assert bias < 0.01


# --- the family ------------------------------------------------------------------------


@pytest.mark.slow
def test_pytree_round_trip_jit_and_vmap():
    q = TRUE
    leaves, treedef = jax.tree_util.tree_flatten(q)
    assert len(leaves) == 3
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(back, jaxvb.GaussianMixture)
    for a, b in zip(jax.tree_util.tree_leaves(back), leaves, strict=True):
        np.testing.assert_array_equal(a, b)

    x = jnp.array([30.0, -40.0])  # far from every component: log-sum-exp, not -inf
    eager = q.log_prob(x)
    assert np.isfinite(eager)
    np.testing.assert_allclose(jax.jit(lambda q, x: q.log_prob(x))(q, x), eager, rtol=1e-14)
    noise = q.noise(KEY)
    np.testing.assert_allclose(
        jax.jit(q.from_noise)(noise), q.from_noise(noise), rtol=1e-14
    )

    # vmap over a batch of mixtures (batched leaves).
    batch = jax.tree_util.tree_map(lambda v: jnp.stack([v, v]), q)
    lp = jax.vmap(lambda m: m.log_prob(x))(batch)
    np.testing.assert_allclose(lp, eager, rtol=1e-14)


def test_log_prob_integrates_to_one_and_matches_its_moments():
    x1, w1 = _simpson(481, -12.0, 12.0)
    x2, w2 = _simpson(401, -10.0, 10.0)
    grid = np.stack(np.meshgrid(x1, x2, indexing="ij"), -1).reshape(-1, 2)
    density = np.exp(np.asarray(jax.jit(jax.vmap(TRUE.log_prob))(grid))).reshape(
        len(x1), -1
    )
    assert w1 @ density @ w2 == pytest.approx(1.0, abs=1e-9)

    x = np.asarray(jax.jit(lambda k: TRUE.sample(k, (20_000,)))(KEY))
    mean = x.mean(0)
    se = x.std(0) / np.sqrt(len(x))
    assert np.all(np.abs(mean - np.asarray(TRUE.mean)) < 5 * se)
    np.testing.assert_allclose(np.cov(x.T), TRUE.cov, rtol=0.05)
    # The label of each draw follows the weights.
    labels = jax.jit(jax.vmap(lambda k: TRUE.label(TRUE.noise(k))))(
        jax.random.split(KEY, 20_000)
    )
    share = float(np.mean(np.asarray(labels) == 1))
    assert abs(share - 0.7) < 5 * np.sqrt(0.7 * 0.3 / 20_000)


def test_responsibilities_and_antithetic_draws():
    x = jnp.array([-4.0, 0.0])
    r = np.exp(np.asarray(TRUE.log_responsibilities(x)))
    assert r.sum() == pytest.approx(1.0, abs=1e-14) and r[0] > 1 - 1e-12
    noise = TRUE.noise(KEY)
    flipped = TRUE.antithetic(noise)
    assert TRUE.label(flipped) == TRUE.label(noise)
    u = int(TRUE.label(noise))
    np.testing.assert_allclose(
        TRUE.from_noise(noise) + TRUE.from_noise(flipped), 2 * TRUE.means[u], atol=1e-12
    )


@pytest.mark.slow
def test_the_start_is_deterministic_and_centred_on_the_laplace_fit():
    x0 = jnp.array([-3.0, 0.5])  # near the first bump
    laplace = jaxvb.laplace(two, x0)
    np.testing.assert_allclose(laplace.cov, TRUE.covs[0], atol=1e-8)  # its curvature
    q0 = jaxvb.init_mixture(two, x0, 5)
    again = jaxvb.init_mixture(two, x0, 5)
    for a, b in zip(
        jax.tree_util.tree_leaves(q0), jax.tree_util.tree_leaves(again), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(q0.weights, 0.2)
    np.testing.assert_allclose(q0.mean, laplace.mean, atol=1e-12)
    np.testing.assert_allclose(q0.covs, np.broadcast_to(0.75 * laplace.cov, (5, 2, 2)))
    # The means are spread, in standard deviations of the Laplace fit: no two coincide.
    white = np.linalg.solve(np.linalg.cholesky(laplace.cov), (q0.means - q0.mean).T).T
    d = np.linalg.norm(white[:, None] - white[None], axis=-1)
    assert d[~np.eye(5, dtype=bool)].min() > 0.1
    assert np.allclose(np.mean(white**2, axis=0), 0.25)  # spread^2 per coordinate
    one = jaxvb.GaussianMixture.around(laplace, 1)
    np.testing.assert_allclose(one.covs[0], laplace.cov)
    np.testing.assert_allclose(one.means[0], laplace.mean)


# --- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "weights, means, covs, match",
    [
        ([0.5, 0.5], [[0.0], [1.0]], [[[1.0]]], "covs must have shape"),
        ([0.5, 0.5], [[0.0], [1.0], [2.0]], [[[1.0]], [[1.0]]], "means must have shape"),
        ([[1.0]], [[0.0]], [[[1.0]]], "weights must have shape"),
        ([0.5, 0.6], [[0.0], [1.0]], [[[1.0]], [[1.0]]], "sum to one"),
        ([1.5, -0.5], [[0.0], [1.0]], [[[1.0]], [[1.0]]], "non-negative"),
        (
            [0.5, 0.5],
            [[0.0], [1.0]],
            [[[1.0]], [[-1.0]]],
            "component 1: cov must be positive",
        ),
        ([0.5, 0.5], [[0.0], [np.nan]], [[[1.0]], [[1.0]]], "means must be finite"),
    ],
)
def test_bad_parameters_are_refused(weights, means, covs, match):
    with pytest.raises(ValueError, match=match):
        jaxvb.GaussianMixture(jnp.array(weights), jnp.array(means), jnp.array(covs))


def test_wrong_method_or_family_is_refused():
    with pytest.raises(TypeError, match="needs a jaxvb.Gaussian"):
        jaxvb.fit(two, start(), KEY, num_steps=10, method="hessian")
    with pytest.raises(TypeError, match="not an exponential family"):
        jaxvb.fit(two, start(), KEY, num_steps=50, method="regression")
    with pytest.raises(TypeError, match="needs a jaxvb.GaussianMixture"):
        jaxvb.fit(
            two,
            jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
            KEY,
            num_steps=10,
            method="mixture",
        )
    with pytest.raises(ValueError, match="sampling must be one of"):
        mixture("stratify")
    with pytest.raises(ValueError, match="spread"):
        jaxvb.GaussianMixture.around(
            jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)), 3, spread=1.0
        )
    with pytest.raises(ValueError, match="num_components"):
        jaxvb.GaussianMixture.around(jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)), 0)
    with pytest.raises(ValueError, match="log_joint failed"):
        jaxvb.fit(
            two,
            jaxvb.GaussianMixture(jnp.ones(1), jnp.zeros((1, 3)), jnp.eye(3)[None]),
            KEY,
            num_steps=10,
        )
