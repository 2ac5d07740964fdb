"""Every benchmark script runs end to end in its quick mode and writes its outputs."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.integration

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_quick(name, tmp_path):
    """``benchmarks/<name>.py --quick`` in a process of its own; its results."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_harness(tmp_path):
    """``_common``: first call and calls after compile, the JSON round trip of numpy
    values, and a worker process's payloads (also those before a time limit)."""
    common = load("_common")
    calls = []

    def call(i):
        calls.append(i)
        return jnp.ones(3) * i

    out, timing = common.first_and_after(call, 3)
    assert calls == [0, 1, 2, 3] and float(out[0]) == 0.0
    assert timing["first_call_s"] > 0 and timing["run"]["repeats"] == 3
    assert timing["run"]["min_s"] <= timing["run"]["median_s"]
    report = dict(a=np.float64(1.5), b=np.arange(3), c=jnp.ones(2))
    common.write_json(tmp_path, "x", report)
    assert common.read_result("x", tmp_path) == dict(a=1.5, b=[0, 1, 2], c=[1.0, 1.0])
    script = tmp_path / "worker.py"
    script.write_text(
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "import _common\n"
        "spec = json.loads(sys.argv[2])\n"
        "_common.emit(dict(spec, seen=True))\n"
        "time.sleep(spec['sleep'])\n"
    )
    payloads, error = common.run_worker(script, dict(sleep=0), 60)
    assert payloads == [dict(sleep=0, seen=True)] and error is None
    # the limit leaves the worker time to import _common (JAX) and emit first
    payloads, error = common.run_worker(script, dict(sleep=300), 6)
    assert payloads == [dict(sleep=300, seen=True)] and error.startswith("stopped")


def test_exponential_toy_quick(tmp_path):
    pytest.importorskip("matplotlib")
    load("exponential_toy").main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "exponential_toy.json").read_text())
    assert result["checks"]["joint_N4"]["max_rel_error_all"] < 1e-8
    assert result["checks"]["est2_exact_for_S_ge_2"]["max_abs_error"] < 1e-8
    for png in ("exponential_toy_iterations.png", "exponential_toy_estimators.png"):
        assert (tmp_path / png).stat().st_size > 10_000


def test_stochastic_volatility_quick(tmp_path):
    """The SV benchmark's quick mode, and the format of ``--refs``'s reference."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("numpyro")
    result = load("stochastic_volatility").main(["--quick", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "stochastic_volatility.json").read_text())["quick"]
    timing = result["speed"]["svapprox"]["diagnostics"]
    assert 0 < timing["run"]["median_s"] < timing["first_call_s"]
    assert timing["speedup_vs_nuts"] == pytest.approx(
        result["nuts"]["wall_s"] / timing["run"]["median_s"]
    )
    acc = result["accuracy"]["svapprox"]
    assert len(acc["fits"]) == 2
    for fit in acc["fits"]:
        assert fit["status"] == 0 and fit["r_squared"] > 0.99
        # The same fit as the full run: the paper's accuracy, with room for the quick
        # run's 10000 draws (Monte Carlo error ~0.01 NUTS sd).
        for k in ("phi", "s2", "beta"):
            assert abs(fit["vs_nuts"][k]["mean_error_in_nuts_sd"]) < 0.25, k
            assert 0.8 < fit["vs_nuts"][k]["sd_ratio"] < 1.2, k
        assert fit["volatility_vs_nuts"]["mean"]["max_abs_error_in_nuts_sd"] < 0.3
    assert set(result["targets"]) == {
        "fit_after_compile_ms",
        "speedup_vs_nuts",
        "means_within_nuts_sd",
        "sds_within_15_percent",
    }
    assert all(isinstance(t["met"], bool) for t in result["targets"].values())
    for name in ("posteriors", "volatility"):
        assert (tmp_path / f"stochastic_volatility_{name}.png").stat().st_size > 10_000

    # --refs writes the stored reference's format (same keys at every level).
    stored = json.loads((BENCHMARKS.parent / "tests" / "data" / "sv_nuts.json").read_text())
    rng = np.random.default_rng(0)
    draws = {k: rng.uniform(0.1, 0.9, (2, 50)) for k in ("phi", "s2", "beta")}
    draws["v"] = rng.normal(size=(2, 50, 7))
    settings = dict(stored["settings"], num_samples=50, num_chains=2)
    record = load("stochastic_volatility").reference_record(draws, 1.0, settings, "abc")

    def keys(d):
        return {k: keys(v) if isinstance(v, dict) else None for k, v in d.items()}

    assert keys(record) == keys(stored)
    assert len(record["params"]["phi"]["draws_thinned"]) == 100
    assert len(record["v"]["mean"]) == 7
    assert record["params"]["phi"]["mean"] == pytest.approx(draws["phi"].mean())


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


def test_beta_binomial_quick(tmp_path):
    pytest.importorskip("matplotlib")
    load("beta_binomial").main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "beta_binomial.json").read_text())
    assert result["quadrature"]["log_z"] == pytest.approx(-570.70861, abs=1e-4)
    rows = {r["K"]: r for r in result["table"]}
    assert set(rows) == {1, 8}
    # One Gaussian: the paper's R^2 of 0.82; more components, a smaller exact KL.
    (k1,), (k8,) = rows[1]["repeats"], rows[8]["repeats"]
    assert 0.8 < k1["exact_r_squared"] < 0.87
    assert k8["exact_kl"] < 0.1 * k1["exact_kl"]
    assert all(r["status"] == 0 for row in rows.values() for r in row["repeats"])
    targets = {"kl_k8", "r_squared_k8", "log_evidence_k8", "fit_time"}
    assert set(result["targets"]) == targets
    assert all(isinstance(t["met"], bool) for t in result["targets"].values())
    for png in ("beta_binomial_kl.png", "beta_binomial_contours.png"):
        assert (tmp_path / png).stat().st_size > 10_000


@pytest.mark.integration
def test_latent_gaussian_quick(tmp_path):
    """The latent Gaussian benchmark's quick mode (GLMM only, its own process: the
    module turns on float64), and the format of ``--refs``'s references."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("numpyro")
    result = run_quick("latent_gaussian", tmp_path)
    glmm = result["problems"]["glmm_baseball"]
    for variant in ("diagnostics", "no_diagnostics"):
        timing = glmm["jaxvb"][variant]
        assert timing["status"] == 0
        assert 0 < timing["run"]["median_s"] < timing["first_call_s"]
    # A near-Gaussian posterior: 100 steps and 2000 draws are well inside the targets
    # (Monte Carlo error of the means ~0.02 reference sd).
    for fit in glmm["accuracy"]["fits"]:
        assert fit["status"] == 0 and fit["r_squared"] > 0.99
        for name, p in fit["params"].items():
            assert abs(p["mean_error_in_ref_sd"]) < 0.25, name
            assert 0.8 < p["sd_ratio"] < 1.2, name
        assert fit["latent"]["rms_standardised_error"] < 0.15
        assert 0.8 < fit["latent"]["median_sd_ratio"] < 1.2
    # the importance-corrected draws of a near-Gaussian posterior: light-tailed
    # weights (k-hat ~0.3 measured) and means as good as q's
    imp = glmm["importance"]
    assert imp["khat"] < 0.7 and imp["ess"] > 500
    assert imp["worst"]["max_abs_mean_error_in_ref_sd"] < 0.25
    assert glmm["nuts"]["run_s"] > 0 and glmm["nuts"]["vs_reference"]["latent"]
    assert glmm["reference"]["r_hat_max"] < 1.01
    assert set(result["targets"]) == {"glmm_baseball", "scaling_slope"}
    assert all(
        isinstance(t["met"], bool) for t in result["targets"]["glmm_baseball"].values()
    )
    rows = result["scaling"]["rows"]
    assert [r["T"] for r in rows] == [500, 1000] and all(r["run_s"] > 0 for r in rows)
    assert np.isfinite(result["scaling"]["log_log_slope"])
    for name in ("accuracy", "speed"):
        assert (tmp_path / f"latent_gaussian_{name}.png").stat().st_size > 10_000

    # --refs writes the stored references' format (same keys at every level).
    module = load("latent_gaussian")
    problem = module.glmm_problem()
    stored = module.read_reference(problem.name)
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(2, 50, 3))
    f = rng.normal(size=(2, 50, problem.num_latent))
    info = {k: stored[k] for k in ("settings", "wall_s", "commit", "num_divergent")}
    record = module.reference_record(problem, theta, f, dict(info, mean_num_steps=7.0))

    def keys(d):
        return {k: keys(v) if isinstance(v, dict) else None for k, v in d.items()}

    assert keys(record) == keys(stored)
    assert record["params"]["beta0"]["mean"] == pytest.approx(theta[..., 0].mean())
    assert len(record["f"]["mean"]) == problem.num_latent


@pytest.mark.parametrize("name", ["sv_sp500", "lgcp_brambles"])
def test_latent_gaussian_fixed_effects_models_are_the_reference_posterior(name):
    """The model jaxvb fits (the fixed effects last in the field, ``Problem.fit_model``)
    is the reference's posterior in other coordinates: at points mapped by
    ``Problem.to_reference`` (the level a shift of the field, unit Jacobian) the two
    log joints are equal -- the flat prior's ``log_norm`` (SV) and the intercept's
    prior in the arrowhead's corner (LGCP) included."""
    module = load("latent_gaussian")
    problem = module.PROBLEMS[name]()
    model, theta0 = problem.jaxvb_model
    fit_model = model.bind(theta0)
    reference = problem.model.bind(problem.theta0)
    # compiled whole: evaluated op by op, the LGCP grid's log joint compiles hundreds
    # of small programs (seconds)
    fit_log_joint, reference_log_joint = jax.jit(fit_model), jax.jit(reference)
    rng = np.random.default_rng(0)
    for _ in range(3):
        theta = theta0 + 0.1 * rng.normal(size=theta0.shape)
        f = 0.3 * rng.normal(size=fit_model.num_field)
        f[-1] += 1.0
        theta_ref, f_ref = problem.reference_draws(theta[None], f[None])
        x = jnp.concatenate([jnp.asarray(theta), jnp.asarray(f)])
        x_ref = jnp.concatenate([jnp.asarray(theta_ref[0]), jnp.asarray(f_ref[0])])
        assert float(fit_log_joint(x)) == pytest.approx(
            float(reference_log_joint(x_ref)), rel=1e-12
        )


def test_gpu_quick(tmp_path):
    """The accelerator script's quick mode runs on the CPU: every section in its own
    subprocess, a row per size, the device named."""
    out = load("gpu").main(["--quick", "--out", str(tmp_path), "--budget", "300"])
    report = json.loads((tmp_path / "gpu.json").read_text())
    record = report["runs"][out["device"]]
    assert record["backend"] == "cpu" and record["environment"]["devices"]
    sections = record["sections"]
    assert set(sections) == {"probit", "dimension", "sv"}
    for name, section in sections.items():
        assert "error" not in section, (name, section["error"])
        assert section["rows"] and all("error" not in row for row in section["rows"])
    (probit,) = sections["probit"]["rows"]
    assert probit["num_datasets"] == 20 and probit["flagged_fraction"] == 0.0
    assert probit["run"]["median_s"] > 0 and 0.5 < probit["coverage_95"] <= 1.0
    (dim,) = sections["dimension"]["rows"]
    assert dim["d"] == 12 and dim["fit"]["iterations"]["ms_per_step"] > 0
    batch, single = sections["sv"]["rows"]
    assert single["tridiagonal"] == "sequential"  # the CPU keeps the row scans
    assert single["status"] == 0 and np.isfinite(single["elbo"])
    assert batch["num_series"] == 3 and batch["T"] == 50 and batch["run"]["median_s"] > 0


def test_dimension_quick(tmp_path):
    pytest.importorskip("matplotlib")
    result = run_quick("dimension", tmp_path)
    rows = result["rows"]
    assert [r["d"] for r in rows] == [12, 32] and all("error" not in r for r in rows)
    for r in rows:
        it = r["fit"]["iterations"]
        assert it["status"] == 0
        assert 0 < it["run"]["median_s"] < it["first_call_s"]
        assert it["over_model"] == pytest.approx(
            it["run"]["median_s"] / r["model"]["run"]["median_s"]
        )
        assert 0 < r["peak_rss_mb"] < 64_000
    assert result["environment"]["git"]["commit"]
    assert (tmp_path / "dimension.png").stat().st_size > 10_000


def test_hierarchical_quick(tmp_path):
    """The hierarchical benchmark's quick mode (the centred eight schools through
    latent='theta', NUTS beside it): scored against the stored reference, with the
    route's times and NUTS's, and a figure; the reference's format."""
    result = run_quick("hierarchical", tmp_path)
    row = result["models"]["eight_schools_centered"]
    assert row["fit"]["route"] == {"latent": "theta"}
    assert row["verdict"] in ("accurate", "accurate (flagged)", "flagged")
    assert row["score"]["max_mean_error_sd"] < 0.25
    assert set(row["score"]["by_site"]) == {"mu", "tau", "theta"}
    assert row["fit"]["first_call_s"] > row["fit"]["after_compile_s"] > 0
    assert row["nuts"]["first_call_s"] > row["nuts"]["after_compile_s"] > 0
    assert (tmp_path / "hierarchical.png").stat().st_size > 10_000
    refs = json.loads((BENCHMARKS.parent / "tests/data/hierarchical_nuts.json").read_text())
    assert len(refs["models"]) >= 10
    for ref in refs["models"].values():
        assert ref["max_r_hat"] < 1.01 and ref["min_ess"] > 1000


@pytest.mark.integration
def test_verdicts_quick(tmp_path):
    """The verdicts benchmark's quick mode (the non-centred eight schools on its own
    data and one data set simulated at the stored reference's posterior means, two
    keys each, short NUTS on each data set): every fit scored against its data set's
    reference, the flag's agreement with accuracy counted, and a figure."""
    result = run_quick("verdicts", tmp_path)
    model = result["models"]["eight_schools_noncentered"]
    refs = json.loads((BENCHMARKS.parent / "tests/data/hierarchical_nuts.json").read_text())
    stored = refs["models"]["eight_schools_noncentered"]["sites"]
    assert model["hyperparameters"] == {
        "mu": stored["mu"]["mean"][0],
        "tau": stored["tau"]["mean"][0],
    }
    rows = model["datasets"]
    assert [(r["index"], r["origin"]) for r in rows] == [(0, "benchmark"), (1, "simulated")]
    # the short reference on the benchmark's data agrees with the stored long one
    # (its Monte Carlo error of the means is ~0.05 sd)
    vs = rows[0]["reference_vs_stored"]
    assert (
        vs["max_mean_error_sd"] < 0.25
        and 0.8 < vs["sd_ratio"][0] <= vs["sd_ratio"][1] < 1.2
    )
    for r in rows:
        ref = r["reference"]
        assert set(ref["sites"]) == {"mu", "tau", "theta"} and ref["max_r_hat"] < 1.05
        assert len(r["fits"]) == 2 and r["verdict"] == r["fits"][0]["verdict"]
        for fit in r["fits"]:
            assert (fit["status"] != 0) == (fit["flags"] != "OK")
            imp = fit["importance"]
            assert np.isfinite(fit["khat"]) and imp["num_proposals"] == 16000
            assert 0 < imp["ess"] <= 16000 and imp["log_weight_variance"] > 0
            assert set(fit["score"]["by_site"]) == {"mu", "tau", "theta"}
            # eight schools is never far off: no fit's means are, flagged or not
            assert fit["score"]["max_mean_error_sd"] < 0.5
            assert fit["verdict"] in ("accurate", "accurate (flagged)", "flagged")
    s = model["summary"]
    assert s["num_datasets"] == 2 and s["num_fits"] == 4
    assert sum(s["verdicts_every_key"].values()) == 4
    a = s["agreement"]
    assert a["of"] == 4
    assert (
        a["agree"] + len(a["accurate_but_flagged"]) + len(a["inaccurate_without_flag"]) == 4
    )
    assert result["targets"]["no_inaccurate_fit_without_flag"]["met"]
    assert set(result["targets"]) == {
        "no_inaccurate_fit_without_flag",
        "no_accurate_fit_flagged",
        "flag_same_over_keys",
    }
    assert (tmp_path / "verdicts.png").stat().st_size > 10_000
