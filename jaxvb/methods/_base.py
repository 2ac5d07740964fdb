"""The protocol between ``fit`` and a method: ``init / noise / estimate / solve``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from jaxvb.families._base import ExponentialFamily


def require_exponential_family(q: Any, method: str) -> None:
    """Raises a ``TypeError`` naming the remedy where ``q`` is no exponential family.

    Algorithm 1 and the gradient estimator regress on the sufficient statistics of
    ``q``; a family without them (a mixture) has a method of its own.
    """
    if not isinstance(q, ExponentialFamily):
        raise TypeError(
            f"method={method!r} needs an exponential family q0 (a jaxvb.ExponentialFamily "
            f"with sufficient statistics T(x)); {type(q).__name__} is not an exponential "
            "family. Use the method it is registered with: jaxvb.fit's default for it."
        )


class Method(NamedTuple):
    """A way of forming and solving the regression statistics of the paper.

    ``fit`` is the only loop; a method only says which statistics it keeps and how one
    draw estimates them. All its functions are pure and traceable. Each that can
    need the model is given the ``log_joint`` passed to ``fit`` as it is (for a
    minibatch log joint, that step's estimate), so a method that reads structure from
    it (:func:`jaxvb.methods.sites` reads a :class:`jaxvb.Factors`) needs no more;
    ``fit`` casts the statistics to ``q``'s dtype.

    Attributes:
      name: a short label for messages.
      init: ``init(key, q0, log_joint) -> stats``, the statistics at the start
        (Algorithm 1: ``C_1`` and ``g_1 = C_1 eta~_1``).
      noise: ``noise(key, q) -> noise``, the randomness of one estimate.
      estimate: ``estimate(noise, q, log_joint) -> (stats_hat, x, log_p)``: an unbiased
        estimate of the statistics at ``q`` from one draw, the draw ``x`` and
        ``log_joint(x)``.
      solve: ``solve(stats, q, log_joint) -> q_new``, the approximation the statistics
        define (possibly improper; ``fit`` checks ``q_new.is_proper``).
      min_draws: ``min_draws(q) -> int``, how many draws the averaged statistics must
        hold to be solvable (``k + 1`` for a full regression).
      accept: ``None``, or ``accept(q, q_new) -> bool``: whether ``fit``'s step control
        takes an update whole. ``None`` takes every proper update. A step whose
        update is refused is halved (up to ``max_backtracks`` times); after that a
        proper update is taken at the smallest step and an improper one skipped.
        Set by wrappers such as :func:`trust_region`, not by a method for itself.
      reframe: ``None``, or ``reframe(stats, q, q_new) -> stats``, for a method whose
        statistics are taken relative to the current ``q`` (Algorithm 1 centres and
        whitens ``T(x)`` by ``q``'s mean and covariance, so that float32 keeps what a
        concentrated ``q`` puts in the last digits of the raw ``E[T~' T~]``): the same
        statistics, relative to ``q_new``.
        It must be linear, since the kernel applies it to the running statistics and
        to the sums of the averaged steps alike, each time ``q`` moves.

    Example:
      The factories of :mod:`jaxvb.methods` build them; ``fit`` takes any ``Method``:

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.Gamma(jnp.ones(1), jnp.ones(1))
      >>> method = jaxvb.methods.regression(estimator="analytic", intercept="normalized")
      >>> method.name, method.min_draws(q0), jaxvb.methods.regression().min_draws(q0)
      ('regression(analytic, init=analytic)', 1, 3)
      >>> stats = method.init(jax.random.key(0), q0, None)   # C_1, g_1 = C_1 eta~_1 ...
      >>> q1 = method.solve(stats, q0, None)                 # ... which solve back to q0
      >>> bool(jnp.allclose(q1.natural_params, q0.natural_params))
      True
    """

    name: str
    init: Callable[[Any, Any, Callable], Any]
    noise: Callable[[Any, Any], Any]
    estimate: Callable[[Any, Any, Callable], tuple[Any, Any, Any]]
    solve: Callable[[Any, Any, Callable], Any]
    min_draws: Callable[[Any], int]
    accept: Callable[[Any, Any], Any] | None = None
    reframe: Callable[[Any, Any, Any], Any] | None = None


def trust_region(
    method: Method, distance: Callable[[Any, Any], Any], max_distance: float
) -> Method:
    """``method`` whose step control refuses updates farther than ``max_distance``.

    An update ``q_new`` with ``distance(q, q_new) > max_distance`` (or NaN) is treated
    as ``fit``'s step control treats an improper one: the step is halved and tried
    again; after ``max_backtracks`` halvings the last proper attempt is taken (and
    counted in ``Result.num_damped_steps``). A guard against the rare huge update of a
    noisy single-draw estimate; the averaged statistics are not changed.

    Args:
      method: any :class:`Method`.
      distance: ``(q, q_new) -> scalar``, e.g. a KL divergence.
      max_distance: the largest accepted distance.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jaxvb.methods import regression, trust_region
      >>> kl = lambda q, q_new: q_new.kl_divergence(q)
      >>> method = trust_region(regression(), kl, 0.01)
      >>> res = jaxvb.fit(lambda x: 3.0 * jnp.log(x[0]) - 2.0 * x[0],   # Gamma(4, 2)
      ...                 jaxvb.Gamma(jnp.ones(1), jnp.ones(1)), jax.random.key(0),
      ...                 num_steps=50, method=method)
      >>> method.name, int(res.num_damped_steps) > 0, res.q.concentration.round(4).tolist()
      ('regression(joint, init=analytic)+trust_region(0.01)', True, [4.0])
    """
    inner = method.accept

    def accept(q, q_new):
        ok = distance(q, q_new) <= max_distance  # False for NaN
        return ok if inner is None else ok & inner(q, q_new)

    return method._replace(
        name=f"{method.name}+trust_region({max_distance:g})", accept=accept
    )


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
