"""The paper's probit model fitted to many simulated data sets with ``jaxvb.fit_many``.

One process (all of this machine's devices)::

    python examples/many_fits.py --store probit-store --num-datasets 100000

Several processes, each fitting its share of the chunks on its own devices, all writing
one store on a file system they share:

* under SLURM, one task per host (or per GPU): ``srun python examples/many_fits.py
  --store /shared/probit --distributed`` (``examples/many_fits_slurm.sh``);
  ``jax.distributed.initialize()`` reads the job's layout from SLURM;
* elsewhere, the same command on every host, with host 0's address::

    python examples/many_fits.py --store /shared/probit \\
        --coordinator host0:1234 --num-processes 2 --process-id 0   # on host0
    python examples/many_fits.py --store /shared/probit \\
        --coordinator host0:1234 --num-processes 2 --process-id 1   # on host1

A run that stops (a time limit, a preempted node, a crash) resumes where it stopped
when it is started again with the same arguments. Each chunk's data sets are simulated
from ``fold_in(key, chunk)`` when the chunk is loaded: replace ``load`` with reading
chunk ``i`` of your own collection.
"""

from __future__ import annotations

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import jaxvb
from jaxvb.models import probit


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True, help="the store's directory (shared)")
    p.add_argument("--num-datasets", type=int, default=10**5)
    p.add_argument("--chunk-size", type=int, default=10**4)
    p.add_argument("--num-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--distributed", action="store_true",
                   help="jax.distributed.initialize() from the cluster's environment")  # fmt: skip
    p.add_argument("--coordinator", help="host:port of process 0")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    p.add_argument("--float64", action="store_true")
    args = p.parse_args(argv)
    jax.config.update("jax_enable_x64", args.float64)
    if args.coordinator:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    elif args.distributed:
        jax.distributed.initialize()  # SLURM, Open MPI, Cloud TPU: detected

    d = probit.PAPER_NUM_FEATURES
    q0 = jaxvb.Gaussian(jnp.zeros(d), jnp.eye(d))

    def fit_one(key, design, y):
        return jaxvb.fit(partial(probit.log_joint, design=design, y=y), q0, key,
                         method="hessian", num_steps=args.num_steps)  # fmt: skip

    simulate = jax.jit(partial(probit.simulate, num_datasets=args.chunk_size))

    def load(i):  # chunk i: data sets i * chunk_size, ... (the last chunk is shorter)
        rows = min(args.chunk_size, args.num_datasets - i * args.chunk_size)
        _, design, y = simulate(jax.random.fold_in(jax.random.key(args.seed + 1), i))
        return np.asarray(design)[:rows], np.asarray(y)[:rows]

    jaxvb.fit_many(fit_one, load, num_datasets=args.num_datasets, store=args.store,
                   chunk_size=args.chunk_size, key=jax.random.key(args.seed))  # fmt: skip


if __name__ == "__main__":
    main()
