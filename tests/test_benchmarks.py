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


def test_probit_quick(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("numpyro")
    load("probit").main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "probit.json").read_text())
    methods = ("basic", "factor", "factor_gradient", "hessian", "hessian_minibatch", "vbem")
    for name in methods:
        row = result["table"][name]
        for key in ("rmse", "log_score", "r_squared", "likelihood_evaluations"):
            assert key in row
        assert {"kl", "sme_max", "sme_mean"} <= set(row["vs_nuts"])
        assert result["curves"][name]
    # Algorithm 2 from the prior is accurate after 50 steps even in the quick run.
    assert result["table"]["hessian"]["rmse"] < 0.3
    assert result["table"]["hessian"]["r_squared"] > 0.9
    # VBEM's covariance is too small: its log score is far below the fixed-form one's.
    assert (
        result["table"]["vbem"]["log_score"] < result["table"]["hessian"]["log_score"] - 2
    )
    speed = result["speed"]
    assert speed["jaxvb_single"]["no_diagnostics"]["median_s"] > 0
    assert speed["all_datasets"]["no_diagnostics"]["python_loop_s"] > 0
    assert speed["svi"] and "svi_fastest_matching" in speed
    assert set(result["targets"]) == {
        "single_fit_200_steps_ms",
        "faster_than_svi",
        "all_datasets_vmapped_s",
    }
    assert result["environment"]["cpu_count"] >= 1 and result["environment"]["jax_version"]
    assert (tmp_path / "probit.png").stat().st_size > 10_000
