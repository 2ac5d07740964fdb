"""The first-fit latency benchmark runs in its quick mode and says what it measured."""

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


@pytest.mark.integration
def test_first_fit_quick(tmp_path):
    """One small posterior, a short fit and a short NUTS run (timings under the tests'
    XLA settings mean nothing here; the structure and the fit's accuracy do)."""
    pytest.importorskip("numpyro")
    load("first_fit").main(["--quick", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "first_fit.json").read_text())
    assert report["settings"]["quick"] is True
    (name,) = report["models"]
    row = report["models"][name]
    for which in ("jaxvb", "nuts"):
        timing = row[which]
        assert timing["first_call_s"] > timing["run_s"] > 0
        assert timing["compile_s"] > 0 and timing["num_compiles"] > 0
    assert row["jaxvb"]["status"] == 0
    # Against the short NUTS run (200 draws: its own Monte Carlo error is ~0.1 sd).
    assert row["jaxvb"]["accuracy"]["max_mean_error_sd"] < 0.5
    assert row["jaxvb"]["accuracy"]["max_sd_rel_error"] < 0.5
    assert report["targets"]["min_speedup"] == row["speedup_first_call"]
