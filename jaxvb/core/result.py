"""What a fit returns: ``Result`` and its per-step ``Trace``."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxvb.core import summary as _summary
from jaxvb.core.status import ERRORS, explain


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
        draws (:func:`jaxvb.diagnostics.psis`). Above 0.7 it flags the fit
        (``Status.HIGH_KHAT``, which :func:`explain` explains) where ``q`` is
        materially off, ``residual_variance`` at least
        :data:`jaxvb.core.status.KHAT_FLAG_VARIANCE`; below that variance a k-hat
        over 0.7 is the noisy tail of an otherwise close fit and does not flag it.
      khat_sd: the Monte Carlo standard deviation of ``khat``
        (:func:`jaxvb.diagnostics.khat_sd`, a bootstrap of the same weights) where
        ``khat`` comes from importance weights computed after the fit
        (:func:`jaxvb.numpyro.fit`'s verdict); NaN for a plain fit, whose
        diagnostics leave it out of the compiled fit (it would add a tenth to a small
        fit's compile and its run).
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
    khat_sd: jax.Array
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
        return _summary.summary(self, key, num_samples, names, prob, max_rows)

    def __str__(self) -> str:
        # print(result) shows the summary; repr stays the field-by-field tuple, and a
        # traced or batched result prints without drawing (see jaxvb.core.summary.text).
        return _summary.text(self)


__all__ = ["Result", "Trace"]
