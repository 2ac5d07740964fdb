r"""The Gaussian field given the hyperparameters: one implementation for every latent fit.

Both ways of fitting a :class:`jaxvb.LatentGaussian` -- with a Gaussian ``q(theta)``
(:mod:`jaxvb.latent`) and with the paper's exponential-family ``q(theta)``
(:mod:`jaxvb.composite`; the stochastic-volatility model, the eight schools) --
approximate ``p(f | theta, y)`` by the exact prior times Gaussian sites ``(S, b)``:

    q(f | theta) ∝ N(f | m, Q^{-1}) exp(b'f - f'S f / 2),   P = Q + S,
    mu = P^{-1} c,   c = Q m + b,

and need the same three quantities of it, computed here:

* :func:`log_normaliser`, ``log Z(theta) = log ∫ N(f | m, Q^{-1}) exp(b'f - f'S f / 2)
  df = (log|Q| - log|P| + c'mu - m'Q m) / 2``;
* :func:`expected_log_site`, ``E_q[b'f - f'S f / 2] = b'mu - (mu'S mu + tr(S Sigma)) /
  2``, from the mean and the covariance on ``S``'s pattern only;
* :func:`site_shift`, Algorithm 2's ``b = E[grad log p(y|f)] + S E[f]`` from the
  averaged statistics (``S = E[-hess log p(y|f)]``).

The hyperparameters' target is then ``L(theta) = log p(theta) + log Z(theta) +
E_q[log p(y|f)] - E_q[log site]``, the ELBO with ``f`` integrated out.

The structure of ``Q`` (and of ``S``, which follows it) picks the operations:
:class:`Dense` (a ``(T, T)`` array, diagonal sites, ``O(T^3)``), :class:`Banded`
(:class:`jaxvb.linalg.Banded`, diagonal sites, ``O(T w^2)``) or :class:`Arrowhead`
(:class:`jaxvb.linalg.Arrowhead`: banded with a dense border, e.g. a state-space prior
with its level or fixed effects last; sites of the same pattern, diagonal band plus
border). :func:`ops` chooses from the prior's type.

With fixed effects last in the field, the sites are diagonal on a linear predictor
``eta = L f = f[:n] + X f[n:]``, so ``S = L' diag(a) L`` and the shift is ``L' b``
(:func:`add_linear_sites`, :func:`lift`, :func:`project`), and the site terms need the
marginal variances of ``eta`` (:func:`site_variances`, from :func:`covariance` on the
prior's pattern). :func:`moments_with_covariance`, :func:`draw` and
:func:`log_density` fuse passes where :mod:`jaxvb.linalg` can (bandwidth-1
arrowheads).

Example:
  A standard normal prior and one site ``exp(f - f^2 / 2)``: ``q(f)`` is ``N(1/2,
  1/2)`` and ``log Z = log E[exp(f - f^2 / 2)] = 1/4 - log(2) / 2``:

  >>> import jax.numpy as jnp
  >>> from jaxvb.latent import _field
  >>> o = _field.ops(jnp.eye(1))
  >>> chol, mean, var = o.moments(o.add_sites(jnp.eye(1), jnp.ones(1)), jnp.ones(1))
  >>> round(float(mean[0]), 6), round(float(var[0]), 6)
  (0.5, 0.5)
  >>> round(float(_field.log_normaliser(o, 0.0, chol, jnp.ones(1), mean)), 4)
  -0.0966
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax.scipy.linalg import cho_solve, solve_triangular

from jaxvb import linalg
from jaxvb._platform import after
from jaxvb.families._base import Array

_LOG_2PI = math.log(2.0 * math.pi)

__all__ = [
    "Arrowhead",
    "Banded",
    "Dense",
    "add_linear_sites",
    "covariance",
    "draw",
    "expected_log_site",
    "lift",
    "linear_variances",
    "moments_with_covariance",
    "log_density",
    "log_normaliser",
    "ops",
    "project",
    "site_shift",
    "site_variances",
    "trace_product",
]


class _Diagonal:
    """Diagonal sites ``S = diag(a)``, ``a`` of shape ``(T,)``; the covariance a
    factorisation hands them is the marginal variances ``diag(P^{-1})``."""

    @staticmethod
    def site_matvec(a, x):
        return a * x

    @staticmethod
    def site_quad(a, x):
        return jnp.sum(a * x * x)

    @staticmethod
    def site_trace(a, var):
        return jnp.sum(a * var)

    @classmethod
    def moments(cls, p, c):
        """``(factor, P^{-1} c, diag(P^{-1}))``."""
        chol = cls.chol(p)
        return chol, cls.solve(chol, c), cls.marginal_var(chol)


class Dense(_Diagonal):
    """``(T, T)`` precisions: ``O(T^3)`` Cholesky, solves and marginal variances."""

    @staticmethod
    def add_sites(q, a):
        return q + jnp.diag(a)

    @staticmethod
    def chol(p):
        return jnp.linalg.cholesky(p)

    @staticmethod
    def is_pd(c):
        return jnp.all(jnp.isfinite(c)) & jnp.all(jnp.diagonal(c) > 0)

    @staticmethod
    def logdet(c):
        return 2.0 * jnp.sum(jnp.log(jnp.diagonal(c)))

    @staticmethod
    def solve(c, b):
        return cho_solve((c, True), b)

    @staticmethod
    def marginal_var(c):
        # diag(P^{-1}) = column sums of (L^{-1})^2: one triangular solve, no P^{-1}.
        inv = solve_triangular(c, jnp.eye(c.shape[0], dtype=c.dtype), lower=True)
        return jnp.sum(inv * inv, axis=0)

    @staticmethod
    def back(c, z):
        return solve_triangular(c, z, lower=True, trans="T")

    @staticmethod
    def matvec(q, x):
        return q @ x


class Banded(_Diagonal):
    """:class:`jaxvb.linalg.Banded` precisions: ``O(T w^2)`` through ``jaxvb.linalg``."""

    @staticmethod
    def add_sites(q, a):
        return linalg.Banded(q.ab.at[0].add(a))

    @staticmethod
    def chol(p):
        return linalg.cholesky_banded(p.ab)

    is_pd = staticmethod(linalg.is_pd_banded)
    logdet = staticmethod(linalg.logdet_banded)
    solve = staticmethod(linalg.solve_banded)

    @staticmethod
    def marginal_var(c):
        return linalg.selected_inverse_banded(c)[0]

    @staticmethod
    def back(c, z):
        return linalg.solve_triangular_banded(c, z, transpose=True)

    @staticmethod
    def matvec(q, x):
        return linalg.matvec_banded(q.ab, x)


class Arrowhead:
    """:class:`jaxvb.linalg.Arrowhead` precisions (band ``(w + 1, T)``, border ``(T,
    k)``, corner ``(k, k)``), ``O(T (w^2 + w k + k^2))``; sites an ``Arrowhead`` with a
    diagonal band ``(1, T)``; the covariance a factorisation hands them is the selected
    inverse (:func:`jaxvb.linalg.selected_inverse_arrowhead`)."""

    @staticmethod
    def add_sites(q, s):
        return linalg.Arrowhead(
            q.band.at[0].add(s.band[0]), q.border + s.border, q.corner + s.corner
        )

    chol = staticmethod(linalg.cholesky_arrowhead)
    is_pd = staticmethod(linalg.is_pd_arrowhead)
    logdet = staticmethod(linalg.logdet_arrowhead)
    solve = staticmethod(linalg.solve_arrowhead)
    matvec = staticmethod(linalg.matvec_arrowhead)
    site_matvec = staticmethod(linalg.matvec_arrowhead)

    @staticmethod
    def moments(p, c):
        """``(factor, P^{-1} c, selected inverse)``; for bandwidth 1 in two scans
        (:func:`jaxvb.linalg.gaussian_arrowhead`)."""
        return linalg.gaussian_arrowhead(p, c)

    @staticmethod
    def back(c, z):
        return linalg.solve_triangular_arrowhead(c, z, transpose=True)

    @staticmethod
    def inner(a, b) -> Array:
        """``tr(A B)`` for symmetric arrowheads stored lower (off-diagonal entries
        count twice); ``B`` may be a selected inverse, ``A`` of its pattern or
        narrower."""
        w = a.band.shape[0]
        out = jnp.sum(a.band[0] * b.band[0])
        if w > 1:  # static: diagonal sites have no off-diagonal band
            out = out + 2.0 * jnp.sum(a.band[1:] * b.band[1:w])
        return out + 2.0 * jnp.sum(a.border * b.border) + jnp.sum(a.corner * b.corner)

    @staticmethod
    def site_quad(s, x):
        return x @ linalg.matvec_arrowhead(s, x)

    @classmethod
    def site_trace(cls, s, cov):
        return cls.inner(s, cov)


def ops(precision):
    """The operations for a prior precision: :class:`Banded`, :class:`Arrowhead` or
    :class:`Dense` (any other array)."""
    if isinstance(precision, linalg.Banded):
        return Banded
    if isinstance(precision, linalg.Arrowhead):
        return Arrowhead
    return Dense


def log_normaliser(o, logdet_prior, chol, c, mean, prior_quad=None) -> Array:
    """``log Z = (log|Q| - log|P| + c'mu - m'Q m) / 2`` from ``log|Q|`` (a
    pseudo-determinant where ``Q`` is flat in some directions that the sites
    inform), the factor of ``P``, ``c = Q m + b``, ``mu = P^{-1} c`` and ``m'Q m``
    (``prior_quad``; ``None`` for a zero prior mean)."""
    value = logdet_prior - o.logdet(chol) + jnp.dot(c, mean)
    return 0.5 * (value if prior_quad is None else value - prior_quad)


def expected_log_site(o, sites, shift, mean, cov) -> Array:
    """``E_q[b'f - f'S f / 2] = b'mu - (mu'S mu + tr(S Sigma)) / 2``, with ``cov`` the
    covariance on ``S``'s pattern (:meth:`Dense.moments` and the like)."""
    return jnp.dot(shift, mean) - 0.5 * (
        o.site_quad(sites, mean) + o.site_trace(sites, cov)
    )


def site_shift(o, sites, grad, mean) -> Array:
    """Algorithm 2's ``b = E[grad log p(y|f)] + S E[f]`` (``sites`` is ``S``)."""
    return grad + o.site_matvec(sites, mean)


# --------------------------------------------------- sites on a linear predictor
#
# With fixed effects in the field, f = (u, beta) of length N = n + p, the n sites see
# the linear predictor eta = L f = u + X beta (L = [I_n, X]; X = None means X = 0,
# sites on the first n values only, as for a level that enters through the prior):
# diagonal sites (a, b) on eta are S = L' diag(a) L and shift L' b on f, an arrowhead
# pattern (diagonal band, border a X, corner X' diag(a) X). The site terms themselves
# (E log site, Algorithm 2's statistics) are then those of diagonal sites on eta, with
# its marginal means L mu and variances diag(L Sigma L').


def project(x, design, n: int) -> Array:
    """``eta = x[:n] + X x[n:]`` (``x[..., :n]`` where ``design`` is ``None``)."""
    eta = x[..., :n]
    if design is None:
        return eta
    return eta + x[..., n:] @ design.T


def lift(b, design, num_field: int) -> Array:
    """``L' b``: ``(b, X' b)``, zeros for the fixed effects where ``design`` is
    ``None``."""
    n = b.shape[-1]
    if num_field == n:
        return b
    rest = (
        jnp.zeros(b.shape[:-1] + (num_field - n,), b.dtype)
        if design is None
        else b @ design
    )
    return jnp.concatenate([b, rest], axis=-1)


def add_linear_sites(o, q, a, design, n: int):
    """``P = Q + L' diag(a) L`` in ``Q``'s structure."""
    if o is Banded:
        return Banded.add_sites(q, a)
    if o is Arrowhead:
        band = q.band.at[0].add(a)
        if design is None:
            return linalg.Arrowhead(band, q.border, q.corner)
        ax = a[:, None] * design
        return linalg.Arrowhead(band, q.border + ax, q.corner + design.T @ ax)
    p = q.at[jnp.arange(n), jnp.arange(n)].add(a)
    if design is None:
        return p
    ax = a[:, None] * design
    return p.at[:n, n:].add(ax).at[n:, :n].add(ax.T).at[n:, n:].add(design.T @ ax)


def covariance(o, chol):
    """``Sigma = P^{-1}`` on ``P``'s pattern from its factor: the band (Banded, lower
    band form), the arrowhead's blocks (Arrowhead) or the whole matrix (Dense)."""
    if o is Banded:
        return linalg.selected_inverse_banded(chol)
    if o is Arrowhead:
        return linalg.selected_inverse_arrowhead(chol)
    inv = solve_triangular(chol, jnp.eye(chol.shape[0], dtype=chol.dtype), lower=True)
    return inv.T @ inv


def trace_product(o, cov, q) -> Array:
    """``tr(Sigma Q)`` for ``Q`` of the prior's pattern and ``Sigma`` from
    :func:`covariance` (off-diagonal entries of the band forms count twice)."""
    if o is Banded:
        w = q.ab.shape[0]
        out = jnp.sum(cov[0] * q.ab[0])
        return out + 2.0 * jnp.sum(cov[1:w] * q.ab[1:]) if w > 1 else out
    if o is Arrowhead:
        return Arrowhead.inner(q, cov)
    return jnp.sum(cov * q)


def linear_variances(o, cov, design, n: int) -> Array:
    """``diag(L Sigma L')`` from :func:`covariance`: the variances of ``eta``."""
    if o is Banded:
        return cov[0]
    if o is Arrowhead:
        var, border, corner = cov.band[0], cov.border, cov.corner
    else:
        var, border, corner = jnp.diagonal(cov)[:n], cov[:n, n:], cov[n:, n:]
    if design is None:
        return var
    return (
        var
        + 2.0 * jnp.sum(design * border, axis=1)
        + jnp.sum((design @ corner) * design, axis=1)
    )


def site_variances(o, chol, design, n: int) -> Array:
    """``diag(L P^{-1} L')``, the marginal variances of ``eta`` under ``N(., P^{-1})``,
    from ``P``'s factor (selected inverse: no dense ``P^{-1}`` but in the dense
    case)."""
    if o is Dense and design is None and chol.shape[0] == n:
        return Dense.marginal_var(chol)
    return linear_variances(o, covariance(o, chol), design, n)


# ------------------------------------------------------- fused passes for speed
#
# Inside an iteration a scan's per-row overhead, not its arithmetic, is the cost of
# the banded algebra: where jaxvb.linalg fuses passes (bandwidth-1 arrowheads, the SV
# and random-walk priors), use them.


def moments_with_covariance(o, p, c):
    """``(factor, P^{-1} c, covariance on P's pattern)`` (:func:`covariance`); for a
    bandwidth-1 arrowhead in two scans (:func:`jaxvb.linalg.gaussian_arrowhead`)."""
    if o is Arrowhead:
        return linalg.gaussian_arrowhead(p, c)
    chol = o.chol(p)
    return chol, o.solve(chol, c), covariance(o, chol)


def draw(o, p, c, z):
    """``(f, log|P|)``: ``f = P^{-1} c + L'^{-1} z`` for ``P = L L'``, a draw of
    ``N(P^{-1} c, P^{-1})`` from standard normal noise ``z``; for a bandwidth-1
    arrowhead the factor and ``L^{-1} c`` share one scan
    (:func:`jaxvb.linalg.cholesky_forward_arrowhead`)."""
    if o is Arrowhead:
        chol, y = linalg.cholesky_forward_arrowhead(p, c)
        return linalg.solve_triangular_arrowhead(chol, y + z, transpose=True), o.logdet(
            chol
        )
    chol = o.chol(p)
    mean = o.solve(chol, c)
    # the noise's solve after the mean's, not beside it: under vmap both are batched
    # triangular solves, and two at once can hang jaxlib 0.10 (jaxvb._platform.after)
    return mean + o.back(chol, after(z, mean)), o.logdet(chol)


def log_density(o, p, c, f) -> Array:
    """``log N(f | P^{-1} c, P^{-1})``; for a bandwidth-1 arrowhead in one scan,
    ``log|L| - |L'f - L^{-1}c|^2 / 2 - N log(2 pi) / 2``."""
    n = f.shape[-1]
    if o is Arrowhead:
        chol, y = linalg.cholesky_forward_arrowhead(p, c)
        r = linalg.matvec_triangular_arrowhead(chol, f, transpose=True) - y
        return 0.5 * (o.logdet(chol) - r @ r - n * _LOG_2PI)
    chol = o.chol(p)
    d = f - o.solve(chol, c)
    return 0.5 * (o.logdet(chol) - n * _LOG_2PI) - 0.5 * jnp.dot(d, o.matvec(p, d))
