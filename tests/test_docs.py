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


@pytest.mark.parametrize("name", ["jaxvb", *MODULES])
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0


def test_demo_runs_and_reproduces_the_paper(capsys):
    from jaxvb import demo

    out = demo.run(seed=0)
    assert abs(out["toy_rate"] - 2.0) < 1e-10
    assert abs(out["beta_binomial_r_squared"] - 0.82) < 0.04
    assert "R^2" in capsys.readouterr().out
