"""``python -m jaxvb``: the demo and the benchmarks' dispatch (the scripts themselves are
run in their quick mode by test_benchmarks.py, not here: the runner is replaced)."""

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

from jaxvb import __main__ as cli

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
NAMES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))


@pytest.fixture
def runs(monkeypatch):
    """Records the scripts the command line would run, and runs none."""
    calls = []

    def fake_run(path, argv):
        calls.append((Path(path), list(argv)))
        return 0

    monkeypatch.setattr(cli, "run_script", fake_run)
    return calls


def test_list_names_every_benchmark(capsys):
    assert cli.main(["benchmark", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == NAMES
    assert "probit" in NAMES and "stochastic_volatility" in NAMES
    probit = next(line for line in lines if line.startswith("probit "))
    assert "Binary probit regression" in probit


def test_every_benchmark_has_a_quick_mode():
    assert all(cli.has_quick_mode(BENCHMARKS / f"{n}.py") for n in NAMES)


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "benchmark" in out
    with pytest.raises(SystemExit) as exit_:
        cli.main(["benchmark", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "--list" in out and "'all'" in out


def test_unknown_benchmark_is_an_error(capsys, runs):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["benchmark", "nope", "--quick"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'nope'" in err and "probit" in err
    with pytest.raises(SystemExit):
        cli.main(["benchmark"])
    assert "--list" in capsys.readouterr().err
    assert runs == []


@pytest.mark.parametrize("name", ["probit", "exponential_toy", "stochastic_volatility"])
def test_benchmark_quick_runs_that_script_with_quick(name, runs, capsys):
    assert cli.main(["benchmark", name, "--quick"]) == 0
    assert runs == [(BENCHMARKS / f"{name}.py", ["--quick"])]
    assert capsys.readouterr().out.startswith(f"== {name}: ")


def test_other_options_are_passed_on(runs):
    cli.main(["benchmark", "probit", "--out", "/tmp/x", "--seed", "3"])
    cli.main(["benchmark", "beta_binomial", "--quick", "--", "--seed", "4"])
    assert runs == [
        (BENCHMARKS / "probit.py", ["--out", "/tmp/x", "--seed", "3"]),
        (BENCHMARKS / "beta_binomial.py", ["--quick", "--seed", "4"]),
    ]


def test_all_runs_each_in_turn_and_reports_failures(monkeypatch, capsys):
    calls = []

    def fake_run(path, argv):
        calls.append((Path(path).stem, argv))
        return 3 if Path(path).stem == "probit" else 0

    monkeypatch.setattr(cli, "run_script", fake_run)
    assert cli.main(["benchmark", "all", "--quick"]) == 1
    assert calls == [(n, ["--quick"]) for n in NAMES]
    out = capsys.readouterr().out
    assert f"{len(NAMES) - 1} of {len(NAMES)} benchmarks finished" in out
    assert "failed: probit (exit code 3)" in out


def test_without_a_source_checkout_says_where_the_benchmarks_are(
    monkeypatch, tmp_path, capsys, runs
):
    monkeypatch.setattr(cli, "BENCHMARKS_DIR", tmp_path / "site-packages" / "benchmarks")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["benchmark", "probit", "--quick"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "benchmarks/ of a jaxvb source checkout" in err and "--dir" in err
    assert runs == []
    (tmp_path / "mine.py").write_text('"""My benchmark."""\n')  # --dir finds others
    assert cli.main(["benchmark", "mine", "--dir", str(tmp_path)]) == 0
    assert runs == [(tmp_path / "mine.py", [])]
    with pytest.raises(SystemExit):
        cli.main(["benchmark", "mine", "--quick", "--dir", str(tmp_path)])
    assert "no --quick mode in mine" in capsys.readouterr().err


def test_no_command_runs_the_demo(monkeypatch):
    from jaxvb import demo

    seeds = []
    monkeypatch.setattr(demo, "run", seeds.append)
    assert cli.main([]) == 0
    assert cli.main(["demo", "--seed", "3"]) == 0
    assert seeds == [0, 3]
    with pytest.raises(SystemExit):
        cli.main(["demo", "--quick"])


def test_main_docstring_example():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(cli.main, "main", globs={}):
        runner.run(test)
    summary = runner.summarize(verbose=False)
    assert summary.attempted > 0 and summary.failed == 0


@pytest.mark.integration
def test_python_dash_m_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "jaxvb", "benchmark", "--list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == NAMES
