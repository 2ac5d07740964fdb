"""The documentation: docstring examples, the README and the documentation site."""

import doctest
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxvb

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(jaxvb.__path__, "jaxvb.")
    if "__main__" not in m.name
)


# The examples run fits and compile them: a slow-tier check. The fast tier keeps
# test_every_public_function_and_class_has_an_example.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["jaxvb", *MODULES])
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0


@pytest.mark.slow
def test_demo_runs_and_reproduces_the_paper(capsys):
    from jaxvb import demo

    out = demo.run(seed=0)
    assert abs(out["toy_rate"] - 2.0) < 1e-10
    assert abs(out["beta_binomial_r_squared"] - 0.82) < 0.04
    assert "R^2" in capsys.readouterr().out


def _public_objects():
    """``(where, object)`` for every public function and class of jaxvb.

    Public: listed in the ``__all__`` of ``jaxvb`` or of one of its modules, or, in a
    module without ``__all__``, defined there without a leading underscore; modules
    with a leading underscore are reached only through what they export.
    """
    import inspect

    seen = {}
    for name in ["jaxvb", *MODULES]:
        if any(part.startswith("_") for part in name.split(".")[1:]):
            continue
        module = importlib.import_module(name)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n in vars(module) if not n.startswith("_")]
        for n in names:
            obj = getattr(module, n)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            home = getattr(obj, "__module__", "") or ""
            if not home.startswith("jaxvb") or (
                not hasattr(module, "__all__") and home != name
            ):
                continue  # another library's, or imported from elsewhere in jaxvb
            seen.setdefault((home, obj.__qualname__), (f"{name}.{n}", obj))
    return sorted(seen.values(), key=lambda item: item[0])


def test_every_public_function_and_class_has_an_example():
    public = _public_objects()
    assert len(public) > 100
    missing = [where for where, obj in public if ">>>" not in (obj.__doc__ or "")]
    assert not missing, f"public names without an example in their docstring: {missing}"


ROOT = Path(__file__).resolve().parents[1]


def _summary():
    """``benchmarks/summary.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "benchmarks_summary", ROOT / "benchmarks" / "summary.py"
    )
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    return summary


def test_readme_results_table_is_what_the_results_say():
    """The README's table is what ``benchmarks/summary.py`` makes of the current JSONs
    (after a benchmark run: ``python benchmarks/summary.py --write-readme``)."""
    summary = _summary()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert summary.readme_block(readme) == summary.table(), (
        "README.md's results table is out of date: python benchmarks/summary.py "
        "--write-readme"
    )


def test_results_pages_cover_every_benchmark_and_figure():
    """Every benchmark script has a documentation page, and every figure in
    ``benchmarks/results/`` is shown on one (the pages are generated at build time)."""
    pages = _summary().docs_pages()
    scripts = {
        p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")
    } - {"summary"}
    assert not [s for s in sorted(scripts) if f"benchmarks/{s}.md" not in pages], (
        "benchmarks without a page: add them to PAGES in benchmarks/summary.py"
    )
    figures = {p.name for p in (ROOT / "benchmarks" / "results").glob("*.png")}
    shown = {name.split("/")[-1] for name in pages if name.endswith(".png")}
    assert figures <= shown, f"figures on no page: {sorted(figures - shown)}"


#: What prose that is true for as long as the code is should not hold: a commit hash,
#: a date, an internal issue number (history belongs in CHANGELOG.md and in commits).
STALE = {
    "commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
    "date": re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b"),
    "issue number": re.compile(r"\bissues? \d+", re.I),
}


def test_readme_and_docs_prose_are_timeless():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [
        f"{path.relative_to(ROOT)}:{n}: {what}: {match.group(0)}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for what, pattern in STALE.items()
        for match in pattern.finditer(line)
    ]
    assert not found, "\n".join(found)


@pytest.mark.integration
def test_docs_build_strict(tmp_path):
    """The documentation site builds with warnings as errors: every page, link,
    API object and docstring resolves (``mkdocs build --strict``)."""
    reason = "the documentation tools are in the test extra: pip install -e '.[test]'"
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=reason)
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in (
        "index.html",
        "getting-started/index.html",
        "guides/diagnostics/index.html",
        "api/fit/index.html",
        "benchmarks/index.html",
        "benchmarks/probit/index.html",
        "benchmarks/probit.png",
        "changelog/index.html",
    ):
        assert (site / page).is_file(), page
    api = (site / "api" / "fit" / "index.html").read_text(encoding="utf-8")
    assert 'id="jaxvb.fit"' in api and ":func:" not in api


@pytest.mark.slow
def test_readme_first_fit_runs_and_says_what_it_prints():
    """The README's first example, run as written; its comments state the results."""
    readme = (ROOT / "README.md").read_text("utf-8")
    first_fit = readme.split("## A first fit", 1)[1]
    code = re.search(r"```python\n(.*?)```", first_fit, re.S).group(1)
    namespace = {}
    exec(compile(code, "README.md (A first fit)", "exec"), namespace)
    res = namespace["res"]
    assert abs(float(res.q.concentration[0]) - 17.0) < 1e-8
    assert abs(float(res.q.rate[0]) - 6.5) < 1e-8
    assert round(float(res.log_evidence), 4) == -12.9855
    assert abs(float(res.r_squared) - 1.0) < 1e-8 and int(res.status) == 0
