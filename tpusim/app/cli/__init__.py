"""The ``tpusim`` command line: a thin layer over library functions.

Each subcommand lives in its own module under ``tpusim/app/cli/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed ``argparse.Namespace`` and returning an exit code. Input problems raise
:class:`hwmodels.errors.InputError`; ``main`` prints them as one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hwmodels.errors import InputError

# Subcommand modules, in the order ``tpusim --help`` lists them.
SUBCOMMAND_MODULES = (
    "demo",
    "hardware",
    "floor",
    "simulate",
    "sweep",
    "run_kernel",
    "calibrate",
    "compare",
    "plan",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpusim",
        description="Simulate, sweep, run and calibrate MoE decode-step megakernels.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(f"tpusim.app.cli.{module_name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except InputError as error:
        print(f"tpusim {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tpusim {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
