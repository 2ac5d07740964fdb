"""``fit``: the one stochastic-approximation loop shared by every method.

Algorithm 1 of the paper, written once over pytrees of regression statistics:

    stats <- init(q0)
    for t in 1..N:                          # one lax.scan, fixed step w = 1/sqrt(N)
        s^    <- estimate(draw from q_t)    # unbiased, from one or a few draws
        stats <- (1 - w) stats + w s^
        q_t+1 <- solve(stats)
        if t > N/2: average s^              # the second half, on the statistics
    q <- solve(average)

The method (``jaxvb.methods``) decides which statistics and how they are estimated.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb import _progress, diagnostics
from jaxvb._laplace import laplace
from jaxvb.families._base import ExponentialFamily, is_concrete
from jaxvb.families.gaussian import Gaussian
from jaxvb.families.mixture import GaussianMixture
from jaxvb.methods import Method, gradient, hessian, mixture, regression, sites


class Status(enum.IntFlag):
    """Bit flags in ``Result.status``; ``0`` means the fit went as planned.

    Example:
      >>> import jaxvb
      >>> status = jaxvb.Status(12)   # e.g. int(result.status)
      >>> [flag.name for flag in status]
      ['NONFINITE_LOG_DENSITY', 'NONFINITE_DIAGNOSTICS']
      >>> jaxvb.Status.NOT_CONVERGED in status, jaxvb.Status(0) == jaxvb.Status.OK
      (False, True)
    """

    OK = 0
    #: An intermediate update was not a proper distribution (the paper's "increase the
    #: number of iterations" case) even after ``max_backtracks`` halvings of the step;
    #: draws continued from the last proper iterate. Harmless in the first steps from a
    #: poor start; ``fit`` warns only when it happened in the averaged second half.
    IMPROPER_PROPOSAL = 1
    #: The averaged solution was not a proper distribution; ``q`` is the last proper
    #: iterate and should not be trusted.
    IMPROPER_RESULT = 2
    #: ``log_joint`` was NaN or infinite at a draw during the fit; that draw was left
    #: out of the statistics.
    NONFINITE_LOG_DENSITY = 4
    #: ``log_joint`` was NaN or infinite at some of the draws used for the diagnostics.
    NONFINITE_DIAGNOSTICS = 8
    #: Started from a point ``x0``: the Laplace approximation there was not proper (the
    #: Hessian at the mode is not negative definite) or its mode search did not converge.
    LAPLACE_FAILED = 16
    #: The fitted ``q`` is not a fixed point of the iteration: one more update from fresh
    #: draws of ``q`` is not a proper distribution, or moves ``q`` by more than 1 nat
    #: (KL) and by more than its Monte Carlo noise. The iteration had not settled when
    #: it stopped (typically a start far from the posterior); ``q`` should not be
    #: trusted.
    NOT_CONVERGED = 32


#: Flags that make a result untrustworthy (``Result.ok`` is False, ``fit`` raises).
ERRORS = (
    Status.IMPROPER_RESULT
    | Status.NONFINITE_LOG_DENSITY
    | Status.LAPLACE_FAILED
    | Status.NOT_CONVERGED
)


class Trace(NamedTuple):
    """Per-step information, stacked over steps (only with ``fit(..., trace=True)``).

    Attributes:
      natural_params: ``(num_steps, k)``, the natural parameters of ``q_{t+1}``.
      log_density: ``(num_steps,)``, the mean of ``log_joint`` over the step's draws.
      proper: ``(num_steps,)``, whether the step's update was a proper distribution.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: -0.5 * jnp.sum((x - 1.0) ** 2)
      >>> res = jaxvb.fit(log_joint, jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
      ...                 jax.random.key(0), num_steps=20, num_eval_draws=2, trace=True)
      >>> res.trace.natural_params.shape, res.trace.log_density.shape   # k = 2 + 3
      ((20, 5), (20,))
      >>> bool(res.trace.proper.all())
      True
    """

    natural_params: jax.Array
    log_density: jax.Array
    proper: jax.Array


class Result(NamedTuple):
    """What :func:`fit` returns: the approximation, its diagnostics and a status.

    Attributes:
      q: the fitted approximation, of the same family type as ``q0``.
      elbo, log_evidence, kl, r_squared, residual_variance, elbo_stderr: section 4's
        diagnostics (see :mod:`jaxvb.diagnostics`).
      status: ``int32`` bit flags, see :class:`Status`; ``0`` when all went well.
      first_improper_step, last_improper_step: the first and last steps whose update
        was improper (``-1`` if none).
      num_damped_steps: steps whose update was improper at the full step size (or
        outside the method's trust region, ``Method.step_ok``) and was taken with a
        smaller one (``fit``'s step control).
      first_nonfinite_step: the first step at which ``log_joint`` was not finite.
      nonfinite_draw: the draw ``x`` at that step (zeros if none).
      fixed_point_shift: how far (KL, nats, to second order) one more update from fresh
        draws of ``q`` moves it; ``inf`` where that update is not proper, ``nan`` where
        the check was not run (see :attr:`Status.NOT_CONVERGED`).
      trace: :class:`Trace` when asked for, else ``None``.

    Example:
      A Gaussian target, ``exp(-|x - 1|^2 / 8)``, whose normaliser is ``8 pi``:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: -0.5 * jnp.sum((x - 1.0) ** 2 / 4.0)
      >>> res = jaxvb.fit(log_joint, jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2)),
      ...                 jax.random.key(0), num_steps=20)
      >>> res.q.mean.round(6).tolist(), round(float(res.log_evidence), 6)   # log 8 pi
      ([1.0, 1.0], 3.224171)
      >>> round(float(res.r_squared), 6), int(res.status), bool(res.ok), res.message
      (1.0, 0, True, 'ok')
    """

    q: Any
    elbo: jax.Array
    log_evidence: jax.Array
    kl: jax.Array
    r_squared: jax.Array
    residual_variance: jax.Array
    elbo_stderr: jax.Array
    status: jax.Array
    first_improper_step: jax.Array
    last_improper_step: jax.Array
    num_damped_steps: jax.Array
    first_nonfinite_step: jax.Array
    nonfinite_draw: jax.Array
    fixed_point_shift: jax.Array
    trace: Trace | None

    @property
    def ok(self) -> jax.Array:
        """True where no error flag is set (``IMPROPER_PROPOSAL`` alone is not one)."""
        return (self.status & int(ERRORS)) == 0

    @property
    def message(self) -> str:
        """A readable account of the status flags (of a single, concrete result)."""
        return explain(self)


class FitError(RuntimeError):
    """A fit whose result cannot be trusted; the flagged result is in ``.result``.

    Example:
      A Gaussian puts mass where ``log x`` is NaN: the fit raises, and keeps its work.

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: jnp.log(x[0]) - x[0]   # Gamma(2, 1), x > 0
      >>> try:
      ...     jaxvb.fit(log_joint, jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1)),
      ...               jax.random.key(0), num_steps=20, num_eval_draws=2)
      ... except jaxvb.FitError as err:
      ...     print(err)
      ...     result = err.result
      jaxvb.fit: log_joint was not finite at x = [-0.49...] (first at step 3); ...
      >>> result.q.mean.shape, int(result.first_nonfinite_step)
      ((1,), 3)
    """

    def __init__(self, message: str, result: Result):
        super().__init__(message)
        self.result = result


class FitWarning(UserWarning):
    """A fit that finished but whose status has a flag worth knowing about.

    Example:
      An ordinary ``UserWarning`` subclass, so the ``warnings`` filters apply:

      >>> import warnings, jaxvb
      >>> issubclass(jaxvb.FitWarning, UserWarning)
      True
      >>> with warnings.catch_warnings():
      ...     warnings.simplefilter("error", jaxvb.FitWarning)   # make it an error
      ...     pass  # fits in here raise instead of warning
    """


def explain(result: Result) -> str:
    """Describes each flag of a concrete ``result.status``: what happened and what to do.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: jnp.log(x[0]) - x[0]   # Gamma(2, 1), x > 0
      >>> res = jaxvb.fit(log_joint, jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1)),
      ...                 jax.random.key(0), num_steps=20, num_eval_draws=2,
      ...                 on_failure="ignore")
      >>> print(jaxvb.explain(res))
      log_joint was not finite at x = [-0.49...] (first at step 3); such draws were left
      out. Make sure log_joint is finite on the whole support of the approximating family
      (e.g. use Gamma for a positive parameter, or transform it to the real line).
    """
    status = Status(int(np.asarray(result.status)))
    if status == Status.OK:
        return "ok"
    lines = []
    if Status.IMPROPER_RESULT in status:
        lines.append(
            "the averaged statistics do not define a proper distribution, so the fit has "
            "not converged; `q` is the last proper iterate. Increase num_steps (the paper's "
            "remedy), start closer to the posterior (fit(log_joint, x0, ...) with a "
            "point x0 starts from the Laplace approximation there), or use more draws "
            "per step. If it "
            "persists, check that the posterior is proper (integrable)."
        )
    if Status.IMPROPER_PROPOSAL in status:
        lines.append(
            "intermediate updates (steps "
            f"{int(result.first_improper_step)} to {int(result.last_improper_step)}) were "
            "not proper distributions (e.g. a negative rate or precision); draws continued "
            "from the last proper iterate. The result may still be fine (check r_squared); "
            "a larger num_steps makes this rarer."
        )
    if Status.NONFINITE_LOG_DENSITY in status:
        x = np.asarray(result.nonfinite_draw)
        lines.append(
            f"log_joint was not finite at x = {x.tolist()} (first at step "
            f"{int(result.first_nonfinite_step)}); such draws were left out. Make sure "
            "log_joint is finite on the whole support of the approximating family (e.g. "
            "use Gamma for a positive parameter, or transform it to the real line)."
        )
    if Status.LAPLACE_FAILED in status:
        lines.append(
            "the Laplace approximation at the starting point x0 was not proper or its mode "
            "search did not converge (see jaxvb.laplace); start from a jaxvb.Gaussian "
            "instead, or check that the posterior is proper."
        )
    if Status.NOT_CONVERGED in status:
        shift = float(np.asarray(result.fixed_point_shift))
        moved = (
            "is not a proper distribution"
            if not math.isfinite(shift)
            else f"moves it by {shift:.3g} nats (KL)"
        )
        lines.append(
            f"the fitted q is not a fixed point: one more update from fresh draws of q "
            f"{moved}, so the iteration had not settled when it stopped. Start from a "
            "point x0 (fit(log_joint, x0, ...) starts from the Laplace approximation "
            "there), or increase num_steps."
        )
    if Status.NONFINITE_DIAGNOSTICS in status:
        lines.append(
            "log_joint was not finite at some draws of the fitted q; the diagnostics "
            "leave them out. q puts mass where the model has none."
        )
    return "; ".join(lines)


class _State(NamedTuple):
    stats: Any
    sums: Any
    count: jax.Array
    q: Any
    status: jax.Array
    first_improper_step: jax.Array
    last_improper_step: jax.Array
    num_damped_steps: jax.Array
    first_nonfinite_step: jax.Array
    nonfinite_draw: jax.Array


_METHODS: dict[str, Callable[[], Method]] = {
    "regression": regression,
    "hessian": hessian,
    "gradient": gradient,
    "sites": sites,
    "mixture": mixture,
}


def _resolve_method(method, q0, log_joint) -> Method:
    if method is None:
        if isinstance(q0, GaussianMixture):
            m = mixture()
        else:
            m = hessian() if isinstance(q0, Gaussian) else regression()
    elif isinstance(method, Method):
        m = method
    elif isinstance(method, str):
        if method not in _METHODS:
            raise ValueError(f"unknown method {method!r}; choose from {sorted(_METHODS)}")
        m = _METHODS[method]()
    else:
        raise TypeError(f"method must be a name or a jaxvb.methods.Method, got {method!r}")
    return m if m.bind is None else m.bind(log_joint)


def _check_log_joint(log_joint, q0) -> None:
    """``q0`` is a family or the ShapeDtypeStruct of a starting point."""
    if isinstance(q0, jax.ShapeDtypeStruct):
        x, what = q0, f"the starting point x0 of shape {q0.shape}"
    else:
        x = jax.ShapeDtypeStruct(q0.event_shape, q0.dtype)
        what = f"q0 = {type(q0).__name__} with event shape {q0.event_shape}"
    try:
        out = jax.eval_shape(log_joint, x)
    except Exception as e:
        raise ValueError(
            f"log_joint failed on a draw of shape {x.shape} ({x.dtype}) from {what}: {e}. "
            "Does q0 have the dimension log_joint expects?"
        ) from e
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(f"log_joint must return one array, got {type(out).__name__}")
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


def fit(
    log_joint: Callable[[jax.Array], jax.Array],
    q0: ExponentialFamily | jax.Array,
    key: jax.Array,
    *,
    num_steps: int,
    method: str | Method | None = None,
    step_size: float | None = None,
    num_draws: int = 1,
    antithetic: bool = False,
    max_backtracks: int = 8,
    num_eval_draws: int = 1000,
    trace: bool = False,
    progress: int | Callable | _progress.Progress | None = None,
    on_failure: str = "raise",
) -> Result:
    r"""Fits ``q`` to the posterior ``p(x) ∝ exp(log_joint(x))`` by stochastic linear regression.

    Runs Algorithm 1 of Salimans & Knowles (2013) -- or another method of
    :mod:`jaxvb.methods` -- as one ``lax.scan`` with a fixed step ``w = 1/sqrt(N)``,
    averages the statistics over the second half of the steps and solves them once more.
    Pure and traceable: ``jit`` and ``vmap`` over data and keys work, and the same key
    gives the same result bit for bit.

    Args:
      log_joint: unnormalised log posterior, ``x -> scalar``, for ``x`` of shape
        ``q0.event_shape``; written with ``jax.numpy``. A :class:`jaxvb.Factors`
        (factor structure, for ``method="sites"``) or a :class:`jaxvb.Minibatch` (a new
        random minibatch of the data at every step, section 5.5) is also a log joint.
      q0: the starting approximation; fixes the family of the result. A plain point
        ``x0`` (an array of shape ``(d,)``) starts from the Laplace approximation there
        (:func:`jaxvb.laplace`) and fits a Gaussian.
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
        the method's trust region (``Method.step_ok``), which is then taken at the
        smallest step. Only the running
        statistics are damped; the second-half average is untouched. ``0`` gives the
        paper's plain iteration.
      num_eval_draws: draws of the fitted ``q`` for the diagnostics.
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
    laplace_failed = None
    if isinstance(q0, (jax.Array, np.ndarray, list, tuple)):
        x0 = jnp.asarray(q0)
        if x0.ndim != 1:
            raise TypeError(
                f"q0 must be a jaxvb family or a starting point of shape (d,), got an "
                f"array of shape {x0.shape}"
            )
        _check_log_joint(log_joint, jax.ShapeDtypeStruct(x0.shape, x0.dtype))
        q0, info = laplace(log_joint, x0, return_info=True)
        laplace_failed = ~(info.converged & info.negative_definite)
    if not isinstance(q0, ExponentialFamily):
        raise TypeError(
            f"q0 must be a jaxvb family such as jaxvb.Gaussian(mean, cov), or a starting "
            f"point x0, got {type(q0).__name__}"
        )
    m = _resolve_method(method, q0, log_joint)
    if not isinstance(num_steps, (int, np.integer)) or num_steps < 2:
        raise ValueError(f"num_steps must be an integer >= 2, got {num_steps!r}")
    if not isinstance(max_backtracks, (int, np.integer)) or max_backtracks < 0:
        raise ValueError(f"max_backtracks must be an integer >= 0, got {max_backtracks!r}")
    if not isinstance(num_draws, (int, np.integer)) or num_draws < 1:
        raise ValueError(f"num_draws must be a positive integer, got {num_draws!r}")
    if on_failure not in ("raise", "warn", "ignore"):
        raise ValueError(
            f"on_failure must be 'raise', 'warn' or 'ignore', got {on_failure!r}"
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
    _check_log_joint(log_joint, q0)
    progress = _progress.resolve(progress, int(num_steps))

    result = _fit(
        log_joint,
        q0,
        key,
        jnp.asarray(step_size, q0.dtype),
        method=m,
        num_steps=int(num_steps),
        num_draws=int(num_draws),
        antithetic=bool(antithetic),
        max_backtracks=int(max_backtracks),
        num_eval_draws=int(num_eval_draws),
        trace=bool(trace),
        progress=progress,
    )
    if laplace_failed is not None:
        # int32 on both sides: an eager int32 | int64 on arrays segfaults in jaxlib
        # 0.10.2 (x64 on), e.g. for a vmapped fit from batched start points.
        flag = jnp.where(laplace_failed, int(Status.LAPLACE_FAILED), 0).astype(jnp.int32)
        result = result._replace(status=result.status | flag)
    if on_failure != "ignore" and is_concrete(result.status) and result.status.ndim == 0:
        status = Status(int(result.status))
        late_improper = int(result.last_improper_step) > num_steps // 2
        if status & ERRORS and on_failure == "raise":
            raise FitError(f"jaxvb.fit: {explain(result)}", result)
        if status & (ERRORS | Status.NONFINITE_DIAGNOSTICS) or late_improper:
            warnings.warn(f"jaxvb.fit: {explain(result)}", FitWarning, stacklevel=2)
    return result


def _finite_rows(stats):
    """Per draw (leading axis): whether every statistic is finite."""
    finite = jax.tree_util.tree_map(
        lambda v: jnp.all(jnp.isfinite(v.reshape(v.shape[0], -1)), axis=1), stats
    )
    return jnp.all(jnp.stack(jax.tree_util.tree_leaves(finite)), axis=0)


def _fixed_point_check(key, q, log_p_fn, method, num_draws):
    """``(shift, noise)`` of one more update of ``method`` from fresh draws of ``q``.

    At a solution the regression of the paper returns ``q`` itself, so the update from
    draws of a converged ``q`` differs from it by Monte Carlo noise only. ``shift`` is
    KL(q || update) and ``noise`` KL(update_1 || update_2) between the updates of the
    two halves of the draws (about four times the noise of ``shift``), both to second
    order, ``Var_q[log a - log b] / 2`` on the draws of ``q``: unlike the natural
    parameters, ``log_prob`` stays accurate for ill-conditioned Gaussians.
    """
    noise = jax.vmap(method.noise, (0, None))(jax.random.split(key, num_draws), q)
    s_hat, x, _ = jax.vmap(method.estimate, (0, None, None))(noise, q, log_p_fn)
    ok = _finite_rows(s_hat)
    first = jnp.arange(num_draws) < num_draws // 2

    def update(mask):
        use = ok & mask
        n = jnp.maximum(jnp.sum(use), 1).astype(q.dtype)
        mean = jax.tree_util.tree_map(
            lambda v: (
                jnp.sum(jnp.where(use.reshape((-1,) + (1,) * (v.ndim - 1)), v, 0), 0) / n
            ),
            s_hat,
        )
        return method.solve(mean, q)

    def distance(a, b):
        d = jax.vmap(a.log_prob)(x) - jax.vmap(b.log_prob)(x)
        value = 0.5 * jnp.var(d)
        proper = a.is_proper & b.is_proper & jnp.isfinite(value)
        return jnp.where(proper, value, jnp.inf)

    shift = distance(q, update(jnp.ones_like(first)))
    return shift, distance(update(first), update(~first))


def _where_tree(pred, a, b):
    return jax.tree_util.tree_map(lambda u, v: jnp.where(pred, u, v), a, b)


@partial(
    jax.jit,
    static_argnames=(
        "log_joint",
        "method",
        "num_steps",
        "num_draws",
        "antithetic",
        "max_backtracks",
        "num_eval_draws",
        "trace",
        "progress",
    ),
)
def _fit(
    log_joint,
    q0,
    key,
    w,
    *,
    method,
    num_steps,
    num_draws,
    antithetic,
    max_backtracks,
    num_eval_draws,
    trace,
    progress,
):
    dtype = q0.dtype

    def log_p_fn(x):
        return jnp.asarray(log_joint(x)).astype(dtype)

    key_batch = None
    # A log joint with batch(key, step): jaxvb.Minibatch, or jaxvb.numpyro's.
    if callable(getattr(log_joint, "batch", None)):
        key, key_batch = jax.random.split(key)
    key_init, key_fit, key_eval = jax.random.split(key, 3)
    key_progress = jax.random.fold_in(key_eval, 2)  # never used by the iteration
    stats0 = method.init(key_init, q0, log_p_fn)
    state0 = _State(
        stats=stats0,
        sums=jax.tree_util.tree_map(jnp.zeros_like, stats0),
        count=jnp.zeros((), dtype),
        q=q0,
        status=jnp.zeros((), jnp.int32),
        first_improper_step=jnp.full((), -1, jnp.int32),
        last_improper_step=jnp.full((), -1, jnp.int32),
        num_damped_steps=jnp.zeros((), jnp.int32),
        first_nonfinite_step=jnp.full((), -1, jnp.int32),
        nonfinite_draw=jnp.zeros(q0.event_shape, dtype),
    )
    half = num_steps / 2

    def step(state, inputs):
        keys_t, t = inputs
        q = state.q
        target = log_p_fn
        if key_batch is not None:  # this step's unbiased minibatch estimate of log p
            batch_log_joint = log_joint.batch(key_batch, t)

            def target(x):
                return jnp.asarray(batch_log_joint(x)).astype(dtype)

        noise = jax.vmap(method.noise, (0, None))(keys_t, q)
        if antithetic:
            flipped = jax.vmap(lambda n: jax.tree_util.tree_map(q.antithetic, n))(noise)
            noise = jax.tree_util.tree_map(
                lambda a, b: jnp.concatenate([a, b]), noise, flipped
            )
        s_hat, x, log_p = jax.vmap(method.estimate, (0, None, None))(noise, q, target)

        ok = _finite_rows(s_hat)  # a draw counts only if all its statistics are finite
        n_ok = jnp.sum(ok).astype(dtype)
        total = jax.tree_util.tree_map(
            lambda v: jnp.sum(jnp.where(ok.reshape((-1,) + (1,) * (v.ndim - 1)), v, 0), 0),
            s_hat,
        )
        mean = jax.tree_util.tree_map(lambda v: v / jnp.maximum(n_ok, 1.0), total)
        w_t = jnp.where(n_ok > 0, w, 0.0)

        def attempt(w_try):
            stats = jax.tree_util.tree_map(
                lambda s, h: (1.0 - w_try) * s + w_try * h, state.stats, mean
            )
            q_new = method.solve(stats, q)
            proper = q_new.is_proper
            take = proper if method.step_ok is None else proper & method.step_ok(q, q_new)
            return stats, q_new, proper, take

        # Step control: halve the step until the update is proper and, where the method
        # has a trust region, near enough (or give up: improper is then skipped, a
        # proper but far update taken at the smallest step).
        def retry(carry):
            w_try, _, _, _, _, n = carry
            return (0.5 * w_try, *attempt(0.5 * w_try), n + 1)

        def refused(carry):
            return ~carry[4] & (carry[5] < max_backtracks)

        first = (w_t, *attempt(w_t), jnp.zeros((), jnp.int32))
        # The loop sits behind a cond: most steps are taken at once, and on the CPU a
        # while loop that runs zero times still costs (copies of its carry, no fusion
        # across it): the 250-step SV fit took 79 ms with it, 45 ms behind the cond.
        _, stats, q_new, proper, _, tries = jax.lax.cond(
            first[4],
            lambda c: c,
            lambda c: jax.lax.while_loop(refused, retry, c),
            first,
        )
        in_avg = t > half
        sums = jax.tree_util.tree_map(
            lambda a, v: a + jnp.where(in_avg, v, 0.0), state.sums, total
        )
        count = state.count + jnp.where(in_avg, n_ok, 0.0)

        q_next = _where_tree(proper, q_new, q)

        bad = ~jnp.all(ok)
        first_bad = jnp.argmin(ok)
        new_nonfinite = bad & (state.first_nonfinite_step < 0)
        new_improper = ~proper & (state.first_improper_step < 0)
        status = (
            state.status
            | jnp.where(proper, 0, int(Status.IMPROPER_PROPOSAL))
            | jnp.where(bad, int(Status.NONFINITE_LOG_DENSITY), 0)
        ).astype(jnp.int32)
        new_state = _State(
            stats=stats,
            sums=sums,
            count=count,
            q=q_next,
            status=status,
            first_improper_step=jnp.where(new_improper, t, state.first_improper_step),
            last_improper_step=jnp.where(proper, state.last_improper_step, t),
            num_damped_steps=state.num_damped_steps + (proper & (tries > 0)),
            first_nonfinite_step=jnp.where(new_nonfinite, t, state.first_nonfinite_step),
            nonfinite_draw=jnp.where(
                new_nonfinite, x[first_bad].astype(dtype), state.nonfinite_draw
            ),
        )
        info = None
        if trace:
            mean_log_p = jnp.sum(jnp.where(ok, log_p, 0.0)) / jnp.maximum(n_ok, 1.0)
            info = Trace(q_next.natural_params, mean_log_p, proper)
        if progress is not None:
            _progress.report(progress, key_progress, t, num_steps, q_next, log_p_fn, status)
        return new_state, info

    # Every step's draw keys, split before the loop (the same keys as splitting each
    # step's key inside it): inside, each split is a chain of small runtime steps
    # (hashing, copies of keys), ~5% of the 250-step SV fit on the CPU.
    keys = jax.vmap(lambda k: jax.random.split(k, num_draws))(
        jax.random.split(key_fit, num_steps)
    )
    steps = jnp.arange(1, num_steps + 1, dtype=jnp.int32)
    state, infos = jax.lax.scan(step, state0, (keys, steps))

    averaged = jax.tree_util.tree_map(
        lambda v: v / jnp.maximum(state.count, 1.0), state.sums
    )
    q_avg = method.solve(averaged, state.q)
    good = q_avg.is_proper & (state.count > 0)
    q = _where_tree(good, q_avg, state.q)
    status = state.status | jnp.where(good, 0, int(Status.IMPROPER_RESULT))

    # Did the iteration settle? One more update from fresh draws of q must give q back
    # (up to its noise). It needs several times the method's unknowns in draws, so it
    # is skipped where 200 are too few (Algorithm 1 with a large Gaussian).
    num_check = min(num_eval_draws, 200)
    shift = jnp.full((), jnp.nan, dtype)
    if method.check_fixed_point and num_check >= 4 * method.min_draws(q):
        shift, noise = _fixed_point_check(
            jax.random.fold_in(key_eval, 1), q, log_p_fn, method, num_check
        )
        settled = jnp.isfinite(shift) & (shift <= jnp.maximum(1.0, noise))
        status = status | jnp.where(good & ~settled, int(Status.NOT_CONVERGED), 0)

    diag = diagnostics.evaluate(key_eval, q, log_p_fn, num_eval_draws)
    status = status | jnp.where(
        diag.num_nonfinite > 0, int(Status.NONFINITE_DIAGNOSTICS), 0
    )
    return Result(
        q=q,
        elbo=diag.elbo,
        log_evidence=diag.log_evidence,
        kl=diag.kl,
        r_squared=diag.r_squared,
        residual_variance=diag.residual_variance,
        elbo_stderr=diag.elbo_stderr,
        status=status.astype(jnp.int32),
        first_improper_step=state.first_improper_step,
        last_improper_step=state.last_improper_step,
        num_damped_steps=state.num_damped_steps,
        first_nonfinite_step=state.first_nonfinite_step,
        nonfinite_draw=state.nonfinite_draw,
        fixed_point_shift=shift,
        trace=infos,
    )
