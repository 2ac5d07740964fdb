"""The examples in the public docstrings run and print what they say."""

import doctest
import importlib
import pkgutil

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


def test_readme_results_table_is_what_the_results_say():
    """The README's table is what ``benchmarks/summary.py`` makes of the current JSONs
    (after a benchmark run: ``python benchmarks/summary.py --write-readme``)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "summary", root / "benchmarks" / "summary.py"
    )
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert summary.readme_block(readme) == summary.table(), (
        "README.md's results table is out of date: python benchmarks/summary.py "
        "--write-readme"
    )


@pytest.mark.slow
def test_readme_first_fit_runs_and_says_what_it_prints():
    """The README's first example, run as written; its comments state the results."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    first_fit = readme.split("## A first fit", 1)[1]
    code = re.search(r"```python\n(.*?)```", first_fit, re.S).group(1)
    namespace = {}
    exec(compile(code, "README.md (A first fit)", "exec"), namespace)
    res = namespace["res"]
    assert abs(float(res.q.concentration[0]) - 17.0) < 1e-8
    assert abs(float(res.q.rate[0]) - 6.5) < 1e-8
    assert round(float(res.log_evidence), 4) == -12.9855
    assert abs(float(res.r_squared) - 1.0) < 1e-8 and int(res.status) == 0
