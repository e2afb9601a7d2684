"""``tpusim simulate``: one decode step in the discrete-event engine.

Usage::

    tpusim simulate --model kimi-k3 --hardware tpu-v7 --chips 16 --batch 1 --schedule published
    tpusim simulate ... --schedule my-schedule.json --trace step.json --plot step.png --json

``--schedule`` is a built-in (``naive``, ``published``, ``layer-double-buffer``) or a JSON
file written by ``tpusim sweep``. ``--trace`` writes Chrome/Perfetto trace-event JSON (open
it in ui.perfetto.dev); ``--plot`` a PNG of a few layers (``--plot-layers FIRST:COUNT``).

``--json`` keys (times in ms, sizes in bytes; every number is simulated unless its key says
floor):

| key | meaning |
| --- | --- |
| ``step_ms``, ``tokens_per_s`` | simulated step time; aggregate tokens/s = batch / step |
| ``exposed_dma_ms`` | compute stream waiting on copies |
| ``overlap_fraction`` | 1 - exposed DMA / time with copies in flight |
| ``vmem_peak_bytes``, ``vmem_peak_time_ms``, ``vmem_peak_layer`` | highest VMEM occupancy, when, where |
| ``vmem_static_bytes``, ``vmem_capacity_bytes`` | the schedule's static scratch; usable capacity |
| ``busy_fraction`` | per resource (hbm, mxu, vpu, link.*) busy time / step |
| ``step_ms_low``, ``step_ms_high``, ``tokens_per_s_low``, ``tokens_per_s_high`` | the 90 % prediction interval of a calibrated chip (re-simulated over the fit's sampled parameter sets, :mod:`tpusim.report.intervals`); ``None`` and ``interval: "none: ..."`` when uncalibrated |
| ``breakdown`` | step ms by what the stream did (phases, collectives, fixed overheads, exposed DMA, drain) |
| ``layer_ms`` | stream ms per layer ("-1": the head) |
| ``exposed_dma_by_family_ms`` | exposed DMA per weight family |
| ``floor_ms``, ``floors`` | analytic floors (:mod:`tpusim.workload.floors`) |
| ``schedule``, ``schedule_hash`` | schedule name and content hash |
| ``source`` | how the numbers were made, and whether the chip had calibrated figures |
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hwmodels.errors import InputError
from hwmodels.schema import Chip
from tpusim.app.cli.common import add_workload_options, emit_json, resolve_workload

MS_PER_S = 1e3
MIB = 1 << 20
SIMULATED = "simulated"
FLOOR = "analytic floor"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "simulate",
        help="simulate one decode step under a prefetch schedule (SimPy engine)",
        description="Simulate one decode step of one device under a prefetch schedule.",
    )
    add_workload_options(parser)
    parser.add_argument("--schedule", default="published",
                        help="naive | published | layer-double-buffer | a schedule JSON file (default: published)")
    parser.add_argument("--trace", type=Path, default=None, help="write a Chrome/Perfetto trace-event JSON here")
    parser.add_argument("--plot", type=Path, default=None, help="write a timeline PNG here")
    parser.add_argument("--plot-layers", default="1:3", metavar="FIRST:COUNT",
                        help="layers drawn in --plot (default 1:3)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def calibration_note(chip: Chip) -> str:
    """``published figures`` or ``calibrated overlay on N figures (paths)``."""
    from hwmodels.overlay import iter_figures

    calibrated = [path for path, figure in iter_figures(chip) if figure.label == "calibrated"]
    if not calibrated:
        return "published figures"
    shown = ", ".join(calibrated[:4]) + (f", +{len(calibrated) - 4} more" if len(calibrated) > 4 else "")
    return f"published figures with a calibrated overlay on {len(calibrated)} figure(s): {shown}"


def _plot_layers(text: str) -> tuple[int, int]:
    first, _, count = text.partition(":")
    try:
        layers = (int(first), int(count or 3))
    except ValueError:
        raise InputError(f"--plot-layers {text!r}: expected FIRST:COUNT, e.g. 1:3") from None
    if layers[1] < 1:
        raise InputError(f"--plot-layers {text!r}: COUNT must be >= 1")
    return layers


def run(args: argparse.Namespace) -> int:
    from tpusim.workload.floors import floors
    from tpusim.engine import InfeasibleSchedule, simulate
    from tpusim.workload.program import build_program
    from tpusim.schedule.schema import load_schedule

    plot_layers = _plot_layers(args.plot_layers)
    model, plan, system, routing = resolve_workload(args)
    schedule = load_schedule(args.schedule)
    chip = system.chip
    try:
        program = build_program(model, plan, batch=args.batch, context_tokens=args.context,
                                routing=routing, seed=args.seed)
    except ValueError as error:
        raise InputError(str(error)) from None
    record = args.trace is not None or args.plot is not None
    try:
        result = simulate(program, schedule, chip, record_timeline=record)
    except InfeasibleSchedule as error:
        raise InputError(f"infeasible schedule: {error}") from None
    floor = floors(program, chip)
    from tpusim.report.intervals import interval_fields

    def resimulate(sample: Chip) -> float:
        return simulate(program, schedule, sample).step_s

    interval = interval_fields(chip, resimulate, result.step_s, args.batch)
    source = (f"simulated (tpusim engine, {result.execution_mode} execution; hardware {chip.name}: "
              f"{calibration_note(chip)})")
    data = _json_result(result, floor, args, system.name, system.devices, plan.name, source)
    data.update(interval)
    if result.timeline is not None:
        try:
            if args.trace is not None:
                from tpusim.report.perfetto import write_trace

                data["trace"] = str(write_trace(result.timeline, args.trace, metadata={
                    "model": model.name, "system": system.name, "batch": args.batch,
                    "schedule": schedule.name, "schedule_hash": result.schedule_hash, "source": source}))
            if args.plot is not None:
                from tpusim.report.timeline import plot_timeline

                first, count = plot_layers
                data["plot"] = str(plot_timeline(
                    result.timeline, args.plot, first_layer=first, layers=count,
                    title=f"{model.name} on {system.name}, batch {args.batch}, schedule {schedule.name} "
                          f"(simulated)"))
        except OSError as error:
            raise InputError(f"cannot write output: {error.strerror or error}") from None
    if args.json:
        emit_json(data)
        return 0
    _print_human(data, Console())
    return 0


def _json_result(result: Any, floor: Any, args: argparse.Namespace, system: str, devices: int,
                 plan: str, source: str) -> dict[str, Any]:
    ms = MS_PER_S
    return {
        "model": args.model, "hardware": args.hardware, "system": system, "chips": args.chips,
        "devices": devices, "plan": plan, "batch": args.batch, "context": args.context,
        "routing": args.routing, "seed": args.seed, "execution_mode": result.execution_mode,
        "schedule": result.schedule_name, "schedule_hash": result.schedule_hash,
        "step_ms": result.step_s * ms,
        "tokens_per_s": result.tokens_per_s,
        "exposed_dma_ms": result.exposed_dma_s * ms,
        "dma_busy_ms": result.dma_busy_s * ms,
        "overlap_fraction": result.overlap_fraction,
        "vmem_peak_bytes": result.vmem_peak_bytes,
        "vmem_peak_time_ms": result.vmem_peak_time_s * ms,
        "vmem_peak_layer": result.vmem_peak_layer,
        "vmem_static_bytes": result.vmem_static_bytes,
        "vmem_capacity_bytes": result.vmem_capacity_bytes,
        "busy_fraction": dict(result.busy_fraction),
        "breakdown": {key: value * ms for key, value in result.breakdown_s.items()},
        "layer_ms": {str(layer): value * ms for layer, value in result.layer_s.items()},
        "exposed_dma_by_family_ms": {key: value * ms for key, value in result.exposed_dma_by_family_s.items()},
        "dma_count": result.dma_count,
        "dma_bytes": result.dma_bytes,
        "event_count": result.event_count,
        "floor_ms": floor.floor_s * ms,
        "floors": {"hbm_ms": floor.hbm_floor_s * ms, "compute_ms": floor.compute_floor_s * ms,
                   "collective_ms": floor.collective_floor_s * ms, "label": FLOOR},
        "source": source,
    }


def _print_human(data: dict[str, Any], console: Console) -> None:
    title = (f"{data['model']} on {data['system']} ({data['devices']} devices, plan {data['plan']}), "
             f"batch {data['batch']}, schedule {data['schedule']} [{data['schedule_hash']}]")
    table = Table(title=title)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("label")
    table.add_row("step time", f"{data['step_ms']:.3f} ms", SIMULATED)
    table.add_row("tokens/s (aggregate)", f"{data['tokens_per_s']:.1f}", SIMULATED)
    from tpusim.report.intervals import format_interval

    if data.get("step_ms_low") is not None:
        table.add_row("  90 % interval", f"{data['step_ms_low']:.3f}–{data['step_ms_high']:.3f} ms; "
                      f"{data['tokens_per_s_low']:.1f}–{data['tokens_per_s_high']:.1f} tok/s",
                      "calibrated, re-simulated")
    else:
        table.add_row("  interval", format_interval(data), SIMULATED)
    table.add_row("floor", f"{data['floor_ms']:.3f} ms", FLOOR)
    floors = data["floors"]
    table.add_row("  HBM / compute / collective floors",
                  f"{floors['hbm_ms']:.3f} / {floors['compute_ms']:.3f} / {floors['collective_ms']:.3f} ms", FLOOR)
    table.add_row("step / floor", f"{data['step_ms'] / data['floor_ms']:.2f}x" if data["floor_ms"] else "—",
                  f"{SIMULATED} / {FLOOR}")
    table.add_row("exposed DMA", f"{data['exposed_dma_ms']:.3f} ms", SIMULATED)
    table.add_row("overlap fraction", f"{data['overlap_fraction']:.3f}", SIMULATED)
    layer = data["vmem_peak_layer"]
    where = "head" if layer == -1 else f"layer {layer}"
    table.add_row("VMEM peak", f"{data['vmem_peak_bytes'] / MIB:.2f} MiB at {data['vmem_peak_time_ms']:.3f} ms ({where})",
                  SIMULATED)
    table.add_row("VMEM static scratch / usable",
                  f"{data['vmem_static_bytes'] / MIB:.2f} / {data['vmem_capacity_bytes'] / MIB:.2f} MiB",
                  "schedule plan / chip figure")
    for key, value in data["busy_fraction"].items():
        table.add_row(f"busy: {key}", f"{100 * value:.1f} %", SIMULATED)
    for key, value in data["breakdown"].items():
        table.add_row(f"step share: {key}", f"{value:.3f} ms", SIMULATED)
    table.add_row("copies issued / events", f"{data['dma_count']} / {data['event_count']}", SIMULATED)
    console.print(table)
    for key in ("trace", "plot"):
        if key in data:
            console.print(f"{key}: {data[key]}", highlight=False)
    console.print(f"source: {data['source']}", highlight=False)
