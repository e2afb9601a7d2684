"""`tpusim compare`: the same model on several systems, side by side."""

from __future__ import annotations

import argparse
import sys

from hwmodels import values
from tpusim.app.cli.common import (
    add_model_options,
    add_systems_option,
    jobs,
    output_folder,
    png_file,
)
from tpusim.app.cli.flag_rules import refuse_unused
from tpusim.app.tables import TableData, add_format_option, emit, output_format
from tpusim.cli_options import (
    ROUTING_HELP,
    add_batch_option,
    add_context_option,
    add_model_option,
    add_routing_options,
    add_schedule_option,
    nonnegative_int,
    positive_int,
)


def _numbers(text: str, kind: type, name: str) -> list:
    """A comma-separated list of numbers >= 1, each finite, none empty (:mod:`hwmodels.values`)."""
    return values.number_list(text, name, kind=kind, minimum=1)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare", help="compare systems (TPU megakernel vs GPU stacks) side by side",
        description="Simulate the same model on several systems at several batch sizes (and, with "
        "--spec-acceptance, with speculative decoding), after checking that weights and KV cache "
        "fit HBM. TPU and GPU-megakernel rows run the best schedule of a reduced sweep per row "
        "unless --schedule is given; each row shows the step time, throughput and where the time "
        "goes (compute, launches, collectives, exposed copies, other).")
    add_model_option(parser, default="kimi-k3")
    add_model_options(parser)
    add_systems_option(parser, default="tpu-v7:16,gb200:16,gb200:16:megakernel")
    add_batch_option(parser, default="1,2,4,8", type=None, help="comma-separated batch sizes (default: 1,2,4,8)")
    parser.add_argument("--spec-acceptance", default="",
                        help="comma-separated acceptance lengths (accepted draft tokens + 1) for speculative "
                        "decoding rows, e.g. 3,6 (default: none, plain decode only)")
    parser.add_argument("--drafter", default=None,
                        help="drafter for speculative rows: kimi-k3-dspark (parallel), kimi-k3-eagle "
                        "(autoregressive), mtp (the target's MTP layers, from config.json) "
                        "(default: the model's published drafter; kimi-k3-dspark for kimi-k3)")
    parser.add_argument("--draft-tokens", type=positive_int, default=None,
                        help="draft tokens per speculative step (default: the drafter's, 7 for kimi-k3-dspark)")
    add_schedule_option(parser,
                        help="best | published | a built-in name | FILE (default: the sweep's best for each "
                        "TPU/megakernel row)")
    parser.add_argument("--sweep-budget", type=positive_int, default=8,
                        help="full engine runs per (reduced) sweep when choosing the best schedule (default: 8)")
    parser.add_argument("--sweep-samples", type=nonnegative_int, default=100,
                        help="random schedules per reduced sweep, beside the built-ins and their neighbours "
                        "(default: 100)")
    parser.add_argument("--jobs", type=jobs, default=1, help="processes for the sweeps (default: 1)")
    add_context_option(parser)
    add_routing_options(parser, routing_help=f"expert routing model: {ROUTING_HELP}",
                        seed_help="seed of the routing draw and the sweeps")
    parser.add_argument("--uncalibrated", action="store_true",
                        help="use the published catalog figures, ignoring calibrated overlays (default: off)")
    add_format_option(parser)
    parser.add_argument("--plot", type=png_file, default=None, help="write a grouped bar chart (PNG) to this file "
                        "(default: none)")
    parser.add_argument("--out", type=output_folder, default=None,
                        help="folder for sweep outputs when choosing schedules (default: a temporary folder)")
    parser.set_defaults(func=run, output_lock="folder")  # --out: the sweeps that choose schedules


def _chips(systems: list, *, calibrated: bool) -> list:
    """Each system's chip in its execution (what the flag rules ask of a row)."""
    from hwmodels.catalog import load_chip
    from tpusim.compare.rows import with_execution

    return [with_execution(load_chip(spec.chip, calibrated=calibrated), spec.execution) for spec in systems]


def run(args: argparse.Namespace) -> int:
    from tpusim.compare.rows import compare_rows, parse_systems
    from tpusim.compare.schedule_choice import sweep_chooser
    from tpusim.workload.routing import parse_routing

    batches = _numbers(args.batch, int, "--batch")  # every value checked before any work
    typed = args.spec_acceptance or "spec_acceptance" in getattr(args, "given", ())  # a typed "" is an empty list
    acceptances = _numbers(args.spec_acceptance, float, "--spec-acceptance") if typed else []
    routing = parse_routing(args.routing)
    systems = parse_systems(args.systems)
    refuse_unused(args, chips=_chips(systems, calibrated=not args.uncalibrated))
    chooser = None
    if args.schedule in (None, "best"):
        chooser = sweep_chooser(budget=args.sweep_budget, jobs=args.jobs, seed=args.seed, out_dir=args.out,
                                context_tokens=args.context, routing=routing,
                                samples=args.sweep_samples)
    rows = compare_rows(args.model, systems, batches, acceptance_lengths=acceptances, schedule=args.schedule,
                        choose_schedule=chooser, context_tokens=args.context, routing=routing,
                        seed=args.seed, calibrated=not args.uncalibrated, draft_tokens=args.draft_tokens,
                        drafter=args.drafter, formats=args.formats, plan_choice=args.plan)
    if args.plot:
        from tpusim.compare.plot import plot_comparison

        plot_comparison(rows, args.plot, title=f"{args.model}: simulated decode throughput")
    fmt = output_format(args)
    table = comparison_table(rows, title=f"{args.model}: decode step per system (simulated)")
    notes = [] if fmt == "json" else calibration_notes(rows) + [
        f"warning: {row['system']} batch {row['batch']}: {row['warning']}" for row in rows if row.get("warning")]
    if fmt == "json":  # the rows carry calibration_warnings; the terminal still hears of them
        for line in calibration_notes(rows):
            if line.startswith("warning: "):
                print(f"tpusim compare: {line}", file=sys.stderr)
    if fmt == "table":
        notes += interval_notes(rows) + added_notes(args, systems, batches)
    emit(table, fmt, notes=notes)
    return 0


def added_notes(args: argparse.Namespace, systems: list, batches: list[int]) -> list[str]:
    """Lines the layers above add under the table, in the entry points' name order: each of
    group ``tpusim.compare_notes`` (:mod:`tpusim.app.plugins`) is called with the parsed
    arguments, the systems and the batches and returns its lines, none for rows it has
    nothing to say about (calibration's: K3 on 16 TPU v7 priced by its compiler)."""
    from tpusim.app.plugins import COMPARE_NOTES, load

    return [line for notes in load(COMPARE_NOTES).values() for line in notes(args, systems, batches)]


def comparison_table(rows: list[dict], *, title: str) -> TableData:
    """The rows as a table: step, throughput, and where the step's time goes (ms)."""
    from tpusim.compare.breakdown import PARTS, where_ms

    columns = ["system", "execution", "batch", "accept.", "step ms", "tokens/s",
               *[f"{part} ms" for part in PARTS], "label", "schedule / note"]
    table = TableData(title=title, columns=columns, records=rows,
                      right_aligned=[c for c in columns if c.endswith("ms") or c in ("batch", "accept.", "tokens/s")])
    for row in rows:
        parts = where_ms(row)
        table.add(
            row["system"], row["execution"], row["batch"],
            "—" if row["acceptance_length"] is None else f"{row['acceptance_length']:g}",
            (f"{row['step_ms']:.3f}" + (f" [{row['step_ms_low']:.3f}–{row['step_ms_high']:.3f}]"
                                        if row.get("step_ms_low") is not None else "")) if parts else "does not fit",
            (f"{row['tokens_per_s']:.1f}" + (f" [{row['tokens_per_s_low']:.1f}–{row['tokens_per_s_high']:.1f}]"
                                             if row.get("tokens_per_s_low") is not None else "")) if parts else "—",
            *[f"{parts[part]:.3f}" if parts else "—" for part in PARTS],
            row["label"], ((f"warning: {row['warning']}; " if row.get("warning") else "")
                           + (row.get("plan_choice") or "") + " "
                           + (row.get("schedule_choice") or row.get("short_note", ""))
                           + (f"; VMEM static {row['vmem_static_mib']:.2f} MiB" if row.get("vmem_static_mib") is not None
                              else "")).strip(),
        )
    return table


def calibration_notes(rows: list[dict]) -> list[str]:
    """One line per calibrated system: what it was fitted on, and where this run lies outside."""
    notes: list[str] = []
    for system in dict.fromkeys(row["system"] for row in rows):
        row = next(r for r in rows if r["system"] == system)
        if row.get("calibrated_on"):
            notes.append(f"{system}: {row['calibrated_on']}")
            notes += [f"warning: {system}: {gap}" for gap in row.get("calibration_warnings", [])]
    return notes


def interval_notes(rows: list[dict]) -> list[str]:
    """What the bracketed intervals in the table are, or that there are none."""
    if any(row.get("step_ms_low") is not None for row in rows):
        return ["[low–high]: 90 % prediction interval (re-simulated over the fit's sampled parameter sets "
                "and/or the fit's out-of-sample model error; a GPU whose figures derive from another chip's "
                "fit takes that fit's model error); other rows have none."]
    return ["no prediction intervals: no row uses calibrated figures."]
