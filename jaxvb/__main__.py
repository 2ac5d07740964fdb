"""Command line: ``python -m jaxvb demo``."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxvb", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    demo = sub.add_parser("demo", help="fit two of the paper's examples and print a report")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command in (None, "demo"):
        from jaxvb import demo as demo_module

        demo_module.run(getattr(args, "seed", 0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
