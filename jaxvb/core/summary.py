"""A printed summary of a fit: per-parameter moments and quantiles, then the diagnostics.

``jaxvb.summary(res)`` (also ``res.summary()`` and ``print(res)``) reads like ArviZ's
``az.summary`` or Stan's ``print(fit)``: one row per parameter with its mean, standard
deviation and central quantiles under the fitted ``q``, then the ELBO with its Monte
Carlo standard error, the log evidence, the KL, R^2, the Pareto k-hat and the status in
words (:func:`jaxvb.explain`).

Where the family has the marginals in closed form the rows are exact (Gaussian;
Gamma, Inverse-Gamma, Beta and Exponential by their CDFs; a Gaussian mixture's
marginals by its CDF): their ``mcse`` is shown as ``-``. Other rows (NumPyro sites on
their constrained scale, a latent field and its model's transformed hyperparameters,
a family without closed forms) come from independent draws of ``q`` (key 0 unless one
is given, so the same result prints the same table); ``mcse`` is the Monte Carlo
standard error of their mean, ``sd / sqrt(n)``. A NumPyro fit's rows come from its
default draws, importance-resampled (:meth:`jaxvb.numpyro.NumPyroResult.sample`;
``mcse`` over the weights' effective number where that is smaller), with ``q``'s own
mean and sd in two more columns.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import betainc, gammainc, gammaincc, ndtr

from jaxvb.core.status import Status, explain
from jaxvb.families._base import is_concrete
from jaxvb.families.beta import Beta
from jaxvb.families.exponential import Exponential
from jaxvb.families.gamma import Gamma
from jaxvb.families.gaussian import Gaussian
from jaxvb.families.inverse_gamma import InverseGamma
from jaxvb.families.mixture import GaussianMixture

if TYPE_CHECKING:  # Result's module imports this one
    from jaxvb.core.result import Result

__all__ = ["Summary", "summary"]

#: Draws are limited so that draws x elements stay below this (memory: 400 MB in
#: float64); a long latent field is summarised from fewer draws, and says so.
MAX_DRAWN_ELEMENTS = 50_000_000
_WIDTH = 88


@dataclasses.dataclass(frozen=True)
class Summary:
    """A fit's summary: a table (``names`` x ``columns``) and lines below it.

    ``str(summary)`` (and its ``repr``, so that a REPL shows it) is the printed table.

    Attributes:
      names: the row labels (``x[0]``, ``beta[1]``, ``theta[0]``, ...).
      columns: the column labels, ``("mean", "sd", "5%", "50%", "95%", "mcse")`` for a
        single fit (the quantiles follow ``prob``); per-item diagnostics for a batch.
      values: ``(len(names), len(columns))`` float64; ``mcse`` is 0 for exact rows.
      notes: lines printed under the table (a long vector site or latent field in one
        line each, where the draws came from).
      diagnostics: label -> value, the fit's ELBO, its standard error, log evidence,
        KL, R^2, k-hat and status (empty for a batch).
      status: the status in words (:func:`jaxvb.explain`); empty for a batch.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> res = jaxvb.fit(lambda x: -0.5 * jnp.sum((x - 1.0) ** 2), jnp.zeros(2),
      ...                 jax.random.key(0), num_steps=20)
      >>> s = res.summary(names=["a", "b"])
      >>> s.names, s.columns
      (('a', 'b'), ('mean', 'sd', '5%', '50%', '95%', 'mcse'))
      >>> s.values[0].round(4).tolist()     # N(1, 1): exact moments and quantiles
      [1.0, 1.0, -0.6449, 1.0, 2.6449, 0.0]
      >>> round(s["b"]["95%"], 4), s.status
      (2.6449, 'ok')
    """

    names: tuple[str, ...]
    columns: tuple[str, ...]
    values: np.ndarray
    notes: tuple[str, ...] = ()
    diagnostics: dict[str, float] = dataclasses.field(default_factory=dict)
    status: str = ""
    title: str = ""

    def __getitem__(self, name: str) -> dict[str, float]:
        """The row ``name`` as ``{column: value}``."""
        try:
            i = self.names.index(name)
        except ValueError:
            raise KeyError(
                f"no row {name!r} in the summary; rows: {', '.join(self.names)}"
            ) from None
        return {c: float(v) for c, v in zip(self.columns, self.values[i], strict=True)}

    def __str__(self) -> str:
        lines = [self.title] if self.title else []
        lines += _table(self.names, self.columns, self.values)
        lines += [""] * bool(self.notes) + list(self.notes)
        if self.diagnostics:
            lines.append("")
            lines += _footer(self.diagnostics)
        if self.status:
            lines += textwrap.wrap(
                f"status        {self.status}",
                _WIDTH,
                subsequent_indent=" " * 14,
                break_on_hyphens=False,
            )
        return "\n".join(lines)

    __repr__ = __str__


def summary(
    result: Any,
    key: jax.Array | None = None,
    num_samples: int = 4000,
    names: Sequence[str] | None = None,
    prob: float = 0.9,
    max_rows: int = 10,
) -> Summary:
    """The summary table of a fit: per parameter, mean, sd and quantiles; then the
    ELBO, log evidence, KL, R^2, k-hat and status in words.

    Args:
      result: a :class:`jaxvb.Result`, a :class:`jaxvb.numpyro.NumPyroResult` (rows
        per site on the model's constrained scale, ``beta[0]``, ``beta[1]``, ... for
        vector sites, deterministic sites included), or a batch of either (from
        ``jax.vmap`` or :func:`jaxvb.fit_batched`: one row of diagnostics per fit).
        For a :class:`jaxvb.LatentGaussian` fit, the rows are the hyperparameters
        (named by the model's ``theta_names``, else ``theta[i]``; exact, or from
        draws of ``q(theta)`` on the scale of its ``theta_transforms``) and the field
        (named by its ``field_name``, ``f`` by default).
      key: the key for rows computed from draws; default ``jax.random.key(0)`` (a
        result always prints the same table). Exact rows use no draws.
      num_samples: draws for those rows (fewer for a very long field: at most
        ``MAX_DRAWN_ELEMENTS`` numbers in all; the table says how many).
      names: for a plain result, one label per coordinate of ``x`` (default
        ``x[0]``, ``x[1]``, ...; for a latent Gaussian fit's hyperparameters, the
        model's ``theta_names`` or ``theta[i]``); for a NumPyro result, the sites to
        show (default all its latent and deterministic sites, in model order).
      prob: the central probability the quantile columns span, e.g. 0.9 gives 5%,
        50% and 95%.
      max_rows: a vector site (or latent field) with more elements is one line under
        the table (the range of its means and sds) instead of one row per element.

    Returns:
      A :class:`Summary`; ``print`` it.

    Raises:
      TypeError: for a traced result (inside ``jit``/``vmap``/``grad``): summarise
        what the traced function returns.

    Example:
      >>> import jax, jax.numpy as jnp, jaxvb
      >>> res = jaxvb.fit(lambda x: -0.5 * jnp.sum((x - 1.0) ** 2 / 4.0), jnp.zeros(2),
      ...                 jax.random.key(0), num_steps=20)
      >>> print(jaxvb.summary(res))   # N(1, 4) in each coordinate
                mean        sd        5%       50%       95%      mcse
      x[0]         1         2     -2.29         1      4.29         -
      x[1]         1         2     -2.29         1      4.29         -
      <BLANKLINE>
      (-: exact, from q's closed form)
      <BLANKLINE>
      ELBO          3.224 ± ... (± Monte Carlo standard error)
      log evidence  3.224 ... (ELBO + KL)
      ...
      status        ok
    """
    if not 0.0 < prob < 1.0:
        raise ValueError(f"summary: prob must be in (0, 1), got {prob!r}")
    if not isinstance(num_samples, (int, np.integer)) or num_samples < 2:
        raise ValueError(
            f"summary: num_samples must be an integer >= 2, got {num_samples!r}"
        )
    base = _base_result(result)
    leaves = jax.tree_util.tree_leaves(result)
    if not all(is_concrete(v) for v in leaves):
        raise TypeError(
            "summary: the result holds traced values (it is inside jax.jit, jax.vmap or "
            "jax.grad); summarise the result that the traced function returns, outside "
            "it."
        )
    if np.ndim(base.status) != 0:
        return _batch_summary(base, one="res[i]" if base is not result else None)
    key = jax.random.key(0) if key is None else key
    probs = ((1.0 - prob) / 2.0, 0.5, (1.0 + prob) / 2.0)
    columns = ("mean", "sd", *(f"{100 * p:.4g}%" for p in probs), "mcse")
    if base is not result:
        rows, notes = _numpyro_rows(result, key, num_samples, names, probs, max_rows)
        if rows and len(rows[0][1]) > len(columns):  # q's own mean and sd beside
            columns = (*columns, "q mean", "q sd")
    else:
        rows, notes = _rows(result.q, key, num_samples, names, probs, max_rows)
    values = np.array([r[1] for r in rows], np.float64).reshape(len(rows), len(columns))
    exact = [r[2] for r in rows]
    if any(exact):
        notes = ["(-: exact, from q's closed form)", *notes]
    table = Summary(
        names=tuple(r[0] for r in rows),
        columns=columns,
        values=values,
        notes=tuple(notes),
        diagnostics=_diagnostics(base),
        status=_status(base),
    )
    return table


def text(result: Result) -> str:
    """``str(result)``: the summary, or the plain tuple form for a traced result."""
    leaves = jax.tree_util.tree_leaves(result)
    if not all(is_concrete(v) for v in leaves):
        return repr(result)
    return str(summary(result))


# ---------------------------------------------------------------------------- rows


def _is_result(obj: Any) -> bool:
    """Whether ``obj`` is a :class:`jaxvb.Result` (whose module imports this one)."""
    return type(obj).__name__ == "Result" and type(obj).__module__ == "jaxvb.core.result"


def _base_result(result: Any) -> Result:
    if _is_result(result):
        return result
    inner = getattr(result, "result", None)
    if _is_result(inner) and hasattr(result, "log_joint"):
        return inner
    raise TypeError(
        f"summary: expected a jaxvb.Result or a jaxvb.numpyro.NumPyroResult, got "
        f"{type(result).__name__}"
    )


def _labels(prefix: str, shape: tuple[int, ...]) -> list[str]:
    if shape == ():
        return [prefix]
    return [f"{prefix}[{','.join(map(str, i))}]" for i in np.ndindex(*shape)]


def _exact(mean, sd, quantiles) -> list[tuple[list[float], bool]]:
    mean, sd = np.ravel(mean), np.ravel(sd)
    q = np.reshape(quantiles, (mean.size, -1))
    return [([mean[i], sd[i], *q[i], 0.0], True) for i in range(mean.size)]


def _from_draws(draws: np.ndarray, probs, effective=None) -> list[tuple[list[float], bool]]:
    """Rows from ``(n, m)`` draws: mean, sd, quantiles, mcse = sd / sqrt(n) (or over
    the square root of ``effective`` draws, where fewer: resampled draws)."""
    draws = np.asarray(draws, np.float64)
    n = draws.shape[0] if effective is None else min(draws.shape[0], effective)
    mean = draws.mean(0)
    sd = draws.std(0, ddof=1)
    q = np.quantile(draws, probs, axis=0).T
    return [
        ([mean[i], sd[i], *q[i], sd[i] / math.sqrt(n)], False) for i in range(mean.size)
    ]


def _rows(q, key, num_samples, names, probs, max_rows):
    """Rows ``(label, values, exact)`` and notes for the fitted family ``q``."""
    notes = []
    if hasattr(q, "num_hyper"):  # a latent field's q(theta) q(f | theta)
        return _latent_rows(q, key, num_samples, names, probs, max_rows)
    shape = tuple(q.event_shape)
    size = math.prod(shape)
    labels = _given_names(names, size, "x", shape)
    stats = _closed_form(q, probs)
    if stats is None:
        n = _num_draws(num_samples, size)
        stats = _from_draws(_draw(q, key, n).reshape(n, size), probs)
        notes.append(f"(from {n} draws of q)")
    return [(label, v, e) for label, (v, e) in zip(labels, stats, strict=True)], notes


def _latent_rows(q, key, num_samples, names, probs, max_rows):
    """Rows and notes of a latent Gaussian fit: the hyperparameters by name (the
    model's ``theta_names``, else ``theta[i]``), exact where their scale is
    ``q(theta)``'s, else from draws of ``q(theta)`` mapped by the model's
    ``theta_transforms``; the field, named ``field_name``, from the same draws."""
    k, t, model = q.num_hyper, q.num_latent, getattr(q, "model", None)
    field = getattr(model, "field_name", "f")
    given = getattr(model, "theta_names", None) if names is None else names
    labels = _given_names(given, k, "theta")
    transforms = getattr(model, "theta_transforms", None) or (None,) * k
    n = _num_draws(num_samples, k + t)
    draws = _draw(q, key, n)
    stats = _closed_form(q.theta, probs)
    drawn = [lb for lb, tr in zip(labels, transforms, strict=True) if tr is not None]
    if drawn:
        theta = np.asarray(q.constrained(jnp.asarray(draws[:, :k])))
        constrained = _from_draws(theta, probs)
        stats = [
            c if tr is not None else s
            for s, c, tr in zip(stats, constrained, transforms, strict=True)
        ]
    rows = [(label, v, e) for label, (v, e) in zip(labels, stats, strict=True)]
    values = _from_draws(draws[:, k:], probs)
    notes = []
    if t <= max_rows:
        rows += [(f"{field}[{i}]", v, e) for i, (v, e) in enumerate(values)]
    else:
        notes.append(_compact(field, values))
    if drawn:
        notes.append(
            f"({', '.join([*drawn, field])}: from {n} draws of q, the hyperparameters "
            "on their constrained scale)"
        )
    else:
        notes.append(f"({field}: from {n} draws of q)")
    return rows, notes


def _given_names(names, size, prefix, shape=None):
    if names is None:
        return _labels(prefix, (size,) if shape is None else shape)
    names = [str(n) for n in names]
    if len(names) != size:
        raise ValueError(
            f"summary: names has {len(names)} labels but the fitted q has {size} "
            f"{'hyperparameters' if prefix == 'theta' else 'coordinates'}"
        )
    return names


def _num_draws(num_samples: int, size: int) -> int:
    return int(max(100, min(num_samples, MAX_DRAWN_ELEMENTS // max(size, 1))))


def _draw(q, key, n) -> np.ndarray:
    draw = jax.jit(lambda q, key: q.sample(key, (n,)))
    return np.asarray(draw(q, _as_key(key)))


def _as_key(key):
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return key


def _normal_quantiles(mean, sd, probs):
    z = np.array([statistics.NormalDist().inv_cdf(p) for p in probs])
    return mean[:, None] + sd[:, None] * z


def _closed_form(q, probs):
    """Exact rows for the families whose marginals have a known CDF, else ``None``."""
    p = np.asarray(probs)
    if isinstance(q, Gaussian):
        mean = np.asarray(q.mean, np.float64)
        sd = np.sqrt(np.asarray(q.variance, np.float64))
        return _exact(mean, sd, _normal_quantiles(mean, sd, probs))
    if isinstance(q, GaussianMixture):
        w = np.asarray(q.weights, np.float64)
        m = np.asarray(q.means, np.float64)  # (K, d)
        s = np.sqrt(np.diagonal(np.asarray(q.covs, np.float64), axis1=1, axis2=2))
        keep = w > 0

        def cdf(x):  # x (d, 3)
            z = (x[None] - m[keep][:, :, None]) / s[keep][:, :, None]
            return np.einsum("k,kdp->dp", w[keep], np.asarray(ndtr(z)))

        lo = (m[keep] - 40.0 * s[keep]).min(0)[:, None] + 0 * p
        hi = (m[keep] + 40.0 * s[keep]).max(0)[:, None] + 0 * p
        quantiles = _bisect(cdf, p, lo, hi, geometric=False)
        mean = np.asarray(q.mean, np.float64)
        sd = np.sqrt(np.asarray(q.variance, np.float64))
        return _exact(mean, sd, quantiles)
    if isinstance(q, Exponential):
        rate = np.ravel(np.asarray(q.rate, np.float64))
        quantiles = -np.log1p(-p)[None, :] / rate[:, None]
        return _exact(1.0 / rate, 1.0 / rate, quantiles)
    cdfs = {
        Gamma: lambda q: (
            (q.concentration, q.rate),
            lambda a, b, x: gammainc(a, b * x),
        ),
        InverseGamma: lambda q: (
            (q.concentration, q.scale),
            lambda a, b, x: gammaincc(a, b / x),
        ),
        Beta: lambda q: (
            (q.concentration1, q.concentration0),
            lambda a, b, x: betainc(a, b, x),
        ),
    }
    if type(q) not in cdfs:
        return None
    (a, b), cdf = cdfs[type(q)](q)
    a = np.ravel(np.asarray(a, np.float64))[:, None]
    b = np.ravel(np.asarray(b, np.float64))[:, None]
    unit = type(q) is Beta
    lo = np.full((a.shape[0], p.size), 0.0 if unit else 1e-300)
    hi = np.full((a.shape[0], p.size), 1.0 if unit else 1e300)
    quantiles = _bisect(lambda x: np.asarray(cdf(a, b, x)), p, lo, hi, geometric=not unit)
    mean = np.asarray(q.mean, np.float64)
    sd = np.sqrt(np.asarray(q.variance, np.float64))
    return _exact(mean, sd, quantiles)


def _bisect(cdf, p, lo, hi, *, geometric: bool, max_iter: int = 200):
    """``x`` with ``cdf(x) = p`` elementwise, by bisection of ``[lo, hi]`` (in log
    space where ``geometric``), in float64 on the host, until the bracket is a few
    float64 ulps wide; ``cdf`` maps arrays of the bracket's shape to probabilities."""
    for _ in range(max_iter):
        mid = np.sqrt(lo * hi) if geometric else 0.5 * (lo + hi)
        below = np.asarray(cdf(mid), np.float64) < p
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        if np.all(hi - lo <= 4 * np.finfo(np.float64).eps * np.maximum(abs(lo), abs(hi))):
            break
    return np.sqrt(lo * hi) if geometric else 0.5 * (lo + hi)


def _numpyro_rows(result, key, num_samples, names, probs, max_rows):
    lj = result.log_joint
    full = getattr(lj, "lj", lj)  # a latent= fit's view of its log joint
    shapes = {**full.latent_shapes, **full.deterministic_shapes}
    sites = list(lj.posterior_sites) if names is None else [str(n) for n in names]
    unknown = [s for s in sites if s not in shapes]
    if unknown:
        raise ValueError(
            f"summary: no site {unknown[0]!r} in the model; its latent and "
            f"deterministic sites are {', '.join(lj.posterior_sites)}"
        )
    size = sum(math.prod(shapes[s]) for s in sites)
    n = _num_draws(num_samples, result.q.event_shape[0] + size)
    draws, own, source = result._summary_draws(_as_key(key), n)
    rows, notes = [], []
    for site in sites:
        value = np.asarray(draws[site], np.float64).reshape(n, -1)
        stats = _from_draws(value, probs, source.effective)
        if own is not None:  # q's own mean and sd, where the draws are resampled
            q_value = np.asarray(own[site], np.float64).reshape(n, -1)
            q_mean, q_sd = q_value.mean(0), q_value.std(0, ddof=1)
            stats = [([*v, q_mean[i], q_sd[i]], e) for i, (v, e) in enumerate(stats)]
        if value.shape[1] > max_rows:
            notes.append(_compact(site, stats, tuple(shapes[site])))
            continue
        labels = _labels(site, tuple(shapes[site]))
        rows += [(label, v, e) for label, (v, e) in zip(labels, stats, strict=True)]
    notes.append(f"({source.words}, on the model's constrained scale)")
    return rows, notes


def _compact(name, stats, shape=None) -> str:
    mean = np.array([v[0] for v, _ in stats])
    sd = np.array([v[1] for v, _ in stats])
    size = f"shape {shape}" if shape is not None else f"{mean.size} values"
    return (
        f"{name}: {size}; mean from {_fmt(mean.min())} to {_fmt(mean.max())}, "
        f"sd from {_fmt(sd.min())} to {_fmt(sd.max())}"
    )


# ---------------------------------------------------------------------- diagnostics


def _scalar(result, name) -> float:
    value = getattr(result, name, None)
    return float("nan") if value is None else float(np.asarray(value))


def _diagnostics(result: Result) -> dict[str, float]:
    return {
        name: _scalar(result, name)
        for name in (
            "elbo",
            "elbo_stderr",
            "log_evidence",
            "log_evidence_stderr",
            "kl",
            "kl_stderr",
            "r_squared",
            "r_squared_stderr",
            "khat",
            "khat_sd",
            "status",
        )
        if hasattr(result, name)
    }


def _footer(d: dict[str, float]) -> list[str]:
    def value(name):  # with its Monte Carlo standard error where the result has one
        se = d.get(f"{name}_stderr")
        return _fmt(d[name]) + ("" if se is None else f" ± {_fmt(se)}")

    spread = d.get("khat_sd", math.nan)
    khat = _fmt(d["khat"]) + (f" ± {_fmt(spread)}" if math.isfinite(spread) else "")
    return [
        f"ELBO          {value('elbo')} (± Monte Carlo standard error)",
        f"log evidence  {value('log_evidence')} (ELBO + KL)",
        f"KL(q || p)    {value('kl')} (s^2 / 2, from the regression's residual)",
        f"R^2           {value('r_squared')} (1: q explains log p exactly)",
        f"k-hat         {khat} (Pareto, of p/q; flags above 0.7 with a KL over 0.25)",
    ]


def _status(result: Result) -> str:
    flags = Status(int(np.asarray(result.status)))
    words = explain(result)
    if flags == Status.OK:
        return words
    names = "|".join(f.name for f in flags)
    return f"{int(flags)} ({names}): {words}"


def _batch_summary(result: Result, one: str | None = None) -> Summary:
    shape = np.shape(result.status)
    columns = ("ELBO", "± se", "log evid", "KL", "R^2", "k-hat", "status")
    fields = ("elbo", "elbo_stderr", "log_evidence", "kl", "r_squared", "khat", "status")
    values = np.stack(
        [
            np.broadcast_to(np.asarray(getattr(result, f), np.float64), shape).ravel()
            for f in fields
        ],
        axis=1,
    )
    flagged = int(np.sum(~np.asarray(result.ok)))
    index = "[i]" if len(shape) == 1 else "[" + ", ".join("ijkl"[: len(shape)]) + "]"
    one = one or f"jax.tree.map(lambda v: v{index}, res)"
    notes = (
        f"{math.prod(shape)} fits (batch shape {shape}), {flagged} flagged. One "
        f"fit's table: jaxvb.summary({one}); its status in words: "
        "jaxvb.explain(that fit).",
    )
    return Summary(
        names=tuple(_labels("", shape)),
        columns=columns,
        values=values,
        notes=notes,
        title=f"a batch of fits, one row each (batch shape {shape})",
    )


# ---------------------------------------------------------------------- formatting


def _fmt(v: float) -> str:
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.4g}" if v != 0 else "0"


def _table(names, columns, values) -> list[str]:
    cells = []
    for row in values:
        out = []
        for c, v in zip(columns, row, strict=True):
            if c == "mcse" and v == 0:
                out.append("-")
            elif c == "status":
                out.append(str(int(v)))
            else:
                out.append(_fmt(v))
        cells.append(out)
    name_width = max([len(n) for n in names] + [4])
    widths = [
        max([len(c)] + [len(r[j]) for r in cells] + [8 if c != "status" else 6])
        for j, c in enumerate(columns)
    ]
    head = " " * name_width + "".join(
        f"  {c:>{w}}" for c, w in zip(columns, widths, strict=True)
    )
    lines = [head]
    for name, row in zip(names, cells, strict=True):
        lines.append(
            f"{name:<{name_width}}"
            + "".join(f"  {c:>{w}}" for c, w in zip(row, widths, strict=True))
        )
    return lines
