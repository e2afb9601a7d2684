"""``tpusim simulate``: one decode step in the discrete-event engine.

Usage::

    tpusim simulate --model kimi-k3 --hardware tpu-v7 --chips 16 --batch 1 --schedule published
    tpusim simulate ... --schedule my-schedule.json --trace step.json --plot step.png --json
    tpusim simulate --model kimi-k3 --hardware gb200 --chips 16 --phase prefill --tokens 8192 --schedule naive

``--schedule`` is a built-in (``naive``, ``published``, ``layer-double-buffer``) or a JSON
file written by ``tpusim sweep``. ``--trace`` writes Chrome/Perfetto trace-event JSON (open
it in ui.perfetto.dev); ``--plot`` a PNG of a few layers (``--plot-layers FIRST:COUNT``).

``--json`` keys (times in ms, sizes in bytes; every number is simulated unless its key says
floor):

| key | meaning |
| --- | --- |
| ``model``, ``hardware``, ``system``, ``chips``, ``devices``, ``plan``, ``batch``, ``context``, ``routing``, ``seed``, ``execution_mode`` | what was simulated (the inputs, the plan and the chip's execution mode) |
| ``prefill_row_tile`` | prefill only: rows of activations on chip at a time (32, stepped down until the schedule's buffers fit, as ``tpusim serving`` does; the ``source`` says when it was) |
| ``prefill_host_bound_ms`` | prefill only: how much longer the host takes to issue the chunk's kernels without a CUDA graph than the step runs (launches x ``execution.gpu.eager_host_op_s``; 0 without the figure; ``tpusim serving`` prices a prefill as ``step_ms`` + this: :func:`tpusim.engine.gpu_batch.prefill_step_s`); ``None`` in decode |
| ``phase``, ``prefix_tokens`` | ``decode`` or ``prefill`` (``--phase prefill``: ``batch`` = the chunk's tokens, ``context`` = prefix + chunk, ``prefix_tokens`` the cached prompt tokens before it, ``tokens_per_s`` = prompt tokens/s; ``None`` in decode) |
| ``step_ms``, ``tokens_per_s`` | simulated step time; aggregate tokens/s = batch / step |
| ``exposed_dma_ms`` | compute stream waiting on copies |
| ``overlap_fraction`` | 1 - exposed DMA / time with copies in flight |
| ``dma_busy_ms``, ``dma_count``, ``dma_bytes``, ``event_count`` | time with a copy in flight (issue latency included), copies, bytes copied, engine events |
| ``vmem_peak_bytes``, ``vmem_peak_time_ms``, ``vmem_peak_layer`` | highest VMEM occupancy, when, where |
| ``vmem_static_bytes``, ``vmem_capacity_bytes`` | the schedule's static scratch; usable capacity |
| ``busy_fraction`` | per resource (hbm, mxu, vpu, link.*) busy time / step |
| ``words`` | the chip's names for ``staging`` (what ``vmem_*`` measure), ``mxu``, ``vpu`` |
| ``step_ms_low``, ``step_ms_high``, ``tokens_per_s_low``, ``tokens_per_s_high``, ``interval`` | the 90 % prediction interval of a calibrated chip (re-simulated over the fit's sampled parameter sets, :mod:`tpusim.report.intervals`); ``None`` and ``interval: "none: ..."`` when uncalibrated |
| ``breakdown`` | step ms by what the stream did (phases, collectives, fixed overheads, exposed DMA, drain) |
| ``layer_ms`` | stream ms per layer ("-1": the head) |
| ``exposed_dma_by_family_ms`` | exposed DMA per weight family |
| ``floor_ms``, ``floors`` | analytic floors (:mod:`tpusim.workload.floors`) of the simulated (critical) device: ``tpusim floor``'s ``floor_ms_critical_device``; its ``floor_ms`` is the expected device's |
| ``schedule``, ``schedule_hash`` | schedule name and content hash (``None`` on a chip without a megakernel: nothing was scheduled) |
| ``schedule_default_families`` | weight families the program reads that the schedule leaves out, so they take the schema's defaults (no prefetch, whole tensors, one buffer) |
| ``source`` | how the numbers were made, and whether the chip had calibrated figures |
| ``formats`` | how the weight formats were chosen (``--formats``, a ``@variant``, the model file's ``deployment_variants`` for this chip kind, or the model file's formats: :func:`tpusim.workload.format_choice.formats_for_chip`) |
| ``figures`` | the chip figures used: ``<chip>: published figures`` or ``<chip>: calibrated on ...`` |
| ``calibrated``, ``calibration_warnings`` | whether an overlay was applied; where this run lies outside its fitted points |
| ``capacity`` | HBM check: ``fits``, ``label`` (``does not fit`` only with ``--force``), bytes needed / per device |
"""

from __future__ import annotations

import argparse
from typing import Any

from hwmodels.errors import InputError
from hwmodels.schema import Chip
from hwmodels.units import MIB
from tpusim.app.cli.capacity_gate import check_fit
from tpusim.app.cli.common import (
    add_workload_options,
    emit_report,
    png_file,
    resolve_workload,
    trace_file,
)
from tpusim.app.cli.flag_rules import refuse_unused
from tpusim.app.cli.floor import CRITICAL_DEVICE
from tpusim.app.tables import TableData, add_format_option, emit, output_format
from tpusim.cli_options import add_schedule_option, nonnegative_int, positive_int

MS_PER_S = 1e3
SIMULATED = "simulated"
FLOOR = "analytic floor"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "simulate",
        help="simulate one decode step under a prefetch schedule (SimPy engine)",
        description="Simulate one decode step of one device under a prefetch schedule in the "
        "discrete-event engine: HBM copies, on-chip memory occupancy, matrix and vector units, "
        "collectives on the links. Prints step time, tokens/s, the analytic floors, exposed DMA, "
        "on-chip memory peak and busy fractions, in the chip's words (VMEM/MXU on a TPU, L2/tensor "
        "cores on a GPU), and whether the chip's figures are published or calibrated (and on what). "
        "--trace and --plot write a Perfetto trace and a timeline image.",
    )
    add_workload_options(parser)
    parser.add_argument("--phase", choices=("decode", "prefill"), default="decode",
                        help="decode: one step of --batch sequences; prefill: one chunk of --tokens prompt tokens "
                        "of one sequence after --prefix-tokens cached ones (tpusim.workload.prefill)")
    parser.add_argument("--tokens", type=positive_int, default=8192, help="prefill chunk tokens (--phase prefill)")
    parser.add_argument("--prefix-tokens", type=nonnegative_int, default=0,
                        help="prompt tokens already cached before the chunk (--phase prefill)")
    add_schedule_option(parser, default="published")
    parser.add_argument("--trace", type=trace_file, default=None, help="write a Chrome/Perfetto trace-event JSON here")
    parser.add_argument("--plot", type=png_file, default=None, help="write a timeline PNG here")
    parser.add_argument("--plot-layers", default="1:3", metavar="FIRST:COUNT",
                        help="layers drawn in --plot (default 1:3)")
    add_format_option(parser)
    parser.set_defaults(func=run)


def calibration_note(chip: Chip) -> str:
    """``published figures`` or ``calibrated on <what> (N figures, overlay FILE)``, read from
    the chip's one calibrated-or-not property (:attr:`hwmodels.schema.Chip.calibration`)."""
    if chip.calibration is None:
        return "published figures"
    return chip.calibration.note()


def plot_layers(text: str) -> tuple[int, int]:
    """``FIRST:COUNT`` of ``--plot-layers`` as two integers."""
    first, _, count = text.partition(":")
    try:
        layers = (int(first), int(count or 3))
    except ValueError:
        raise InputError(f"--plot-layers {text!r}: expected FIRST:COUNT, e.g. 1:3") from None
    if layers[0] < 0 or layers[1] < 1:
        raise InputError(f"--plot-layers {text!r}: FIRST must be >= 0 and COUNT >= 1")
    return layers


def check_plot_layers(args: argparse.Namespace, model: Any) -> None:
    """A typed ``--plot-layers`` window inside the model's layers (``200:3`` on a 93-layer model
    would draw a window that is not there); the default ``1:3`` is drawn as far as it goes."""
    if "plot_layers" not in getattr(args, "given", ()):
        return
    first, count = plot_layers(args.plot_layers)
    if first + count > model.num_layers:
        raise InputError(f"--plot-layers {args.plot_layers}: {model.name} has {model.num_layers} layers "
                         f"(0..{model.num_layers - 1}); FIRST + COUNT must be <= {model.num_layers}")


def simulate_data(args: argparse.Namespace, workload: tuple[Any, Any, Any, Any], schedule: Any, *,
                  record_timeline: bool) -> tuple[dict[str, Any], Any]:
    """Simulate one step of ``workload`` (from :func:`resolve_workload`) under ``schedule``;
    returns the ``--json`` dictionary and the timeline (None unless recorded)."""
    from tpusim.engine import InfeasibleSchedule, simulate
    from tpusim.workload.floors import floors
    from tpusim.workload.program import build_program

    model, plan, system, routing = workload
    chip = system.chip
    prefill_tile = None
    try:
        if getattr(args, "phase", "decode") == "prefill":
            program, result, prefill_tile = _prefill_fitting(args, workload, schedule, record_timeline)
        else:
            program = build_program(model, plan, batch=args.batch, context_tokens=args.context,
                                    routing=routing, seed=args.seed)
            result = simulate(program, schedule, chip, record_timeline=record_timeline)
    except InfeasibleSchedule as error:  # a ValueError too: caught first
        raise InputError(f"infeasible schedule {schedule.name!r}: {error}") from None
    except ValueError as error:
        raise InputError(str(error)) from None
    source = (f"simulated (tpusim engine, {result.execution_mode} execution; hardware {chip.name}: "
              f"{calibration_note(chip)})")
    if chip.kind == "gpu":
        from tpusim.engine.gpu import stack_source

        source += f"; {stack_source(chip)}"
    data = _json_result(result, floors(program, chip), args, system.name, system.devices, plan.name, source)
    data["formats"] = getattr(args, "formats_choice", "the model file's formats")
    data["prefill_row_tile"], data["prefill_host_bound_ms"] = None, None
    data["schedule_default_families"] = []
    if result.execution_mode != "megakernel":  # no schedule ran: the output names none
        data["schedule"], data["schedule_hash"] = None, None
    else:  # the schema gives a family the schedule leaves out the defaults; the output says which
        from tpusim.schedule.schema import SCHEDULE_FAMILIES

        used = dict.fromkeys(tensor.family for _, tensor in program.iter_tensors())
        data["schedule_default_families"] = [str(family) for family in used
                                             if family in SCHEDULE_FAMILIES and family not in schedule.families]
    data["phase"], data["prefix_tokens"] = str(program.phase), None
    if data["phase"] == "prefill":
        data.update(batch=program.batch, context=program.context_tokens, prefix_tokens=args.prefix_tokens)
        data["source"] += ("; prefill chunk of one sequence (tokens_per_s = prompt tokens/s; prefill form and "
                           "assumptions: tpusim.workload.prefill)")
        from tpusim.engine.gpu_batch import host_bound_s
        from tpusim.workload.prefill import PREFILL_ROW_TILE

        data["prefill_row_tile"] = prefill_tile
        data["prefill_host_bound_ms"] = host_bound_s(chip, result) * 1e3
        if prefill_tile != PREFILL_ROW_TILE:
            data["source"] += (f"; row tile stepped down from {PREFILL_ROW_TILE} to {prefill_tile} rows so the "
                               "schedule's buffers fit on chip (as tpusim serving does)")
    from tpusim.report.intervals import interval_fields, outside_fit

    outside = outside_fit(chip, args.model, args.chips, program.batch)
    data.update(interval_fields(chip, lambda sample: simulate(program, schedule, sample).step_s,
                                result.step_s, program.batch, outside=outside))
    data["calibrated"] = chip.is_calibrated
    data["figures"] = f"{chip.name}: {calibration_note(chip)}"
    data["calibration_warnings"] = outside
    return data, result.timeline


def _prefill_fitting(args: argparse.Namespace, workload: tuple[Any, Any, Any, Any], schedule: Any,
                     record_timeline: bool) -> tuple[Any, Any, int]:
    """The prefill chunk under ``schedule`` at the widest row tile (32, 16, ... 1 rows) whose
    buffers fit on chip, as the serving simulation steps its tile down; when none does, an
    InputError that names what would fit (a built-in schedule, or more chips)."""
    from tpusim.compare.schedule_choice import fitting_schedule
    from tpusim.engine import InfeasibleSchedule, simulate
    from tpusim.schedule.vmem import check_fits, vmem_plan
    from tpusim.workload.prefill import PREFILL_ROW_TILE, build_prefill_program

    model, plan, system, routing = workload
    chip = system.chip
    first: InfeasibleSchedule | None = None
    tile = PREFILL_ROW_TILE
    while tile >= 1:
        try:  # the static scratch first (cheap); the engine has the last word
            if chip.execution.mode == "megakernel":
                check_fits(vmem_plan(schedule, model, plan, tile, 1), chip.staging_memory.usable_bytes)
            program = build_prefill_program(model, plan, tokens=args.tokens, prefix_tokens=args.prefix_tokens,
                                            routing=routing, seed=args.seed, row_tile=tile)
            return program, simulate(program, schedule, chip, record_timeline=record_timeline), tile
        except InfeasibleSchedule as error:
            first = first or error
        tile //= 2
    try:
        fits = fitting_schedule(model, plan, chip, 1, sequences=1)[0].name
        way = f"built-in schedule `{fits}` fits at a 1-row tile (--schedule {fits})"
    except InputError:
        way = "no built-in schedule fits either; more chips (--chips) shrink each device's weights"
    raise InputError(f"infeasible schedule {schedule.name!r} for a {args.tokens}-token prefill at every row tile "
                     f"from {PREFILL_ROW_TILE} down to 1: {first}; {way}")


def run(args: argparse.Namespace) -> int:
    from tpusim.schedule.schema import load_schedule

    layers = plot_layers(args.plot_layers)
    schedule = load_schedule(args.schedule)
    workload = resolve_workload(args)
    if schedule.deployment is not None and getattr(args, "plan", None) in (None, "auto"):
        # a joint sweep's best.json: its plan and collective algorithms, unless --plan says otherwise
        from tpusim.workload.model_catalog import deployment_plan

        model, _, system, routing = workload
        plan = deployment_plan(model, system.chip, system.chips, schedule.deployment.plan,
                               schedule.deployment.collectives)
        workload = (model, plan, system, routing)
    model, plan, system, _ = workload
    refuse_unused(args, chip=system.chip)  # a typed flag this path ignores is an error, not dropped
    check_plot_layers(args, model)
    if args.phase == "prefill":  # one sequence holding the prefix and the chunk
        if args.prefix_tokens < 0:
            raise InputError(f"--prefix-tokens {args.prefix_tokens}: must be >= 0")
        fit = check_fit(argparse.Namespace(**{**vars(args), "batch": 1,
                                              "context": args.prefix_tokens + args.tokens}), model, plan, system)
    else:
        fit = check_fit(args, model, plan, system)  # capacity first: before any draw or schedule
    record = args.trace is not None or args.plot is not None
    data, timeline = simulate_data(args, workload, schedule, record_timeline=record)
    data["capacity"] = fit.as_json()
    if timeline is not None:
        try:
            if args.trace is not None:
                from tpusim.report.perfetto import write_trace

                data["trace"] = str(write_trace(timeline, args.trace, metadata={
                    "model": model.name, "system": system.name, "batch": args.batch,
                    "schedule": schedule.name, "schedule_hash": data["schedule_hash"],
                    "source": data["source"]}))
            if args.plot is not None:
                from tpusim.report.timeline import plot_timeline

                first, count = layers
                data["plot"] = str(plot_timeline(
                    timeline, args.plot, first_layer=first, layers=count,
                    title=f"{model.name} on {system.name}, batch {args.batch}, schedule {schedule.name} "
                          f"(simulated)"))
        except OSError as error:
            raise InputError(f"cannot write output: {error.strerror or error}") from None
    return emit_report(data, output_format(args), _print_human)


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
        "words": dict(result.words),
        "dma_count": result.dma_count,
        "dma_bytes": result.dma_bytes,
        "event_count": result.event_count,
        "floor_ms": floor.floor_s * ms,
        "floors": {"hbm_ms": floor.hbm_floor_s * ms, "compute_ms": floor.compute_floor_s * ms,
                   "collective_ms": floor.collective_floor_s * ms, "label": FLOOR, "device": "critical"},
        "source": source,
    }


def _print_human(data: dict[str, Any], fmt: str) -> None:
    schedule = (f"schedule {data['schedule']} [{data['schedule_hash']}]" if data["execution_mode"] == "megakernel"
                else f"no prefetch schedule ({data['execution_mode']} execution)")
    what = (f"prefill of {data['batch']} tokens after {data['prefix_tokens']} cached" if data.get("phase") == "prefill"
            else f"batch {data['batch']}")
    title = (f"{data['model']} on {data['system']} ({data['devices']} devices, plan {data['plan']}), "
             f"{what}, {schedule}")
    table = TableData(title=title, columns=["quantity", "value", "label"], right_aligned=("value",), records=data)
    if "capacity" in data:
        table.add("HBM needed / available", data["capacity"]["summary"], data["capacity"]["label"])
    fits = data.get("capacity", {}).get("fits", True)
    if data.get("formats"):
        table.add("weight formats", data["formats"], "input")
    table.add("step time", f"{data['step_ms']:.3f} ms", SIMULATED if fits else f"{SIMULATED}, does not fit")
    table.add("tokens/s (aggregate)", f"{data['tokens_per_s']:.1f}", SIMULATED)
    from tpusim.report.intervals import format_interval

    if data.get("step_ms_low") is not None:
        table.add("  90 % interval", f"{data['step_ms_low']:.3f}–{data['step_ms_high']:.3f} ms; "
                  f"{data['tokens_per_s_low']:.1f}–{data['tokens_per_s_high']:.1f} tok/s", "calibrated, re-simulated")
    else:
        table.add("  interval", format_interval(data), SIMULATED)
    table.add(f"floor, {CRITICAL_DEVICE}", f"{data['floor_ms']:.3f} ms", FLOOR)
    floors = data["floors"]
    table.add("  HBM / compute / collective floors",
                  f"{floors['hbm_ms']:.3f} / {floors['compute_ms']:.3f} / {floors['collective_ms']:.3f} ms", FLOOR)
    table.add("step / floor", f"{data['step_ms'] / data['floor_ms']:.2f}x" if data["floor_ms"] else "—",
                  f"{SIMULATED} / {FLOOR}")
    table.add("exposed DMA", f"{data['exposed_dma_ms']:.3f} ms", SIMULATED)
    table.add("overlap fraction", f"{data['overlap_fraction']:.3f}", SIMULATED)
    layer = data["vmem_peak_layer"]
    where = "head" if layer == -1 else f"layer {layer}"
    words = data["words"]
    table.add(f"{words['staging']} peak",
                  f"{data['vmem_peak_bytes'] / MIB:.2f} MiB at {data['vmem_peak_time_ms']:.3f} ms ({where})", SIMULATED)
    if data["execution_mode"] == "megakernel":
        table.add(f"{words['staging']} static / usable",
                      f"{data['vmem_static_bytes'] / MIB:.2f} / {data['vmem_capacity_bytes'] / MIB:.2f} MiB",
                      "schedule plan / chip figure")
    else:  # one kernel per op: no persistent kernel holds the schedule's buffers
        table.add(f"{words['staging']} usable", f"{data['vmem_capacity_bytes'] / MIB:.2f} MiB", "chip figure")
    for key, value in data["busy_fraction"].items():
        table.add(f"busy: {words.get(key, key)}", f"{100 * value:.1f} %", SIMULATED)
    for key, value in data["breakdown"].items():
        table.add(f"step share: {key}", f"{value:.3f} ms", SIMULATED)
    if data.get("prefill_row_tile") is not None:
        stepped = "stepped down" in data["source"]
        table.add("prefill row tile", f"{data['prefill_row_tile']} rows",
                  "stepped down until the schedule fits on chip" if stepped else "default tile")
    if data.get("schedule_default_families"):
        table.add("families on schedule defaults", ", ".join(data["schedule_default_families"]),
                  "schedule (left out: no prefetch, whole tensors, 1 buffer)")
    table.add("copies issued / events", f"{data['dma_count']} / {data['event_count']}", SIMULATED)
    notes = [f"{key}: {data[key]}" for key in ("trace", "plot") if key in data]
    notes.append(f"source: {data['source']}")
    notes += [f"warning: {warning}; the calibrated figures are extrapolated here"
              for warning in data.get("calibration_warnings", [])]
    emit(table, fmt, notes=notes)
