"""The verdict on a fit, in one place: ``Status``, its thresholds and the policy that
sets the flags, ``explain`` and ``check``.

:func:`fit_status` turns what the kernel, the convergence check and the diagnostics
measured into :class:`Status` flags; :func:`check` turns the flags into an error, a
warning or nothing; :func:`explain` puts them in words. Every threshold a flag depends
on is defined here.
"""

from __future__ import annotations

import enum
import math
import warnings
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb.families._base import is_concrete

if TYPE_CHECKING:  # Result's module imports this one
    from jaxvb.core.result import Result


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
    #: random key for a fit near the threshold. More steps will tell. Also
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
    #: many dimensions.) A ``latent=`` fit of :func:`jaxvb.numpyro.fit` reads k-hat
    #: from the weights its draws rest on, ``p(y, theta) / q(theta)`` with the field
    #: integrated out, by the same rule.
    HIGH_KHAT = 256
    #: Warning: draws of the distribution the fit started from reach posterior mass
    #: that ``q`` misses: importance sampling from ``(q + q0) / 2`` (a Gaussian ``q0``
    #: with its covariance widened 4x, ``jaxvb.core.fit.START_SCALE``) puts ``log p(y)``
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


#: Stan's k-hat threshold for PSIS.
KHAT_THRESHOLD = 0.7
#: The k-hat up to which importance-resampled draws are the default answer
#: (:meth:`jaxvb.numpyro.NumPyroResult.sample`, :func:`jaxvb.to_arviz` of a latent
#: Gaussian fit). Up to 0.7 PSIS's estimates are reliable; up to 1 they still
#: converge, with a bias that shrinks as proposals are added (Vehtari et al. 2024,
#: section 3), and they stay closer to the posterior than ``q``'s own draws where
#: ``q``'s tails are too light (the eight schools' centred scale: sd 0.93-0.98 of
#: NUTS's at k-hat 0.87, ``q``'s own 1.23-1.26); above 1 the weights' mean does not
#: exist, and ``q``'s own draws are given.
KHAT_RESAMPLE_LIMIT = 1.0
#: The variance of the log ratios above which a k-hat over the threshold sets the
#: warning flag ``Status.HIGH_KHAT`` (an approximate KL(q || p) = s^2 / 2 of 0.25 nats
#: or more): below it k-hat, a noisy and in many dimensions pessimistic estimate, is
#: reported (``Result.khat`` and its spread, the summary) but does not flag, and
#: :func:`explain` does not qualify, a fit that is otherwise close (a Gamma fitted to
#: a log-normal, the paper's hierarchical eight schools: k-hat above 0.7 at a small
#: s^2).
KHAT_FLAG_VARIANCE = 0.5
#: A residual variance this much above the family's own least-squares fit at q's
#: draws (``Result.reachable_variance``; about 0.2 nats of KL), and by more than three
#: standard errors, is Status.UNSETTLED (a warning); three times it, POOR_FIT (an error).
#: Converged fits lie well below it (probit, eight schools, a Student-t, a Gamma
#: fitted to a log-normal); a minibatch fit stopped far too early, well above.
REACHABLE_EXCESS = 0.4
#: ``Diagnostics.start_excess`` above this (and above three standard errors) is
#: ``Status.MISSED_MASS``: the start's draws found 22% more posterior mass than ``q``
#: covers. Where ``q`` covers the posterior the excess is Monte Carlo noise (the two
#: estimates share ``q``'s draws, and ``p / r <= 2 p / q``).
START_EXCESS = 0.2


#: Fewest finite diagnostic draws from which a negative R^2 is flagged POOR_FIT (the
#: variances' relative standard error is then ~20% or less).
MIN_POOR_FIT_DRAWS = 50
#: A fixed-point shift beyond this multiple of the check's threshold is NOT_CONVERGED
#: (an error); between the threshold and it, UNSETTLED (a warning).
UNSETTLED_FACTOR = 3.0
#: The start's covariance is scaled by this for the diagnostics' draws of it
#: (``Status.MISSED_MASS``): defensive, like a mixture's widened evidence draws.
START_SCALE = 4.0


def fit_status(
    status: jax.Array,
    proper_result: jax.Array,
    shift: jax.Array,
    noise: jax.Array,
    diag: Any,
    num_eval_draws: int,
) -> jax.Array:
    """The flags of a fit: the kernel's (``status``), and those the result, the
    convergence check and the diagnostics call for.

    Args:
      status: the kernel's flags (:attr:`jaxvb.kernel.State.status`).
      proper_result: whether the averaged statistics solved to a proper ``q``.
      shift, noise: the convergence check's distances (NaN: no check).
      diag: the :class:`jaxvb.diagnostics.Diagnostics` of the result.
      num_eval_draws: the draws ``diag`` was computed from.

    Returns:
      ``int32`` :class:`Status` flags (traceable).

    Example:
      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.core.status import fit_status

      One more update moves ``q`` by 5 nats, far past the check's threshold:

      >>> fields = jaxvb.diagnostics.Diagnostics._fields
      >>> diag = jaxvb.diagnostics.Diagnostics(*[jnp.nan] * len(fields))._replace(
      ...     num_nonfinite=0, khat_informative=False)
      >>> flags = fit_status(jnp.int32(0), True, 5.0, 0.1, diag, num_eval_draws=1000)
      >>> jaxvb.Status(int(flags)).name
      'NOT_CONVERGED'
    """
    status = status | jnp.where(proper_result, 0, int(Status.IMPROPER_RESULT))
    # Three zones for the fixed-point check, so that a fit near the threshold is not an
    # error with one key and clean with the next: settled, unsettled (a warning) up to
    # three times the threshold, not converged (an error) beyond. NaN: no check.
    checked = ~jnp.isnan(shift)
    threshold = jnp.maximum(1.0, noise)
    settled = jnp.isfinite(shift) & (shift <= threshold)
    far = ~jnp.isfinite(shift) | (shift > UNSETTLED_FACTOR * threshold)
    status = status | jnp.where(checked & proper_result & far, int(Status.NOT_CONVERGED), 0)
    unsettled = checked & proper_result & ~settled & ~far
    status = status | jnp.where(unsettled, int(Status.UNSETTLED), 0)
    status = status | jnp.where(
        diag.num_nonfinite > 0, int(Status.NONFINITE_DIAGNOSTICS), 0
    )
    # R^2 from a handful of draws is noise (num_eval_draws=2 is how callers skip the
    # diagnostics): judged from MIN_POOR_FIT_DRAWS finite draws or more
    judged = (num_eval_draws - diag.num_nonfinite) >= MIN_POOR_FIT_DRAWS
    # q against the family's own least-squares fit at its draws (NaN: not computed),
    # significant only beyond three standard errors; as for the fixed-point check,
    # a warning zone below three times the threshold
    excess = diag.residual_variance - diag.reachable_variance
    significant = excess > 3.0 * diag.excess_stderr
    far = significant & (excess > UNSETTLED_FACTOR * REACHABLE_EXCESS)
    near = significant & (excess > REACHABLE_EXCESS) & ~far
    poor = (diag.r_squared < 0.0) | far
    status = status | jnp.where(judged & poor, int(Status.POOR_FIT), 0)
    status = status | jnp.where(judged & near, int(Status.UNSETTLED), 0)
    high_khat = (diag.khat > KHAT_THRESHOLD) & diag.khat_informative
    status = status | jnp.where(judged & high_khat, int(Status.HIGH_KHAT), 0)
    # draws of q0 found mass that q's miss (a second mode q0 covers)
    missed = diag.start_excess > jnp.maximum(START_EXCESS, 3.0 * diag.start_excess_stderr)
    status = status | jnp.where(judged & missed, int(Status.MISSED_MASS), 0)
    return status.astype(jnp.int32)


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
    if status == Status.OK:
        return "ok"
    tail = _khat_line(result)
    phrases = _PHRASES
    if never_proper(result):
        phrases = ((Status.IMPROPER_RESULT, _no_proper_update),) + tuple(
            (f, p) for f, p in _PHRASES if f not in _IMPROPER
        )
    lines = [phrase(result) for flag, phrase in phrases if flag in status]
    if tail is not None:
        lines.append(tail)
    return "; ".join(lines)


def _improper_result(result) -> str:
    return (
        "the averaged statistics do not define a proper distribution, so the fit has "
        "not converged; `q` is the last proper iterate. Increase num_steps (the paper's "
        "remedy), start closer to the posterior (fit(log_joint, x0, ...) with a "
        "point x0 starts from the Laplace approximation there), or use more draws "
        "per step. If it persists, check that the posterior is proper (integrable)."
    )


_IMPROPER = Status.IMPROPER_RESULT | Status.IMPROPER_PROPOSAL


def never_proper(result) -> bool:
    """Whether no update of the fit was proper: improper from the first step, and the
    average never proper either."""
    status = Status(int(np.asarray(result.status)))
    first = int(np.asarray(getattr(result, "first_improper_step", -1)))
    return Status.IMPROPER_RESULT in status and 0 <= first <= 1


def _no_proper_update(result) -> str:
    return (
        "no update was a proper distribution, from the first step to the last: the "
        "log density does not curve downwards in every direction where q sits, so no "
        "fixed form of this family fits it there. This is a saddle between modes (the "
        "symmetric modes of a neural network's hidden units, a mixture's relabelled "
        "components) or a density without a maximum, and more steps will not help. "
        "Sample it with NUTS, fit a jaxvb.GaussianMixture with a component per mode, "
        "or reparameterise to break the symmetry (order the hidden units)."
    )


def _improper_proposal(result) -> str:
    return (
        "intermediate updates (steps "
        f"{int(result.first_improper_step)} to {int(result.last_improper_step)}) were "
        "not proper distributions (e.g. a negative rate or precision); draws continued "
        "from the last proper iterate. The result may still be fine (check r_squared); "
        "a larger num_steps makes this rarer."
    )


def _nonfinite_log_density(result) -> str:
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
    return (
        f"log_joint was not finite at x = {short_array(x, 'result.nonfinite_draw')} "
        f"(first at step {int(result.first_nonfinite_step)}); such draws were left "
        f"out. {remedy}."
    )


#: Coordinates of a point a message prints in full; a longer one is shown by its first
#: and last few, and its size.
_SHOWN_IN_FULL = 8


def short_array(x, where: str | None = None) -> str:
    """``x`` for a message of a few lines: in full up to :data:`_SHOWN_IN_FULL`
    coordinates, else its first and last three, its size and (if given) ``where`` the
    whole of it is.

    Example:
      >>> import numpy as np
      >>> from jaxvb.core.status import short_array
      >>> short_array(np.arange(20.0), "result.nonfinite_draw")
      '[0, 1, 2, ..., 17, 18, 19] (20 values; all in result.nonfinite_draw)'
    """
    x = np.ravel(np.asarray(x))
    if x.size <= _SHOWN_IN_FULL:
        return str(x.tolist())
    first, last = (", ".join(f"{v:.4g}" for v in part) for part in (x[:3], x[-3:]))
    size = f"{x.size} values" + ("" if where is None else f"; all in {where}")
    return f"[{first}, ..., {last}] ({size})"


def _laplace_failed(result) -> str:
    if hasattr(result.q, "theta"):  # a latent Gaussian model's start from theta0
        return (
            "the start's search for the hyperparameters' mode (the field integrated "
            "out) did not converge from theta0; start theta0 nearer the posterior, or "
            "check that p(theta | y) is proper (a scale whose group effects are among "
            "theta, not the field, can run off to 0: non-centre those effects)."
        )
    return (
        "the Laplace approximation at the starting point x0 was not proper or its mode "
        "search did not converge (see jaxvb.laplace); start from a jaxvb.Gaussian "
        "instead, or check that the posterior is proper."
    )


def _not_converged(result) -> str:
    shift = float(np.asarray(result.fixed_point_shift))
    moved = (
        "is not a proper distribution"
        if not math.isfinite(shift)
        else f"moves it by {shift:.3g} nats (KL)"
    )
    return (
        f"the fitted q is not a fixed point: one more update from fresh draws of q "
        f"{moved}, so the iteration had not settled when it stopped. Start from a "
        "point x0 (fit(log_joint, x0, ...) starts from the Laplace approximation "
        "there), or increase num_steps."
    )


def _unsettled(result) -> str:
    shift = float(np.asarray(result.fixed_point_shift))
    reach = _reach_phrase(result)
    why = [] if reach is None else [reach]
    if not why or shift > 1.0:
        why.append(
            f"one more update from fresh draws of q moves it by {shift:.3g} nats "
            "(KL), above the check's threshold (1 nat or the update's own noise) but "
            "below three times it (NOT_CONVERGED)"
        )
    return (
        f"{' and '.join(why)}: the iteration may not have settled. Increase "
        "num_steps and compare, or start from a point x0 (the Laplace "
        "approximation there)."
    )


def _poor_fit(result) -> str:
    r2 = float(np.asarray(result.r_squared))
    reach = _reach_phrase(result)
    why = (
        f"R^2 is {r2:.3g}, below 0: over draws of q the residual log p - log q varies "
        "more than log p itself, so q is far from the posterior"
        if r2 < 0 or reach is None
        else f"R^2 is {r2:.3g}, but {reach}, so the iteration had not settled"
    )
    return (
        f"{why}. Increase num_steps (or draws per step), start from a point x0 (the "
        "Laplace approximation there), or use a family that can follow the posterior."
    )


def _missed_mass(result) -> str:
    return (
        "draws of the start q0 reach posterior mass that q misses (importance "
        "sampling from (q + q0) / 2 finds more than q's own draws): q covers one "
        "part of the posterior, such as one of several modes, and its log evidence "
        "is too low. Fit a jaxvb.GaussianMixture with a component per mode, or "
        "check with starts in the other regions."
    )


def _nonfinite_diagnostics(result) -> str:
    return (
        "log_joint was not finite at some draws of the fitted q; the diagnostics "
        "leave them out. q puts mass where the model has none."
    )


#: Each flag's account, in the order :func:`explain` gives them.
_PHRASES = (
    (Status.IMPROPER_RESULT, _improper_result),
    (Status.IMPROPER_PROPOSAL, _improper_proposal),
    (Status.NONFINITE_LOG_DENSITY, _nonfinite_log_density),
    (Status.LAPLACE_FAILED, _laplace_failed),
    (Status.NOT_CONVERGED, _not_converged),
    (Status.UNSETTLED, _unsettled),
    (Status.POOR_FIT, _poor_fit),
    (Status.MISSED_MASS, _missed_mass),
    (Status.NONFINITE_DIAGNOSTICS, _nonfinite_diagnostics),
)


def _reach_phrase(result) -> str | None:
    """How far ``q`` is from the family's own least-squares fit of ``log p`` at its
    draws (``Result.reachable_variance``), or ``None`` below the flags' threshold."""
    s2 = float(np.asarray(result.residual_variance))
    reach = float(np.asarray(getattr(result, "reachable_variance", np.nan)))
    if not (math.isfinite(reach) and s2 - reach > REACHABLE_EXCESS):
        return None
    return (
        f"the family fits log p at q's own draws with a residual variance of {reach:.3g} "
        f"against q's {s2:.3g} (q is ~{(s2 - reach) / 2:.2g} nats from the family's best "
        "fit there)"
    )


def _khat_line(result) -> str | None:
    """The sentence of :func:`explain` for ``Status.HIGH_KHAT``, or ``None`` where the
    flag is not set: a k-hat over 0.7 that did not flag the fit (the log ratios nearly
    constant) is the noisy tail of a close fit, and an accurate fit is told "ok"."""
    if Status.HIGH_KHAT not in Status(int(np.asarray(result.status))):
        return None
    khat = float(np.asarray(result.khat))
    spread = float(np.asarray(getattr(result, "khat_sd", np.nan)))
    sd = f" (Monte Carlo sd {spread:.2f})" if math.isfinite(spread) else ""
    return (
        f"the Pareto k-hat of the importance ratios p/q is {khat:.2f}{sd}, above "
        f"{KHAT_THRESHOLD}: q's tails are lighter than the posterior's, or q misses "
        "part of its mass (another mode), so expectations under q can be off and "
        "importance sampling from q (jaxvb.diagnostics.psis) is unreliable. A "
        "richer family (jaxvb.GaussianMixture, a hierarchical approximation) or a "
        "reparameterisation of the model may help."
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


__all__ = ["ERRORS", "FitError", "FitWarning", "Status", "check", "explain", "fit_status"]
