#!/bin/bash
# Many probit fits on a SLURM cluster: one jaxvb process per node, each fitting its
# share of the chunks on the node's GPUs, all writing one store on a shared file system.
#
#   sbatch examples/many_fits_slurm.sh                 # STORE and sizes below
#   STORE=/scratch/$USER/probit sbatch examples/many_fits_slurm.sh
#
# The job can be requeued or resubmitted as is: fit_many skips the chunks the store
# holds and fits the rest. One process per GPU works too: --ntasks-per-node=<GPUs>
# with --gpus-per-task=1.
#SBATCH --job-name=jaxvb-many-fits
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --output=jaxvb-many-fits-%j.out

set -euo pipefail
STORE=${STORE:-$HOME/jaxvb-probit-store}
NUM_DATASETS=${NUM_DATASETS:-10000000}
CHUNK_SIZE=${CHUNK_SIZE:-100000}

# jax.distributed.initialize() takes the coordinator, the process count and each
# process's id from SLURM's environment (srun starts one task per node here).
srun python examples/many_fits.py --distributed --store "$STORE" \
    --num-datasets "$NUM_DATASETS" --chunk-size "$CHUNK_SIZE"
# Read the store with jaxvb.load_many(STORE) (all of it at once), or chunk by chunk
# with numpy.load(STORE/chunk-000000.npz).
