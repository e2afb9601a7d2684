"""How every subcommand runs: one writer per output, signals as interrupts, errors as one line.

:func:`run_command` is what ``tpusim.app.cli.main`` calls after parsing. Around the
subcommand's ``func`` it

1. turns SIGTERM into an interrupt (:mod:`tpusim.app.interrupts`), so ``kill`` unwinds
   like Ctrl-C and atomic writers clean up; a command that received SIGINT or SIGTERM exits
   130 or 143 whatever exception the interrupt became on its way up (a library may wrap it);
2. refuses an output path that would be destroyed (a FIFO, device or folder where a file
   goes: :func:`tpusim.app.cli.common.check_outputs`), then holds the output lock (:mod:`tpusim.app.outdir_lock`) when the subcommand declared one
   with ``set_defaults(output_lock="folder" | "file")`` on its ``--out``;
3. prints every input problem as one line, ``tpusim CMD: error: ...``, exit 2: our own
   :class:`~hwmodels.errors.InputError`, pydantic ``ValidationError`` raised by models
   built after parsing (speculative settings, plans, formats, schedules made in code),
   ``OSError`` from reading or writing a user's path, and ``MemoryError`` (a size this host
   cannot hold; the size limits refuse the known ones before they allocate).

An entry point the command needed that failed to load (:class:`tpusim.app.plugins.PluginError`:
an installation problem) is one line too, exit 1. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from hwmodels.errors import InputError
from tpusim.app.cli.common import check_local_dir, check_outputs
from tpusim.app.cli.flag_rules import refuse_unused
from tpusim.app.interrupts import Received, Terminated, terminate_as_interrupt
from tpusim.app.outdir_lock import output_lock
from tpusim.app.tables import output_format

EXIT_INPUT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


def validation_message(error: ValidationError) -> str:
    """One line for a pydantic error raised outside any file: ``Model: field: message``."""
    from tpusim.workload.model_catalog import format_validation_error

    return format_validation_error(error.title, error)


def os_error_message(error: OSError) -> str:
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or error}"


def _lock(args: argparse.Namespace) -> contextlib.AbstractContextManager[object]:
    kind = getattr(args, "output_lock", None)
    out = getattr(args, "out", None)
    if kind is None or out is None:
        return contextlib.nullcontext()
    return output_lock(Path(out), command=args.command, is_folder=kind == "folder",
                       on_stale=lambda line: print(f"tpusim {args.command}: {line}", file=sys.stderr))


def input_error_message(error: BaseException) -> str | None:
    """The one line for an input problem (see the module docstring); ``None``: a bug."""
    if isinstance(error, InputError):
        return str(error)
    if isinstance(error, ValidationError):
        return validation_message(error)
    if isinstance(error, OSError):
        return os_error_message(error)
    if isinstance(error, MemoryError):
        return "ran out of memory: this host cannot hold the request; lower --batch or --context"
    return None


def _interrupted(command: str, error: BaseException, received: Received) -> int | None:
    """The exit code of a command stopped by a signal, or ``None`` when it was not.

    Asked first for every exception: once SIGINT or SIGTERM arrived, what it turned into
    (an ``OSError`` from a cut write, a library's own error) is the interrupt, not a problem
    to report."""
    if received.first == signal.SIGTERM or isinstance(error, Terminated):
        print(f"tpusim {command}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    if received.first == signal.SIGINT or isinstance(error, KeyboardInterrupt):
        print(f"tpusim {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return None


def run_command(args: argparse.Namespace) -> int:
    """Run ``args.func(args)`` as described in the module docstring; return the exit code."""
    received = Received()
    try:
        output_format(args)  # --json against a different --format: refused before any work
        check_outputs(args)  # an output path that is a FIFO, device or folder: refused before any work
        check_local_dir(args)  # --local-dir FILE or /dev/full: refused before any work
        refuse_unused(args)  # a typed flag the chosen path ignores (what the options alone show): before any work
        with terminate_as_interrupt() as received, _lock(args):
            return int(args.func(args) or 0)
    except SystemExit:
        raise
    except BaseException as error:
        code = _interrupted(args.command, error, received)
        if code is not None:
            return code
        from tpusim.app.plugins import PluginError

        if isinstance(error, PluginError):  # an entry point a command needed did not load: not input
            print(f"tpusim {args.command}: error: {error}", file=sys.stderr)
            return 1
        message = input_error_message(error)
        if message is None:
            raise
    print(f"tpusim {args.command}: error: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_INPUT_ERROR
