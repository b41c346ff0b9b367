"""``python -m laneflow demo``, ``python -m laneflow bench <suite>`` and ``python -m laneflow info``."""

from __future__ import annotations

import argparse
import sys

from . import demo, info
from .bench import cli as bench_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m laneflow",
                                     description="laneflow: independent array work runs at the same time on "
                                                 "several lanes.")
    sub = parser.add_subparsers(dest="command", metavar="command")
    sub.required = True
    demo.add_parser(sub)
    bench_cli.add_parser(sub)
    info.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
