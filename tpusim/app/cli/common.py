"""Options shared by the subcommands: the local folder (every command), and the model, system
and batch of those that take a workload."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hwmodels import values
from hwmodels.atomic import check_output_file, check_output_folder
from hwmodels.errors import InputError
from tpusim.cli_options import (
    add_batch_option,
    add_chips_option,
    add_context_option,
    add_hardware_option,
    add_model_option,
    add_routing_options,
    argument_type,
)

LOCAL_DIR_HELP = ("folder of machine-local catalog entries (host-cpu) and calibrated overlays; the same as "
                  "setting TPUSIM_LOCAL_DIR (default: $TPUSIM_LOCAL_DIR, else the user data folder)")


def add_local_dir_option(parser: argparse.ArgumentParser) -> None:
    """``--local-dir DIR``: which calibrated overlays and local entries a command reads and
    writes (:func:`hwmodels.files.local_dir`). Unset unless given (``SUPPRESS``), so a
    subcommand's default never hides a ``tpusim --local-dir DIR COMMAND`` given before it."""
    parser.add_argument("--local-dir", default=argparse.SUPPRESS, metavar="DIR", help=LOCAL_DIR_HELP)


@contextlib.contextmanager
def local_dir_from(args: argparse.Namespace) -> Iterator[None]:
    """While a command runs, ``--local-dir`` (if given) is the local folder: it sets
    ``TPUSIM_LOCAL_DIR``, the one place :func:`hwmodels.files.local_dir` reads, and restores
    the previous value afterwards (in-process callers such as the demo and the tests)."""
    from hwmodels.files import LOCAL_DIR_ENV

    chosen = getattr(args, "local_dir", None)
    if chosen is None:
        yield
        return
    previous = os.environ.get(LOCAL_DIR_ENV)
    os.environ[LOCAL_DIR_ENV] = str(chosen)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LOCAL_DIR_ENV, None)
        else:
            os.environ[LOCAL_DIR_ENV] = previous


def check_local_dir(args: argparse.Namespace) -> None:
    """``--local-dir`` (else ``TPUSIM_LOCAL_DIR``) checked by :func:`_check_folder_path`."""
    from hwmodels.files import LOCAL_DIR_ENV

    chosen = getattr(args, "local_dir", None)
    if chosen is not None:
        _check_folder_path(str(chosen), "--local-dir")
    elif os.environ.get(LOCAL_DIR_ENV):
        _check_folder_path(os.environ[LOCAL_DIR_ENV], LOCAL_DIR_ENV)


def _check_folder_path(text: str, where: str) -> None:
    """The local folder is a folder, or a path where one can be made: a file, a device
    (``/dev/full``) or a path below a file is refused before any command reads or writes it."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"{where} {text}: not a folder (calibrated overlays and local entries live in a folder)")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not path.exists() and not parent.is_dir():
        raise InputError(f"{where} {text}: cannot be a folder: {parent} is not one")


def warn_outside_fit(chip: Any, model_spec: str, chips: int) -> list[str]:
    """Print, on stderr, one line per way (``model_spec``, ``chips``) lies outside the points
    ``chip``'s calibrated overlay was fitted on; returns the gaps (none: published figures).
    On stderr so that ``--json`` output, whose ``calibration_warnings`` carry the same
    sentences, still shows them on the terminal."""
    calibration = getattr(chip, "calibration", None)
    gaps = calibration.warnings(model_spec, chips) if calibration is not None else []
    for gap in gaps:
        print(f"tpusim: warning: {chip.name} calibration: {gap}; the calibrated figures are "
              "extrapolated here", file=sys.stderr)
    return gaps


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _jobs(text: str) -> int:
    value = int(values.number(text, "value", kind=int, minimum=1))
    cores = usable_cores()
    if value > cores:
        raise InputError(f"value {value}: more processes than the {cores} cores this host gives tpusim; at most "
                         f"{cores} (more only slow every job down)")
    return value


jobs = argument_type("jobs", _jobs)  # worker processes: 1 .. the usable cores


class OutputFile(type(Path())):  # type: ignore[misc]
    """A file the command writes (``--trace``, ``--plot``, run-kernel's ``--out``): checked by
    :func:`check_outputs` before the command runs."""


class OutputFolder(type(Path())):  # type: ignore[misc]
    """A folder the command writes into (``--out``): checked by :func:`check_outputs`."""


def output_file(text: str) -> Path:
    """The ``argparse`` type of a file the command writes (checked before it runs, in one line)."""
    return OutputFile(text)


def _file_of(kind: str, suffixes: tuple[str, ...]) -> Callable[[str], Path]:
    """An ``argparse`` type of a file the command writes in one format: its name ends in one of
    ``suffixes`` (case aside), or it is refused at parse time (PNG bytes in ``out.txt`` are a
    file nobody opens with the right program)."""
    def parse(text: str) -> Path:
        path = OutputFile(text)
        if path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{text!r}: writes {kind}; name the file *{' or *'.join(suffixes)}")
        return path
    parse.__name__ = f"{kind} file"
    return parse


png_file = _file_of("a PNG image", (".png",))  # --plot
trace_file = _file_of("Chrome/Perfetto trace-event JSON", (".json",))  # --trace
jsonl_file = _file_of("JSON lines", (".jsonl",))  # run-kernel --out (records appended)


def output_folder(text: str) -> Path:
    """The ``argparse`` type of a folder the command writes into."""
    return OutputFolder(text)


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before anything runs, an output path that is (or links to) a directory, FIFO or
    device where a file goes, or anything but a folder where a folder goes
    (:mod:`hwmodels.atomic` owns the rule; every writer checks again as it writes). An
    InputError, so the user reads one line and exit 2, not argparse's usage block."""
    for dest, value in vars(args).items():
        try:
            if isinstance(value, OutputFile):
                check_output_file(value)
            elif isinstance(value, OutputFolder):
                check_output_folder(value)
        except InputError as error:
            raise InputError(f"--{dest.replace('_', '-')}: {error}") from None


def add_workload_options(parser: argparse.ArgumentParser, *, batch: bool = True) -> None:
    add_model_option(parser, required=True)
    add_hardware_option(parser, required=True)
    add_chips_option(parser, required=True)
    if batch:
        add_batch_option(parser)
    add_context_option(parser)
    add_routing_options(parser)
    parser.add_argument("--uncalibrated", action="store_true", help="use published figures only, ignoring calibrated overlays")
    from tpusim.app.cli.capacity_gate import add_force_option

    add_force_option(parser)
    add_model_options(parser)


def add_model_options(parser: argparse.ArgumentParser, *, plan: bool = True) -> None:
    """``--formats`` (weight format per family) and ``--plan`` (deployment plan)."""
    parser.add_argument("--formats", default=None, metavar="FAMILY=FORMAT,...",
                        help="weight format per family, e.g. experts=nvfp4,shared_expert=fp8,attention=bf16,kv=fp8 "
                        "(formats: bf16 fp8 int8 int4 nvfp4 mxfp4 ...; default: the model file / quantization_config)")
    if plan:
        parser.add_argument("--plan", default=None, metavar="NAME|FILE|SPEC",
                            help="sharding plan: a published name (k3-tp32, muse-tp8), generic, a plan YAML, or "
                            "a SPEC like tp=8,expert_groups=2,expert_tp=4[,attention=dp] or "
                            "base=published,expert_groups=4,expert_tp=8[,expert_reduce=fused|,shared_wait=deferred] "
                            "(docs/plan-variants.md; default: published if one matches, else generic)")
        parser.add_argument("--shard-of", default=None, metavar="PLAN",
                            help="one device's program of PLAN (e.g. k3-tp32) alone on one chip, no collectives: "
                            "the program `run-kernel --shard-of` runs on a TPU (needs --chips 1)")


def load_model_with_formats(args: argparse.Namespace) -> Any:
    """The ``--model`` with ``--formats`` applied."""
    from tpusim.workload.format_choice import apply_formats
    from tpusim.workload.model_catalog import load_model

    return apply_formats(load_model(args.model), getattr(args, "formats", None))


def resolve_workload(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(model, plan, system, routing) from the parsed options."""
    from hwmodels.catalog import make_system
    from tpusim.workload.format_choice import formats_for_chip
    from tpusim.workload.model_catalog import load_model
    from tpusim.workload.routing import parse_routing

    system = make_system(args.hardware, args.chips, calibrated=not args.uncalibrated)
    model, args.formats_choice = formats_for_chip(load_model(args.model), getattr(args, "formats", None),
                                                  system.chip.kind)  # one rule for every command
    warn_outside_fit(system.chip, args.model, args.chips)
    plan = shard_or_plan(args, model, system)
    routing = parse_routing(args.routing)
    return model, plan, system, routing


def shard_or_plan(args: argparse.Namespace, model: Any, system: Any) -> Any:
    """The plan: ``--shard-of``'s one-device program, else :func:`plan_for_system`'s choice."""
    from tpusim.workload.model_catalog import plan_for_system, shard_plan

    shard = getattr(args, "shard_of", None)
    if shard is None:
        return plan_for_system(model, system.chip, system.chips, getattr(args, "plan", None))
    if getattr(args, "plan", None) not in (None, "auto"):
        raise InputError(f"--shard-of {shard} and --plan {args.plan}: give one (--shard-of names the plan)")
    if system.chips != 1:
        raise InputError(f"--shard-of {shard}: one device's program runs on one chip; use --chips 1")
    return shard_plan(model, shard)


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")


def emit_report(report: Any, fmt: str, human: Callable[[Any, str], None]) -> int:
    """``report`` as JSON when ``fmt`` is ``json``, else ``human(report, fmt)``; the command's
    exit code (0)."""
    if fmt == "json":
        emit_json(report)
    else:
        human(report, fmt)
    return 0


def add_systems_option(parser: argparse.ArgumentParser, *, default: str) -> None:
    """``--systems chip:chips[:execution],...``: the systems a comparison simulates side by side
    (:func:`tpusim.compare.rows.parse_systems`)."""
    parser.add_argument("--systems", default=default,
                        help="comma-separated chip:chips[:execution]; GPU execution: none = the serving stack "
                        f"(CUDA graphs, fused kernels), eager, megakernel (default: {default})")
