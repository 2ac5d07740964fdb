"""``fit``: checks, the start, one compiled scan of the kernel, diagnostics, ``check``.

Algorithm 1 of the paper, written once over pytrees of regression statistics:

    stats <- init(q0)
    for t in 1..N:                          # one lax.scan, fixed step w = 1/sqrt(N)
        s^    <- estimate(draw from q_t)    # unbiased, from one or a few draws
        stats <- (1 - w) stats + w s^
        q_t+1 <- solve(stats)
        if t > N/2: average s^              # the second half, on the statistics
    q <- solve(average)

The steps are :mod:`jaxvb.kernel`'s; the method (:mod:`jaxvb.methods`) decides which
statistics and how they are estimated. ``fit`` names no family and no method.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb import _platform, _static, diagnostics
from jaxvb._algebra import finite_rows, masked_sum, where_tree
from jaxvb._platform import after, draws_in_sequence, jit_fast, outside_traces
from jaxvb.core import kernel
from jaxvb.core import progress as _progress
from jaxvb.core._indices import out_of_bounds_reads
from jaxvb.core.result import Result, Trace
from jaxvb.core.start import _laplace, default_tol, near_mode, raise_for, working_dtype
from jaxvb.core.status import START_SCALE, Status, check, fit_status
from jaxvb.families._base import ExponentialFamily, Family, is_concrete
from jaxvb.families.gaussian import Gaussian
from jaxvb.methods import Method, resolve
from jaxvb.structure import Factors


@_static.memo_by_signature
def _check_log_joint(log_joint, q0):
    """``q0`` is a family or the ShapeDtypeStruct of a starting point (a trace of
    ``log_joint``: kept per model structure and shapes)."""
    if isinstance(q0, jax.ShapeDtypeStruct):
        x, what = q0, f"the starting point x0 of shape {q0.shape}"
    else:
        x = jax.ShapeDtypeStruct(q0.event_shape, q0.dtype)
        what = f"q0 = {type(q0).__name__} with event shape {q0.event_shape}"
    try:
        closed, out = jax.make_jaxpr(log_joint, return_shape=True)(x)
    except Exception as e:
        raise ValueError(
            f"log_joint failed on a draw of shape {x.shape} ({x.dtype}) from {what}: {e}. "
            "Does q0 have the dimension log_joint expects?"
        ) from e
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(f"log_joint must return one array, got {type(out).__name__}")
    reads = out_of_bounds_reads(closed)
    if reads:
        raise ValueError(
            f"log_joint reads outside an array at a draw of shape {x.shape} from {what}: "
            f"{'; '.join(reads[:3])}. JAX clamps such an index (x[1] of a one-element x "
            "reads x[0]) instead of raising, so the fit would be of another model. Does "
            "q0 have the dimension log_joint expects?"
        )
    if out.shape != ():
        raise ValueError(
            f"log_joint must return a scalar, got shape {out.shape}. Sum the terms of the "
            "log density (e.g. jnp.sum(...)), and check that q0 has the model's dimension."
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"log_joint must return a floating-point scalar, got dtype {out.dtype}. "
            "Return the log density itself, not a count or a boolean."
        )
    return out.dtype


def _check_key(key) -> None:
    """A JAX random key: a typed key (``jax.random.key``) or a raw ``uint32[2]`` one
    (``jax.random.PRNGKey``)."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if key.shape == ():
            return
    elif dtype == jnp.uint32 and getattr(key, "shape", None) == (2,):
        return
    raise TypeError(
        "key must be one JAX random key, jax.random.key(seed), got "
        + (
            f"an array of dtype {dtype} and shape {key.shape}"
            if dtype is not None
            else type(key).__name__
        )
        + ". Under jax.vmap, map over jax.random.split(key, n)."
    )


def fit(
    log_joint: Callable[[jax.Array], jax.Array],
    q0: Family | jax.Array,
    key: jax.Array,
    *,
    num_steps: int,
    method: str | Method | None = None,
    step_size: float | None = None,
    num_draws: int = 1,
    antithetic: bool = False,
    max_backtracks: int = 8,
    num_eval_draws: int = 1000,
    num_check_draws: int | None = None,
    trace: bool = False,
    progress: int | Callable | _progress.Progress | None = None,
    on_failure: str = "raise",
    laplace_tol: float | None = None,
) -> Result:
    r"""Fits ``q`` to the posterior ``p(x) ∝ exp(log_joint(x))`` by stochastic linear regression.

    Runs Algorithm 1 of Salimans & Knowles (2013) -- or another method of
    :mod:`jaxvb.methods` -- as one ``lax.scan`` with a fixed step ``w = 1/sqrt(N)``,
    averages the statistics over the second half of the steps and solves them once more.
    Pure and traceable: ``jit`` and ``vmap`` over data and keys work, and the same key
    gives the same result bit for bit.

    ``fit`` is checks, the start, the method (:func:`jaxvb.methods.resolve`), one
    compiled ``lax.scan`` of :func:`jaxvb.kernel.step`, :func:`jaxvb.kernel.finalize`,
    the diagnostics and :func:`jaxvb.check`. The compiled program is reused for every
    call with the same static settings and the same ``log_joint`` -- the same function
    object, or, for a ``log_joint`` that is a pytree such as
    ``jax.tree_util.Partial(fn, data)``, the same ``fn`` with data of the same shapes.

    Args:
      log_joint: unnormalised log posterior, ``x -> scalar``, for ``x`` of shape
        ``q0.event_shape``; written with ``jax.numpy``. A :class:`jaxvb.Factors`
        (factor structure, for ``method="sites"``) or a :class:`jaxvb.Minibatch` (a new
        random minibatch of the data at every step, section 5.5) is also a log joint.
      q0: the starting approximation; fixes the family of the result. A plain point
        ``x0`` (an array of shape ``(d,)``) starts from the Laplace approximation there
        (:func:`jaxvb.laplace`) and fits a Gaussian; a log joint with a ``start(x0)``
        method (a :class:`jaxvb.LatentGaussian`, ``x0`` its hyperparameters) builds its
        own start and family.
      key: a JAX random key, the only source of randomness.
      num_steps: ``N``, the number of iterations.
      method: ``"hessian"`` (Algorithm 2; the default for a Gaussian), ``"regression"``
        (Algorithm 1; the default for the other families), ``"mixture"`` (section
        6.2; the default for a :class:`jaxvb.GaussianMixture`), ``"gradient"`` (sections 5.2
        and 5.4), ``"sites"`` (factor structure, section 5.1, for a
        :class:`jaxvb.Factors`), or a
        :class:`~jaxvb.methods.Method` such as ``jaxvb.methods.regression(estimator=...)``.
      step_size: ``w``; default ``1/sqrt(num_steps)``.
      num_draws: draws per step, vmapped; the estimates are averaged.
      antithetic: add the antithetic partner of each draw (``2 * num_draws`` per step).
      max_backtracks: step control. An update that is not a proper distribution (e.g.
        a precision that is not positive definite) is retried with half the step, up
        to this many times, before the step is flagged and skipped; so is one outside
        the method's trust region (:func:`jaxvb.methods.trust_region`), which is then
        taken at the smallest step. Only the running
        statistics are damped; the second-half average is untouched. ``0`` gives the
        paper's plain iteration.
      num_eval_draws: draws of the fitted ``q`` for the diagnostics (evaluated in
        chunks of 100, fewer for a long ``x``: one at ``d = 10^6``; memory does not
        grow with it).
      num_check_draws: draws for the convergence check (one more update from fresh
        draws must give ``q`` back; :attr:`Status.NOT_CONVERGED`), rounded up to a
        whole number of steps: they are drawn as extra steps of the iteration's own
        loop, ``num_draws`` (times two if ``antithetic``) at a time, and kept to the
        end for the distances (evaluated in chunks). Default ``min(num_eval_draws,
        200)``, fewer for a short fit (at most a quarter of the iteration's draws, at
        least 32: 62 for 250 steps of one draw, whose check would otherwise cost 80%
        of the iteration) and for a long ``x`` (at most ~4 million values held, at
        least 16 draws: 16 at ``d = 10^6``); ``0`` skips the check, as does a number
        below four times the draws the method needs to solve (Algorithm 1 with a large
        Gaussian).
      trace: also return per-step :class:`Trace` information.
      progress: report the progress of a long fit from inside the compiled loop (off by
        default): an int ``k`` prints the step and the current ELBO and R^2 estimates
        to standard error every ``k`` steps and after the last; a callable is given a
        :class:`jaxvb.ProgressInfo` about ten times; a :class:`jaxvb.Progress` says
        how often, to what and from how many draws. The result is the same bit for
        bit with or without it.
      on_failure: what a flagged result does when ``fit`` runs outside ``jit``/``vmap``:
        ``"raise"`` (a :class:`FitError` carrying the result; warnings for milder
        flags), ``"warn"`` or ``"ignore"``. Under ``jit``/``vmap`` only the status flags.
      laplace_tol: the Laplace start's ``tol`` (from a point ``x0``; see
        :func:`jaxvb.laplace`); ``None``: by the coarser of ``x0``'s dtype and the
        dtype ``log_joint`` returns (1e-3 for float32, 1e-6 for float64).

    Returns:
      :class:`Result` with ``.q``, ``.elbo``, ``.log_evidence``, ``.kl``, ``.r_squared``
      and ``.status``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: 3.0 * jnp.log(x[0]) - 2.0 * x[0]   # Gamma(4, 2)
      >>> res = jaxvb.fit(log_joint, jaxvb.Gamma(jnp.ones(1), jnp.ones(1)),
      ...                 jax.random.key(0), num_steps=50)
      >>> [round(float(v), 6) for v in (res.q.concentration[0], res.q.rate[0])]
      [4.0, 2.0]
    """
    _platform.guard_maps()
    if on_failure not in ("raise", "warn", "ignore"):
        raise ValueError(
            f"on_failure must be 'raise', 'warn' or 'ignore', got {on_failure!r}"
        )
    _check_key(key)
    laplace_failed = None
    prefetch = None  # the fit's program compiling beside the start
    fit_options = dict(
        method=method,
        num_steps=num_steps,
        num_draws=num_draws,
        antithetic=antithetic,
        max_backtracks=max_backtracks,
        num_eval_draws=num_eval_draws,
        num_check_draws=num_check_draws,
        step_size=step_size,
        trace=trace,
        progress=progress,
    )
    checked = False  # log_joint traced and checked at q0's shape already
    if isinstance(q0, (jax.Array, np.ndarray, list, tuple)):
        x0 = jnp.asarray(q0)
        if x0.ndim != 1:
            raise TypeError(
                f"q0 must be a jaxvb family or a starting point of shape (d,), got an "
                f"array of shape {x0.shape}"
            )
        if x0.shape[0] == 0:
            raise ValueError(
                "q0: the starting point has dimension 0; there is nothing to fit"
            )
        start = getattr(log_joint, "start", None)
        if callable(start):  # a structured model builds its own start
            prefetch = _prefetch(start, x0, None, key, fit_options)
            log_joint, q0, ok = start(x0)
            laplace_failed = ~ok
        else:
            x0 = x0.astype(jnp.result_type(x0.dtype, float))
            out = _check_log_joint(log_joint, jax.ShapeDtypeStruct(x0.shape, x0.dtype))
            checked = True  # the Laplace Gaussian has x0's shape and dtype
            if laplace_tol is None:
                laplace_tol = default_tol(working_dtype(x0.dtype, out))
            prefetch = _prefetch(
                lambda x, tol=laplace_tol: _laplace(log_joint, x, tol, max_iter=200)[0],
                x0,
                log_joint,
                key,
                fit_options,
            )
            q0, info = _laplace(log_joint, x0, laplace_tol, max_iter=200)
            # a search stalled by log p's rounding within 0.01 sd of the mode is a
            # good enough start
            laplace_failed = ~near_mode(info)
            if on_failure == "raise" and is_concrete(laplace_failed) and laplace_failed:
                raise_for(info, q0, laplace_tol)  # names the cause
    if not isinstance(q0, Family):
        raise TypeError(
            f"q0 must be a jaxvb family such as jaxvb.Gaussian(mean, cov), or a starting "
            f"point x0, got {type(q0).__name__}"
        )
    if math.prod(q0.event_shape) == 0:
        raise ValueError(
            f"q0 = {type(q0).__name__} has event shape {q0.event_shape}, dimension 0; "
            "there is nothing to fit"
        )
    if jnp.dtype(q0.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise TypeError(
            f"q0 has dtype {jnp.dtype(q0.dtype).name}; jaxvb fits in float32 or float64 "
            "(float16 and bfloat16 lose the regression statistics to round-off). Build "
            "q0 from float32 or float64 arrays."
        )
    m = resolve(method, q0)
    if not isinstance(num_steps, (int, np.integer)) or num_steps < 2:
        raise ValueError(f"num_steps must be an integer >= 2, got {num_steps!r}")
    if not isinstance(max_backtracks, (int, np.integer)) or max_backtracks < 0:
        raise ValueError(f"max_backtracks must be an integer >= 0, got {max_backtracks!r}")
    if not isinstance(num_draws, (int, np.integer)) or num_draws < 1:
        raise ValueError(f"num_draws must be a positive integer, got {num_draws!r}")
    if not isinstance(num_eval_draws, (int, np.integer)) or num_eval_draws < 2:
        raise ValueError(
            "num_eval_draws (draws of q for the diagnostics) must be an integer >= 2: a "
            f"variance needs two draws; got {num_eval_draws!r}"
        )
    per_step = num_draws * (2 if antithetic else 1)
    averaged = (num_steps - num_steps // 2) * per_step
    needed = m.min_draws(q0)
    if averaged < needed:
        least = 2 * math.ceil(needed / per_step)
        raise ValueError(
            f"num_steps={num_steps} is too small for {m.name} on {type(q0).__name__}: the "
            f"average over the second half holds {averaged} draws, but solving for its "
            f"{needed} unknowns needs at least {needed}. Use num_steps >= {least} (the "
            "paper's 2(k + 1) with one draw per step), or more draws per step."
        )
    if antithetic:  # traced only: raises early where the family has no antithetic
        jax.eval_shape(lambda k: q0.antithetic(q0.noise(k)), key)
    if step_size is None:
        step_size = 1.0 / math.sqrt(num_steps)
    if is_concrete(step_size) and not 0.0 < float(step_size) <= 1.0:
        raise ValueError(f"step_size must lie in (0, 1], got {step_size}")
    if not checked:
        _check_log_joint(log_joint, q0)
    args, kwargs = _fit_arguments(
        log_joint, q0, key, **dict(fit_options, method=m, step_size=step_size)
    )
    if prefetch is not None:
        prefetch.join()  # its program is the one this call would compile
    result = _fit(*args, **kwargs)
    if laplace_failed is not None:
        # int32 on both sides: an eager int32 | int64 on arrays segfaults in jaxlib
        # 0.10.2 (x64 on), e.g. for a vmapped fit from batched start points.
        flag = jnp.where(laplace_failed, int(Status.LAPLACE_FAILED), 0).astype(jnp.int32)
        result = result._replace(status=result.status | flag)
    return check(result, on_failure, num_steps=num_steps, stacklevel=2)


def _fit_arguments(
    log_joint,
    q0,
    key,
    *,
    method,
    num_steps,
    num_draws,
    antithetic,
    max_backtracks,
    num_eval_draws,
    num_check_draws,
    step_size,
    trace,
    progress,
    abstract=False,
):
    """``(args, kwargs)`` of ``_fit``; ``abstract``: for a ``q0`` and ``log_joint`` of
    ``jax.ShapeDtypeStruct`` leaves (from ``jax.eval_shape``), to compile ahead."""
    m = resolve(method, q0)
    if step_size is None:
        step_size = 1.0 / math.sqrt(num_steps)
    if num_check_draws is None:
        # the check keeps its draws until the end: at most ~32 MB of them (a long
        # latent field, d ~ 10^6, gets 16 draws); and it costs at most a quarter of the
        # iteration's draws (each a step of the same loop), 32 at least
        per_step = num_draws * (2 if antithetic else 1)
        num_check_draws = min(
            num_eval_draws,
            200,
            max(16, _MAX_HELD // _size(q0)),
            max(_MIN_CHECK_DRAWS, num_steps * per_step // 4),
        )
    # Half the check's draws must solve the method's statistics, with room to spare.
    if num_check_draws < 4 * m.min_draws(q0):
        num_check_draws = 0
    arrays, static = _static.partition(log_joint, abstract=abstract)
    if abstract:
        w = jax.ShapeDtypeStruct((), q0.dtype)
    else:
        w = jnp.asarray(step_size, q0.dtype)
    kwargs = dict(
        log_joint=static,
        method=m,
        num_steps=int(num_steps),
        num_draws=int(num_draws),
        antithetic=bool(antithetic),
        max_backtracks=int(max_backtracks),
        num_eval_draws=int(num_eval_draws),
        num_check_draws=int(num_check_draws),
        trace=bool(trace),
        progress=_progress.resolve(progress, int(num_steps)),
    )
    return (arrays, q0, key, w), kwargs


def _would_run(q0, options) -> bool:
    """Whether ``fit``'s checks after the start pass for a ``q0`` of these shapes (a
    thread compiling for a call that then raises would outlive it)."""
    if not isinstance(q0, Family) or math.prod(q0.event_shape) == 0:
        return False
    if jnp.dtype(q0.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        return False
    num_steps, num_draws = options["num_steps"], options["num_draws"]
    if not isinstance(num_draws, (int, np.integer)) or num_draws < 1:
        return False
    if not isinstance(options["max_backtracks"], (int, np.integer)):
        return False
    per_step = num_draws * (2 if options["antithetic"] else 1)
    m = resolve(options["method"], q0)
    if (num_steps - num_steps // 2) * per_step < m.min_draws(q0):
        return False
    step_size = options["step_size"]
    return step_size is None or not is_concrete(step_size) or 0.0 < float(step_size) <= 1.0


def _prefetch(start, x0, log_joint, key, options):
    """The fit's program compiled in a thread while the start (``start(x0)``: the
    Laplace search, a model's own start) compiles and runs. Only the start's output
    shapes decide the program: they come from ``jax.eval_shape`` and the program is
    traced and lowered here, in the calling thread (a model's code, NumPyro's handler
    stack among it, is never traced in two threads at once); the thread runs XLA's
    compile alone, which does not hold the GIL, so on two cores the start's compile
    and run hide behind it. ``None`` where it does not apply (inside a trace, an
    abstract ``x0``, a call whose checks will raise); any error here leaves the call
    to compile, and report, as it would have."""
    if not outside_traces() or not is_concrete(x0) or not is_concrete(key):
        return None
    valid = (
        isinstance(options["num_steps"], (int, np.integer))
        and options["num_steps"] >= 2
        and isinstance(options["num_eval_draws"], (int, np.integer))
        and options["num_eval_draws"] >= 2
    )
    if not valid:
        return None
    done = _static.signature(
        log_joint if log_joint is not None else getattr(start, "__self__", start),
        x0,
        key,
        tuple(sorted(options.items())),
    )
    if done is not None and done in _PREFETCHED:
        return None  # compiled by an earlier call: its lowering alone costs ~10 ms
    try:
        if log_joint is None:  # the start returns (log_joint, q0, ok)
            model, q0, _ = jax.eval_shape(start, x0)
        else:
            model, q0 = log_joint, jax.eval_shape(start, x0)
        if not _would_run(q0, options):
            return None  # the call raises before it compiles
        args, kwargs = _fit_arguments(model, q0, key, **options, abstract=True)
        if log_joint is not None:
            args = (_static.partition(model)[0],) + args[1:]
        lowered = _fit.lower(*args, **kwargs)
    except Exception:  # noqa: BLE001 (the call compiles, and reports, itself)
        return None

    def work():
        try:
            lowered.compile()
        except Exception:  # noqa: BLE001
            pass

    thread = threading.Thread(target=work, name="jaxvb-compile", daemon=True)
    thread.start()
    if done is not None:
        if len(_PREFETCHED) >= 256:
            _PREFETCHED.clear()
        _PREFETCHED.add(done)
    return thread


#: Signatures of the calls whose program :func:`_prefetch` compiled.
_PREFETCHED: set = set()


#: Elements of draws held at once: by the check (its draws, to the end of the fit) and
#: by a chunk of the diagnostics or of the check's distances (their work arrays).
_MAX_HELD = 2**22
_MAX_CHUNK = 2**20
#: The fewest draws the convergence check takes by default (a short fit's: the check
#: costs at most a quarter of the iteration's draws otherwise).
_MIN_CHECK_DRAWS = 32


def _size(q) -> int:
    return max(1, math.prod(q.event_shape))


def _chunk_size(d: int) -> int:
    """Draws evaluated at once: 100, fewer for a long event (one at d ~ 10^6), so that
    memory stays bounded whatever the dimension."""
    return max(1, min(100, _MAX_CHUNK // max(1, d)))


def _wide_start(q0):
    """The start's draws for ``Status.MISSED_MASS``: ``q0`` with ``START_SCALE`` times
    its covariance where it is a dense Gaussian (formed from its precision: no
    ``O(d^3)`` inverse), ``q0`` itself for the other exponential families, and
    ``None`` (no check) for the rest: a mixture's evidence has wide draws of its own,
    and a structured ``q`` (a latent field's) would compile its sampler twice."""
    if type(q0) is Gaussian:
        return Gaussian.from_precision(q0.mean, q0.precision / START_SCALE)
    return q0 if isinstance(q0, ExponentialFamily) else None


def _offset(key, q0, log_p_fn) -> jax.Array:
    """``log p`` at one draw of ``q0`` (0 where that is not finite), held fixed."""
    value = log_p_fn(q0.sample(key))
    return jax.lax.stop_gradient(jnp.where(jnp.isfinite(value), value, 0.0))


def _plain(log_joint) -> bool:
    """Whether ``log_joint`` is a plain function of ``x`` (or a minibatch one) whose
    values the methods may see shifted; a model object that a method reads (a
    :class:`jaxvb.Factors`, a log joint with its own ``start``) keeps its values."""
    return not isinstance(log_joint, Factors) and not callable(
        getattr(log_joint, "start", None)
    )


class _Shifted:
    """``log_joint(x) - offset``; a minibatch log joint's estimates shifted alike."""

    def __init__(self, log_joint, offset):
        self.log_joint, self.offset = log_joint, offset
        if callable(getattr(log_joint, "batch", None)):
            self.batch = self._batch

    def __call__(self, x):
        return self.log_joint(x) - self.offset

    def _batch(self, key, step):
        estimate = self.log_joint.batch(key, step)
        return lambda x: estimate(x) - self.offset


class _Centred:
    """``log p(x) - offset`` in ``dtype``, for the diagnostics; with the model's
    ``log_joint_given`` where it has one (:meth:`jaxvb.LatentGaussian.log_joint_given`:
    the pairs of draws of :meth:`jaxvb.latent.LatentGaussianApproximation.paired_draws`
    share the prior's factorisation)."""

    def __init__(self, log_joint, offset, dtype):
        self.log_joint, self.offset, self.dtype = log_joint, offset, dtype
        if callable(getattr(log_joint, "log_joint_given", None)):
            self.log_joint_given = self._given

    def __call__(self, x):
        return jnp.asarray(self.log_joint(x)).astype(self.dtype) - self.offset

    def _given(self, theta, fs):
        values = self.log_joint.log_joint_given(theta, fs)
        return jnp.asarray(values).astype(self.dtype) - self.offset


class _Check(NamedTuple):
    """The convergence check's part of the scan's carry.

    ``q``/``good``: the fit's result (:func:`kernel.finalize` at the last step), whose
    draws the check steps use; ``sums``/``counts``: their statistics summed for the two
    halves of the check (leading axis 2); ``x``: the draws, one row per check step.
    """

    q: Any
    good: jax.Array
    sums: Any
    counts: jax.Array
    x: Any


def _check_distances(check: _Check, method: Method, log_joint):
    """``(shift, noise)`` from the check steps' statistics.

    At a solution the regression of the paper returns ``q`` itself, so the update from
    draws of a converged ``q`` differs from it by Monte Carlo noise only. ``shift`` is
    KL(q || update) and ``noise`` KL(update_1 || update_2) between the updates of the
    two halves of the draws (about four times the noise of ``shift``), both to second
    order, ``Var_q[log a - log b] / 2`` on the check's own draws of ``q`` (a second set
    of draws would cost another random-number program to compile): unlike the natural
    parameters, ``log_prob`` stays accurate for ill-conditioned Gaussians.
    """
    q, dtype = check.q, check.q.dtype
    tree = jax.tree_util.tree_map

    def update(total, n):
        mean = tree(lambda v: v / jnp.maximum(n, 1.0).astype(dtype), total)
        return method.solve(mean, q, log_joint)

    # The three updates (all draws, each half) in one vmapped solve, and the log
    # densities of q and of them in one vmapped log_prob: each traced once, not three
    # and four times (a structured q's solve and log_prob are much of what the check
    # compiles: a latent field's banded factorisations)
    both = tree(lambda v: jnp.stack([v[0] + v[1], v[0], v[1]]), check.sums)
    counts = jnp.stack([check.counts[0] + check.counts[1], *check.counts])
    updates = jax.vmap(update)(both, counts)
    qs = tree(lambda a, b: jnp.concatenate([a[None], b]), q, updates)
    x = check.x.reshape(-1, *check.x.shape[2:])
    if draws_in_sequence(q):  # one factorisation after another (a latent field's)
        log_probs = jax.lax.map(lambda xi: jax.lax.map(lambda one: one.log_prob(xi), qs), x)
    else:
        log_probs = jax.lax.map(
            lambda xi: jax.vmap(lambda one: one.log_prob(xi))(qs),
            x,
            batch_size=_chunk_size(x.shape[-1]),
        )  # (num_draws, 4): q, the update, the halves' updates
    # after the densities: both factor the four (_platform.after)
    proper = jax.vmap(lambda one: one.is_proper)(after(qs, log_probs))

    def distance(i, j):
        value = 0.5 * jnp.var(log_probs[:, i] - log_probs[:, j])
        ok = proper[i] & proper[j] & jnp.isfinite(value)
        return jnp.where(ok, value, jnp.inf)

    return distance(0, 1), distance(2, 3)


@partial(
    jit_fast,
    static_argnames=(
        "log_joint",
        "method",
        "num_steps",
        "num_draws",
        "antithetic",
        "max_backtracks",
        "num_eval_draws",
        "num_check_draws",
        "trace",
        "progress",
    ),
)
def _fit(
    arrays,
    q0,
    key,
    w,
    *,
    log_joint,
    method,
    num_steps,
    num_draws,
    antithetic,
    max_backtracks,
    num_eval_draws,
    num_check_draws,
    trace,
    progress,
):
    log_joint = _static.combine(arrays, log_joint)
    unshifted = log_joint  # log_p_fn's, the progress reports' and the diagnostics'
    dtype = q0.dtype

    def log_p_fn(x):
        return jnp.asarray(unshifted(x)).astype(dtype)

    key_batch = None
    # A log joint with batch(key, step): jaxvb.Minibatch, or jaxvb.numpyro's.
    if callable(getattr(log_joint, "batch", None)):
        key, key_batch = jax.random.split(key)
    key_init, key_fit, key_eval = jax.random.split(key, 3)
    key_progress = jax.random.fold_in(key_eval, 2)  # never used by the iteration
    # log p is regressed on (and its variance taken) after subtracting a fixed offset,
    # log p at one draw of q0: a log joint of -1e6 + O(1) otherwise loses its O(1)
    # variation to cancellation against the intercept in float32 (issue 16,
    # reproducer 1). A constant shift of log p changes no statistic in exact
    # arithmetic; the diagnostics add it back to the ELBO and the evidence.
    offset = _offset(jax.random.fold_in(key_init, 1), q0, log_p_fn)

    log_p_centred = _Centred(unshifted, offset, dtype)

    if _plain(log_joint):
        log_joint = _Shifted(log_joint, offset)

    state0 = kernel.init(key_init, q0, log_joint, method)

    # Did the iteration settle? One more update from fresh draws of q must give q back
    # (up to its noise). The check's draws run as extra steps of the same scan, the
    # update swapped for a sum, so that the log joint's derivatives (most of the
    # program) are compiled once: a second traced estimate doubled the compile time.
    per_step = num_draws * (2 if antithetic else 1)
    num_check_steps = 2 * -(-(num_check_draws // 2) // per_step) if num_check_draws else 0
    checking_on = num_check_steps > 0
    zeros2 = jax.tree_util.tree_map(lambda v: jnp.zeros((2, *v.shape), dtype), state0.stats)
    # Every step's draw keys, the check's steps included, split before the loop (the
    # same keys as splitting each step's key inside it; inside, each split is a chain of
    # small runtime steps, ~5% of the 250-step SV fit on the CPU). A split's first n
    # keys do not depend on how many follow, so the iteration's keys are those of a fit
    # without the check; one split, not two: each is a program to compile.
    keys = jax.vmap(lambda k: jax.random.split(k, num_draws))(
        jax.random.split(key_fit, num_steps + num_check_steps)
    )
    # the check's draws, per step (as the kernel keeps its non-finite draw: q's points)
    x0 = jnp.zeros((num_check_steps, per_step, *q0.event_shape), dtype)
    check0 = _Check(q0, jnp.zeros((), bool), zeros2, jnp.zeros((2,), dtype), x0)

    def iterate(state, check, draws, t, target):
        state, info = kernel._advance(
            state,
            draws,
            t,
            target,
            method,
            step_size=w,
            average_from=num_steps / 2,
            max_backtracks=max_backtracks,
        )
        if progress is not None:
            _progress.report(
                progress, key_progress, t, num_steps, state.q, log_p_fn, state.status
            )
        if checking_on:  # the result, once, at the last step: the check draws from it
            q, good = jax.lax.cond(
                t == num_steps,
                lambda: kernel.finalize(state, method, log_joint),
                lambda: (check.q, check.good),
            )
            check = check._replace(q=q, good=good)
        if not trace:
            return state, check, None
        return state, check, Trace(state.q.natural_params, info.log_density, info.proper)

    def accumulate(state, check, draws, t, target):
        del target
        s_hat = draws[0]
        use = finite_rows(s_hat)
        half = (t - num_steps) % 2  # the two halves alternate
        add = masked_sum(s_hat, use)
        sums = jax.tree_util.tree_map(lambda a, v: a.at[half].add(v), check.sums, add)
        counts = check.counts.at[half].add(jnp.sum(use).astype(dtype))
        row = t - num_steps - 1
        xs = check.x.at[row].set(draws[1].astype(dtype))
        check = check._replace(sums=sums, counts=counts, x=xs)
        if not trace:
            return state, check, None
        nan = jnp.full((), jnp.nan, dtype)
        return state, check, Trace(state.q.natural_params, nan, jnp.ones((), bool))

    def body(carry, inputs):
        state, check = carry
        keys_t, t = inputs
        # this step's unbiased minibatch estimate of log p, or log p itself
        target = log_joint if key_batch is None else log_joint.batch(key_batch, t)
        if checking_on:
            checking = t > num_steps
            q_draw = where_tree(checking, check.q, state.q)
        else:
            q_draw = state.q
        draws = kernel._estimate(keys_t, q_draw, target, method, antithetic)
        args = (state, check, draws, t, target)  # the target stays a closure
        if checking_on:
            state, check, trace_t = jax.lax.cond(
                checking, lambda: accumulate(*args), lambda: iterate(*args)
            )
        else:
            state, check, trace_t = iterate(*args)
        return (state, check), trace_t

    steps = jnp.arange(1, num_steps + num_check_steps + 1, dtype=jnp.int32)
    (state, check), infos = jax.lax.scan(body, (state0, check0), (keys, steps))
    if trace:
        infos = jax.tree_util.tree_map(lambda v: v[:num_steps], infos)

    shift = jnp.full((), jnp.nan, dtype)
    if checking_on:
        q, good = check.q, check.good
    else:
        q, good = kernel.finalize(state, method, log_joint)
    noise = shift
    if checking_on:
        shift, noise = _check_distances(check, method, log_joint)

    # The diagnostics after the check's distances, not beside them: two loops of
    # factorisations at once on XLA:CPU's thread pool run slower than one after the
    # other (and can hang: _platform.after)
    diag = diagnostics.evaluate(
        key_eval,
        after(q, shift) if checking_on else q,
        log_p_centred,
        num_eval_draws,
        chunk_size=_chunk_size(_size(q)),
        start=_wide_start(q0),
    )
    diag = diag._replace(elbo=diag.elbo + offset, log_evidence=diag.log_evidence + offset)
    status = fit_status(state.status, good, shift, noise, diag, num_eval_draws)
    return Result(
        q=q,
        elbo=diag.elbo,
        log_evidence=diag.log_evidence,
        kl=diag.kl,
        r_squared=diag.r_squared,
        residual_variance=diag.residual_variance,
        elbo_stderr=diag.elbo_stderr,
        kl_stderr=diag.kl_stderr,
        log_evidence_stderr=diag.log_evidence_stderr,
        r_squared_stderr=diag.r_squared_stderr,
        reachable_variance=diag.reachable_variance,
        khat=diag.khat,
        status=status,
        first_improper_step=state.first_improper_step,
        last_improper_step=state.last_improper_step,
        num_damped_steps=state.num_damped_steps,
        first_nonfinite_step=state.first_nonfinite_step,
        nonfinite_draw=state.nonfinite_draw,
        fixed_point_shift=shift,
        trace=infos,
    )


__all__ = ["fit"]
