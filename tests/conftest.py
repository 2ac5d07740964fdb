"""Tests run in float64 (float32 is checked explicitly where it matters) on the CPU.

The environment (:func:`jaxvb._platform.test_environment`) is set before JAX starts:
for speed, XLA's backend optimisation and its fusion emitters are off (the tests check
numbers, not speed; the default settings spend most of the suite's time compiling).
``JAXVB_TEST_XLA=default`` runs the tests with XLA's default options, as users run
(``tests/test_platform.py`` does this for the smoke tests). ``JAXVB_TEST_CACHE=1``
turns on JAX's persistent compilation cache in ``.jax_cache/`` (git-ignored).

Every test has a time limit (``--timeout`` in pyproject.toml, pytest-timeout): a fit
that never returns fails its test with a traceback instead of stalling the suite.
pytest-timeout's thread needs the interpreter lock; a hang that holds it is ended by a
second watchdog (``faulthandler``, a C thread) a minute later, which prints every
thread's stack and ends the worker.

Tiers (markers registered in pyproject.toml): ``slow`` for long statistical runs and
large fits, ``integration`` for notebooks, benchmark quick runs, subprocesses and live
NUTS runs. ``-m "not slow and not integration"`` is the fast tier.
"""

import faulthandler
import os
import sys
from pathlib import Path

from jaxvb import _platform  # imports jax, which reads XLA_FLAGS only when first used

# tests/ mirrors jaxvb/, a folder per package; test modules import helpers.py and each
# other's models by name (test_float32 uses test_fit's and test_latent's), so every
# folder is on the path, as pytest puts a test module's own.
for _folder in sorted(Path(__file__).resolve().parent.iterdir()):
    if (
        _folder.is_dir()
        and not _folder.name.startswith((".", "_"))
        and _folder.name != "data"
    ):
        sys.path.insert(0, str(_folder))

os.environ.update(_platform.test_environment(str(Path(__file__).parents[1] / ".jax_cache")))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
_platform.configure_test_cache()
_platform.configure_test_gc()

import pytest  # noqa: E402


def pytest_collection_finish(session):
    _platform.freeze_test_heap()


#: The hard limit of one test, past pytest-timeout's (pyproject.toml: 900 s).
_HARD_TIMEOUT_S = 960.0


@pytest.fixture(autouse=True)
def _hard_timeout():
    """End the process where a test outlives pytest-timeout: ``faulthandler``'s
    watchdog is a C thread, so it fires even where the hang holds the interpreter
    lock (pytest-timeout's thread cannot then run); it prints every thread's stack to
    the real stderr (the worker's, which xdist passes on) and exits."""
    faulthandler.dump_traceback_later(_HARD_TIMEOUT_S, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()


#: ``_platform.compilations()`` when the maps were last counted here.
_counted_at = [-1]


@pytest.fixture(autouse=True)
def _free_compiled_programs():
    """Free compiled programs when a worker holds many memory maps.

    XLA:CPU keeps each compiled program in memory maps of its own (~700 per fit); an
    xdist worker that runs a few hundred tests passes Linux's ``vm.max_map_count`` and
    the next compilation segfaults (seen in CI). ``jaxvb.fit`` guards users at 60% of
    the limit with a warning; the tests clear quietly at 30,000 maps, below it (each
    clearing costs the next tests the small programs they compile again). The maps are
    counted only after a test that compiled something (a read of ``/proc/self/maps``
    costs about a microsecond a map).
    """
    yield
    if _counted_at[0] == _platform.compilations():
        return
    _counted_at[0] = _platform.compilations()
    n = _platform.num_maps()
    if n is not None and n > 30_000:
        jax.clear_caches()
