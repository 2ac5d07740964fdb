"""Sections 5.2 and 5.4: the regression statistics from the gradient of the log posterior.

Without the intercept (Appendix A, Frisch-Waugh-Lovell) the KL-optimal natural parameters
solve (eq. covgrad)

    eta = Cov_q[T, T]^{-1} Cov_q[T, log p],

and for an exponential family both covariances are derivatives in ``eta`` of
expectations under ``q_eta`` (eqs. reggrad1, reggrad2):

    C = Cov_q[T, T] = d/deta E_q[T(x)],    g = Cov_q[T, log p] = d/deta E_q[log p(x)].

With a differentiable sampler ``x* = s(eta, z*)`` one draw gives unbiased estimates of
both (eq. grad):

    C^ = d/deta T(s(eta, z*))   (k x k),    g^ = d/deta log p(s(eta, z*))   (k,),

with ``C^[i, j] = dT_j / deta_i``, and again the *same* ``z*`` for both, so that when
``p`` is in the family (``log p = T eta_p + c``) every draw satisfies ``g^ = C^ eta_p``
exactly and the average of the second half solves to ``eta_p``.

Section 5.4: differentiating in other parameters ``phi(eta)`` instead multiplies both
statistics on the left by ``K = (d eta / d phi)'``, a linear transformation of the
regression that leaves its solution, the natural parameters, unchanged
(eq. vblinregtrans, eq. grad2):

    C^ = d/dphi T(s(phi, z*)),    g^ = d/dphi log p(s(phi, z*)),    eta = C^{-1} g.

Gamma, Beta and InverseGamma draws are differentiated through
:mod:`jaxvb._gamma`, whose derivatives in the concentration are the implicit
(inverse-transform) ones of eq. invtrans: the sampler itself is a rejection sampler,
which, as the paper notes, does not matter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from jaxvb._algebra import solve_equilibrated
from jaxvb.families._base import build
from jaxvb.families.gaussian import Gaussian
from jaxvb.methods._base import Method, require_exponential_family
from jaxvb.methods._registry import register


class GradientStats(NamedTuple):
    """``C`` (``(k, k)``, not symmetric) and ``g`` (``(k,)``) of eq. grad.

    Example:
      The method's starting statistics: the Fisher information and ``C eta``.

      >>> import jax, jax.numpy as jnp, jaxvb
      >>> q0 = jaxvb.Gamma(jnp.ones(1), jnp.ones(1))
      >>> method = jaxvb.methods.gradient()
      >>> stats = method.init(jax.random.key(0), q0, None)
      >>> stats.C.shape, stats.g.shape, method.solve(stats, q0, None)
      ((2, 2), (2,), Gamma(concentration=[1.0], rate=[1.0]))
    """

    C: jax.Array
    g: jax.Array


class Parameterization(NamedTuple):
    """The parameters ``phi`` a method differentiates in (sec. 5.4).

    Both functions are pure; ``phi`` must have as many elements as there are natural
    parameters (``q.num_stats``), and ``phi -> q`` must be invertible and differentiable
    near the current ``q``, so that ``K = (d eta / d phi)'`` is invertible.

    Attributes:
      to_params: ``to_params(q) -> phi``, shape ``(k,)``.
      from_params: ``from_params(q, phi) -> q'``, the family of ``q``'s type and shape
        with parameters ``phi`` (``q`` supplies only the type and the shape).

    Example:
      A Gamma differentiated in its log concentration and log rate:

      >>> import jax.numpy as jnp, jaxvb
      >>> from jaxvb.methods import Parameterization
      >>> log_params = Parameterization(
      ...     to_params=lambda q: jnp.log(jnp.concatenate([q.concentration, q.rate])),
      ...     from_params=lambda q, phi: jaxvb.Gamma(*jnp.split(jnp.exp(phi), 2)))
      >>> q = jaxvb.Gamma(jnp.array([4.0]), jnp.array([2.0]))
      >>> log_params.from_params(q, log_params.to_params(q))
      Gamma(concentration=[4.0], rate=[2.0])
      >>> method = jaxvb.methods.gradient(log_params)   # for jaxvb.fit(..., method=method)
    """

    to_params: Callable[[Any], jax.Array]
    from_params: Callable[[Any, jax.Array], Any]


def _check_gaussian(q) -> None:
    if not isinstance(q, Gaussian):
        raise TypeError(
            f"the MEAN_CHOLESKY parameterization is for jaxvb.Gaussian, got "
            f"{type(q).__name__}; use parameterization=None (natural parameters) or one "
            "written for that family."
        )


def _mean_cholesky_to_params(q) -> jax.Array:
    _check_gaussian(q)
    i, j = np.tril_indices(q.dim)
    return jnp.concatenate([q.mean, q.scale_tril[i, j]])


def _mean_cholesky_from_params(q, phi) -> Gaussian:
    _check_gaussian(q)
    d = q.dim
    i, j = np.tril_indices(d)
    chol = jnp.zeros((d, d), phi.dtype).at[i, j].set(phi[d:])
    # The precision factor is chol^{-T}; its draws m + chol z (Gaussian.from_noise).
    eye = jnp.eye(d, dtype=phi.dtype)
    factor = solve_triangular(chol, eye, lower=True).T
    return build(Gaussian, mean=phi[:d], precision_factor=factor)


#: ``phi = (m, L[i, j] for i >= j)`` with ``L`` the lower Cholesky factor of the
#: covariance, for :class:`~jaxvb.Gaussian`: the location-scale form ``x = m + L z``,
#: in which a draw is *linear* in ``phi``. Why choose it: ``C^`` and ``g^`` are then the
#: familiar reparameterisation gradients (``dx/dm = I``, ``dx/dL_ij = z_j e_i``), and
#: the derivatives do not pass through the inversions ``(P m, P) -> (m, V) -> chol(V)``
#: that the natural parameters require, which lose accuracy when the precision is badly
#: conditioned (a same-family 2-D target solved from the fewest draws, 6 steps: worst
#: relative error over 200 keys 2e-10 here, 5e-6 in the natural parameters). It has
#: the same ``d + d(d + 1)/2`` parameters as ``eta`` and maps positive-diagonal ``L``
#: one to one onto proper Gaussians. The fixed point is the same as in the natural
#: parameters; the finite-sample averages differ (sec. 5.4), so the two are different
#: estimators of it (on a 1-D quartic target their spreads are equal).
MEAN_CHOLESKY = Parameterization(_mean_cholesky_to_params, _mean_cholesky_from_params)


def _natural_from_params(q, eta):
    return q.from_natural(eta)


def _natural_to_params(q):
    return q.natural_params


NATURAL = Parameterization(_natural_to_params, _natural_from_params)


def _check_parameterization(p: Parameterization, q0, key) -> None:
    k = q0.num_stats
    phi = jax.eval_shape(p.to_params, q0)
    if getattr(phi, "shape", None) != (k,):
        raise ValueError(
            f"parameterization.to_params must return a vector of the {k} parameters of "
            f"{type(q0).__name__} (as many as its natural parameters, so that the "
            f"regression is square), got shape {getattr(phi, 'shape', phi)}."
        )
    q = jax.eval_shape(p.from_params, q0, phi)
    if type(q) is not type(q0):
        raise TypeError(
            f"parameterization.from_params must return a {type(q0).__name__}, got "
            f"{type(q).__name__}."
        )
    x = jax.eval_shape(lambda q, key: q.from_noise(q.noise(key)), q0, key)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"the gradient method differentiates the draws of q, but {type(q0).__name__} "
            f"draws are {x.dtype}; use method='regression' for a discrete family."
        )


@functools.cache
def gradient(parameterization: Parameterization | None = None) -> Method:
    """Stochastic linear regression with statistics from ``grad log p`` (sec. 5.2, 5.4).

    Each step differentiates one reparameterised draw ``x* = s(phi, z*)`` of ``q``
    (``jax.jacfwd``, ``k`` forward passes through the sampler, ``log_joint`` and ``T``)
    to get ``C^ = d/dphi T(x*)`` and ``g^ = d/dphi log p(x*)`` (eqs. grad, grad2), then
    ``eta = C^{-1} g``. A draw carries ``dim(x)`` equations instead of one (``C^`` has
    rank ``dim(x)``), so the averaged statistics are solvable after ``ceil(k / dim(x))``
    draws instead of ``k + 1``, and the noise is typically smaller than Algorithm 1's
    ("about the same information as 2 dim(x) iterations"); the price is that ``log_joint`` must be differentiable in ``x`` and ``q`` must have a
    differentiable sampler (Gaussian, Exponential, Gamma, Beta, InverseGamma here).

    ``C_1 = d/dphi E_{q0}[T]`` (the Fisher information when ``phi = eta``, eq. reggrad1)
    and ``g_1 = C_1 eta_1``, the analogue of Algorithm 1's initialisation; ``fit`` does
    the running average and the average over the second half.

    Args:
      parameterization: the parameters ``phi`` to differentiate in (sec. 5.4);
        ``None`` for the natural parameters ``eta`` (eq. grad). :data:`MEAN_CHOLESKY`
        is the location-scale form of a Gaussian; any :class:`Parameterization` (a pair
        ``(to_params, from_params)``) with ``k`` parameters works. The solution is
        always the natural parameters.

    Returns:
      A :class:`~jaxvb.methods.Method` for :func:`jaxvb.fit`.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> from jaxvb.methods.gradient import MEAN_CHOLESKY, gradient
      >>> log_joint = lambda x: -0.5 * jnp.sum((x - 1.0) ** 2) / 4.0   # N(1, 4)
      >>> q0 = jaxvb.Gaussian(jnp.zeros(1), jnp.eye(1))
      >>> res = jaxvb.fit(log_joint, q0, jax.random.key(0), num_steps=4,
      ...                 method=gradient(MEAN_CHOLESKY))
      >>> [round(float(v), 10) for v in (res.q.mean[0], res.q.cov[0, 0])]
      [1.0, 4.0]
    """
    if parameterization is None:
        param = NATURAL
    else:
        if not (isinstance(parameterization, tuple) and len(parameterization) == 2):
            raise TypeError(
                "parameterization must be None or a pair of functions "
                f"(to_params, from_params), got {parameterization!r}"
            )
        param = Parameterization(*parameterization)

    def init_fn(key, q0, log_joint):
        del log_joint
        require_exponential_family(q0, "gradient")
        _check_parameterization(param, q0, key)
        if parameterization is None:
            c = q0.fisher_information
        else:
            phi = param.to_params(q0)
            jac = jax.jacfwd(lambda p: param.from_params(q0, p).mean_sufficient_stats)(phi)
            c = jac.T
        return GradientStats(C=c, g=c @ q0.natural_params)

    def noise_fn(key, q):
        return q.noise(key)

    def estimate_fn(noise, q, log_joint):
        def stats_and_log_p(phi):
            q_phi = param.from_params(q, phi)
            x = q_phi.from_noise(noise)
            log_p = log_joint(x) - q_phi.log_base_measure(x)
            t = q_phi.sufficient_stats(x)
            return jnp.concatenate([t, log_p[None]]), (x, log_p)

        # One jacfwd for both statistics: rows of the Jacobian are T_1..T_k and log p.
        jac, (x, log_p) = jax.jacfwd(stats_and_log_p, has_aux=True)(param.to_params(q))
        return GradientStats(C=jac[:-1].T, g=jac[-1]), x, log_p

    def solve_fn(stats, q, log_joint=None):
        del log_joint
        return q.from_natural(solve_equilibrated(stats.C, stats.g))

    def min_draws(q):
        require_exponential_family(q, "gradient")
        # C^ = (dx/dphi)' (dT/dx)' has rank at most dim(x): a draw gives dim(x) of the
        # k equations, so the average needs ceil(k / dim(x)) draws to be solvable.
        return -(-q.num_stats // max(math.prod(q.event_shape), 1))

    label = "natural" if parameterization is None else "custom"
    if param == MEAN_CHOLESKY:
        label = "mean_cholesky"
    return Method(
        name=f"gradient({label})",
        init=init_fn,
        noise=noise_fn,
        estimate=estimate_fn,
        solve=solve_fn,
        min_draws=min_draws,
    )


register("gradient", gradient)
