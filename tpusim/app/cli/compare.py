"""`tpusim compare`: the same model on several systems, side by side."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hwmodels.errors import InputError
from tpusim.app.cli.common import emit_json


def _numbers(text: str, kind: type, name: str) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"{name} {text!r}: expected a comma-separated list of numbers") from None
    if not values or any(v < 1 for v in values):
        raise InputError(f"{name} {text!r}: values must be >= 1")
    return values


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("compare", help="compare systems (TPU megakernel vs GPU stacks) side by side")
    parser.add_argument("--model", default="kimi-k3")
    parser.add_argument("--systems", default="tpu-v7:16,gb200:16,gb200:16:megakernel",
                        help="comma-separated chip:chips[:per-kernel|graphs|megakernel]")
    parser.add_argument("--batch", default="1,2,4,8", help="comma-separated batch sizes")
    parser.add_argument("--spec-acceptance", default="", help="acceptance lengths for speculative decoding, e.g. 3,6")
    parser.add_argument("--draft-tokens", type=int, default=7, help="draft tokens per speculative step")
    parser.add_argument("--schedule", default=None,
                        help="best | published | a built-in | FILE (default: the sweep's best for each TPU/megakernel row)")
    parser.add_argument("--sweep-budget", type=int, default=8,
                        help="full engine runs per (reduced) sweep when choosing the best schedule")
    parser.add_argument("--sweep-samples", type=int, default=100,
                        help="random schedules per reduced sweep, beside the built-ins and their neighbours")
    parser.add_argument("--jobs", type=int, default=1, help="processes for the sweeps")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--routing", default="uniform")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--uncalibrated", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, default=None, help="write a grouped bar chart (PNG)")
    parser.add_argument("--out", type=Path, default=None, help="folder for sweep outputs when choosing schedules")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tpusim.compare.rows import compare_rows, parse_systems, sweep_chooser
    from tpusim.workload.routing import parse_routing

    systems = parse_systems(args.systems)
    batches = _numbers(args.batch, int, "--batch")
    acceptances = _numbers(args.spec_acceptance, float, "--spec-acceptance") if args.spec_acceptance else []
    chooser = None
    if args.schedule in (None, "best"):
        chooser = sweep_chooser(budget=args.sweep_budget, jobs=args.jobs, seed=args.seed, out_dir=args.out,
                                context_tokens=args.context, routing=parse_routing(args.routing),
                                samples=args.sweep_samples)
    rows = compare_rows(args.model, systems, batches, acceptance_lengths=acceptances, schedule=args.schedule,
                        choose_schedule=chooser, context_tokens=args.context, routing=parse_routing(args.routing),
                        seed=args.seed, calibrated=not args.uncalibrated, draft_tokens=args.draft_tokens)
    if args.plot:
        from tpusim.compare.plot import plot_comparison

        plot_comparison(rows, args.plot, title=f"{args.model}: simulated decode throughput")
    if args.json:
        emit_json(rows)
        return 0
    render_table(rows, Console(), title=f"{args.model}: decode step per system")
    return 0


def render_table(rows: list[dict], console: Console, *, title: str) -> None:
    table = Table(title=title)
    for column in ("system", "execution", "batch", "accept.", "step ms", "tokens/s", "label", "schedule / note"):
        table.add_column(column, justify="right" if column in ("batch", "accept.", "step ms", "tokens/s") else "left",
                         overflow="fold")
    for row in rows:
        fits = row.get("fits", True)
        table.add_row(
            row["system"], row["execution"], str(row["batch"]),
            "—" if row["acceptance_length"] is None else f"{row['acceptance_length']:g}",
            (f"{row['step_ms']:.3f}" + (f" [{row['step_ms_low']:.3f}–{row['step_ms_high']:.3f}]"
                                        if row.get("step_ms_low") is not None else "")) if fits else "does not fit",
            (f"{row['tokens_per_s']:.1f}" + (f" [{row['tokens_per_s_low']:.1f}–{row['tokens_per_s_high']:.1f}]"
                                             if row.get("tokens_per_s_low") is not None else "")) if fits else "—",
            row["label"], row.get("schedule_choice") or row.get("short_note", ""),
        )
    console.print(table)
    if any(row.get("step_ms_low") is not None for row in rows):
        console.print("[low–high]: 90 % prediction interval of calibrated rows (re-simulated over the fit's "
                      "sampled parameter sets); rows labelled simulated have none.", highlight=False, markup=False)
    else:
        console.print("no prediction intervals: no row uses calibrated figures.", highlight=False, markup=False)
