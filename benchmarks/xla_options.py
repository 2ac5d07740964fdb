"""What jaxvb's own CPU compile options buy, against XLA's defaults.

jaxvb's own programs on the CPU compile with XLA's fusion emitters off and its backend
at optimisation level 1 (``cpu_compile_options`` in ``jaxvb/_platform.py``); with
``JAXVB_WORKAROUNDS_OFF=cpu_compile_options`` they compile with XLA's defaults, as a
user's own programs do. Each variant runs in a fresh process, the variants taking
turns, and times the first ``jaxvb.fit`` (compile included) and the median of the calls
after it, on a probit regression from a Gaussian ``q0``, the posteriordb ARMA(1, 1)
from a point (the Laplace start) and a latent-field model from its hyperparameters.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

import jaxvb  # noqa: E402
from jaxvb.models import posteriors, probit  # noqa: E402

NAME = "xla_options"
VARIANTS = {
    "jaxvb": {},  # as users run it
    "xla_defaults": {"JAXVB_WORKAROUNDS_OFF": "cpu_compile_options"},
}
MODELS = ("probit", "arma11_point", "latent_field")


def model(name):
    """``(log_joint, start, num_steps)`` of one model."""
    if name == "probit":
        _, design, y = probit.simulate(jax.random.key(0), num_datasets=1)
        log_joint = jax.tree_util.Partial(probit.log_joint, design=design[0], y=y[0])
        return log_joint, jaxvb.Gaussian(jnp.zeros(5), jnp.eye(5)), 500
    if name == "arma11_point":
        return posteriors.arma11(), jnp.zeros(4), 1000
    # a Poisson random-walk field of 200 days with an unknown log precision
    counts = jax.random.poisson(jax.random.key(1), 3.0, (200,)).astype(float)

    def prior(theta):
        tau = jnp.exp(theta[0])
        band = jnp.zeros((2, 200)).at[0].set(2.0 * tau + 1e-3).at[1, :-1].set(-tau)
        return jnp.zeros(200), jaxvb.linalg.Banded(band)

    latent = jaxvb.LatentGaussian(
        log_prior=lambda theta: -0.5 * jnp.sum(theta**2),
        prior=prior,
        log_lik=lambda f, y: y * f - jnp.exp(f),
        data=counts,
    )
    return latent, jnp.zeros(1), 500


def worker(spec: dict) -> dict:
    log_joint, start, num_steps = model(spec["model"])
    res, timing = common.first_and_after(
        lambda seed: jaxvb.fit(log_joint, start, jax.random.key(seed), num_steps=num_steps),
        spec["repeats"],
    )
    return dict(
        first_call_s=timing["first_call_s"],
        after_compile_s=timing["run"]["median_s"],
        status=int(res.status),
        elbo=float(res.elbo),
    )


def main(argv=None):
    p = common.parser(__doc__)
    p.add_argument("--quick", action="store_true", help="one round, the probit only")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.worker:
        return common.emit(worker(json.loads(args.worker)))
    models = MODELS[:1] if args.quick else MODELS
    rounds = 1 if args.quick else args.rounds
    runs = {m: {v: [] for v in VARIANTS} for m in models}
    for r in range(rounds):
        for name in models:
            # the variants take turns in a rotating order, so that a slow spell of the
            # machine does not fall on one of them
            order = list(VARIANTS)[r % 2 :] + list(VARIANTS)[: r % 2]
            for variant in order:
                env = dict(os.environ, **VARIANTS[variant])
                spec = dict(model=name, repeats=2 if args.quick else 5)
                payloads, error = common.run_worker(__file__, spec, 900, env=env)
                runs[name][variant].append(payloads[0] if payloads else {"error": error})
    median = {
        name: {
            variant: {
                key: statistics.median(row[key] for row in rows if key in row)
                for key in ("first_call_s", "after_compile_s")
                if any(key in row for row in rows)
            }
            for variant, rows in by_variant.items()
        }
        for name, by_variant in runs.items()
    }
    report = dict(
        experiment=NAME,
        environment=common.environment(),
        rounds=rounds,
        variants={k: v or "as users run it" for k, v in VARIANTS.items()},
        runs=runs,
        median=median,
    )
    common.write_json(common.output_dir(args, NAME), NAME, report)
    return report


if __name__ == "__main__":
    main()
