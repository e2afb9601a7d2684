"""The ``tpusim`` command line: a thin layer over library functions.

Each of ``tpusim``'s own subcommands lives in its own module under ``tpusim/app/cli/`` and
exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking
the parsed ``argparse.Namespace`` and returning an exit code. The commands of the layers above
(``run-kernel`` and ``lower`` in ``megakernel/commands/``; ``calibrate``, ``report`` and
``demo`` in ``calibration/commands/``) have the same shape and are found through the
``tpusim.commands`` entry points (:mod:`tpusim.app.plugins`), so this package imports nothing
above ``tpusim``. Input problems raise :class:`hwmodels.errors.InputError`; ``main`` prints
them (and pydantic validation errors) as one line on stderr and exits 2 (see
:mod:`tpusim.app.cli.run_guard`); an entry point that fails to load is one line, exit 1. Every
parser takes ``--local-dir DIR`` (:func:`tpusim.app.cli.common.add_local_dir_option`): the
folder of calibrated overlays and local entries, as ``TPUSIM_LOCAL_DIR`` sets it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

# tpusim's own subcommands: name -> module under tpusim/app/cli/.
OWN_COMMANDS = {
    "hardware": "hardware",
    "floor": "floor",
    "simulate": "simulate",
    "sweep": "sweep",
    "compare": "compare",
    "serving": "serving",
    "plan": "plan",
    "diff": "diff",
    "overlays": "overlays",
    "schema": "schema",
    "sources": "sources",
}

# The order ``tpusim --help`` lists the commands in, by the names a user types (those of the
# layers above come from entry points, whose order is the installer's); a command not named
# here follows these, by name.
HELP_ORDER = (
    "demo",
    "hardware",
    "floor",
    "simulate",
    "sweep",
    "run-kernel",
    "lower",
    "calibrate",
    "report",
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
    registrars = _registrars()
    for name in sorted(registrars, key=lambda n: (HELP_ORDER.index(n) if n in HELP_ORDER else len(HELP_ORDER), n)):
        registrars[name](subparsers)
    _finish(parser)
    return parser


def _registrars() -> dict[str, Callable[[argparse._SubParsersAction], None]]:  # type: ignore[type-arg]
    """Command name -> its ``register``: tpusim's own, then those of the ``tpusim.commands``
    entry points (:mod:`tpusim.app.plugins`; :class:`~tpusim.app.plugins.PluginError` when one
    fails to load or takes a name already taken)."""
    from tpusim.app.plugins import COMMANDS, REINSTALL, PluginError, load

    found = {name: importlib.import_module(f"tpusim.app.cli.{module}").register
             for name, module in OWN_COMMANDS.items()}
    for name, register in load(COMMANDS).items():
        if name in found:
            raise PluginError(f"the command {name} is declared twice (tpusim's own and an entry point of group "
                              f"{COMMANDS}); {REINSTALL}")
        found[name] = register
    return found


def _missing_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first argument when it names a command of :data:`HELP_ORDER` that nothing registered."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    first = next((token for token in argv if not token.startswith("-")), None)
    return first if first in HELP_ORDER and first not in commands else None


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
    from tpusim.app.plugins import PluginError

    try:
        parser = build_parser()
    except PluginError as error:  # an installation problem: one line, exit 1 (input errors exit 2)
        print(f"tpusim: error: {error}", file=sys.stderr)
        return 1
    argv = list(sys.argv[1:] if argv is None else argv)
    missing = _missing_command(parser, argv)
    if missing:  # metadata older than the code (installed before an entry point was added)
        from tpusim.app.plugins import COMMANDS, REINSTALL

        print(f"tpusim: error: the command {missing} is not installed (no entry point of group {COMMANDS} "
              f"declares it); {REINSTALL}", file=sys.stderr)
        return 1
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
