"""Command line: the demo and the benchmarks.

    python -m jaxvb                                 # the demo (as `demo`)
    python -m jaxvb demo [--seed N]
    python -m jaxvb benchmark --list                # the benchmarks and what they do
    python -m jaxvb benchmark probit --quick        # one benchmark, a fast run
    python -m jaxvb benchmark all --quick           # every benchmark in turn
    python -m jaxvb benchmark probit --out DIR -- --seed 3   # options for the script

The benchmarks are the scripts in ``benchmarks/`` of a source checkout (they are not
part of the installed package); each runs in a Python process of its own, as
``python benchmarks/<name>.py [--quick] [options]`` would.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

from jaxvb import demo as demo_module

#: Where the benchmark scripts are in a source checkout (an editable install).
BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def find_benchmarks(directory: Path = BENCHMARKS_DIR) -> dict[str, Path]:
    """The benchmark scripts in ``directory`` by name (files starting ``_`` are helpers)."""
    return {p.stem: p for p in sorted(Path(directory).glob("*.py")) if p.stem[0] != "_"}


def summary(path: Path) -> str:
    """The first line of a script's docstring, read without running it."""
    doc = ast.get_docstring(ast.parse(Path(path).read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def has_quick_mode(path: Path) -> bool:
    """Whether a script's argument parser has a ``--quick`` option."""
    return '"--quick"' in Path(path).read_text(encoding="utf-8")


def run_script(path: Path, argv: list[str]) -> int:
    """Runs one benchmark script in a Python process of its own; its exit code."""
    return subprocess.run([sys.executable, str(path), *argv], check=False).returncode


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(
        prog="python -m jaxvb",
        description="jaxvb: the demo (the default) and the paper's benchmarks.",
        epilog="With no command, runs the demo.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{demo,benchmark}")
    demo = sub.add_parser("demo", help="fit two of the paper's examples and print a report")
    demo.add_argument("--seed", type=int, default=0)
    bench = sub.add_parser(
        "benchmark",
        help="run a benchmark script from benchmarks/ (source checkout)",
        description=(
            "Runs benchmarks/<name>.py of a source checkout in its own process. Options "
            "it does not know (or everything after --) are passed on to the script, "
            "e.g. --out DIR or --seed N."
        ),
    )
    bench.add_argument("name", nargs="?", help="a benchmark (see --list), or 'all'")
    bench.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    bench.add_argument("--quick", action="store_true", help="a fast smoke-test run")
    bench.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the benchmarks folder (default: benchmarks/ of this source checkout)",
    )
    return parser, bench


def main(argv: list[str] | None = None) -> int:
    """Runs ``python -m jaxvb [demo | benchmark ...]``; returns the exit code.

    Example:
      >>> from jaxvb.__main__ import main
      >>> main(["benchmark", "--list"])  # doctest: +ELLIPSIS
      beta_binomial ...
      ...
      0
    """
    parser, bench = _parsers()
    argv = list(sys.argv[1:] if argv is None else argv)
    passed_on: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passed_on = argv[:cut], argv[cut + 1 :]
    args, unknown = parser.parse_known_args(argv)
    if args.command != "benchmark" and (unknown or passed_on):
        parser.error(f"unrecognized arguments: {' '.join(unknown + passed_on)}")
    if args.command in (None, "demo"):
        demo_module.run(getattr(args, "seed", 0))
        return 0
    return _benchmark(bench, args, unknown + passed_on)


def _benchmark(parser, args, passed_on: list[str]) -> int:
    directory = BENCHMARKS_DIR if args.dir is None else args.dir
    scripts = find_benchmarks(directory) if directory.is_dir() else {}
    if not scripts:
        parser.error(
            f"no benchmark scripts in {directory}. The benchmarks are the scripts in "
            "benchmarks/ of a jaxvb source checkout, not part of the installed package: "
            "run this from a clone of the repository (pip install -e .), or point "
            "--dir at its benchmarks/ folder."
        )
    if args.list:
        width = max(map(len, scripts))
        for name, path in scripts.items():
            quick = "" if has_quick_mode(path) else "  (no --quick)"
            print(f"{name:<{width}}  {summary(path)}{quick}")
        return 0
    if args.name is None:
        parser.error("name a benchmark, 'all', or --list to see them")
    if args.name != "all" and args.name not in scripts:
        parser.error(
            f"unknown benchmark {args.name!r}; choose from {', '.join(scripts)} or 'all'"
        )
    names = list(scripts) if args.name == "all" else [args.name]
    if args.quick:
        slow = [n for n in names if not has_quick_mode(scripts[n])]
        if slow:
            parser.error(f"no --quick mode in {', '.join(slow)}")
    script_argv = (["--quick"] if args.quick else []) + passed_on
    failed = []
    for name in names:
        path = scripts[name]
        print(f"== {name}: python {path} {' '.join(script_argv)}".rstrip(), flush=True)
        code = run_script(path, script_argv)
        if code:
            failed.append(f"{name} (exit code {code})")
    if len(names) > 1:
        print(f"== {len(names) - len(failed)} of {len(names)} benchmarks finished", end="")
        print(f"; failed: {', '.join(failed)}" if failed else "")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
