"""The printed summary of a fit (jaxvb.summary, print(res)) and save/load (jaxvb.io).

Fast tier: results built by hand around each family (no fit to compile) and one small
Gaussian fit. Slow tier: real fits of a mixture, a vmapped batch, a LatentGaussian
model and a NumPyro model, summarised and round-tripped.

Exact rows are checked against SciPy's quantile functions to near machine precision.
Rows from draws are checked within 5 Monte Carlo standard errors of the exact value
(a false failure rate of about 6e-7 per comparison).
"""

import json
import math
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import jaxvb
from jaxvb.io import FORMAT_VERSION

PROBS = (0.05, 0.5, 0.95)


def made(q, dtype=jnp.float64, status=0, r_squared=0.99, trace=None, **fields):
    """A concrete Result around ``q`` with chosen diagnostics (no fit)."""
    f = lambda v: jnp.asarray(v, dtype)  # noqa: E731
    i = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    d = q.event_shape[0] if q.event_shape else 1
    values = dict(
        q=q,
        elbo=f(-3.25),
        log_evidence=f(-3.2),
        kl=f(0.05),
        r_squared=f(r_squared),
        residual_variance=f(0.1),
        elbo_stderr=f(0.01),
        khat=f(0.3),
        status=i(status),
        first_improper_step=i(-1),
        last_improper_step=i(-1),
        num_damped_steps=i(0),
        first_nonfinite_step=i(-1),
        nonfinite_draw=jnp.zeros(d, dtype),
        fixed_point_shift=f(0.01),
        trace=trace,
    )
    values.update(fields)
    # diagnostics added to Result after these tests were written: a plain value
    values.update({n: f(0.02) for n in jaxvb.Result._fields if n not in values})
    return jaxvb.Result(**values)


def stack(*results):
    return jax.tree_util.tree_map(lambda *v: jnp.stack(v), *results)


def assert_same(a, b):
    """Two pytrees equal leaf for leaf: structure, dtype and every bit."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


COV = np.array([[4.0, 1.2], [1.2, 1.0]])
MEAN = np.array([1.0, -2.0])


@pytest.fixture(scope="module")
def gaussian_fit():
    """A Gaussian target, fitted exactly by Algorithm 1 in a few steps."""
    prec = jnp.asarray(np.linalg.inv(COV))
    log_joint = lambda x: -0.5 * (x - MEAN) @ prec @ (x - MEAN)  # noqa: E731
    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    return jaxvb.fit(log_joint, q0, jax.random.key(0), num_steps=20)


# ---------------------------------------------------------------------------- summary


@pytest.mark.slow
def test_a_gaussian_fit_prints_exact_marginals_and_its_diagnostics(gaussian_fit):
    res = gaussian_fit
    s = res.summary(names=["a", "b"])
    sd = np.sqrt(np.diag(COV))
    expected = np.stack(
        [stats.norm.ppf(PROBS, m, v) for m, v in zip(MEAN, sd, strict=True)]
    )
    np.testing.assert_allclose(s.values[:, 0], MEAN, atol=1e-10)
    np.testing.assert_allclose(s.values[:, 1], sd, rtol=1e-10)
    np.testing.assert_allclose(s.values[:, 2:5], expected, rtol=1e-10, atol=1e-10)
    assert s.columns == ("mean", "sd", "5%", "50%", "95%", "mcse")
    assert (s.values[:, 5] == 0).all()  # closed form: no Monte Carlo error
    assert s.diagnostics["elbo"] == float(res.elbo)
    assert s.diagnostics["r_squared"] == float(res.r_squared)
    text = str(s)
    for piece in ("a ", "b ", "ELBO", "log evidence", "KL", "R^2", "k-hat", "status"):
        assert piece in text
    assert text.splitlines()[-1] == "status        ok"
    # print(res) is the default summary; repr stays the NamedTuple's
    assert str(res) == str(jaxvb.summary(res))
    assert "x[0]" in str(res) and "x[1]" in str(res)
    assert repr(res).startswith("Result(q=Gaussian(")
    assert s["b"]["95%"] == pytest.approx(expected[1, 2], rel=1e-10)


def test_prob_sets_the_quantile_columns():
    s = jaxvb.summary(made(jaxvb.Gaussian(MEAN, COV)), prob=0.5)
    assert s.columns[2:5] == ("25%", "50%", "75%")
    np.testing.assert_allclose(
        s.values[0, 2], stats.norm.ppf(0.25, MEAN[0], 2.0), rtol=1e-10
    )


@pytest.mark.parametrize(
    "q, dist",
    [
        (jaxvb.Gamma(jnp.array([3.0, 0.5]), jnp.array([2.0, 1.0])), None),
        (jaxvb.InverseGamma(jnp.array([3.5, 1.5]), jnp.array([2.0, 1.0])), None),
        (jaxvb.Beta(jnp.array([2.0, 0.7]), jnp.array([6.0, 0.4])), None),
        (jaxvb.Exponential(jnp.array([0.5, 4.0])), None),
    ],
    ids=["Gamma", "InverseGamma", "Beta", "Exponential"],
)
def test_scalar_families_rows_are_exact(q, dist):
    del dist
    name = type(q).__name__
    if name == "Gamma":
        ref = stats.gamma(np.asarray(q.concentration), scale=1 / np.asarray(q.rate))
    elif name == "InverseGamma":
        ref = stats.invgamma(np.asarray(q.concentration), scale=np.asarray(q.scale))
    elif name == "Beta":
        ref = stats.beta(np.asarray(q.concentration1), np.asarray(q.concentration0))
    else:
        ref = stats.expon(scale=1 / np.asarray(q.rate))
    s = jaxvb.summary(made(q))
    assert s.names == ("x[0]", "x[1]")
    np.testing.assert_allclose(s.values[:, 0], ref.mean(), rtol=1e-12)
    np.testing.assert_allclose(s.values[:, 1], ref.std(), rtol=1e-12)  # inf for a <= 2
    quantiles = np.stack([ref.ppf(p) for p in PROBS], axis=1)
    np.testing.assert_allclose(s.values[:, 2:5], quantiles, rtol=1e-9)
    assert (s.values[:, 5] == 0).all()


def test_mixture_rows_are_exact():
    q = jaxvb.GaussianMixture(
        weights=jnp.array([0.3, 0.7, 0.0]),
        means=jnp.array([[-2.0, 0.0], [1.0, 5.0], [50.0, 50.0]]),
        covs=jnp.stack([jnp.eye(2), 0.25 * jnp.eye(2), jnp.eye(2)]),
    )
    s = jaxvb.summary(made(q))
    np.testing.assert_allclose(s.values[:, 0], q.mean, rtol=1e-12)
    np.testing.assert_allclose(s.values[:, 1], np.sqrt(q.variance), rtol=1e-12)
    for j, (m, sd) in enumerate([((-2.0, 1.0), (1.0, 0.5)), ((0.0, 5.0), (1.0, 0.5))]):
        cdf = 0.3 * stats.norm.cdf(s.values[j, 2:5], m[0], sd[0]) + 0.7 * stats.norm.cdf(
            s.values[j, 2:5], m[1], sd[1]
        )
        np.testing.assert_allclose(cdf, PROBS, atol=1e-12)


def test_float32_rows_are_exact_to_float32():
    q = jaxvb.Gamma(jnp.array([3.0], jnp.float32), jnp.array([2.0], jnp.float32))
    s = jaxvb.summary(made(q, jnp.float32))
    ref = stats.gamma(3.0, scale=0.5)
    np.testing.assert_allclose(s.values[0, 2:5], ref.ppf(PROBS), rtol=1e-5)
    assert s.diagnostics["elbo"] == pytest.approx(-3.25)


def test_a_flagged_result_prints_its_flags_in_words():
    res = made(
        jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1)),
        status=int(jaxvb.Status.POOR_FIT),
        r_squared=-0.4,
    )
    s = res.summary()
    assert s.status.startswith("64 (POOR_FIT): R^2 is -0.4, below 0")
    text = str(res)
    assert "status        64 (POOR_FIT): R^2 is -0.4" in text
    assert max(len(line) for line in text.splitlines()) <= 92


def test_a_batch_prints_one_row_per_fit():
    g = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    res = stack(made(g), made(g, status=2))
    s = jaxvb.summary(res)
    assert s.names == ("[0]", "[1]")
    assert s.columns[-1] == "status"
    assert s.values[:, -1].tolist() == [0, 2]
    np.testing.assert_allclose(s.values[:, 0], [-3.25, -3.25])
    text = str(res)
    assert "1 flagged" in text and "jax.tree.map(lambda v: v[i], res)" in text
    # the slice it suggests is a summary of its own
    one = jax.tree_util.tree_map(lambda v: v[1], res)
    assert "IMPROPER_RESULT" in str(one)


def test_inside_jit_print_shows_the_fields_and_summary_refuses():
    seen = []

    @jax.jit
    def f(mean):
        res = made(jaxvb.Gaussian(mean, jnp.eye(1)))
        seen.append(str(res))
        with pytest.raises(TypeError, match="traced values"):
            jaxvb.summary(res)
        return res.elbo

    f(jnp.zeros(1))
    assert seen[0].startswith("Result(q=Gaussian(mean=(1,)")


def test_bad_arguments_are_named():
    res = made(jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)))
    with pytest.raises(ValueError, match="names has 3 labels but the fitted q has 2"):
        res.summary(names=["a", "b", "c"])
    with pytest.raises(ValueError, match="prob must be in"):
        res.summary(prob=1.0)
    with pytest.raises(KeyError, match="no row 'y'"):
        res.summary()["y"]
    with pytest.raises(TypeError, match="expected a jaxvb.Result"):
        jaxvb.summary(res.q)


# -------------------------------------------------------------------------- save/load


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_round_trip_keeps_every_bit_and_dtype(tmp_path, dtype):
    cov = jnp.asarray(COV, dtype)
    cases = {
        "dense": jaxvb.Gaussian(jnp.asarray(MEAN, dtype), cov),
        "precision": jaxvb.Gaussian.from_precision(
            jnp.asarray(MEAN, dtype), jnp.linalg.inv(cov)
        ),
        "gamma": jaxvb.Gamma(jnp.array([3.0, 0.5], dtype), jnp.array([2.0, 1.0], dtype)),
        "beta": jaxvb.Beta(jnp.array([2.0], dtype), jnp.array([3.0], dtype)),
        "inverse_gamma": jaxvb.InverseGamma(
            jnp.array([3.0], dtype), jnp.array([1.0], dtype)
        ),
        "exponential": jaxvb.Exponential(jnp.array([2.0], dtype)),
        "mixture": jaxvb.GaussianMixture.around(
            jaxvb.Gaussian(jnp.zeros(2, dtype), cov), 3
        ),
    }
    trace = jaxvb.Trace(
        jnp.ones((4, 5), dtype), jnp.arange(4.0, dtype=dtype), jnp.ones(4, bool)
    )
    for name, q in cases.items():
        res = made(q, dtype, trace=trace if name == "dense" else None)
        path = tmp_path / f"{name}.npz"
        jaxvb.save(path, res)
        back = jaxvb.load(path)
        assert type(back.q) is type(q), name
        assert_same(back, res)
        assert back.q.dtype == dtype
        np.testing.assert_array_equal(back.q.mean, q.mean)  # a working family
        assert repr(back.q) == repr(q)
    # a batch, with its leading axis
    res = stack(made(cases["mixture"], dtype), made(cases["mixture"], dtype, status=2))
    jaxvb.save(tmp_path / "batch.npz", res)
    back = jaxvb.load(tmp_path / "batch.npz")
    assert_same(back, res)
    assert back.q.weights.shape == (2, 3)


def test_the_file_is_plain_npz_with_a_json_header(tmp_path):
    gaussian_fit = made(jaxvb.Gaussian(MEAN, COV))
    path = tmp_path / "fit"  # no suffix is added
    jaxvb.save(path, gaussian_fit)
    assert path.exists() and not (tmp_path / "fit.npz").exists()
    with np.load(path, allow_pickle=False) as f:
        header = json.loads(bytes(f["__header__"]).decode())
        mean = header["root"]["fields"]["q"]["fields"]["mean"]
        np.testing.assert_array_equal(f[mean["name"]], gaussian_fit.q.mean)
    assert header["format"] == "jaxvb.result"
    assert header["format_version"] == FORMAT_VERSION
    assert header["jaxvb_version"] == jaxvb.__version__
    assert header["root"]["fields"]["q"]["class"] == "jaxvb.families.gaussian.Gaussian"
    assert_same(jaxvb.load(path), gaussian_fit)


def test_a_numpyro_result_is_recorded_under_its_public_path(tmp_path):
    """The file names ``jaxvb.numpyro.NumPyroResult``, wherever the class is defined."""
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist

    import jaxvb.numpyro

    def model(y):
        loc = numpyro.sample("loc", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        numpyro.sample("y", dist.Normal(loc, 1.0).to_event(1), obs=y)

    lj = jaxvb.numpyro.log_joint(model, jnp.array([0.5, -1.0]))
    res = jaxvb.numpyro.NumPyroResult(made(jaxvb.Gaussian(MEAN, COV)), lj)
    jaxvb.save(tmp_path / "np.npz", res)
    with np.load(tmp_path / "np.npz", allow_pickle=False) as f:
        header = json.loads(bytes(f["__header__"]).decode())
    assert header["wrapper"] == {
        "class": "jaxvb.numpyro.NumPyroResult",
        "sites": ["loc"],
        "dim": 2,
    }
    assert_same(jaxvb.load(tmp_path / "np.npz"), res.result)


def _rewrite(path, edit_header=None, edit_arrays=None):
    with np.load(path, allow_pickle=False) as f:
        arrays = {n: f[n] for n in f.files}
    header = json.loads(bytes(arrays.pop("__header__")).decode())
    if edit_header:
        edit_header(header)
    if edit_arrays:
        edit_arrays(arrays)
    text = np.frombuffer(json.dumps(header).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, __header__=text, **arrays)


def test_load_refuses_newer_damaged_and_foreign_files(tmp_path):
    gaussian_fit = made(jaxvb.Gaussian(MEAN, COV))
    path = tmp_path / "fit.npz"

    def fresh():
        jaxvb.save(path, gaussian_fit)
        return path

    _rewrite(fresh(), edit_header=lambda h: h.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(ValueError, match="written by a newer jaxvb .* format version 2"):
        jaxvb.load(path)

    def flip(arrays):
        arrays["a1"] = arrays["a1"].copy()
        arrays["a1"].flat[0] += 1.0

    _rewrite(fresh(), edit_arrays=flip)
    with pytest.raises(ValueError, match="corrupted .* do not match their checksum"):
        jaxvb.load(path)

    raw = bytearray(fresh().read_bytes())  # bytes damaged inside the zip
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("a1.npy")
    raw[info.header_offset + 100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="corrupted or not a jaxvb file"):
        jaxvb.load(path)

    path.write_bytes(fresh().read_bytes()[:300])  # truncated
    with pytest.raises(ValueError, match="corrupted or not a jaxvb file"):
        jaxvb.load(path)

    def evil(h):
        h["root"]["fields"]["q"]["class"] = "os.system"

    _rewrite(fresh(), edit_header=evil)
    with pytest.raises(ValueError, match="'os.system', which is not one of the families"):
        jaxvb.load(path)

    # an object array (a pickle) is refused, never unpickled
    _rewrite(fresh(), edit_arrays=lambda a: a.update(a1=np.array([print], dtype=object)))
    with pytest.raises(ValueError, match="array 'a1' cannot be read"):
        jaxvb.load(path)

    np.save(tmp_path / "plain.npy", np.zeros(3))
    with pytest.raises(ValueError, match="not a NumPy .npz archive"):
        jaxvb.load(tmp_path / "plain.npy")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="its header cannot be read"):
        jaxvb.load(tmp_path / "other.npz")
    with pytest.raises(FileNotFoundError):
        jaxvb.load(tmp_path / "missing.npz")


def test_save_refuses_what_it_cannot_rebuild(tmp_path):
    from jaxvb.models import stochastic_volatility as sv

    q = sv.initial_q(jnp.array([0.5, -1.2, 0.3]))
    with pytest.raises(TypeError, match="Hierarchical, which jaxvb.save does not know"):
        jaxvb.save(tmp_path / "h.npz", made(q))

    @jax.jit
    def f(mean):
        with pytest.raises(TypeError, match="traced value"):
            jaxvb.save(tmp_path / "t.npz", made(jaxvb.Gaussian(mean, jnp.eye(1))))
        return mean

    f(jnp.zeros(1))
    assert not list(tmp_path.iterdir())  # nothing half-written
    with pytest.raises(TypeError, match="expected a jaxvb.Result"):
        jaxvb.save(tmp_path / "q.npz", q)


def test_float64_file_in_a_float32_session_warns(tmp_path):
    res = made(jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1)))
    jaxvb.save(tmp_path / "f64.npz", res)
    with jax.enable_x64(False):
        with pytest.warns(
            UserWarning, match="float64 -> float32 arrays, but jax_enable_x64"
        ):
            back = jaxvb.load(tmp_path / "f64.npz")
        assert back.q.mean.dtype == jnp.float32


# ------------------------------------------------------------------ real fits (slow)


@pytest.mark.slow
def test_mixture_and_vmapped_fits_round_trip_and_print(tmp_path):
    log_joint = lambda x: jnp.logaddexp(  # noqa: E731
        -0.5 * jnp.sum((x - 2.0) ** 2), -0.5 * jnp.sum((x + 2.0) ** 2)
    )
    q0 = jaxvb.GaussianMixture.around(jaxvb.Gaussian(jnp.zeros(1), 4 * jnp.eye(1)), 2)
    res = jaxvb.fit(log_joint, q0, jax.random.key(0), num_steps=300)
    jaxvb.save(tmp_path / "m.npz", res)
    assert_same(jaxvb.load(tmp_path / "m.npz"), res)
    s = res.summary()
    np.testing.assert_allclose(s.values[0, 0], res.q.mean[0], rtol=1e-12)
    assert "x[0]" in str(res)

    g0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    batch = jax.vmap(
        lambda c, k: jaxvb.fit(lambda x: -0.5 * jnp.sum((x - c) ** 2), g0, k, num_steps=20)
    )(jnp.arange(3.0), jax.random.split(jax.random.key(0), 3))
    jaxvb.save(tmp_path / "b.npz", batch)
    back = jaxvb.load(tmp_path / "b.npz")
    assert_same(back, batch)
    s = jaxvb.summary(back)
    assert s.names == ("[0]", "[1]", "[2]")
    assert jaxvb.summary(jax.tree_util.tree_map(lambda v: v[2], back))["x[1]"][
        "mean"
    ] == pytest.approx(2.0, abs=1e-10)


@pytest.mark.slow
def test_latent_gaussian_fit_prints_theta_and_the_field_and_reloads(tmp_path):
    y = jnp.array([0.0, 2.0, 1.0, 4.0, 3.0, 5.0, 2.0, 1.0, 0.0, 3.0, 2.0, 4.0])
    T = y.shape[0]
    model = jaxvb.LatentGaussian(
        log_prior=lambda th: -0.5 * jnp.sum(th**2),
        prior=lambda th: (jnp.zeros(T), jnp.exp(th[0]) * jnp.eye(T)),
        log_lik=lambda f, y: y * f - jnp.exp(f),
        data=y,
    )
    res = jaxvb.fit(model, jnp.zeros(1), jax.random.key(0), num_steps=100)
    s = res.summary()
    assert s.names == ("theta[0]",)  # T = 12 > max_rows: one line for f
    assert s.values[0, 0] == pytest.approx(float(res.q.theta.mean[0]), rel=1e-12)
    assert any(n.startswith("f: 12 values; mean from") for n in s.notes)
    rows = res.summary(max_rows=20)
    assert rows.names[1:] == tuple(f"f[{t}]" for t in range(T))
    # draws: within 5 Monte Carlo standard errors of the exact marginal mean of f,
    # E[f_t] = E_theta[mu_t(theta)] (by 20-point Gauss-Hermite over q(theta))
    z, w = np.polynomial.hermite_e.hermegauss(20)
    m, sd = float(res.q.theta.mean[0]), float(np.sqrt(res.q.theta.variance[0]))
    mu = np.stack([np.asarray(res.q.conditional(jnp.array([m + sd * zi]))[0]) for zi in z])
    exact = (w / w.sum()) @ mu
    mean, mcse = rows.values[1:, 0], rows.values[1:, 5]
    assert np.all(np.abs(mean - exact) < 5 * mcse), (mean - exact) / mcse

    jaxvb.save(tmp_path / "lg.npz", res)
    with pytest.raises(ValueError, match="pass the jaxvb.LatentGaussian"):
        jaxvb.load(tmp_path / "lg.npz")
    back = jaxvb.load(tmp_path / "lg.npz", model=model)
    assert back.q.model.num_hyper == 1
    np.testing.assert_array_equal(
        back.sample(jax.random.key(3), 4)[1], res.sample(jax.random.key(3), 4)[1]
    )
    assert str(back.summary()) == str(s)


@pytest.mark.slow
def test_numpyro_fit_prints_sites_and_rewraps_after_load(tmp_path):
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist

    import jaxvb.numpyro

    def model(X, y):
        beta = numpyro.sample("beta", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
        scale = numpyro.sample("scale", dist.HalfNormal(1.0))
        numpyro.deterministic("total", beta.sum())
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Normal(X @ beta, scale), obs=y)

    X = jax.random.normal(jax.random.key(1), (30, 2))
    y = X @ jnp.array([1.0, -0.5]) + 0.3 * jax.random.normal(jax.random.key(2), (30,))
    res = jaxvb.numpyro.fit(model, jax.random.key(0), X, y, num_steps=300)
    s = res.summary()
    assert s.names == ("beta[0]", "beta[1]", "scale", "total")
    assert s.columns[-2:] == ("q mean", "q sd")
    assert s.notes[-1].startswith("(from 4000 draws resampled from 16000 of q by ")
    # x = (beta, log scale) in sorted site order; q is Gaussian on it
    m, v = np.asarray(res.q.mean), np.asarray(res.q.variance)
    exact = {
        "beta[0]": m[0],
        "beta[1]": m[1],
        "scale": math.exp(m[2] + v[2] / 2),  # a log-normal's mean
        "total": m[0] + m[1],
    }
    for name, value in exact.items():  # q's own draws' means; the resampled ones
        row = s[name]  # move towards the posterior, by much less than an sd here
        assert abs(row["q mean"] - value) < 5 * row["q sd"] / math.sqrt(4000), name
        assert abs(row["mean"] - value) < 0.1 * row["q sd"], name
    assert s["scale"]["5%"] == pytest.approx(
        math.exp(m[2] + math.sqrt(v[2]) * stats.norm.ppf(0.05)), rel=0.05
    )
    assert jaxvb.summary(res, names=["scale"]).names == ("scale",)
    with pytest.raises(ValueError, match="no site 'sigma'"):
        res.summary(names=["sigma"])

    jaxvb.save(tmp_path / "np.npz", res)
    back = jaxvb.load(tmp_path / "np.npz")
    assert_same(back, res.result)
    again = jaxvb.numpyro.NumPyroResult(back, jaxvb.numpyro.log_joint(model, X, y))
    a, b = again.sample(jax.random.key(5), 7), res.sample(jax.random.key(5), 7)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert str(again.summary()) == str(s)
