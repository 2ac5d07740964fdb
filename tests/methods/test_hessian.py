"""Algorithm 2 (``method="hessian"``), the Laplace start and fit's step control."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import gammaln
from test_mixture import BB

import jaxvb
from jaxvb._special import betaln
from jaxvb.models import beta_binomial, conjugate

KEY = jax.random.key(5)


@pytest.mark.slow
def test_betaln_derivatives_are_right_at_every_order():
    """JAX's own betaln has a wrong Hessian at small arguments; ours does not."""

    def ours(e):
        return betaln(e[0], e[1])

    def reference(e):
        return gammaln(e[0]) + gammaln(e[1]) - gammaln(e[0] + e[1])

    @jax.jit  # one program for every point, not one per operation
    def values_and_derivatives(e):
        return [(f(e), jax.grad(f)(e), jax.hessian(f)(e)) for f in (ours, reference)]

    for e in ([1.0, 1.0], [0.5, 0.5], [2.0, 6.0], [30.0, 40.0], [2.5, 2400.0]):
        (value, grad, hess), (value_ref, grad_ref, hess_ref) = values_and_derivatives(
            jnp.array(e)
        )
        # The reference loses digits to cancellation for large arguments.
        np.testing.assert_allclose(value, value_ref, rtol=1e-9)
        np.testing.assert_allclose(grad, grad_ref, rtol=1e-10)
        np.testing.assert_allclose(hess, hess_ref, rtol=1e-7, atol=1e-10)


def test_betaln_values_against_mpmath_from_small_to_huge_arguments():
    """Below 1e7 the value is the ``gammaln`` sum: within 1e-12 of mpmath's 50-digit
    value up to arguments of 1e3, losing digits to cancellation beyond (1e-10 at
    ``(1, 1e6)``, 1e-8 at ``(1, 9.99e6)``); from 1e7 on, Stirling's series, within a
    few ulp."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    small = [1e-6, 1e-3, 0.5, 1.0, 3.0, 17.5, 1e3, 1e6, 9.99e6]
    large = [1e7, 1.0000001e7, 3e8, 1e12, 1e18]
    a, b = np.array([(s, t) for s in small + large for t in small + large]).T
    got = np.asarray(jax.jit(betaln)(jnp.asarray(a), jnp.asarray(b)))
    want = np.array(
        [
            float(mpmath.log(mpmath.beta(mpmath.mpf(x), mpmath.mpf(y))))
            for x, y in zip(a, b, strict=True)
        ]
    )
    err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    top = np.maximum(a, b)
    assert np.max(err[top >= 1e7]) < 4e-15
    assert np.max(err[top <= 1e3]) < 1e-12
    assert np.max(err) < 2e-8


@pytest.mark.slow
def test_hessian_is_exact_on_a_gaussian_target():
    model = conjugate.gaussian_linear(
        np.random.default_rng(0).normal(size=(30, 3)),
        np.random.default_rng(1).normal(size=30),
        noise_sd=0.8,
        prior_sd=2.0,
    )
    q0 = jaxvb.Gaussian(jnp.zeros(3), jnp.eye(3))
    res = jaxvb.fit(model.log_joint, q0, KEY, num_steps=10)  # hessian is the default
    assert bool(res.ok)
    np.testing.assert_allclose(res.q.mean, model.posterior.mean, rtol=1e-10)
    np.testing.assert_allclose(res.q.cov, model.posterior.cov, rtol=1e-10)
    assert float(res.log_evidence) == pytest.approx(float(model.log_evidence), abs=1e-8)


@pytest.mark.slow
def test_hessian_accepts_a_user_gradient_and_hessian():
    target = jaxvb.Gaussian(jnp.array([1.0, -1.0]), jnp.array([[1.0, 0.4], [0.4, 2.0]]))
    precision = target.precision

    def grad_and_hess(x):
        return -precision @ (x - target.mean), -precision

    method = jaxvb.methods.hessian(grad_and_hess)
    res = jaxvb.fit(
        target.log_prob,
        jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
        KEY,
        num_steps=10,
        method=method,
    )
    np.testing.assert_allclose(res.q.cov, target.cov, rtol=1e-10)


@pytest.mark.slow
def test_laplace_and_fit_from_a_point():
    log_joint = BB  # one function object: the search is test_mixture_diagnostics' too
    q, info = jaxvb.laplace(log_joint, jnp.array([-7.0, 6.0]), return_info=True)
    assert bool(info.converged) and bool(info.negative_definite)
    np.testing.assert_allclose(q.mean, beta_binomial.PAPER_MODE, atol=0.01)
    res = jaxvb.fit(log_joint, jnp.array([-7.0, 6.0]), KEY, num_steps=1000, num_draws=4)
    assert bool(res.ok)
    # Over 16 keys this setting gives sds of (0.0025, 0.024) for the mean and 0.28,
    # 0.043, 0.022 for the precision entries: the tolerances are about 4 sds.
    np.testing.assert_allclose(res.q.mean, beta_binomial.PAPER_GAUSSIAN_MEAN, atol=0.1)
    np.testing.assert_allclose(
        res.q.precision, beta_binomial.PAPER_GAUSSIAN_PRECISION, rtol=0.1
    )


def test_laplace_refuses_a_saddle():
    with pytest.raises(ValueError, match="not negative definite"):
        jaxvb.laplace(lambda x: -(x[0] ** 2) + 0.0 * x[1], jnp.zeros(2))


def wiggly(x):
    """Not log-concave: the Hessian -1 - 27 cos(3x) reaches +26 between the wiggles."""
    return -0.5 * x[0] ** 2 + 3.0 * jnp.cos(3.0 * x[0])


@pytest.mark.slow
def test_step_control_keeps_the_precision_positive_definite():
    q0 = jaxvb.Gaussian(jnp.array([1.05]), 0.05 * jnp.eye(1))  # where cos(3x) = -1
    # a key whose draws turn an update improper (keys 6-9 of 0-11 do; the rest land
    # where the target is concave enough and need no damping)
    key = jax.random.key(8)
    res = jaxvb.fit(wiggly, q0, key, num_steps=400)
    assert int(res.status) == 0
    assert int(res.num_damped_steps) > 0  # the step control did work here
    for leaf in jax.tree_util.tree_leaves(res.q):
        assert np.all(np.isfinite(leaf))
    plain = jaxvb.fit(wiggly, q0, key, num_steps=400, max_backtracks=0, on_failure="ignore")
    assert int(plain.status) & int(jaxvb.Status.IMPROPER_PROPOSAL)


@pytest.mark.slow
def test_step_control_honours_a_methods_trust_region():
    # A trust region refusing every update that moves the mean by more than 1e-3: every
    # step is halved (up to max_backtracks times) and then taken, still proper.
    q0 = jaxvb.Gaussian(jnp.array([1.0]), jnp.eye(1))
    base = jaxvb.methods.hessian()

    def shift(q, q_new):
        return jnp.max(jnp.abs(q_new.mean - q.mean))

    target = lambda x: -0.5 * jnp.sum((x - 3.0) ** 2)  # noqa: E731
    free = jaxvb.fit(target, q0, KEY, num_steps=50, method=base)
    held = jaxvb.fit(
        target, q0, KEY, num_steps=50, method=jaxvb.methods.trust_region(base, shift, 1e-3)
    )
    assert int(free.num_damped_steps) == 0 and int(free.status) == 0
    assert int(held.num_damped_steps) == 50 and int(held.status) == 0
    # a same-family target is found exactly either way: the damped running statistics
    # still solve to it, and the second-half average never was damped
    np.testing.assert_allclose(held.q.mean, free.q.mean, rtol=1e-12)
    np.testing.assert_allclose(free.q.mean, [3.0], rtol=1e-12)
