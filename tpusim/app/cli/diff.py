"""``tpusim diff A B``: two schedules, or two ``simulate --json`` results, side by side.

Usage::

    tpusim diff published layer-double-buffer                   # K3 on tpu-v7 x16, batch 1
    tpusim diff published best.json --model kimi-k3 --hardware tpu-v7 --chips 16 --batch 8 \\
        --plot diff.png                                         # + both timelines, one image
    tpusim diff a.json b.json                                   # two `simulate --json` outputs

For two schedules (built-in names or JSON files) it lists the knobs that differ
(:mod:`tpusim.schedule.diff`), simulates both on the same workload, and prints step time,
exposed DMA (total and per weight family) and VMEM peak for each, with B − A. ``--plot``
draws both timelines on one time axis. For two simulate results it compares the stored
numbers and lists the inputs that differ (no timeline: results do not keep one).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json
from hwmodels.units import MIB
from tpusim.app.cli.common import png_file
from tpusim.app.cli.flag_rules import refuse_unused, schedule_unused
from tpusim.app.tables import TableData, add_format_option, emit, output_format
from tpusim.cli_options import (
    MODEL_HELP,
    add_batch_option,
    add_chips_option,
    add_context_option,
    add_hardware_option,
    add_model_option,
    add_routing_options,
)

SCHEDULE_KEYS = frozenset({"families", "max_dmas_in_flight", "name"})
INPUT_KEYS = ("model", "hardware", "chips", "batch", "context", "routing", "seed", "schedule",
              "schedule_hash", "execution_mode", "source")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "diff", help="compare two schedules (or two simulate results): knobs, step, exposed DMA, VMEM",
        description="Compare two prefetch schedules on one workload (the knobs that differ, then "
        "step time, exposed DMA per weight family and VMEM peak of each, simulated), or two "
        "`tpusim simulate --json` results (the inputs that differ and the same numbers).")
    parser.add_argument("a", help="schedule A: a built-in name, a schedule JSON, or a simulate --json result")
    parser.add_argument("b", help="schedule B (the same kind as A)")
    add_model_option(parser, default="kimi-k3", help=f"{MODEL_HELP}: the model the schedules are simulated on")
    add_hardware_option(parser, default="tpu-v7")
    add_chips_option(parser, default=16)
    add_batch_option(parser)
    add_context_option(parser)
    add_routing_options(parser)
    parser.add_argument("--uncalibrated", action="store_true", help="published figures only, ignoring overlays")
    parser.add_argument("--plot", type=png_file, default=None, help="write both timelines into one PNG here")
    parser.add_argument("--plot-layers", default="1:3", metavar="FIRST:COUNT", help="layers drawn in --plot")
    add_format_option(parser)
    parser.set_defaults(func=run)


def _simulate_result(spec: str) -> dict[str, Any] | None:
    """The parsed file when ``spec`` is a ``simulate --json`` result, else None. Read by its
    content, not its name: ``simulate --json > a.stdout`` is a result as much as ``a.json``. A
    file that is neither a result nor a schedule (not JSON, or JSON of another shape) is an
    InputError saying so, not a schedule's validation errors."""
    path = Path(spec)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        if path.suffix == ".json":
            return read_user_json(path, shown=spec)  # its own one-line parse error, with the position
        raise InputError(f"diff {spec}: not a schedule or a simulate --json result (not JSON)") from None
    if isinstance(data, dict) and "step_ms" in data:
        return data
    if not isinstance(data, dict) or not SCHEDULE_KEYS & data.keys():
        raise InputError(f"diff {spec}: not a schedule or a simulate --json result (a schedule has "
                         f"{', '.join(sorted(SCHEDULE_KEYS))}; a result has step_ms)")
    return None


def _numbers(data: dict[str, Any]) -> dict[str, float]:
    """The compared quantities of one simulate result (ms and MiB)."""
    numbers = {"step ms": data["step_ms"], "tokens/s": data["tokens_per_s"],
               "exposed DMA ms": data["exposed_dma_ms"], "VMEM peak MiB": data["vmem_peak_bytes"] / MIB,
               "VMEM static MiB": data["vmem_static_bytes"] / MIB}
    for family, value in sorted(data.get("exposed_dma_by_family_ms", {}).items()):
        numbers[f"exposed DMA {family} ms"] = value
    return numbers


def _quantity_table(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> TableData:
    first, second = _numbers(a), _numbers(b)
    table = TableData(title=f"A = {names[0]}, B = {names[1]} (simulated)",
                      columns=["quantity", "A", "B", "B - A"], right_aligned=("A", "B", "B - A"))
    for key in dict.fromkeys([*first, *second]):
        x, y = first.get(key, 0.0), second.get(key, 0.0)
        table.add(key, f"{x:.3f}", f"{y:.3f}", f"{y - x:+.3f}")
    return table


def _difference_table(title: str, rows: list[tuple[str, Any, Any]]) -> TableData:
    table = TableData(title=title, columns=["what", "A", "B"])
    for key, x, y in rows:
        table.add(key, x, y)
    if not rows:
        table.add("(none)", "", "")
    return table


def run(args: argparse.Namespace) -> int:
    fmt = output_format(args)
    results = _simulate_result(args.a), _simulate_result(args.b)
    if all(result is not None for result in results):
        a, b = results
        assert a is not None and b is not None
        refuse_unused(args, results=True)  # nothing is simulated: a workload flag would be ignored
        inputs = [(key, a.get(key), b.get(key)) for key in INPUT_KEYS if a.get(key) != b.get(key)]
        emit([_difference_table("inputs that differ", inputs), _quantity_table(a, b, (args.a, args.b))], fmt)
        return 0
    if any(result is not None for result in results):
        raise InputError("diff: give two schedules or two simulate --json results, not one of each")
    return _diff_schedules(args, fmt)


def _diff_schedules(args: argparse.Namespace, fmt: str) -> int:
    from tpusim.app.cli.common import resolve_workload
    from tpusim.app.cli.simulate import simulate_data
    from tpusim.schedule.diff import knob_differences
    from tpusim.schedule.schema import load_schedule

    first, second = load_schedule(args.a), load_schedule(args.b)
    workload = resolve_workload(args)
    unused = schedule_unused(workload[2].chip)
    if unused:  # a GPU serving stack runs no schedule: two schedules would give the same step
        raise InputError(f"diff {args.a} {args.b}: {unused}")
    if args.plot is not None:
        from tpusim.app.cli.simulate import check_plot_layers

        check_plot_layers(args, workload[0])
    record = args.plot is not None
    a, timeline_a = simulate_data(args, workload, first, record_timeline=record)
    b, timeline_b = simulate_data(args, workload, second, record_timeline=record)
    knobs = _difference_table(f"knobs that differ ({first.name} vs {second.name})",
                              knob_differences(first, second))
    names = (f"{first.name} [{a['schedule_hash']}]", f"{second.name} [{b['schedule_hash']}]")
    notes = [f"workload: {args.model} on {a['system']}, batch {args.batch}, context {args.context}; "
             f"{a['source']}"]
    if record and timeline_a is not None and timeline_b is not None:
        from tpusim.app.cli.simulate import plot_layers
        from tpusim.report.timeline import plot_timelines

        first_layer, count = plot_layers(args.plot_layers)
        path = plot_timelines([(f"A: {names[0]}", timeline_a), (f"B: {names[1]}", timeline_b)], args.plot,
                              first_layer=first_layer, layers=count,
                              title=f"{args.model} on {a['system']}, batch {args.batch}: A vs B (simulated)")
        notes.append(f"timelines: {path}")
    emit([knobs, _quantity_table(a, b, names)], fmt, notes=notes)
    return 0
