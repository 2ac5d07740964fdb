"""A fit compiles once per model structure: new data of the same shapes and a new key
reuse the compiled program (counted with JAX's compile events)."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
import jaxvb.numpyro  # noqa: E402

_counts = []


#: Lowering to XLA and compiling: a program found in JAX's in-memory cache does
#: neither; one found in the persistent cache (the tests use one) is still lowered.
#: (Tracing alone is not counted: fit traces the log joint for its shape checks.)
_EVENTS = (
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def _listener(event, duration, **kwargs):
    if event in _EVENTS:
        for count in _counts:
            count.append(kwargs.get("fun_name", "?"))


jax.monitoring.register_event_duration_secs_listener(_listener)


@contextlib.contextmanager
def compilations():
    """The names of the programs lowered or compiled inside the block."""
    names = []
    _counts.append(names)
    try:
        yield names
    finally:
        _counts.remove(names)


def regression(x, y=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ beta, sigma), obs=y)


def data(seed, beta):
    kx, ky = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (40, 2))
    return x, x @ jnp.asarray(beta) + 0.5 * jax.random.normal(ky, (40,))


FIT_KWARGS = {"num_eval_draws": 50}


@pytest.mark.slow
def test_numpyro_fit_compiles_once_per_model():
    x1, y1 = data(0, [1.0, -1.0])
    x2, y2 = data(1, [-2.0, 0.5])
    first = jaxvb.numpyro.fit(
        regression, jax.random.key(0), x1, y=y1, num_steps=100, fit_kwargs=FIT_KWARGS
    )
    with compilations() as names:
        second = jaxvb.numpyro.fit(
            regression, jax.random.key(1), x2, y=y2, num_steps=100, fit_kwargs=FIT_KWARGS
        )
    assert names == []
    # The second fit used the second data set.
    np.testing.assert_allclose(first.q.mean[:2], [1.0, -1.0], atol=0.3)
    np.testing.assert_allclose(second.q.mean[:2], [-2.0, 0.5], atol=0.3)


@pytest.mark.slow
def test_numpyro_log_joints_of_one_model_are_one_pytree_structure():
    x1, y1 = data(0, [1.0, -1.0])
    x2, y2 = data(1, [-2.0, 0.5])
    a = jaxvb.numpyro.log_joint(regression, x1, y=y1)
    b = jaxvb.numpyro.log_joint(regression, x2, y=y2)
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b and hash(tree_a) == hash(tree_b)
    rebuilt = jax.tree_util.tree_unflatten(tree_a, leaves_b)
    x = jnp.array([0.3, -0.2, 0.1])
    assert float(rebuilt(x)) == float(b(x)) != float(a(x))
    # Another model is another structure.
    other = jaxvb.numpyro.log_joint(lambda x, y=None: regression(x, y), x1, y=y1)
    assert jax.tree_util.tree_structure(other) != tree_a


def test_minibatch_log_joint_is_a_pytree():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        with numpyro.plate("data", y.shape[0], subsample_size=2) as idx:
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    a = jaxvb.numpyro.log_joint(model, jnp.arange(6.0))
    b = jaxvb.numpyro.log_joint(model, jnp.arange(6.0) + 1.0)
    assert type(a).__name__ == "MinibatchLogJoint"
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    batch = jax.jit(lambda lj, x: lj.batch(jax.random.key(0), 1)(x))
    batch(a, jnp.array([1.0]))
    with compilations() as names:
        batch(b, jnp.array([1.0]))
    assert names == []


def _log_joint(x, y):
    return -0.5 * jnp.sum((x - y.mean()) ** 2) - 0.5 * jnp.sum(x**2)


@pytest.mark.slow
def test_fit_of_a_partial_compiles_once():
    y1, y2 = jnp.arange(5.0), jnp.arange(5.0) + 3.0
    first = jaxvb.fit(
        jax.tree_util.Partial(_log_joint, y=y1),
        jnp.zeros(2),
        jax.random.key(0),
        num_steps=50,
        num_eval_draws=50,
    )
    with compilations() as names:
        second = jaxvb.fit(
            jax.tree_util.Partial(_log_joint, y=y2),
            jnp.zeros(2),
            jax.random.key(1),
            num_steps=50,
            num_eval_draws=50,
        )
    assert names == []
    # Exact: the posterior is N(mean(y) / 2, 1/2).
    np.testing.assert_allclose(first.q.mean, [1.0, 1.0], rtol=1e-10)
    np.testing.assert_allclose(second.q.mean, [2.5, 2.5], rtol=1e-10)


def test_laplace_of_a_partial_compiles_once():
    y1, y2 = jnp.arange(5.0), jnp.arange(5.0) + 3.0
    jaxvb.laplace(jax.tree_util.Partial(_log_joint, y=y1), jnp.zeros(2))
    with compilations() as names:
        q = jaxvb.laplace(jax.tree_util.Partial(_log_joint, y=y2), jnp.zeros(2))
    assert names == []
    np.testing.assert_allclose(q.mean, [2.5, 2.5], rtol=1e-10)
