"""Every workaround for jaxlib, XLA or the operating system, in one place.

Each workaround has a name, says what it works around, the versions it applies to
and the upstream report, and can be switched off: set ``JAXVB_WORKAROUNDS_OFF`` to a
comma-separated list of names (or ``all``) before jaxvb is imported. With all of them
off jaxvb's programs compile with XLA's default options, exactly as a user's own.

=========================  ==========================================================
``map_guard``              Linux caps a process's memory maps (``vm.max_map_count``);
                           XLA:CPU keeps each compiled program in maps of its own and
                           crashes when the next compilation's ``mmap`` fails. Near the
                           cap ``fit`` clears JAX's compiled programs, with a warning.
                           Linux, any jaxlib; no upstream fix (raise the cap).
``cpu_compile_options``    jaxvb's own programs on the CPU compile with XLA's fusion
                           emitters off and its backend at optimisation level 1 (the
                           default is 2): a first call that compiles much sooner, and
                           after compile as fast on some models, slower on others
                           (``benchmarks/xla_options.py`` measures both against XLA's
                           defaults; switch it off for a long run of one model).
                           Never applied to a program the user compiles.
``ordered_factorisations`` jaxlib 0.10's batched LAPACK kernels (a vmapped Cholesky,
                           triangular solve, ...) block on XLA:CPU's intra-op thread
                           pool; two of them scheduled at once on a machine with as
                           many cores can each wait on the thread the other holds, and
                           the process hangs. :func:`after` orders jaxvb's own. Applies
                           to jaxlib < 0.11.2, which runs the batch serially
                           (jax-ml/jax#36927 changed the batched path in 0.10.0).
``sequential_draws``       On the CPU a batch of blocked banded or dense
                           factorisations runs slower vmapped than in a loop: Monte
                           Carlo draws of a family that factors a matrix per draw
                           (``Family.factors_per_draw``) are evaluated one after
                           another (:func:`each_draw`). Any jaxlib on the CPU.
``trace_state``            Whether a call is outside every JAX trace (compiler options
                           and clearing caches are only allowed there) is read from
                           JAX's private ``jax._src.core.trace_state_clean``; JAX has
                           no public equivalent. Off: treated as inside a trace (no
                           compiler options, no clearing).
=========================  ==========================================================

The test suite's own environment (:func:`test_environment`: XLA flags, the CPU
backend, the opt-in persistent compilation cache) lives here too, so that the whole of
jaxvb's dealings with XLA's options can be read in one file.
"""

from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp

try:  # trace_state: JAX has no public way to ask whether a trace is active
    from jax._src import core as _jax_core
except ImportError:
    _jax_core = None

#: The workarounds, by name (see the module's docstring).
WORKAROUNDS = (
    "map_guard",
    "cpu_compile_options",
    "ordered_factorisations",
    "sequential_draws",
    "trace_state",
)


def _switched_off() -> frozenset[str]:
    names = {n.strip() for n in os.environ.get("JAXVB_WORKAROUNDS_OFF", "").split(",")}
    names.discard("")
    if "all" in names:
        return frozenset(WORKAROUNDS)
    unknown = names - set(WORKAROUNDS)
    if unknown:
        raise ValueError(
            f"JAXVB_WORKAROUNDS_OFF names {sorted(unknown)}, which jaxvb does not know; "
            f"the workarounds are {', '.join(WORKAROUNDS)} (or 'all')."
        )
    return frozenset(names)


_OFF = _switched_off()


def _jaxlib_version() -> tuple[int, ...]:
    parts = []
    for part in jax.lib.__version__.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def enabled(name: str) -> bool:
    """Whether the workaround ``name`` is on in this process: not switched off and
    applicable to this jaxlib.

    Example:
      >>> from jaxvb import _platform
      >>> _platform.enabled("map_guard") in (True, False)
      True
    """
    if name not in WORKAROUNDS:
        raise ValueError(f"unknown workaround {name!r}; known: {', '.join(WORKAROUNDS)}")
    if name in _OFF:
        return False
    if name == "ordered_factorisations":
        return _jaxlib_version() < (0, 11, 2)
    return True


# ------------------------------------------------------------------ trace_state


def outside_traces() -> bool:
    """Whether this call runs outside every JAX trace (under ``jit``/``vmap`` of
    ``fit`` the compiled-program caches are in use by the trace around it)."""
    if not enabled("trace_state"):
        return False
    clean = getattr(_jax_core, "trace_state_clean", None)
    return True if clean is None else bool(clean())  # a JAX without it: guard anyway


# -------------------------------------------------------------------- map_guard

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


def num_maps() -> int | None:
    """The number of memory maps this process holds (``None`` where unknown)."""
    try:
        with open(_MAPS_FILE, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


#: Compilations (and loads from the persistent cache) in this process, and their number
#: when the maps were last counted: the maps that matter grow only with them, so a fit
#: that compiles nothing new (a second call) does not read ``/proc/self/maps`` again (a
#: read costs about a microsecond a map, a noticeable part of a small fit in a process
#: holding many).
_compilations = [0]
_counted_at = [-1]


def _count_compiles(event: str, duration: float, **kwargs) -> None:
    del duration, kwargs
    if "compil" in event:
        _compilations[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def compilations() -> int:
    """How many compile events (and persistent-cache loads) this process has seen."""
    return _compilations[0]


def guard_maps(stacklevel: int = 3) -> bool:
    """Clear JAX's compiled programs when the process nears its map limit.

    Returns whether it cleared them. Costs a read of ``/proc/self/maps`` where
    programs were compiled since the last one; a no-op where the limit is unknown.
    """
    if not enabled("map_guard"):
        return False
    if _MAX_MAPS is None or not outside_traces() or _counted_at[0] == _compilations[0]:
        return False
    _counted_at[0] = _compilations[0]
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


# ---------------------------------------------------------- cpu_compile_options

#: XLA options for jaxvb's own programs on the CPU: the fusion emitters off (fused loops
#: emitted the older way) and XLA's backend (LLVM) at optimisation level 1 instead of
#: the default 2: they compile much sooner, and run after compile as fast on some
#: models and slower on others; ``benchmarks/xla_options.py`` measures both against
#: XLA's defaults. Probed once: a
#: JAX whose XLA lacks an option gets none. An optimisation level set in ``XLA_FLAGS``
#: (``--xla_backend_optimization_level``) keeps its say: a compiler option would
#: override it.
_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}


@functools.cache
def compile_options() -> dict:
    """The compiler options of :data:`_CPU_OPTIONS` where the default backend is the
    CPU and XLA knows them, else ``{}``; less the optimisation level where
    ``XLA_FLAGS`` sets one."""
    if not enabled("cpu_compile_options") or jax.default_backend() != "cpu":
        return {}
    options = dict(_CPU_OPTIONS)
    if "--xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        del options["xla_backend_optimization_level"]
    try:
        jax.jit(lambda v: v + 1, compiler_options=options).lower(1.0).compile()
    except Exception:  # an XLA without the option: "No such compile option"
        return {}
    return options


# ------------------------------------------------------------- sequential_draws


def draws_in_sequence(q) -> bool:
    """Whether ``q``'s Monte Carlo draws (diagnostics, the convergence check) are
    evaluated one after another rather than vmapped: where the family says each draw
    factors a matrix of its own (``Family.factors_per_draw``), on the CPU, where a
    batch of blocked banded or dense factorisations runs slower than a loop over them
    (the wide-band LGCP of ``benchmarks/latent_gaussian.py``); vectorised elsewhere."""
    if not enabled("sequential_draws") or jax.default_backend() != "cpu":
        return False
    return bool(getattr(q, "factors_per_draw", False))


def each_draw(q) -> Callable:
    """``(fn, xs) -> fn`` over the rows of ``xs`` (a pytree): a loop where
    :func:`draws_in_sequence`, else ``vmap``."""
    if draws_in_sequence(q):
        return lambda fn, xs: jax.lax.map(fn, xs)
    return lambda fn, xs: jax.vmap(fn)(xs)


_ORDERED = enabled("ordered_factorisations")


# ------------------------------------------------------- ordered_factorisations


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
    if not leaves or not _ORDERED:
        return x
    flag = jnp.isnan(jnp.ravel(leaves[0])[0])

    def tie(v):
        if not hasattr(v, "dtype") or not jnp.issubdtype(v.dtype, jnp.floating):
            return v
        return v + flag.astype(v.dtype) * jnp.zeros((), v.dtype)

    return jax.tree_util.tree_map(tie, x)


# ------------------------------------------------------ jaxvb's own programs


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
            if once and options:  # on the CPU, where jaxvb sets options at all
                options["xla_backend_optimization_level"] = 0
            fast.append(
                jax.jit(fn, static_argnames=static_argnames, compiler_options=options)
            )
        return fast[0]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return (compiled() if outside_traces() else nested)(*args, **kwargs)

    call._cache_size = lambda: compiled()._cache_size()  # for the tests' counts
    return call


def jit_once(fn: Callable | None = None, *, static_argnames: tuple[str, ...] = ()):
    """``jax.jit`` for a program that runs once per call (a start, a search): compiled
    with XLA's backend optimisation off, which costs seconds to compile and saves
    little at run time, and :func:`compile_options`. Inside another trace (``fit``
    under ``jit``/``vmap``), where JAX accepts no compiler options, the plain
    ``jax.jit`` of the same function.
    """
    return jit_fast(fn, static_argnames=static_argnames, once=True)


# ----------------------------------------------------------- the tests' settings

#: XLA flags the test suite sets for speed (the tests check numbers, not speed):
#: XLA's backend optimisation off and the fusion emitters off. The concurrency-
#: optimised scheduler off too, where ``ordered_factorisations`` applies: a test's own
#: model may factor two matrices side by side, which jaxvb's :func:`after` cannot
#: order.
_TEST_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_enable_concurrency_optimized_scheduler=false",
)


def _xla_accepts(flags: tuple[str, ...]) -> bool:
    """Whether this jaxlib's XLA starts with ``flags`` in ``XLA_FLAGS`` (an unknown flag
    there is fatal), tried in a subprocess."""
    env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    code = "import jax.numpy as jnp; jnp.ones(2).sum().block_until_ready()"
    try:
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0


#: jaxlib releases whose XLA is known to take every flag of :data:`_TEST_FLAGS`
#: (``(major, minor)``): no probe there, which saves each test session a subprocess
#: that starts JAX (seconds); any other release is probed.
_FLAGS_KNOWN = {(0, 10)}


def _env_key(flag: str) -> str:
    return "JAXVB_TEST_" + flag.lstrip("-").split("=")[0].upper()


def test_xla_flags(defaults: bool = False) -> list[str]:
    """The flags the test suite adds to ``XLA_FLAGS``: :data:`_TEST_FLAGS` that this
    jaxlib's XLA knows (all of them on the releases of :data:`_FLAGS_KNOWN`; on others
    probed once in a subprocess, the answers travelling in the environment to xdist
    workers and the subprocesses tests start), or none with ``defaults`` (the tier
    that runs as users do).

    Example:
      >>> from jaxvb import _platform
      >>> _platform.test_xla_flags(defaults=True)
      []
    """
    if defaults:
        return []
    wanted = [f for f in _TEST_FLAGS if "scheduler" not in f or _ORDERED]
    if _jaxlib_version()[:2] in _FLAGS_KNOWN:
        return wanted
    unknown = [f for f in wanted if _env_key(f) not in os.environ]
    if unknown and _xla_accepts(tuple(unknown)):
        os.environ.update({_env_key(f): "1" for f in unknown})
    for f in unknown:
        if _env_key(f) not in os.environ:
            os.environ[_env_key(f)] = "1" if _xla_accepts((f,)) else "0"
    return [f for f in wanted if os.environ[_env_key(f)] == "1"]


def test_environment(cache_dir: str, environ=None) -> dict[str, str]:
    """The environment variables the test suite sets before JAX starts, so that its
    xdist workers, notebook kernels and benchmark subprocesses inherit them.

    ``JAX_PLATFORMS=cpu`` unless set; ``XLA_FLAGS`` plus :func:`test_xla_flags`, which
    are none with ``JAXVB_TEST_XLA=default`` (XLA's default options, as users run).
    ``JAXVB_TEST_CACHE=1`` turns JAX's persistent compilation cache on in ``cache_dir``
    (``JAX_COMPILATION_CACHE_DIR`` overrides it) for every program, whatever its size
    or compile time: with the optimiser off most programs compile in well under JAX's
    default threshold of 1 s, yet together they are the suite's time. The cache is
    opt-in because jaxlib's cache writer has crashed a worker when several processes
    wrote one directory; no test depends on it.

    Example:
      >>> from jaxvb import _platform
      >>> env = _platform.test_environment("/tmp/c", {"JAXVB_TEST_XLA": "default"})
      >>> env["JAX_PLATFORMS"], env["XLA_FLAGS"], "JAX_COMPILATION_CACHE_DIR" in env
      ('cpu', '', False)
    """
    environ = os.environ if environ is None else environ
    defaults = environ.get("JAXVB_TEST_XLA", "").lower() == "default"
    flags = [environ.get("XLA_FLAGS", ""), *test_xla_flags(defaults=defaults)]
    env = {
        "JAX_PLATFORMS": environ.get("JAX_PLATFORMS", "cpu"),
        "XLA_FLAGS": " ".join(flags).strip(),
    }
    if test_cache(environ):
        env["JAX_COMPILATION_CACHE_DIR"] = environ.get(
            "JAX_COMPILATION_CACHE_DIR", cache_dir
        )
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = environ.get(
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"
        )
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = environ.get(
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1"
        )
    return env


def test_cache(environ=None) -> bool:
    """Whether ``JAXVB_TEST_CACHE`` asks for the persistent compilation cache."""
    environ = os.environ if environ is None else environ
    return environ.get("JAXVB_TEST_CACHE", "").lower() in ("1", "true", "yes")


def configure_test_cache() -> None:
    """The cache settings of :func:`test_environment` once more through ``jax.config``,
    in case a plugin imported JAX before the variables were set."""
    if not test_cache():
        return
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )
    jax.config.update(
        "jax_persistent_cache_min_entry_size_bytes",
        int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
    )


#: The test processes' garbage-collector thresholds (Python's default: 700, 10, 10).
_TEST_GC_THRESHOLDS = (10_000, 10, 10)


def configure_test_gc() -> None:
    """Fewer garbage collections in a test process: tracing and compiling allocate
    millions of short-lived objects, and with Python's default thresholds a worker
    that holds hundreds of traced and compiled programs runs full collections often,
    each walking all it holds. Memory is still reclaimed, in larger batches."""
    gc.set_threshold(*_TEST_GC_THRESHOLDS)


def freeze_test_heap() -> None:
    """Leave what a test process holds once its tests are collected (JAX, the modules,
    their data) out of later full collections (``gc.freeze``): it lives to the end."""
    gc.collect()
    gc.freeze()
