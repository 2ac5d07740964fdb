"""The protocol between ``fit`` and a method: ``init / noise / estimate / solve``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax


class Method(NamedTuple):
    """A way of forming and solving the regression statistics of the paper.

    ``fit`` is the only loop; a method only says which statistics it keeps and how one
    draw estimates them. All four functions are pure and traceable.

    Attributes:
      name: a short label for messages.
      init: ``init(key, q0, log_joint) -> stats``, the statistics at the start
        (Algorithm 1: ``C_1`` and ``g_1 = C_1 eta~_1``).
      noise: ``noise(key, q) -> noise``, the randomness of one estimate.
      estimate: ``estimate(noise, q, log_joint) -> (stats_hat, x, log_p)``: an unbiased
        estimate of the statistics at ``q`` from one draw, the draw ``x`` and
        ``log_joint(x)``.
      solve: ``solve(stats, q) -> q_new``, the approximation the statistics define
        (possibly improper; ``fit`` checks ``q_new.is_proper``).
      min_draws: ``min_draws(q) -> int``, how many draws the averaged statistics must
        hold to be solvable (``k + 1`` for a full regression).
      bind: ``None``, or ``bind(log_joint) -> Method`` for a method that needs to know
        the structure of the log joint (:func:`jaxvb.methods.sites` reads the factors of
        a :class:`jaxvb.Factors`); ``fit`` calls it once before running.
      check_fixed_point: whether ``fit`` ends with its convergence check (one more
        update from fresh draws must give ``q`` back; ``Status.NOT_CONVERGED``). It
        needs ``estimate``'s ``x`` to be draws of ``q``; a Rao-Blackwellised method whose
        ``x`` is not (e.g. a conditional mean) turns it off.
      step_ok: ``None``, or ``step_ok(q, q_new) -> bool``: whether a proper update is
        close enough to ``q`` to take whole. ``fit``'s step control halves the step of
        an update that is not (as of an improper one) and, after ``max_backtracks``
        halvings, takes the last proper one. A trust region against the rare huge
        update of a noisy single-draw estimate (:func:`jaxvb.composite.hierarchical`).

    Example:
      The factories of :mod:`jaxvb.methods` build them; ``fit`` takes any ``Method``:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.Gamma(jnp.ones(1), jnp.ones(1))
      >>> method = jaxvb.methods.regression(estimator="analytic", intercept="normalized")
      >>> method.name, method.min_draws(q0), jaxvb.methods.regression().min_draws(q0)
      ('regression(analytic, init=analytic)', 1, 3)
      >>> stats = method.init(jax.random.key(0), q0, None)   # C_1, g_1 = C_1 eta~_1 ...
      >>> q1 = method.solve(stats, q0)                       # ... which solve back to q0
      >>> bool(jnp.allclose(q1.natural_params, q0.natural_params))
      True
    """

    name: str
    init: Callable[[Any, Any, Callable], Any]
    noise: Callable[[Any, Any], Any]
    estimate: Callable[[Any, Any, Callable], tuple[Any, Any, Any]]
    solve: Callable[[Any, Any], Any]
    min_draws: Callable[[Any], int]
    bind: Callable[[Any], Method] | None = None
    check_fixed_point: bool = True
    step_ok: Callable[[Any, Any], Any] | None = None


def value_grad_hessian(log_joint: Callable) -> Callable:
    """``x -> (log p(x), grad, hess)`` in one forward-over-reverse pass.

    ``jax.jacfwd`` of ``jax.value_and_grad`` carries the value and the gradient out as
    its primal, so ``log p`` is not evaluated a second time (a third of the cost of a
    step on the probit model). Used by :func:`jaxvb.methods.hessian` and
    :func:`jaxvb.methods.mixture`.

    Example:
      >>> import jax.numpy as jnp
      >>> fn = value_grad_hessian(lambda x: -jnp.sum(x**4) / 4)
      >>> value, grad, hess = fn(jnp.array([1.0, 2.0]))
      >>> float(value), grad.tolist(), jnp.diagonal(hess).tolist()
      (-4.25, [-1.0, -8.0], [-3.0, -12.0])
    """

    def value_and_grad(x):
        value, grad = jax.value_and_grad(log_joint)(x)
        return grad, (value, grad)

    def fn(x):
        hess, (value, grad) = jax.jacfwd(value_and_grad, has_aux=True)(x)
        return value, grad, hess

    return fn
