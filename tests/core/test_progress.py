"""``fit(..., progress=...)``: reports from inside the compiled loop, the fit unchanged."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb
from jaxvb.core import progress as _progress

KEY = jax.random.key(6)
Q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))
LOG_Z = math.log(2 * math.pi) - 0.5 * math.log(4.0)  # of the Gaussian target below


def gaussian_target(x):  # N((1, -1), diag(1, 1/4)), unnormalised: log Z = LOG_Z
    return -0.5 * (x[0] - 1.0) ** 2 - 2.0 * (x[1] + 1.0) ** 2


def skewed_target(x):  # not in any family: the draws matter
    return -0.5 * jnp.sum(x**2) + jnp.sum(jnp.log(jax.nn.sigmoid(3.0 * x)))


def exponential_target(x):  # Exponential(2) times a non-exponential factor
    return -2.0 * x - 0.3 * jnp.sqrt(x)


#: The diagnostics and the check's shift: means and variances over q's draws, whose last bits depend on how
#: XLA fuses their sums. With the tests' compile flags (tests/conftest.py: XLA:CPU's
#: fusion emitters off) the program with a callback fuses them differently (``kl`` and
#: ``kl_stderr`` moved by one ulp); q, the status and everything the iteration gives
#: stay bit for bit, and with XLA's defaults the diagnostics do too.
ROUNDED = (
    "elbo",
    "log_evidence",
    "kl",
    "r_squared",
    "residual_variance",
    "reachable_variance",
    "khat",
    "elbo_stderr",
    "kl_stderr",
    "log_evidence_stderr",
    "r_squared_stderr",
    "fixed_point_shift",  # a variance over the check's draws
)


def assert_identical(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for name in a._fields:
        for u, v in zip(
            jax.tree_util.tree_leaves(getattr(a, name)),
            jax.tree_util.tree_leaves(getattr(b, name)),
            strict=True,
        ):
            if name in ROUNDED:
                np.testing.assert_allclose(u, v, rtol=1e-12, atol=0)
            else:
                assert np.array_equal(np.asarray(u), np.asarray(v), equal_nan=True), name


def report_steps(text):
    return [int(m) for m in re.findall(r"jaxvb\.fit step +(\d+)/", text)]


@pytest.mark.slow
def test_prints_every_k_steps_and_the_last_and_the_result_is_the_same(capsys):
    """Algorithm 2 with the per-step trace: printed every 10 steps and at the last, and
    the result bit for bit that of the fit without reports."""
    on = jaxvb.fit(skewed_target, Q0, KEY, num_steps=25, progress=10, trace=True)
    jax.effects_barrier()
    err = capsys.readouterr().err
    assert report_steps(err) == [10, 20, 25]
    line = err.splitlines()[0]
    assert re.fullmatch(r"jaxvb\.fit step 10/25  ELBO \S+ ± \S+  R\^2 \S+", line), line
    assert_identical(on, jaxvb.fit(skewed_target, Q0, KEY, num_steps=25, trace=True))


@pytest.mark.slow
def test_result_is_bit_for_bit_the_same():
    """Algorithm 1 with two draws a step, reported to a callable (about ten times)."""
    q0 = jaxvb.Exponential(1.0)
    off = jaxvb.fit(exponential_target, q0, KEY, num_steps=40, num_draws=2)
    seen = []
    on = jaxvb.fit(
        exponential_target, q0, KEY, num_steps=40, num_draws=2, progress=seen.append
    )
    jax.effects_barrier()
    assert len(seen) == 10
    assert_identical(on, off)


def test_off_by_default_and_no_callback_in_the_compiled_loop():
    def program(progress):
        return str(
            jax.make_jaxpr(
                lambda k: jaxvb.fit(skewed_target, Q0, k, num_steps=20, progress=progress)
            )(KEY)
        )

    assert "debug_callback" not in program(None)
    assert "debug_callback" in program(5)


@pytest.mark.slow
def test_callable_gets_records_under_jit_with_honest_estimates():
    seen = []
    run = jax.jit(
        lambda k: jaxvb.fit(gaussian_target, Q0, k, num_steps=200, progress=seen.append)
    )
    res = run(KEY)
    jax.effects_barrier()
    assert [info.step for info in seen] == list(range(20, 201, 20))  # about ten
    for info in seen:
        assert isinstance(info, jaxvb.ProgressInfo) and info.num_steps == 200
        assert info.elbo.shape == info.r_squared.shape == info.status.shape == ()
        assert int(info.status) == 0
    # The target is Gaussian: the iterates approach it, the ELBO rises to log Z (a
    # lower bound, up to Monte Carlo error) and R^2 to 1.
    last = seen[-1]
    assert float(last.elbo) <= LOG_Z + 4 * float(last.elbo_stderr)
    assert abs(float(last.elbo) - LOG_Z) < 0.05
    assert float(last.r_squared) > 0.98
    assert float(seen[0].elbo) < float(last.elbo)
    assert_identical(res, jaxvb.fit(gaussian_target, Q0, KEY, num_steps=200))


@pytest.mark.slow
def test_a_callback_that_raises_is_a_warning_and_the_fit_is_kept():
    """An exception in the callback reached XLA as an INTERNAL
    error and the fit was lost."""

    def broken(info):
        raise KeyError("oops")

    with pytest.warns(RuntimeWarning, match=r"callback 'broken' raised KeyError"):
        res = jaxvb.fit(gaussian_target, Q0, KEY, num_steps=200, progress=broken)
        jax.effects_barrier()
    assert_identical(res, jaxvb.fit(gaussian_target, Q0, KEY, num_steps=200))


@pytest.mark.slow
def test_vmap_reports_once_per_step_with_batch_arrays():
    keys = jax.random.split(KEY, 3)
    seen = []
    progress = jaxvb.Progress(every=15, callback=seen.append, num_draws=20)
    on = jax.vmap(
        lambda k: jaxvb.fit(skewed_target, Q0, k, num_steps=30, progress=progress)
    )(keys)
    jax.effects_barrier()
    assert [info.step for info in seen] == [15, 30]
    assert all(info.elbo.shape == info.r_squared.shape == (3,) for info in seen)
    off = jax.vmap(lambda k: jaxvb.fit(skewed_target, Q0, k, num_steps=30))(keys)
    assert_identical(on, off)


def test_printed_line_summarises_a_batch(capsys):
    info = jaxvb.ProgressInfo(
        step=20,
        num_steps=200,
        elbo=np.array([-3.0, -1.0, -2.0, -5.0]),
        elbo_stderr=np.full(4, 0.1),
        r_squared=np.array([0.9, 0.99, 0.95, 0.97]),
        status=np.array([0, 1, 0, 0]),
    )
    _progress._print_line(info)
    assert capsys.readouterr().err == (
        "jaxvb.fit step  20/200  4 fits  ELBO median -2.5 (min -5, max -1)  "
        "R^2 median 0.9600 (min 0.9000)  1 flagged\n"
    )


@pytest.mark.parametrize("bad", [0, -3])
def test_nonpositive_k_is_an_error(bad):
    with pytest.raises(ValueError, match="progress must be a number of steps >= 1"):
        jaxvb.fit(skewed_target, Q0, KEY, num_steps=20, progress=bad)


@pytest.mark.parametrize("bad", [2.5, "10", True, [10]])
def test_non_int_is_an_error(bad):
    with pytest.raises(TypeError, match="progress must be None, a number of steps"):
        jaxvb.fit(skewed_target, Q0, KEY, num_steps=20, progress=bad)


def test_bad_progress_settings_are_errors():
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        jaxvb.Progress(every=0)
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        jaxvb.Progress(every=1.5)
    with pytest.raises(ValueError, match="num_draws must be an integer >= 2"):
        jaxvb.Progress(every=5, num_draws=1)
    with pytest.raises(TypeError, match="callback must be callable"):
        jaxvb.Progress(every=5, callback="stderr")
