"""Keep a long session of fits inside the operating system's limit on memory maps.

Every program XLA:CPU compiles keeps its machine code in memory maps of its own (about
700 for one ``fit``: the iteration, the start, the diagnostics). Linux caps a process at
``vm.max_map_count`` maps (65,530 by default); past it the next compilation's ``mmap``
fails and XLA crashes the process with a segmentation fault, losing all its work. A
notebook or a test session that fits ~90 different models in one process gets there.
JAX frees the maps with its compiled programs (``jax.clear_caches``), so before
compiling we look at how many maps the process holds and, near the limit, clear the
caches (the programs compile again when next used) with a warning that says why.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp

_LIMIT_FILE = "/proc/sys/vm/max_map_count"
_MAPS_FILE = "/proc/self/maps"
_FRACTION = 0.6  # leaves room for ~25 more fits before the limit


def _read_limit() -> int | None:
    try:
        with open(_LIMIT_FILE) as f:
            return int(f.read())
    except (OSError, ValueError):  # not Linux, or not readable: nothing to guard
        return None


_MAX_MAPS = _read_limit()


def outside_traces() -> bool:
    # Under jit/vmap of fit the caches are in use by the trace around us: leave them.
    try:
        from jax._src import core

        return bool(core.trace_state_clean())
    except (ImportError, AttributeError):  # a JAX without it: guard anyway
        return True


def num_maps() -> int | None:
    """The number of memory maps this process holds (``None`` where unknown)."""
    try:
        with open(_MAPS_FILE, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


#: Compilations (and loads from the persistent cache) since the maps were last
#: counted: the maps that matter grow only with them, so a fit that compiles nothing
#: new (a second call) does not read ``/proc/self/maps`` again (~1 us a map: 10-20 ms
#: a call in a process that holds 10,000-20,000 of them, a fifth of a small fit).
_compiles_since_count = [1]


def _count_compiles(event: str, duration: float, **kwargs) -> None:
    del duration, kwargs
    if "compil" in event:
        _compiles_since_count[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def guard_maps(stacklevel: int = 3) -> bool:
    """Clear JAX's compiled programs when the process nears its map limit.

    Returns whether it cleared them. Costs a read of ``/proc/self/maps`` where
    programs were compiled since the last one; a no-op where the limit is unknown.
    """
    if _MAX_MAPS is None or not outside_traces() or not _compiles_since_count[0]:
        return False
    _compiles_since_count[0] = 0
    n = num_maps()
    if n is None or n < _FRACTION * _MAX_MAPS:
        return False
    jax.clear_caches()
    warnings.warn(
        f"This process holds {n} memory maps, near the system's limit of {_MAX_MAPS} "
        "(vm.max_map_count), past which XLA crashes when it compiles the next program. "
        "Most of them hold the machine code of programs compiled earlier, so jaxvb "
        "cleared JAX's compilation caches (jax.clear_caches()); programs compile again "
        "when next used. To keep them, raise the limit (sysctl vm.max_map_count).",
        RuntimeWarning,
        stacklevel=stacklevel,
    )
    return True


#: XLA options for jaxvb's own programs on the CPU.
#:
#: - The fusion emitters off (fused loops emitted the older way). They compile 25-30%
#:   sooner (the first fit of a posteriordb ARMA(1, 1): 4.5 -> 3.1 s; the test suite:
#:   17.9 -> 8.6 min) and ran as fast (the same fit's 1000 steps 166 vs 168 ms; a
#:   d = 1002 hierarchical logistic regression within 6%).
#: - XLA's backend (LLVM) at optimisation level 1 instead of the default 2. Measured on
#:   2026-11-29 (2 cores, one process per level, the same keys), first calls, compile
#:   included: 43.5 -> 35.8 s (the LGCP of ``benchmarks/latent_gaussian.py``), 11.7 ->
#:   9.5 s and 10.9 -> 9.4 s (its GLMM), 7.1 -> 5.6 s (posteriordb ARMA(1, 1)), 4.8 ->
#:   4.2 s (``benchmarks/dimension.py``, d = 102), 35.3 -> 35.0 s (the 2500-day SV).
#:   After compile, within this machine's noise: LGCP 5.3 and 5.0 s against 5.2 and
#:   4.8, GLMM 0.16-0.22 s against 0.20, SV 0.40-0.46 s against 0.39-0.41, d = 1002
#:   675 against 689 ms per step. Results move by rounding (<= 1e-12 relative on those
#:   fits). Level 0 compiles quicker still, but ran the GLMM 3.5x slower. Repeated,
#:   the levels taking turns: the LGCP 38.5 against 41.4 s (runs 4.8-4.9 s against
#:   5.3-5.6 s); the GLMM no different beyond the noise (first calls 10.6-10.9 s
#:   against 10.2-10.8 s, runs 0.16-0.25 s against 0.17-0.23 s, two processes each):
#:   single pairs of this machine's runs are not to be trusted by a second or two.
#:
#: Probed once: a JAX whose XLA lacks an option gets none. An optimisation level set in
#: ``XLA_FLAGS`` (``--xla_backend_optimization_level``; the tests set 0) keeps its
#: say: a compiler option would override it.
_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}


@functools.cache
def compile_options() -> dict:
    """The compiler options of :data:`_CPU_OPTIONS` where the default backend is the
    CPU and XLA knows them, else ``{}``; less the optimisation level where
    ``XLA_FLAGS`` sets one."""
    if jax.default_backend() != "cpu":
        return {}
    options = dict(_CPU_OPTIONS)
    if "--xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        del options["xla_backend_optimization_level"]
    try:
        jax.jit(lambda v: v + 1, compiler_options=options).lower(1.0).compile()
    except Exception:  # an XLA without the option: "No such compile option"
        return {}
    return options


def draws_in_sequence(q) -> bool:
    """Whether ``q``'s Monte Carlo draws (diagnostics, the convergence check) are
    evaluated one after another rather than vmapped: where the family says each draw
    factors a matrix of its own (``Family.factors_per_draw``), on the CPU, where a
    batch of blocked banded or dense factorisations runs slower than a loop over them
    (the LGCP of ``benchmarks/latent_gaussian.py``, ``w = 40``: its 2000 diagnostic
    draws in 3.6 s vmapped, 2.5 s in a loop); vectorised elsewhere."""
    return bool(getattr(q, "factors_per_draw", False)) and jax.default_backend() == "cpu"


def each_draw(q) -> Callable:
    """``(fn, xs) -> fn`` over the rows of ``xs`` (a pytree): a loop where
    :func:`draws_in_sequence`, else ``vmap``."""
    if draws_in_sequence(q):
        return lambda fn, xs: jax.lax.map(fn, xs)
    return lambda fn, xs: jax.vmap(fn)(xs)


def after(x, before):
    """``x``, computed only once ``before`` is: a run-time dependency of every float
    leaf of ``x`` on one value of ``before`` (``+ 0 * isnan(v)``, which XLA keeps:
    float multiplication by zero is not folded away, and ``isnan`` keeps a NaN in
    ``before`` out of ``x``).

    Why: XLA:CPU runs operations that do not depend on each other concurrently on a
    thread pool of one thread per core, and jaxlib 0.10's batched LAPACK kernels (a
    vmapped Cholesky, QR, triangular solve, ...) split their batch into tasks on that
    same pool and block until they are done: with as many of them running at once as
    there are pool threads (two on a 2-core machine) every thread waits and the
    process hangs (reproduced here with two independent vmapped Cholesky factorisations
    of 64 40 x 40 matrices: hangs within seconds; jaxlib 0.11.2 compiles that parallel
    path out). ``jax.lax.optimization_barrier`` does not order them at run time (the
    runtime orders by buffers, not by the barrier); a data dependency does. Used where
    one vmapped evaluation factors two matrices per draw: a draw and the other
    density at it, the prior's and ``q(f | theta)``'s factors."""
    leaves = [v for v in jax.tree_util.tree_leaves(before) if hasattr(v, "dtype")]
    if not leaves:
        return x
    flag = jnp.isnan(jnp.ravel(leaves[0])[0])

    def tie(v):
        if not hasattr(v, "dtype") or not jnp.issubdtype(v.dtype, jnp.floating):
            return v
        return v + flag.astype(v.dtype) * jnp.zeros((), v.dtype)

    return jax.tree_util.tree_map(tie, x)


def jit_fast(
    fn: Callable | None = None, *, static_argnames: tuple[str, ...] = (), once=False
):
    """``jax.jit`` with :func:`compile_options` (and, ``once``, XLA's backend
    optimisation off) for calls outside any trace; inside another trace (``fit``
    under the user's ``jit``/``vmap``), where JAX accepts no compiler options, the
    plain ``jax.jit`` of the same function (compiled with the caller's program).
    """
    if fn is None:
        return functools.partial(jit_fast, static_argnames=static_argnames, once=once)
    nested = jax.jit(fn, static_argnames=static_argnames)
    fast = []

    def compiled():
        if not fast:
            options = dict(compile_options())
            if once:
                options["xla_backend_optimization_level"] = 0
            fast.append(
                jax.jit(fn, static_argnames=static_argnames, compiler_options=options)
            )
        return fast[0]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return (compiled() if outside_traces() else nested)(*args, **kwargs)

    call._cache_size = lambda: compiled()._cache_size()  # for the tests' counts
    # ahead of time, outside traces: the compiled program lands in the same cache as a
    # call's (a later call with the same signature does not compile again)
    call.lower = lambda *args, **kwargs: compiled().lower(*args, **kwargs)
    return call


def jit_once(fn: Callable | None = None, *, static_argnames: tuple[str, ...] = ()):
    """``jax.jit`` for a program that runs once per call (a start, a search): compiled
    with XLA's backend optimisation off, which costs seconds to compile and saves
    little at run time, and :func:`compile_options`. Inside another trace (``fit``
    under ``jit``/``vmap``), where JAX accepts no compiler options, the plain
    ``jax.jit`` of the same function.
    """
    return jit_fast(fn, static_argnames=static_argnames, once=True)
