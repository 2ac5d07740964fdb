"""The diagnostics' Monte Carlo standard errors: each is the spread its estimate has
over evaluation keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb

KEY = jax.random.key(0)


def test_standard_errors_match_the_spread_over_keys():
    """q = N(0, I_3) against a Gaussian log p of another scale and centre (KL 0.22,
    R^2 0.53): over 200 evaluation keys of 1000 draws each, the mean reported standard
    error equals the standard deviation of the estimates. 200 replicates estimate that
    standard deviation to 5% (1 / sqrt(2 * 200)); the tolerance is 15%, 3 of them."""
    q = jaxvb.Gaussian(jnp.zeros(3), jnp.eye(3))

    def log_p(x):
        return jnp.sum(-0.5 * x**2 / 1.5 + 0.3 * x)

    run = jax.jit(jax.vmap(lambda k: jaxvb.diagnostics.evaluate(k, q, log_p, 1000)))
    d = run(jax.random.split(KEY, 200))
    for name in ("elbo", "kl", "log_evidence", "r_squared"):
        spread = np.std(np.asarray(getattr(d, name)), ddof=1)
        reported = np.mean(np.asarray(getattr(d, f"{name}_stderr")))
        assert abs(reported / spread - 1.0) < 0.15, (name, reported, spread)


@pytest.mark.slow  # (an exact case of evaluate is diagnostics' docstring example)
def test_standard_errors_of_an_exact_fit_are_zero_and_reach_the_result():
    q = jaxvb.Gaussian(jnp.ones(2), jnp.eye(2))
    d = jax.jit(  # one program, not one per operation
        lambda q: jaxvb.diagnostics.evaluate(KEY, q, lambda x: q.log_prob(x) + 2.0, 100)
    )(q)
    for name in ("elbo", "kl", "log_evidence", "r_squared"):
        assert abs(float(getattr(d, f"{name}_stderr"))) < 1e-12, name
    res = jaxvb.fit(lambda x: -0.5 * jnp.sum(x**2), q, KEY, num_steps=20)
    assert float(res.kl_stderr) < 1e-12 and float(res.log_evidence_stderr) < 1e-12
    assert float(res.r_squared_stderr) < 1e-12


def test_evaluate_on_its_own_is_one_program_and_equals_it_under_jit():
    """Called outside a trace, ``evaluate`` compiles once (a new data set of a pytree
    log joint reuses the program) and gives what the same call gives under ``jit``."""
    from jaxvb.diagnostics import evaluation

    q = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))

    def log_p(x, centre):
        return -0.5 * jnp.sum((x - centre) ** 2)

    def target(centre):
        return jax.tree_util.Partial(log_p, centre=centre)

    first = jaxvb.diagnostics.evaluate(KEY, q, target(jnp.ones(2)), 200)
    size = evaluation._evaluate_compiled._cache_size()
    jaxvb.diagnostics.evaluate(KEY, q, target(jnp.zeros(2)), 200)
    assert evaluation._evaluate_compiled._cache_size() == size
    traced = jax.jit(lambda c: jaxvb.diagnostics.evaluate(KEY, q, target(c), 200))
    for name, value in traced(jnp.ones(2))._asdict().items():
        np.testing.assert_allclose(getattr(first, name), value, rtol=1e-12, err_msg=name)
