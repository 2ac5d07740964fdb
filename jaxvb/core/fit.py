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
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb import _platform, _static, diagnostics
from jaxvb._algebra import where_tree
from jaxvb._platform import after, jit_fast
from jaxvb.core import convergence, kernel
from jaxvb.core import progress as _progress
from jaxvb.core.result import Result, Trace
from jaxvb.core.start import _laplace, default_tol, near_mode, raise_for, working_dtype
from jaxvb.core.status import START_SCALE, Status, check, fit_status
from jaxvb.core.validate import check_key, check_log_joint, validate
from jaxvb.families._base import ExponentialFamily, Family, is_concrete
from jaxvb.families.gaussian import Gaussian
from jaxvb.methods import Method, resolve
from jaxvb.structure import Factors


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
    check_key(key)
    laplace_failed = None
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
            log_joint, q0, ok = start(x0)
            laplace_failed = ~ok
        else:
            x0 = x0.astype(jnp.result_type(x0.dtype, float))
            out = check_log_joint(log_joint, jax.ShapeDtypeStruct(x0.shape, x0.dtype))
            checked = True  # the Laplace Gaussian has x0's shape and dtype
            if laplace_tol is None:
                laplace_tol = default_tol(working_dtype(x0.dtype, out))
            q0, info = _laplace(log_joint, x0, laplace_tol, max_iter=200)
            # a search stalled by log p's rounding within 0.01 sd of the mode is a
            # good enough start
            laplace_failed = ~near_mode(info)
            if on_failure == "raise" and is_concrete(laplace_failed) and laplace_failed:
                raise_for(info, q0, laplace_tol, log_joint)  # names the cause
    m, step_size = validate(q0, key, fit_options)
    if not checked:
        check_log_joint(log_joint, q0)
    args, kwargs = _fit_arguments(
        log_joint, q0, key, **dict(fit_options, method=m, step_size=step_size)
    )
    result = _fit(*args, **kwargs)
    if laplace_failed is not None:
        # int32 on both sides, as the status is (no promotion to int64 under x64)
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
):
    """``(args, kwargs)`` of ``_fit``: the arrays it traces and the static settings
    that key its compiled program."""
    m = resolve(method, q0)
    if step_size is None:
        step_size = 1.0 / math.sqrt(num_steps)
    if num_check_draws is None:
        per_step = num_draws * (2 if antithetic else 1)
        num_check_draws = convergence.default_draws(q0, num_steps, per_step, num_eval_draws)
    # Half the check's draws must solve the method's statistics, with room to spare.
    if num_check_draws < 4 * m.min_draws(q0):
        num_check_draws = 0
    arrays, static = _static.partition(log_joint)
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
    target = _Target.build(_static.combine(arrays, log_joint), q0, key)
    settings = dict(
        num_steps=num_steps,
        num_draws=num_draws,
        antithetic=antithetic,
        max_backtracks=max_backtracks,
        num_check_draws=num_check_draws,
        trace=trace,
        progress=progress,
    )
    state, rec, check, infos = _iterate(target, q0, w, method, **settings)
    dtype = q0.dtype
    shift = noise = jnp.full((), jnp.nan, dtype)
    if check is not None:
        q, good = check.q, check.good
        shift, noise = convergence.distances(check, method, target.log_joint)
    else:
        q, good = kernel.finalize(state, method, target.log_joint)

    # The diagnostics after the check's distances, not beside them: two loops of
    # factorisations at once on XLA:CPU's thread pool run slower than one after the
    # other (and can hang: _platform.after)
    diag = diagnostics.evaluate(
        target.key_eval,
        after(q, shift) if check is not None else q,
        target.centred,
        num_eval_draws,
        chunk_size=convergence.chunk_size(convergence.size(q)),
        start=_wide_start(q0),
    )
    offset = target.offset
    diag = diag._replace(elbo=diag.elbo + offset, log_evidence=diag.log_evidence + offset)
    status = fit_status(rec.status, good, shift, noise, diag, num_eval_draws)
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
        khat_sd=jnp.full((), jnp.nan, dtype),
        status=status,
        first_improper_step=rec.first_improper_step,
        last_improper_step=rec.last_improper_step,
        num_damped_steps=rec.num_damped_steps,
        first_nonfinite_step=rec.first_nonfinite_step,
        nonfinite_draw=rec.nonfinite_draw,
        fixed_point_shift=shift,
        trace=infos,
    )


class _Target(NamedTuple):
    """The log joint as the iteration, the progress reports and the diagnostics see
    it, with the keys the fit's parts draw from."""

    log_joint: Any  # what the methods regress on: shifted by ``offset`` where plain
    log_p: Callable  # log p itself, in q0's dtype (the progress reports')
    centred: Any  # log p - offset, for the diagnostics
    offset: jax.Array
    key_batch: jax.Array | None
    key_init: jax.Array
    key_fit: jax.Array
    key_eval: jax.Array
    key_progress: jax.Array

    @classmethod
    def build(cls, log_joint, q0, key) -> _Target:
        unshifted = log_joint
        dtype = q0.dtype

        def log_p(x):
            return jnp.asarray(unshifted(x)).astype(dtype)

        key_batch = None
        # A log joint with batch(key, step): jaxvb.Minibatch, or jaxvb.numpyro's.
        if callable(getattr(log_joint, "batch", None)):
            key, key_batch = jax.random.split(key)
        key_init, key_fit, key_eval = jax.random.split(key, 3)
        key_progress = jax.random.fold_in(key_eval, 2)  # never used by the iteration
        # log p is regressed on (and its variance taken) after subtracting a fixed
        # offset, log p at one draw of q0: a log joint of -1e6 + O(1) otherwise loses
        # its O(1) variation to cancellation against the intercept in float32. A
        # constant shift of log p changes no statistic in exact arithmetic; the
        # diagnostics add it back to the ELBO and the evidence.
        offset = _offset(jax.random.fold_in(key_init, 1), q0, log_p)
        centred = _Centred(unshifted, offset, dtype)
        if _plain(log_joint):
            log_joint = _Shifted(log_joint, offset)
        return cls(
            log_joint,
            log_p,
            centred,
            offset,
            key_batch,
            key_init,
            key_fit,
            key_eval,
            key_progress,
        )


def _iterate(
    target: _Target,
    q0,
    w,
    method,
    *,
    num_steps,
    num_draws,
    antithetic,
    max_backtracks,
    num_check_draws,
    trace,
    progress,
):
    """One ``lax.scan`` of the kernel's steps, then of the convergence check's:
    ``(state, record, check, trace)``; ``check`` is ``None`` without the check."""
    log_joint, dtype = target.log_joint, q0.dtype
    state0 = kernel.init(target.key_init, q0, log_joint, method)
    rec0 = kernel.start_record(q0)
    # Did the iteration settle? One more update from fresh draws of q must give q back
    # (up to its noise): the check's draws run as extra steps of the same scan.
    per_step = num_draws * (2 if antithetic else 1)
    num_check_steps = convergence.num_steps_for(num_check_draws, per_step)
    checking_on = num_check_steps > 0
    # Every step's draw keys, the check's steps included, split before the loop (the
    # same keys as splitting each step's key inside it, where each split is a chain of
    # small runtime steps). A split's first n keys do not depend on how many follow, so
    # the iteration's keys are those of a fit without the check; one split, not two:
    # each is a program to compile.
    keys = jax.vmap(lambda k: jax.random.split(k, num_draws))(
        jax.random.split(target.key_fit, num_steps + num_check_steps)
    )
    check0 = convergence.init(q0, state0.stats, num_check_steps, per_step)

    def iterate(state, rec, check, draws, t, batch):
        state, info = kernel.update(
            state,
            draws,
            t,
            batch,
            method,
            step_size=w,
            average_from=num_steps / 2,
            max_backtracks=max_backtracks,
        )
        rec = kernel.record(rec, info, t)
        if progress is not None:
            _progress.report(
                progress,
                target.key_progress,
                t,
                num_steps,
                state.q,
                target.log_p,
                rec.status,
            )
        if checking_on:
            check = convergence.settle(check, state, t, num_steps, method, log_joint)
        if not trace:
            return state, rec, check, None
        trace_t = Trace(state.q.natural_params, info.log_density, info.proper)
        return state, rec, check, trace_t

    def accumulate(state, rec, check, draws, t, batch):
        del batch
        check = convergence.accumulate(check, draws, t, num_steps)
        if not trace:
            return state, rec, check, None
        nan = jnp.full((), jnp.nan, dtype)
        return state, rec, check, Trace(state.q.natural_params, nan, jnp.ones((), bool))

    def body(carry, inputs):
        state, rec, check = carry
        keys_t, t = inputs
        # this step's unbiased minibatch estimate of log p, or log p itself
        batch = (
            log_joint if target.key_batch is None else log_joint.batch(target.key_batch, t)
        )
        if checking_on:
            checking = t > num_steps
            q_draw = where_tree(checking, check.q, state.q)
        else:
            q_draw = state.q
        draws = kernel.draw(keys_t, q_draw, batch, method, antithetic)
        args = (state, rec, check, draws, t, batch)  # the batch stays a closure
        if checking_on:
            *carry, trace_t = jax.lax.cond(
                checking, lambda: accumulate(*args), lambda: iterate(*args)
            )
        else:
            *carry, trace_t = iterate(*args)
        return tuple(carry), trace_t

    steps = jnp.arange(1, num_steps + num_check_steps + 1, dtype=jnp.int32)
    (state, rec, check), infos = jax.lax.scan(body, (state0, rec0, check0), (keys, steps))
    if trace:
        infos = jax.tree_util.tree_map(lambda v: v[:num_steps], infos)
    return state, rec, (check if checking_on else None), infos


__all__ = ["fit"]
