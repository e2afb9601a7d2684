"""The ``tpusim`` command line: a thin layer over library functions.

Each subcommand lives in its own module under ``tpusim/app/cli/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed ``argparse.Namespace`` and returning an exit code. Input problems raise
:class:`hwmodels.errors.InputError`; ``main`` prints them (and pydantic validation errors)
as one line on stderr and exits 2 (see :mod:`tpusim.app.cli.run_guard`). Every parser
takes ``--local-dir DIR`` (:func:`tpusim.app.cli.common.add_local_dir_option`): the folder
of calibrated overlays and local entries, as ``TPUSIM_LOCAL_DIR`` sets it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

# Subcommand modules, in the order ``tpusim --help`` lists them.
SUBCOMMAND_MODULES = (
    "demo",
    "hardware",
    "floor",
    "simulate",
    "sweep",
    "run_kernel",
    "lower",
    "calibrate",
    "compare",
    "serving",
    "plan",
    "diff",
    "overlays",
    "schema",
    "sources",
)


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default unless it names one already
    (``argparse.ArgumentDefaultsHelpFormatter`` would repeat it and show ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default in (None, False, "", argparse.SUPPRESS)
                or "default" in text or "%(default)" in text):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Every ``tpusim`` parser, nested ones too (``add_subparsers`` builds children of the
    parent's class): no abbreviations (``--schedule`` must not quietly become ``--scheduler``,
    nor ``--mod`` ``--model``), and a parse error is one line, ``tpusim CMD: error: ...``,
    exit 2, like every other input problem (the usage is one ``--help`` away)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tpusim")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def _finish(parser: argparse.ArgumentParser) -> None:
    """Every parser, nested ones too, gets the help formatter and ``--local-dir``."""
    from tpusim.app.cli.common import add_local_dir_option

    parser.formatter_class = HelpFormatter
    if not any("--local-dir" in action.option_strings for action in parser._actions):
        add_local_dir_option(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _finish(child)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tpusim",
        description="Simulate, sweep, run and calibrate MoE decode-step megakernels. "
        "`tpusim COMMAND --help` describes each command; `tpusim schema TOPIC` the file formats.",
    )
    parser.add_argument("--version", action="version", version=f"tpusim {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", help="one of:")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(f"tpusim.app.cli.{module_name}").register(subparsers)
    _finish(parser)
    return parser


def _chosen_parsers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[argparse.ArgumentParser]:
    """The parser and the (nested) subparsers the parsed ``args`` went through."""
    chain = [parser]
    while True:
        actions = [a for a in chain[-1]._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions:
            return chain
        name = getattr(args, actions[0].dest or "", None)
        if name not in actions[0].choices:
            return chain
        chain.append(actions[0].choices[name])


def given_options(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]) -> frozenset[str]:
    """The ``dest`` of every option the user typed (not defaulted), so a command can refuse a
    flag its chosen path does not use (:func:`tpusim.app.cli.flag_rules.refuse_unused`)."""
    by_string: dict[str, str] = {}
    for each in _chosen_parsers(parser, args):
        for action in each._actions:
            for option in action.option_strings:
                by_string[option] = action.dest
    given = set()
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if not name.startswith("-") or name == "-":
            continue
        if name in by_string:  # abbreviations are refused by the parser (Parser): only full names
            given.add(by_string[name])
    return frozenset(given)


def cpu_only_without_a_tpu() -> None:
    """On a host with no TPU, keep JAX on the CPU unless the user chose (``JAX_PLATFORMS``):
    with libtpu installed (the ``[test]`` and ``[tpu-compile]`` extras) JAX would otherwise try
    the TPU backend first and libtpu prints a screen of initialisation errors before falling
    back. A TPU host shows its chips as ``/dev/accel*`` or ``/dev/vfio/<n>`` device nodes."""
    import glob
    import os

    if "JAX_PLATFORMS" not in os.environ and not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        os.environ["JAX_PLATFORMS"] = "cpu"


def main(argv: Sequence[str] | None = None) -> int:
    cpu_only_without_a_tpu()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.given = given_options(parser, args, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from tpusim.app.cli.common import local_dir_from
    from tpusim.app.cli.run_guard import run_command

    with local_dir_from(args):  # --local-dir DIR: overlays and local entries from DIR
        return run_command(args)  # locks, signals, and every input error as one line, exit 2


if __name__ == "__main__":
    sys.exit(main())
