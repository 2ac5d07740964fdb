"""MkDocs hook: the benchmark pages, generated from ``benchmarks/results/*.json``.

At every build, ``benchmarks/summary.py`` turns the JSON files and figures the
benchmark scripts wrote into Markdown pages under ``benchmarks/`` (:func:`on_files`)
and lists them in the navigation (:func:`on_config`); nothing is written into ``docs/``,
so the pages are always those of the results in the checkout, and a new benchmark
script gets its page without an edit here.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _summary():
    spec = importlib.util.spec_from_file_location(
        "benchmarks_summary", ROOT / "benchmarks" / "summary.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_config(config):
    """The navigation's ``Benchmarks`` entry lists the overview, then every page."""
    pages = [{page.title: f"benchmarks/{name}.md"} for name, page in _pages()]
    for i, item in enumerate(config.nav or []):
        if isinstance(item, dict) and "Benchmarks" in item:
            config.nav[i] = {"Benchmarks": ["benchmarks/index.md", *pages]}
    return config


def _pages():
    return _summary().pages().items()


def on_files(files, config):
    for name, content in _summary().docs_pages().items():
        if isinstance(content, Path):
            files.append(File.generated(config, name, abs_src_path=str(content)))
        else:
            files.append(File.generated(config, name, content=content))
    return files
