"""The engine's shape: the kernel, the method registry, the family protocol, ``check``,
the chunked convergence check and one compiled program per log-joint structure."""

import contextlib
import dataclasses
import logging
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb
from jaxvb.core import convergence, kernel
from jaxvb.core import fit as _fit
from jaxvb.families import Family, register_family
from jaxvb.methods import _registry

KEY = jax.random.key(0)


def _gaussian_target(x, centre):
    return -0.5 * jnp.sum((x - centre) ** 2 / jnp.array([1.0, 4.0]))


def test_kernel_by_hand_gives_fit():
    """A scan of kernel.step from kernel.init, then finalize, is what fit runs."""
    target = jax.tree_util.Partial(_gaussian_target, jnp.array([1.0, -2.0]))
    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    method = jaxvb.methods.hessian()
    state = kernel.init(KEY, q0, target, method)

    def body(state, xs):
        keys, t = xs
        return kernel.step(keys, state, t, target, method, step_size=0.3, average_from=10)

    keys = jax.random.split(jax.random.key(1), (20, 2))
    state, info = jax.lax.scan(body, state, (keys, jnp.arange(1, 21)))
    q, ok = kernel.finalize(state, method, target)
    assert bool(ok) and bool(info.proper.all()) and info.num_finite.tolist() == [2] * 20
    np.testing.assert_allclose(q.mean, [1.0, -2.0], rtol=1e-12)
    np.testing.assert_allclose(q.cov, np.diag([1.0, 4.0]), rtol=1e-12)
    res = jaxvb.fit(target, q0, KEY, num_steps=20, num_eval_draws=20)
    np.testing.assert_allclose(res.q.mean, q.mean, rtol=1e-12)


@pytest.mark.slow
def test_a_method_registers_itself_and_becomes_a_default():
    @register_family
    class Shifted(jaxvb.Gamma.__mro__[1]):  # a ScalarFamily: Gamma's own base
        rate: jax.Array

        def _natural_parts(self):
            return (self.rate,)

        def _from_natural_parts(self, rate):
            return Shifted(rate)

        def _stats_parts(self, x):
            return (-x,)

        def _log_normalizer_parts(self, rate):
            return -jnp.log(rate)

        def noise(self, key):
            return jax.random.exponential(key, self.event_shape, self.dtype)

        def from_noise(self, z):
            return z / self.rate

        def in_support(self, x):
            return jnp.all(x > 0)

        @property
        def mean(self):
            return 1.0 / self.rate

    calls = []

    def factory():
        calls.append(1)
        return jaxvb.methods.regression()

    def log_joint(x):  # one function: both fits resolve to one method, one program
        return -3.0 * x[0]

    _registry.register("test_analytic", factory, default_for=(Shifted,))
    try:
        q0 = Shifted(jnp.ones(1))
        by_default = jaxvb.fit(log_joint, q0, KEY, num_steps=20)
        by_name = jaxvb.fit(log_joint, q0, KEY, num_steps=20, method="test_analytic")
        assert len(calls) == 2
        np.testing.assert_allclose(by_default.q.rate, [3.0], rtol=1e-12)
        np.testing.assert_allclose(by_name.q.rate, [3.0], rtol=1e-12)
        assert "test_analytic" in jaxvb.methods.names()
        with pytest.raises(ValueError, match="registered already"):
            _registry.register("test_analytic", lambda: None)
    finally:
        del _registry._FACTORIES["test_analytic"], _registry._DEFAULTS[Shifted]
    with pytest.raises(ValueError, match="unknown method 'test_analytic'; choose from"):
        jaxvb.fit(lambda x: -x[0], q0, KEY, num_steps=20, method="test_analytic")


def test_a_family_missing_a_piece_is_refused_when_it_is_created():
    with pytest.raises(TypeError, match="does not implement _log_normalizer, from_natural"):

        @register_family
        class Half(jaxvb.ExponentialFamily):
            loc: jax.Array
            event_shape = property(lambda self: self.loc.shape)
            is_proper = property(lambda self: jnp.all(jnp.isfinite(self.loc)))
            natural_params = property(lambda self: self.loc)

            def sufficient_stats(self, x):
                return x

            def noise(self, key):
                return jax.random.normal(key, self.loc.shape)

            def from_noise(self, z):
                return self.loc + z


def test_the_mixture_is_a_family_not_an_exponential_family():
    q = jaxvb.GaussianMixture.around(jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)), 3)
    assert isinstance(q, Family) and not isinstance(q, jaxvb.ExponentialFamily)
    assert jaxvb.methods.resolve(None, q).name.startswith("mixture")
    with pytest.raises(TypeError, match="needs an exponential family"):
        jaxvb.fit(lambda x: -jnp.sum(x**2), q, KEY, num_steps=50, method="gradient")


@pytest.mark.slow
def test_check_raises_warns_or_passes_a_result_through():
    log_joint = lambda x: jnp.log(x[0]) - x[0]  # noqa: E731  (NaN for x < 0)
    q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
    res = jaxvb.fit(log_joint, q0, KEY, num_steps=20, num_eval_draws=4, on_failure="ignore")
    assert jaxvb.Status.NONFINITE_LOG_DENSITY in jaxvb.Status(int(res.status))
    with pytest.raises(jaxvb.FitError, match="^mine: log_joint was not finite") as err:
        jaxvb.check(res, who="mine")
    assert err.value.result is res
    with pytest.warns(jaxvb.FitWarning, match="^mine: log_joint was not finite"):
        assert jaxvb.check(res, "warn", who="mine") is res
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jaxvb.check(res, "ignore") is res
        batched = jax.tree_util.tree_map(lambda v: jnp.stack([v, v]), res)
        assert jaxvb.check(batched) is batched  # a batched status only flags
    with pytest.raises(ValueError, match="on_failure must be"):
        jaxvb.check(res, "loud")


def test_trust_region_wrapper_composes():
    base = jaxvb.methods.regression()
    kl = lambda q, q_new: q_new.kl_divergence(q)  # noqa: E731
    inner = jaxvb.methods.trust_region(base, kl, 10.0)
    outer = jaxvb.methods.trust_region(inner, kl, 0.01)
    q = jaxvb.Gamma(jnp.ones(1), jnp.ones(1))
    far, near = jaxvb.Gamma(jnp.ones(1), 2 * jnp.ones(1)), jaxvb.Gamma(jnp.ones(1), 1.01)
    assert bool(inner.accept(q, far)) and not bool(outer.accept(q, far))
    assert bool(outer.accept(q, near)) and base.accept is None
    assert (
        outer.name == "regression(joint, init=analytic)+trust_region(10)+trust_region(0.01)"
    )


@pytest.mark.slow
def test_the_convergence_check_reuses_the_iterations_traced_estimate():
    """The check's draws are extra steps of the same scan: the method's estimate (the
    log joint's derivatives, most of the program) is traced once, not once more for the
    check, and on the same-family target the check sees q come back exactly."""
    target = jax.tree_util.Partial(_gaussian_target, jnp.array([1.0, -2.0]))
    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    base = jaxvb.methods.hessian()
    traced = []

    def estimate(noise, q, log_joint):
        traced.append(1)
        return base.estimate(noise, q, log_joint)

    method = base._replace(name="hessian (counted)", estimate=estimate)
    res = jaxvb.fit(target, q0, KEY, num_steps=20, method=method, num_check_draws=40)
    assert len(traced) == 1
    assert res.ok and 0.0 <= float(res.fixed_point_shift) < 1e-20
    np.testing.assert_allclose(res.q.mean, [1.0, -2.0], rtol=1e-12)
    traced.clear()
    res = jaxvb.fit(target, q0, KEY, num_steps=20, method=method, num_check_draws=0)
    assert len(traced) == 1 and np.isnan(float(res.fixed_point_shift))


@pytest.mark.slow
def test_an_unsettled_fit_is_flagged_by_the_check():
    """A few steps of a tiny step size on a quartic: the average is one Newton-like
    step from q0, not a fixed point, and one more update moves q."""

    def target(x):
        return -0.25 * jnp.sum((x - 6.0) ** 4) - 0.5 * jnp.sum(x**2)

    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    res = jaxvb.fit(target, q0, KEY, num_steps=20, step_size=0.01, on_failure="ignore")
    assert res.status & jaxvb.Status.NOT_CONVERGED
    assert float(res.fixed_point_shift) > 1.0


def test_the_check_takes_a_quarter_of_the_iteration_by_default():
    """The default number of check draws: 200, at most a quarter of the iteration's
    draws (each check draw is a step of the same loop), at least 32; what is asked
    for is kept."""
    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))

    def check_draws(num_steps, num_draws=1, antithetic=False, asked=None):
        _, kwargs = _fit._fit_arguments(
            lambda x: -0.5 * jnp.sum(x**2),
            q0,
            KEY,
            method=None,
            num_steps=num_steps,
            num_draws=num_draws,
            antithetic=antithetic,
            max_backtracks=8,
            num_eval_draws=1000,
            num_check_draws=asked,
            step_size=None,
            trace=False,
            progress=None,
        )
        return kwargs["num_check_draws"]

    assert check_draws(1000) == 200 and check_draws(250) == 62
    assert check_draws(20) == convergence.MIN_CHECK_DRAWS == 32
    assert check_draws(250, num_draws=4) == 200
    assert check_draws(250, antithetic=True) == 125
    assert check_draws(250, asked=150) == 150


@pytest.mark.slow
def test_a_pytree_log_joint_compiles_once_for_new_data():
    """jax.tree_util.Partial(fn, data): data of the same shapes reuses the program."""
    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))

    def fit(centre, key):  # (test_kernel_by_hand_gives_fit's settings)
        target = jax.tree_util.Partial(_gaussian_target, centre)
        return jaxvb.fit(target, q0, key, num_steps=20, num_eval_draws=20)

    first = fit(jnp.array([1.0, 2.0]), jax.random.key(1))
    size = _fit._fit._cache_size()
    second = fit(jnp.array([-3.0, 0.5]), jax.random.key(2))
    assert _fit._fit._cache_size() == size
    np.testing.assert_allclose(first.q.mean, [1.0, 2.0], rtol=1e-12)
    np.testing.assert_allclose(second.q.mean, [-3.0, 0.5], rtol=1e-12)
    fit(jnp.array([1.0, 2.0, 3.0])[:2].astype(jnp.float32), jax.random.key(3))
    assert _fit._fit._cache_size() == size + 1  # a new dtype is a new program


def test_static_part_compares_by_value():
    from jaxvb import _static

    a = _static.partition(jax.tree_util.Partial(_gaussian_target, jnp.ones(2)))[1]
    b = _static.partition(jax.tree_util.Partial(_gaussian_target, jnp.zeros(2)))[1]
    c = _static.partition(jax.tree_util.Partial(_gaussian_target, jnp.zeros(3), 1.0))[1]
    assert a == b and hash(a) == hash(b) and a != c
    assert _static.partition(_gaussian_target)[0] == []


@dataclasses.dataclass
class _Target:  # a dataclass with __eq__ and no __hash__: unhashable
    centre: float

    def __call__(self, x):
        return -0.5 * jnp.sum((x - self.centre) ** 2)


def test_an_unhashable_log_joint_is_compiled_as_a_function_is():
    """A callable object that is not hashable is static by identity, as a function
    is: ``fit`` and a ``diagnostics.evaluate`` called on its own both take it."""
    from jaxvb import _static

    target = _Target(1.0)
    arrays, static = _static.partition(target)
    assert arrays == [] and static == _static.partition(target)[1]
    assert static != _static.partition(_Target(1.0))[1] and hash(static)
    assert _static.combine(arrays, static) is target
    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
    res = jaxvb.fit(target, q0, jax.random.key(0), num_steps=20, num_eval_draws=20)
    np.testing.assert_allclose(res.q.mean, [1.0, 1.0], rtol=1e-12)
    d = jaxvb.diagnostics.evaluate(jax.random.key(1), res.q, target, 20)
    assert abs(float(d.kl)) < 1e-12


def test_family_protocol_is_a_dataclass_pytree():
    q = jaxvb.GaussianMixture.around(jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)), 2)
    assert [f.name for f in dataclasses.fields(q)] == ["weights", "means", "covs"]
    leaves, treedef = jax.tree_util.tree_flatten(q)
    assert isinstance(jax.tree_util.tree_unflatten(treedef, leaves), jaxvb.GaussianMixture)


def _count_fit_compiles(records) -> int:
    return sum("XLA compilation of jit(_fit)" in r.getMessage() for r in records)


@contextlib.contextmanager
def _log_compiles():
    before = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)
    try:
        yield
    finally:
        jax.config.update("jax_log_compiles", before)


@pytest.mark.slow
def test_a_point_start_compiles_the_fit_once(caplog):
    """From a point, the fit's program compiles once, after the Laplace start; a second
    call with the same settings compiles nothing and gives the same bits."""

    def log_joint(x):  # a function of this test's own: a new program
        return -0.5 * jnp.sum((x - 0.3) ** 2) - 0.1 * jnp.sum(x**4)

    with _log_compiles(), caplog.at_level(logging.WARNING):
        res = jaxvb.fit(log_joint, jnp.zeros(3), KEY, num_steps=30)
        assert _count_fit_compiles(caplog.records) == 1
        again = jaxvb.fit(log_joint, jnp.zeros(3), KEY, num_steps=30)
        assert _count_fit_compiles(caplog.records) == 1
    leaves = zip(
        jax.tree_util.tree_leaves(res), jax.tree_util.tree_leaves(again), strict=True
    )
    for a, b in leaves:
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_latent_model_start_compiles_the_fit_once(caplog):
    """The same for a model's own start (``LatentGaussian.start``)."""
    model = jaxvb.LatentGaussian(
        log_prior=lambda th: -0.5 * jnp.sum(th**2),
        prior=lambda th: (jnp.zeros(3), jnp.exp(th[0]) * jnp.eye(3)),
        log_lik=lambda f, y: y * f - jnp.exp(f),
        data=jnp.array([0.0, 2.0, 5.0]),
    )
    with _log_compiles(), caplog.at_level(logging.WARNING):
        res = jaxvb.fit(model, jnp.zeros(1), KEY, num_steps=40)
    assert res.ok
    assert _count_fit_compiles(caplog.records) == 1
