"""Every benchmark script runs end to end in its quick mode and writes its outputs."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exponential_toy_quick(tmp_path):
    pytest.importorskip("matplotlib")
    load("exponential_toy").main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "exponential_toy.json").read_text())
    assert result["checks"]["joint_N4"]["max_rel_error_unflagged"] < 1e-8
    assert result["checks"]["est2_exact_for_S_ge_2"]["max_abs_error"] < 1e-8
    for png in ("exponential_toy_iterations.png", "exponential_toy_estimators.png"):
        assert (tmp_path / png).stat().st_size > 10_000
