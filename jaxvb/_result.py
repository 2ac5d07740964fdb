"""What a fit returns and how a flagged result is reported: ``Result``, ``Status``, ``check``."""

from __future__ import annotations

import enum
import math
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxvb import diagnostics as _diagnostics
from jaxvb.families._base import is_concrete


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
    #: The diagnostics' R^2 is below 0, or far below what the family reaches (judged
    #: from 50 finite draws or more): over draws of the fitted ``q``, ``log q``
    #: explains none of the variation of ``log p`` (the residual varies more than
    #: ``log p`` itself), or the family's own least-squares fit of ``log p`` at those
    #: draws leaves a residual variance smaller by 1.2 or more, beyond three standard
    #: errors (``q`` is ~0.6 nats or more from the family's best fit:
    #: ``Result.reachable_variance``). ``q`` is far
    #: from the posterior (too few steps for a noisy estimate, or a posterior this
    #: family cannot follow) and should not be trusted.
    POOR_FIT = 64
    #: Warning: one more update from fresh draws of ``q`` moves it by more than the
    #: check's threshold (``max(1 nat, the update's own noise)``) but by less than
    #: three times it, where :attr:`NOT_CONVERGED` starts. The iteration may not have
    #: settled; the gap between the two keeps ``Result.ok`` from flipping with the
    #: random key for a fit near the threshold (issue 16). More steps will tell. Also
    #: set when the family's own least-squares fit of ``log p`` at ``q``'s draws leaves
    #: a residual variance smaller by 0.4 to 1.2 (~0.2-0.6 nats; beyond: POOR_FIT).
    UNSETTLED = 128
    #: Warning: the Pareto k-hat of the importance ratios ``p / q`` is above 0.7
    #: (Stan's threshold) and ``q`` is materially off: ``Var_q[log p - log q]`` is
    #: 0.5 or more (an approximate KL of 0.25 nats), judged from 50 finite diagnostic
    #: draws or more; or, for a :class:`jaxvb.GaussianMixture`, its evidence's wide
    #: draws reached mass that ``q`` misses. ``q``'s tails are lighter than the
    #: posterior's or it misses mass (a funnel, a skewed or heavy-tailed posterior),
    #: so its expectations can be off. (A k-hat above 0.7 on a closer fit is reported
    #: by :func:`explain` without a flag: k-hat alone is noisy, and pessimistic in
    #: many dimensions.)
    HIGH_KHAT = 256
    #: Warning: draws of the distribution the fit started from reach posterior mass
    #: that ``q`` misses: importance sampling from ``(q + q0) / 2`` (a Gaussian ``q0``
    #: with its covariance widened 4x, ``jaxvb._fit.START_SCALE``) puts ``log p(y)``
    #: ``diagnostics.START_EXCESS`` (0.2) nats or more above ``q``'s own draws, and by
    #: more than three standard errors (``diagnostics.Diagnostics.start_excess``). A
    #: second mode (``q`` covers one of them; its evidence is too low) or a tail ``q``
    #: does not follow. ``q`` cannot see a mode its draws never reach; ``q0``'s can,
    #: where it covers it. Set only for fits started from a distribution ``q0``.
    MISSED_MASS = 512


#: Flags that make a result untrustworthy (``Result.ok`` is False, ``fit`` raises).
ERRORS = (
    Status.IMPROPER_RESULT
    | Status.NONFINITE_LOG_DENSITY
    | Status.LAPLACE_FAILED
    | Status.NOT_CONVERGED
    | Status.POOR_FIT
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
      kl_stderr, log_evidence_stderr, r_squared_stderr: the Monte Carlo standard
        errors of ``kl``, ``log_evidence`` and ``r_squared`` (``elbo_stderr``'s
        counterparts; delta method over the diagnostics' draws).
      reachable_variance: the residual variance of the family's own least-squares fit
        of ``log p`` at the diagnostics' draws (``residual_variance`` can come down to
        it; see :class:`jaxvb.diagnostics.Diagnostics`), NaN where not computed.
      khat: the Pareto k-hat of the importance ratios ``p / q`` at the diagnostics'
        draws (:func:`jaxvb.diagnostics.psis`); above 0.7 :func:`explain` says why it
        matters (not a status flag: it is read with ``residual_variance``).
      status: ``int32`` bit flags, see :class:`Status`; ``0`` when all went well.
      first_improper_step, last_improper_step: the first and last steps whose update
        was improper (``-1`` if none).
      num_damped_steps: steps whose update was improper at the full step size (or
        refused by the method's ``accept``, e.g. a trust region) and was taken with a
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
    kl_stderr: jax.Array
    log_evidence_stderr: jax.Array
    r_squared_stderr: jax.Array
    reachable_variance: jax.Array
    khat: jax.Array
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

    def sample(self, key: jax.Array, n: int):
        """``n`` draws of the fitted ``q``: an ``(n, d)`` array, or the family's own
        split of them (``(theta, f)`` for a :class:`jaxvb.LatentGaussian` fit).

        Example:
          >>> import jax, jax.numpy as jnp, jaxvb
          >>> res = jaxvb.fit(lambda x: -0.5 * jnp.sum(x**2), jnp.ones(2),
          ...                 jax.random.key(0), num_steps=20)
          >>> res.sample(jax.random.key(1), 5).shape
          (5, 2)
        """
        draws = self.q.sample(key, (n,))
        unpack = getattr(self.q, "unpack", None)
        return unpack(draws) if callable(unpack) else draws

    def summary(
        self,
        key: jax.Array | None = None,
        num_samples: int = 4000,
        names: Any = None,
        prob: float = 0.9,
        max_rows: int = 10,
    ):
        """The summary table: :func:`jaxvb.summary` of this result (``print`` it).

        Example:
          >>> import jax, jax.numpy as jnp, jaxvb
          >>> res = jaxvb.fit(lambda x: -0.5 * jnp.sum(x**2), jnp.ones(2),
          ...                 jax.random.key(0), num_steps=20)
          >>> round(res.summary()["x[1]"]["sd"], 6)   # N(0, 1)
          1.0
        """
        from jaxvb._summary import summary

        return summary(self, key, num_samples, names, prob, max_rows)

    def __str__(self) -> str:
        # print(result) shows the summary; repr stays the field-by-field tuple, and a
        # traced or batched result prints without drawing (see jaxvb._summary.text).
        from jaxvb._summary import text

        return text(self)


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
      jaxvb.fit: log_joint was not finite at x = [-0.96...] (first at step 1); ...
      >>> result.q.mean.shape, int(result.first_nonfinite_step)
      ((1,), 1)
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
      log_joint was not finite at x = [-0.96...] (first at step 1); such draws were left
      out. Make sure log_joint is finite on the whole support of the approximating family
      (e.g. use Gamma for a positive parameter, or transform it to the real line).
    """
    if not is_concrete(result.status) or np.ndim(result.status) != 0:
        raise TypeError(
            "explain reads one concrete result; this one is "
            + (
                f"a batch of shape {np.shape(result.status)} (take one fit first: "
                "jax.tree.map(lambda v: v[i], res), or res[i] for a jaxvb.numpyro result)"
                if is_concrete(result.status)
                else "traced (under jit/vmap: return it, then explain it outside)"
            )
        )
    status = Status(int(np.asarray(result.status)))
    tail = _khat_line(result)
    if status == Status.OK:
        return "ok" if tail is None else f"ok, but {tail}"
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
        remedy = (
            "log_joint is not finite at some draws of the approximating family (a "
            f"{type(result.q).__name__}, whose draws stay in its support): check "
            "log_joint there, or that it is not rounded to inf (fit in float64)"
            if type(result.q).__name__ in ("Gamma", "InverseGamma", "Exponential", "Beta")
            else "Make sure log_joint is finite on the whole support of the approximating "
            "family (e.g. use Gamma for a positive parameter, or transform it to the "
            "real line)"
        )
        lines.append(
            f"log_joint was not finite at x = {x.tolist()} (first at step "
            f"{int(result.first_nonfinite_step)}); such draws were left out. {remedy}."
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
    if Status.UNSETTLED in status:
        shift = float(np.asarray(result.fixed_point_shift))
        reach = _reach_phrase(result)
        why = [] if reach is None else [reach]
        if not why or shift > 1.0:
            why.append(
                f"one more update from fresh draws of q moves it by {shift:.3g} nats "
                "(KL), above the check's threshold (1 nat or the update's own noise) but "
                "below three times it (NOT_CONVERGED)"
            )
        lines.append(
            f"{' and '.join(why)}: the iteration may not have settled. Increase "
            "num_steps and compare, or start from a point x0 (the Laplace "
            "approximation there)."
        )
    if Status.POOR_FIT in status:
        r2 = float(np.asarray(result.r_squared))
        reach = _reach_phrase(result)
        why = (
            f"R^2 is {r2:.3g}, below 0: over draws of q the residual log p - log q varies "
            "more than log p itself, so q is far from the posterior"
            if r2 < 0 or reach is None
            else f"R^2 is {r2:.3g}, but {reach}, so the iteration had not settled"
        )
        lines.append(
            f"{why}. Increase num_steps (or draws per step), start from a point x0 (the "
            "Laplace approximation there), or use a family that can follow the posterior."
        )
    if Status.MISSED_MASS in status:
        lines.append(
            "draws of the start q0 reach posterior mass that q misses (importance "
            "sampling from (q + q0) / 2 finds more than q's own draws): q covers one "
            "part of the posterior, such as one of several modes, and its log evidence "
            "is too low. Fit a jaxvb.GaussianMixture with a component per mode, or "
            "check with starts in the other regions."
        )
    if Status.NONFINITE_DIAGNOSTICS in status:
        lines.append(
            "log_joint was not finite at some draws of the fitted q; the diagnostics "
            "leave them out. q puts mass where the model has none."
        )
    if tail is not None:
        lines.append(tail)
    return "; ".join(lines)


#: Above this Pareto k-hat (Stan's threshold, Vehtari et al. 2024) importance sampling
#: from ``q`` is unreliable.
KHAT_THRESHOLD = _diagnostics.KHAT_THRESHOLD
#: Below this variance of the log ratios ``log p - log q`` (sd 0.01: weights within
#: ~1% of each other) k-hat is not informative: an almost exact fit whose ratios
#: differ by round-off can give any k-hat.
KHAT_MIN_VARIANCE = _diagnostics.KHAT_MIN_VARIANCE


def _reach_phrase(result) -> str | None:
    """How far ``q`` is from the family's own least-squares fit of ``log p`` at its
    draws (``Result.reachable_variance``), or ``None`` below the flags' threshold."""
    s2 = float(np.asarray(result.residual_variance))
    reach = float(np.asarray(getattr(result, "reachable_variance", np.nan)))
    if not (math.isfinite(reach) and s2 - reach > _diagnostics.REACHABLE_EXCESS):
        return None
    return (
        f"the family fits log p at q's own draws with a residual variance of {reach:.3g} "
        f"against q's {s2:.3g} (q is ~{(s2 - reach) / 2:.2g} nats from the family's best "
        "fit there)"
    )


def _khat_line(result) -> str | None:
    """The k-hat sentence of :func:`explain`, or ``None`` when k-hat is fine, unknown
    or not informative."""
    khat = getattr(result, "khat", None)
    if khat is None or np.ndim(khat) != 0:
        return None
    khat = float(np.asarray(khat))
    variance = float(np.asarray(getattr(result, "residual_variance", np.inf)))
    if not math.isfinite(khat) or khat <= KHAT_THRESHOLD:
        return None
    flagged = Status.HIGH_KHAT in Status(int(np.asarray(result.status)))
    if variance < KHAT_MIN_VARIANCE and not flagged:
        return None
    return (
        f"the Pareto k-hat of the importance ratios p/q over the diagnostics' draws is "
        f"{khat:.2f} (above {KHAT_THRESHOLD}): q's tails are lighter than the "
        "posterior's, or q misses part of its mass (another mode), so expectations under "
        "q can be off and importance sampling from q (jaxvb.diagnostics.psis) is "
        "unreliable. A richer family (jaxvb.GaussianMixture, a hierarchical "
        "approximation) or a reparameterisation of the model may help."
    )


def check(
    result: Any,
    on_failure: str = "raise",
    *,
    num_steps: int | None = None,
    who: str = "jaxvb.fit",
    stacklevel: int = 2,
) -> Any:
    """Raises or warns about a flagged, concrete result; returns it unchanged.

    What :func:`jaxvb.fit` does with its result, public so that models built on the
    engine (e.g. :func:`jaxvb.models.stochastic_volatility.fit`) report the same way.
    A result under ``jit``/``vmap`` (traced or batched status) passes through: only its
    status flags tell.

    Args:
      result: a :class:`Result`, or anything with its ``status``, ``last_improper_step``
        and the fields :func:`explain` reads (e.g. a model's result wrapper).
      on_failure: ``"raise"`` (a :class:`FitError` carrying the result for an error
        flag, a :class:`FitWarning` for a milder one), ``"warn"`` or ``"ignore"``.
      num_steps: the fit's number of steps, if known: improper updates in the averaged
        second half then warn even when the result is proper.
      who: the name that opens the message.
      stacklevel: passed to ``warnings.warn``, counted from the caller of ``check``.

    Returns:
      ``result``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> log_joint = lambda x: jnp.log(x[0]) - x[0]   # Gamma(2, 1), x > 0
      >>> res = jaxvb.fit(log_joint, jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1)),
      ...                 jax.random.key(0), num_steps=20, num_eval_draws=2,
      ...                 on_failure="ignore")
      >>> try:
      ...     jaxvb.check(res, who="my_model.fit")
      ... except jaxvb.FitError as err:
      ...     print(str(err)[:44])
      my_model.fit: log_joint was not finite at x
    """
    if on_failure not in ("raise", "warn", "ignore"):
        raise ValueError(
            f"on_failure must be 'raise', 'warn' or 'ignore', got {on_failure!r}"
        )
    status = result.status
    if on_failure == "ignore" or not is_concrete(status) or np.ndim(status) != 0:
        return result
    flags = Status(int(status))
    late_improper = (
        num_steps is not None and int(result.last_improper_step) > int(num_steps) // 2
    )
    if flags & ERRORS and on_failure == "raise":
        raise FitError(f"{who}: {explain(result)}", result)
    warned = (
        ERRORS
        | Status.NONFINITE_DIAGNOSTICS
        | Status.UNSETTLED
        | Status.HIGH_KHAT
        | Status.MISSED_MASS
    )
    if flags & warned or late_improper:
        warnings.warn(f"{who}: {explain(result)}", FitWarning, stacklevel=stacklevel + 1)
    return result
