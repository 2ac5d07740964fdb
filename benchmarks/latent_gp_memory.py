"""Peak memory and time of a default fit of a latent Gaussian-process model, d = 102.

A Poisson model of the first 100 years of :func:`jaxvb.data.coal_mining_disasters`
whose log rate ``f`` has a squared-exponential Gaussian-process prior with unknown
amplitude and length scale, written as a user would (the 100 x 100 Cholesky of ``K``
inside ``log_joint``)::

    x = (f_1..f_100, log a, log l),   f ~ N(m, K(a, l)),   y_t ~ Poisson(exp(f_t)),
    K = a^2 exp(-(t - t')^2 / (2 l^2)) + 1e-4 I,
    log a ~ N(0, 1),   log l ~ N(log 10, 0.5^2).

``jaxvb.fit(log_joint, x0, key, num_steps=1000)`` with every default: the first call
(compile included), a second call, the process's peak resident memory, and the model's
own cost per value/gradient/Hessian for comparison with a step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402
import jaxvb.data  # noqa: E402

NAME = "latent_gp_memory"
TARGET_GB = 4.0


def model(num_years: int = 100):
    """``(log_joint, x0)`` of the first ``num_years`` years."""
    counts = jnp.asarray(
        np.asarray(jaxvb.data.coal_mining_disasters()[1])[:num_years], float
    )
    t = jnp.arange(num_years, dtype=counts.dtype)
    m = float(jnp.log(jnp.mean(counts) + 0.1))

    def log_joint(x):
        f, log_a, log_l = x[:-2], x[-2], x[-1]
        sq = (t[:, None] - t[None, :]) ** 2
        k = jnp.exp(2 * log_a) * jnp.exp(-0.5 * sq / jnp.exp(2 * log_l))
        chol = jnp.linalg.cholesky(k + 1e-4 * jnp.eye(num_years))
        v = jax.scipy.linalg.solve_triangular(chol, f - m, lower=True)
        log_prior_f = -0.5 * v @ v - jnp.sum(jnp.log(jnp.diagonal(chol)))
        log_lik = jnp.sum(counts * f - jnp.exp(f))
        hyper = -0.5 * log_a**2 - 0.5 * ((log_l - jnp.log(10.0)) / 0.5) ** 2
        return log_lik + log_prior_f + hyper

    x0 = jnp.concatenate([jnp.full(num_years, m), jnp.array([0.0, jnp.log(10.0)])])
    return log_joint, x0


def main(argv=None) -> dict:
    parser = common.parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="20 years, 100 steps")
    parser.add_argument("--num-steps", type=int, default=1000)
    args = parser.parse_args(argv)
    num_steps = 100 if args.quick else args.num_steps
    out = common.output_dir(args, NAME)
    log_joint, x0 = model(20 if args.quick else 100)

    def call(seed):
        return jaxvb.fit(log_joint, x0, jax.random.key(seed), num_steps=num_steps)

    _, first = common.timed(call, 0)
    res, second = common.timed(call, 1)
    model_scan = common.hessian_scan(log_joint)
    xs = res.q.sample(jax.random.key(2), (50,))
    jax.block_until_ready(model_scan(xs))
    _, model_s = common.timed(model_scan, xs)
    peak_gb = common.peak_rss_mb() / 1e3
    report = dict(
        description=__doc__.splitlines()[0],
        environment=common.environment(),
        settings=dict(
            num_steps=num_steps, d=int(x0.size), dtype="float64", quick=args.quick
        ),
        first_call_s=round(first, 2),
        second_call_s=round(second, 2),
        model_ms_per_hessian=round(1e3 * model_s / xs.shape[0], 2),
        fit_ms_per_step=round(1e3 * second / num_steps, 2),
        peak_rss_gb=round(peak_gb, 3),
        status=int(res.status),
        r_squared=float(res.r_squared),
        hyperparameters=dict(
            mean=np.asarray(res.q.mean[-2:]).tolist(),
            sd=np.sqrt(np.diagonal(np.asarray(res.q.cov))[-2:]).tolist(),
        ),
        target=dict(peak_rss_gb_below=TARGET_GB, met=peak_gb < TARGET_GB),
    )
    common.write_json(out, NAME, report)
    return report


if __name__ == "__main__":
    main()
