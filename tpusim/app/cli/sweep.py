"""`tpusim sweep`: search prefetch schedules for a model on a system and choose the fastest.

    tpusim sweep --model kimi-k3 --hardware tpu-v7 --chips 16 --batch 1 --jobs 2 --out sweeps/k3-b1

writes ``sweep.csv``, ``best.json`` (the schedule the kernel takes), ``summary.md``,
``pareto.png``, ``sensitivity.png`` and ``space.json`` into ``--out``, and prints the top 5
and the rank of ``published``, every number labelled *simulated* or *estimate*. Ctrl-C
keeps every finished row; the same command with ``--resume`` continues without repeating
them. On a calibrated chip every row shown (the top 5 and ``published``) gets a 90 %
prediction interval and ``P(best)``, the share of the calibration's sampled parameter sets on
which it is the fastest of those rows (``row_intervals`` in ``--json``, with the best row's
also as ``best_interval``; :mod:`tpusim.sweep.intervals`). See :mod:`tpusim.sweep` for the
search itself.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json
from hwmodels.units import MIB
from tpusim.app.cli.capacity_gate import check_fit
from tpusim.app.cli.common import (
    add_workload_options,
    emit_json,
    jobs,
    output_folder,
    resolve_workload,
)
from tpusim.app.tables import TableData, add_format_option, emit, output_format
from tpusim.cli_options import nonnegative_int, positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    from tpusim.sweep.defaults import DEFAULT_BUDGET, DEFAULT_SCREEN_FACTOR, DEFAULT_SCREEN_LAYERS

    parser = subparsers.add_parser(
        "sweep", help="search prefetch schedules: prune, estimate, simulate the best, write best.json",
        description="Search prefetch schedules for one workload: every built-in schedule, their "
        "one-knob neighbours and seeded random draws; prune what overflows on-chip memory, rank the "
        "rest by an analytic estimate, screen the best on the first layers with the engine and "
        "simulate the finalists in full. Writes sweep.csv (resumable), best.json (the schedule the "
        "kernel takes), summary.md and plots to --out. Every time is simulated or estimated, and "
        "labelled so.")
    add_workload_options(parser)
    for action in parser._actions:
        if action.dest == "seed":  # one seed fixes both the routing draw and the sampled candidates
            action.help = "seed of the routing draw and of the sampled candidates"
    parser.add_argument("--out", required=True, type=output_folder, help="output folder (sweep.csv, best.json, summary.md, plots)")
    parser.add_argument("--budget", type=positive_int, default=DEFAULT_BUDGET,
                        help=f"full-step engine simulations, built-ins included (default {DEFAULT_BUDGET})")
    parser.add_argument("--jobs", type=jobs, default=1, help="worker processes (default 1)")
    parser.add_argument("--resume", action="store_true", help="continue a sweep in --out, skipping finished rows")
    parser.add_argument("--samples", type=nonnegative_int, default=None, help="random draws from the space (default: the space's)")
    parser.add_argument("--space", default=None,
                        help="joint (plan x collective algorithms x schedule, searched by Optuna), or a "
                        "SweepSpace JSON (or a previous space.json); default: the schedule space")
    parser.add_argument("--batches", default=None, metavar="LIST",
                        help="--space joint: one sweep per batch (e.g. 1,2,4,8; --budget each) into OUT/batch-N, "
                        "then OUT/report.md and OUT/pareto.png over all of them (instead of --batch)")
    parser.add_argument("--executor", choices=("local", "dask"), default="local",
                        help="--space joint: where candidates run (local: --jobs processes; dask: Dask workers)")
    parser.add_argument("--workers", type=positive_int, default=2, help="--executor dask: local cluster workers")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="--executor dask: an existing scheduler (tcp://host:8786) instead of a local cluster")
    parser.add_argument("--screen-factor", type=nonnegative_int, default=DEFAULT_SCREEN_FACTOR,
                        help=f"screen factor x budget candidates on reduced layers (0: off; default {DEFAULT_SCREEN_FACTOR})")
    parser.add_argument("--screen-layers", type=positive_int, default=DEFAULT_SCREEN_LAYERS,
                        help=f"layers in the screening program (default {DEFAULT_SCREEN_LAYERS})")
    parser.add_argument("--baseline", action="append", default=[], metavar="FILE",
                        help="--space joint: also simulate this schedule on the auto plan beside the built-ins "
                        "(repeatable; e.g. a schedule sweep's best.json, so the search's best is never slower)")
    parser.add_argument("--no-plots", action="store_true", help="skip pareto.png and sensitivity.png")
    parser.add_argument("--no-kernel-gate", action="store_true",
                        help="--space joint: let plans the multi-device megakernel cannot run win too (judged by "
                        "the simulator alone; default: such a candidate gets a pruned row 'kernel: ...')")
    parser.add_argument("--compile-check", type=positive_int, default=None, metavar="N",
                        help="TPU, with libtpu: compile the simulated schedules with Mosaic, fastest first, and "
                        "choose the fastest that compiles (at most N compiles; after a refusal on VMEM, candidates "
                        "that cannot fit beside what the compiler kept are skipped); exit 1 when none compiles")
    parser.add_argument("--weight-banks", type=nonnegative_int, default=0, metavar="N",
                        help="--compile-check of a --shard-of program: compile it with stacked weights of N "
                        "distinct entries, as run-kernel runs a shard too big for one chip's HBM (0: one per layer)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_format_option(parser)
    parser.set_defaults(func=run, output_lock="folder")


def load_space(path: Path) -> Any:
    """A :class:`SweepSpace` from a JSON file (bare, or a sweep's ``space.json``)."""
    from pydantic import ValidationError

    from tpusim.sweep.space import SweepSpace
    from tpusim.workload.model_catalog import format_validation_error

    data = read_user_json(path)
    if isinstance(data, dict) and "space" in data and "workload" in data:
        data = data["space"]
    try:
        return SweepSpace.model_validate(data)
    except ValidationError as error:
        raise InputError(format_validation_error(path, error)) from None


def run(args: argparse.Namespace) -> int:
    from tpusim.sweep import SweepInterrupted, default_space, run_sweep

    model, plan, system, routing = resolve_workload(args)
    fit = check_fit(args, model, plan, system)  # capacity first
    accept = None
    if args.compile_check is not None:  # refused here, before any work, when it cannot run
        accept = compile_checker()(args, system, plan, args.compile_check)
    if args.space == "joint":
        return _run_joint(args, model, system, routing)
    space = load_space(Path(args.space)) if args.space else default_space()
    if args.samples is not None:
        space = space.model_copy(update={"samples": args.samples})

    def sweep_into(out: Path, chosen: Any) -> Any:
        return run_sweep(
            model, plan, chosen, args.batch, out_dir=out, budget=args.budget, jobs=args.jobs,
            seed=args.seed, resume=args.resume, context_tokens=args.context, routing=routing,
            quiet=args.quiet or output_format(args) != "table", space=space, screen_factor=args.screen_factor,
            screen_layers=args.screen_layers, plots=not args.no_plots, accept=accept,
        )

    first = None
    try:
        result = sweep_into(Path(args.out), system)
        if accept is not None and accept.learned:  # refused on VMEM: sweep again within what Mosaic leaves
            first, result = result, accept.resweep(result, sweep_into, system, Path(args.out))
    except SweepInterrupted as interrupted:
        command = " ".join(shlex.quote(a) for a in ["tpusim", *sys.argv[1:]] if a != "--resume")
        print(f"tpusim sweep: {interrupted}\n  resume with: {command} --resume", file=sys.stderr)
        from tpusim.app.cli.run_guard import EXIT_INTERRUPTED, EXIT_TERMINATED
        from tpusim.app.interrupts import Terminated

        # SweepInterrupted is raised from the interrupt it caught: SIGTERM exits 143, Ctrl-C 130
        return EXIT_TERMINATED if isinstance(interrupted.__context__, Terminated) else EXIT_INTERRUPTED
    intervals = _row_intervals(result, model, plan, system, args, routing)
    interval = next((r for r in intervals if r["hash"] == result.best_row["hash"]), None) or _estimate_only()
    fmt = output_format(args)
    if fmt == "json":
        figures = "published figures" if system.chip.calibration is None else system.chip.calibration.note()
        emit_json({**_as_json(result), "best_interval": interval, "row_intervals": intervals,
                   "capacity": fit.as_json(), "figures": f"{system.chip.name}: {figures}",
                   "formats": args.formats_choice, "compile_checks": [*(first.checks if first else []), *result.checks]})
        return _checked_exit(result)
    from tpusim.report.intervals import format_interval

    hardware = [f"hardware {system.chip.name}: published figures"]
    calibration = system.chip.calibration
    if calibration is not None:
        hardware = [f"hardware {system.chip.name}: {calibration.note()}"]
        hardware += [f"warning: {gap}; the calibrated figures are extrapolated here"
                     for gap in calibration.warnings(args.model, args.chips)]
    hardware.append(f"weight formats: {args.formats_choice}")
    hardware.append(f"best schedule: {format_interval(interval)}")
    if interval.get("step_ms_low") is not None:
        hardware.append("P(best): share of the calibration's sampled parameter sets on which the row is the "
                        "fastest of the rows shown (paired re-simulations)")
    if not fit.fits:
        hardware.append(f"HBM: {fit.summary()}: every time above is for a deployment that does not fit")
    hardware += _check_lines(first, result, accept)
    _print_human(result, model.name, system.chip.name, system.chips, args.batch, fmt, hardware,
                 {r["hash"]: r for r in intervals})
    return _checked_exit(result)


def compile_checker() -> Any:
    """What ``--compile-check`` runs: the one entry point of group ``tpusim.compile_checks``
    (:mod:`tpusim.app.plugins`; Mosaic's, declared by the megakernel package), a callable
    ``(args, system, plan, compiles) -> acceptor`` that raises InputError when it cannot run
    here. The acceptor is called per simulated row by :func:`tpusim.sweep.run_sweep`; after a
    VMEM refusal (``accept.learned``) ``accept.resweep`` sweeps again within what the compiler
    leaves."""
    from tpusim.app.plugins import COMPILE_CHECKS, REINSTALL, load

    checkers = load(COMPILE_CHECKS)
    if len(checkers) != 1:
        raise InputError(f"--compile-check: {len(checkers)} compile checks installed (entry point group "
                         f"{COMPILE_CHECKS}: {', '.join(checkers) or 'none'}), expected one; {REINSTALL}")
    return next(iter(checkers.values()))


def _check_lines(first: Any, result: Any, accept: Any) -> list[str]:
    """--compile-check: each compile (or skip), fastest first; the second sweep's after the first's."""
    def lines(checks: list[dict[str, Any]]) -> list[str]:
        shown = [c for c in checks if c["accepted"] is not None]
        skipped = len(checks) - len(shown)
        return ([f"compile check: {c['name']} ({c['predicted_ms']:.4f} ms simulated): {c['note']}" for c in shown]
                + ([f"compile check: {skipped} slower rows not compiled (summary.md)"] if skipped else []))

    if first is None:
        return lines(result.checks)
    return [*lines(first.checks), f"swept again within the VMEM Mosaic leaves: {accept.usable_bytes / MIB:.2f} "
            f"MiB (measured in this run) -> {result.paths.get('summary', '')}", *lines(result.checks)]


def _checked_exit(result: Any) -> int:
    """1 when --compile-check accepted no schedule (best.json is then the unchecked simulated best)."""
    if result.check_failed:
        print("tpusim sweep: --compile-check: no schedule compiled; best.json is the simulated best, unchecked "
              "(summary.md lists the refusals)", file=sys.stderr)
        return 1
    return 0


def _run_joint(args: argparse.Namespace, model: Any, system: Any, routing: Any) -> int:
    """``--space joint``: :func:`tpusim.sweep.joint.run_joint_sweep`, then its best and the published row."""
    from tpusim.sweep import SweepInterrupted
    from tpusim.sweep.joint import default_joint_space, run_joint_sweep
    from tpusim.sweep.joint_batches import parse_batches, run_joint_batches

    space = None
    if args.no_kernel_gate:
        space = default_joint_space(model, system.devices).model_copy(update={"kernel_runs_winner": False})
    options = dict(budget=args.budget, seed=args.seed, resume=args.resume, context_tokens=args.context,
                   routing=routing, jobs=args.jobs, executor=args.executor, workers=args.workers,
                   scheduler=args.scheduler, quiet=args.quiet or output_format(args) != "table",
                   plots=not args.no_plots, space=space, baselines=tuple(args.baseline))
    try:
        if args.batches is not None:
            command = " ".join(shlex.quote(a) for a in ["tpusim", *sys.argv[1:]] if a != "--resume")
            batches = parse_batches(args.batches)
            results = run_joint_batches(model, system, batches, out_dir=args.out, command=command, **options)
            return _print_batches(args, batches, results)
        result = run_joint_sweep(model, system, args.batch, out_dir=args.out, **options)
    except SweepInterrupted as interrupted:
        command = " ".join(shlex.quote(a) for a in ["tpusim", *sys.argv[1:]] if a != "--resume")
        print(f"tpusim sweep: {interrupted}\n  resume with: {command} --resume", file=sys.stderr)
        from tpusim.app.cli.run_guard import EXIT_INTERRUPTED, EXIT_TERMINATED
        from tpusim.app.interrupts import Terminated

        return EXIT_TERMINATED if isinstance(interrupted.__context__, Terminated) else EXIT_INTERRUPTED
    figures = "published figures" if system.chip.calibration is None else system.chip.calibration.note()
    data = {"best": result.best_row, "published": result.published_row, "speedup": result.speedup,
            "figures": f"{system.chip.name}: {figures}", "formats": args.formats_choice,
            "trials": result.trials, "simulated": result.simulated, "wall_s": result.wall_s, "cpu_s": result.cpu_s,
            "executor": result.executor, "paths": {k: str(v) for k, v in result.paths.items()},
            "robust": result.robust}
    if output_format(args) == "json":
        emit_json(data)
        return 0
    best, pub = result.best_row, result.published_row
    print(f"joint sweep: {result.trials} trials, {result.simulated} simulated (full step) in {result.wall_s:.1f} s "
          f"wall, {result.cpu_s:.1f} s CPU in this process ({result.executor})")
    print(f"weight formats: {args.formats_choice}")
    print(f"best: plan {best['plan']}, collectives {best['collectives'] or 'as the plan'}, "
          f"{best['predicted_ms']:.4f} ms/step, {best['tokens_per_s']:.1f} tokens/s (simulated)")
    if pub is not None and result.speedup is not None:
        print(f"published: {pub['predicted_ms']:.4f} ms/step, {pub['tokens_per_s']:.1f} tokens/s (simulated); "
              f"speedup {result.speedup:.3f}x")
    if result.robust is not None:
        from tpusim.sweep.joint_robust import robust_lines

        print("\n".join(robust_lines(result.robust)))
    for key, path in result.paths.items():
        print(f"  {key}: {path}")
    return 0


def _print_batches(args: argparse.Namespace, batches: list[int], results: list[Any]) -> int:
    """``--batches``: one line per batch (best, published, speedup, P(best)), then the report's path."""
    data = [{"batch": batch, "best": r.best_row, "published": r.published_row, "speedup": r.speedup,
             "simulated": r.simulated, "robust": r.robust, "paths": {k: str(v) for k, v in r.paths.items()}}
            for batch, r in zip(batches, results, strict=True)]
    if output_format(args) == "json":
        emit_json({"batches": data, "report": str(args.out / "report.md"), "formats": args.formats_choice})
        return 0
    print(f"weight formats: {args.formats_choice}")
    for row in data:
        p = (row["robust"] or {}).get("p_beats_published")
        versus = (f"vs published {row['published']['tokens_per_s']:.1f} (simulated); speedup {row['speedup']:.3f}x"
                  if row["published"] else "(simulated); the published design does not run here (see report.md)")
        print(f"batch {row['batch']}: best plan {row['best']['plan']}, {row['best']['tokens_per_s']:.1f} tokens/s "
              + versus + (f", P(faster than published) {p:.2f}" if p is not None else ""))
    print(f"report: {args.out / 'report.md'}")
    return 0


def _row_intervals(result: Any, model: Any, plan: Any, system: Any, args: argparse.Namespace,
                   routing: Any) -> list[dict[str, Any]]:
    """The shown rows' 90 % intervals and ``p_best`` (:mod:`tpusim.sweep.intervals`)."""
    from tpusim.progress_notes import note
    from tpusim.report.intervals import outside_fit
    from tpusim.sweep.intervals import row_intervals
    from tpusim.workload.program import build_program

    def program() -> Any:  # the sweep's full-step program (Workload.program)
        return build_program(model, plan, batch=args.batch, context_tokens=args.context, routing=routing,
                             seed=args.seed)

    outside = outside_fit(system.chip, args.model, args.chips, args.batch)
    note("90 % intervals of the shown rows")
    return row_intervals(result, program, system.chip, outside=outside, batch=args.batch)


def _estimate_only() -> dict[str, Any]:
    from tpusim.report.intervals import no_interval

    return no_interval("the best row is an estimate, not a simulation")


def _as_json(result: Any) -> dict[str, Any]:
    def clean(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        keys = ("hash", "name", "source", "status", "predicted_ms", "predicted_by", "tokens_per_s",
                "exposed_dma_ms", "vmem_peak_mib", "vmem_static_mib", "est_ms", "screen_ms")
        return {key: row.get(key) for key in keys}

    simulated = sorted((r for r in result.rows if r["status"] == "simulated"),
                       key=lambda r: (r["predicted_ms"], r["hash"]))
    return {
        "best": clean(result.best_row), "published": clean(result.published_row),
        "published_rank": result.published_rank, "speedup_vs_published": result.speedup_vs_published,
        "counts": {"considered": result.considered, "pruned": result.pruned, "screened": result.screened,
                   "simulated": result.simulated, "estimated": result.estimated},
        "top": [clean(r) for r in simulated[:10]], "wall_s": result.wall_s,
        "paths": {k: str(v) for k, v in result.paths.items()},
    }


def _print_human(result: Any, model: str, chip: str, chips: int, batch: int, fmt: str,
                 hardware: list[str], intervals: dict[str, dict[str, Any]]) -> None:
    simulated = sorted((r for r in result.rows if r["status"] == "simulated"),
                       key=lambda r: (r["predicted_ms"], r["hash"]))
    notes = [f"{model} on {chip} x{chips}, batch {batch}: {result.considered} candidates considered, "
             f"{result.pruned} pruned, {result.screened} screened, {result.simulated} simulated, "
             f"{result.estimated} estimate only ({result.wall_s:.1f} s)"]
    with_interval = any(r.get("step_ms_low") is not None for r in intervals.values())
    columns = ["#", "name", "ms/step", *(["90 % interval ms", "P(best)"] if with_interval else []),
               "tokens/s", "exposed DMA ms", "VMEM static MiB", "VMEM peak MiB", "label"]
    table = TableData(title="top 5", columns=columns, right_aligned=("#", "ms/step", "P(best)", "tokens/s",
                                                                      "exposed DMA ms", "VMEM static MiB",
                                                                      "VMEM peak MiB"))
    shown = simulated[:5] or sorted((r for r in result.rows if r["status"] == "estimated"),
                                    key=lambda r: (r["predicted_ms"], r["hash"]))[:5]
    for i, r in enumerate(shown, 1):
        vmem, static = r.get("vmem_peak_mib"), r.get("vmem_static_mib")
        table.add(i, r["name"], f"{r['predicted_ms']:.4f}", *_interval_cells(intervals.get(r["hash"]), with_interval),
                  f"{r['tokens_per_s']:.1f}",
                  f"{r['exposed_dma_ms']:.3f}" if r.get("exposed_dma_ms") is not None else "–",
                  f"{static:.2f}" if static is not None else "–",
                  f"{vmem:.2f}" if vmem is not None else "–", r["predicted_by"])
    pub = result.published_row
    if pub and pub.get("predicted_ms"):
        cells = _interval_cells(intervals.get(pub["hash"]), with_interval)
        extra = f", 90 % interval {cells[0]} ms, P(best) {cells[1]}" if cells and cells[0] != "–" else ""
        notes.append(f"published: {pub['predicted_ms']:.4f} ms/step ({pub['predicted_by']}{extra}), rank "
                     f"{result.published_rank} of {len(simulated) or result.estimated}; chosen "
                     f"{result.best_row['predicted_ms']:.4f} ms/step ({result.best_row['predicted_by']}), "
                     f"{result.speedup_vs_published:.3f}x")
    elif pub:
        notes.append(f"published: {pub['status']}: {pub.get('reason', '')}")
    notes.append(f"best schedule: {result.paths['best']}  (summary: {result.paths['summary']})")
    emit(table, fmt, notes=[*notes, *hardware])


def _interval_cells(entry: dict[str, Any] | None, with_interval: bool) -> list[str]:
    """The interval and P(best) cells of one row (none when no row has an interval)."""
    if not with_interval:
        return []
    if entry is None or entry.get("step_ms_low") is None:
        return ["–", "–"]
    p_best = entry.get("p_best")  # None: a model-error interval with no parameter samples to rank on
    return [f"{entry['step_ms_low']:.3f}–{entry['step_ms_high']:.3f}", "–" if p_best is None else f"{p_best:.2f}"]
