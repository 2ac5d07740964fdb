"""What every benchmark records and how it times: environment, git state, timings."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def git_state() -> dict:
    """The commit the numbers come from, and whether ``jaxvb/`` had local changes."""

    def git(*cmd):
        try:
            return subprocess.run(
                ["git", *cmd], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = git("status", "--porcelain", "--", "jaxvb")
    return dict(commit=git("rev-parse", "HEAD"), jaxvb_dirty=bool(status))


def environment(**extra_versions) -> dict:
    """Machine, library versions and JAX settings, for the results JSON."""
    import jaxvb

    return dict(
        cpu_count=os.cpu_count(),
        cpu_affinity=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        jax_version=jax.__version__,
        jaxlib_version=getattr(jax.lib, "__version__", None),
        jaxvb_version=jaxvb.__version__,
        numpy_version=np.__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        backend=jax.default_backend(),
        devices=[str(d) for d in jax.devices()],
        x64=bool(jax.config.jax_enable_x64),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        git=git_state(),
        **extra_versions,
    )


def time_calls(fn, args_for_call, repeats: int) -> dict:
    """Seconds per call of an already compiled ``fn`` (``block_until_ready`` each).

    ``args_for_call(i)`` gives the arguments of call ``i`` (e.g. a new key each time).
    """
    times = []
    for i in range(repeats):
        args = args_for_call(i)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return dict(
        median_s=statistics.median(times),
        min_s=min(times),
        q25_s=float(np.quantile(times, 0.25)),
        q75_s=float(np.quantile(times, 0.75)),
        repeats=int(repeats),
    )
