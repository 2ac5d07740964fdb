"""MkDocs hook: the benchmark pages, generated from ``benchmarks/results/*.json``.

At every build, :func:`benchmarks.summary.docs_pages` turns the JSON files and figures
the benchmark scripts wrote into Markdown pages under ``benchmarks/``; nothing is
written into ``docs/``, so the pages are always those of the results in the checkout.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def _summary():
    spec = importlib.util.spec_from_file_location(
        "benchmarks_summary", ROOT / "benchmarks" / "summary.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_files(files, config):
    for name, content in _summary().docs_pages().items():
        if isinstance(content, Path):
            files.append(File.generated(config, name, abs_src_path=str(content)))
        else:
            files.append(File.generated(config, name, content=content))
    return files
