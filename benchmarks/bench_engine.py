"""Benchmark the engine on one full 93-layer Kimi K3 decode step.

Run::

    .venv/bin/python benchmarks/bench_engine.py                      # published, batch 1, 7 runs
    .venv/bin/python benchmarks/bench_engine.py --schedule naive --batch 8 --runs 11
    .venv/bin/python benchmarks/bench_engine.py --all                # every built-in, batch 1 and 8
    .venv/bin/python benchmarks/bench_engine.py --schedule best.json --batch 8 --cold --runs 5

``--schedule`` takes a built-in name or a schedule JSON; a joint sweep's ``best.json`` (a
schedule with a ``deployment``) runs on its deployment's plan and collective algorithms, as
``tpusim simulate`` does (the batch is ``--batch``: the file's description says which).
``--cold`` times the case a sweep pays for: every run simulates a fresh copy of the
schedule with the issue-plan cache and the kept lowered steps emptied first
(:func:`tpusim.schedule.program_issue.forget_issue_plans`,
:func:`tpusim.engine.reuse.forget_lowerings`), so planning, lowering and the event loop are
all timed (the program's schedule-independent facts stay memoised, as they do across a
sweep's candidates: the issue plan's program facts, the lowering's collectives and op kinds);
without it, runs after the warm-up re-simulate the same step: the cached plan and the kept
lowered step, reset (:mod:`tpusim.engine.reuse`).
Uncalibrated chip figures, as for the built-ins (a ``best.json``'s description quotes its
sweep's step time, which may have used other figures).

For each case it builds the program once (K3 on tpu-v7 x16, the published TP32 plan or the
file's deployment, per device), simulates it ``--runs`` times on the fast path (no
timeline, no events) and prints the median wall time per step, the median CPU time of this
process per step (what to compare on a machine shared with other jobs: wall time there
counts waiting for a core), engine events per second, copies per step and the simulated
step time. Target (issue 11):
<= 0.1 s per full K3 step at batch 1 with the message-level collectives, on the project's
2-core machine (a sweep, a calibration and every interval re-simulation depend on it).
``--profile`` prints the top of a cProfile of one run. ``--event-by-event`` runs the
reference loop (one queue entry per piece and per copy event, no running ahead:
:mod:`tpusim.engine.loop`), whose results are identical (``tests/test_engine_run_ahead.py``);
events per step are printed for either, and ``tests/test_engine_run_ahead.py`` holds K3
published batch 1 to a budget. The first line says which engine runs: ``compiled`` (the
install's Cython build of the hot modules) or ``interpreted`` (``TPUSIM_ENGINE=interpreted``
forces it: :mod:`tpusim.engine.native`).

Speed work must not move a simulated result. ``--results-out FILE`` writes, for every
case run, the simulated step, exposed DMA, VMEM peak, breakdown, copy count and per-op
times; ``--results-check FILE`` compares this run's against such a file (taken before the
change) and fails on any relative difference above 1e-12::

    .venv/bin/python benchmarks/bench_engine.py --all --runs 1 --results-out /tmp/before.json
    (change the engine)
    .venv/bin/python benchmarks/bench_engine.py --all --runs 1 --results-check /tmp/before.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

from hwmodels.catalog import make_system
from tpusim.cli_options import add_batch_option, add_schedule_option
from tpusim.engine import InfeasibleSchedule, native, simulate
from tpusim.engine.reuse import forget_lowerings
from tpusim.schedule.program_issue import forget_issue_plans
from tpusim.schedule.schema import BUILTIN_SCHEDULES, load_schedule
from tpusim.workload.floors import floors
from tpusim.workload.model_catalog import deployment_plan, load_model, plan_for
from tpusim.workload.program import build_program

RELATIVE_TOLERANCE = 1e-12


def bench(schedule_name: str, batch: int, runs: int, *, profile: bool = False, cold: bool = False,
          event_by_event: bool = False) -> dict[str, Any]:
    system = make_system("tpu-v7", 16, calibrated=False)
    model = load_model("kimi-k3")
    schedule = load_schedule(schedule_name)
    if schedule.deployment is not None:  # a joint sweep's best.json: its plan and algorithms
        plan = deployment_plan(model, system.chip, system.chips, schedule.deployment.plan,
                               schedule.deployment.collectives)
    else:
        plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    program = build_program(model, plan, batch=batch)
    result = simulate(program, schedule, system.chip, event_by_event=event_by_event)  # warm-up (imports, caches)
    walls, cpus = [], []
    for run in range(runs):
        if cold:  # a new candidate: nothing planned for it yet
            forget_issue_plans()
            forget_lowerings()
            fresh = schedule.model_copy(update={"name": f"{schedule.name}-cold{run}"})
        began, began_cpu = time.perf_counter(), time.process_time()
        result = simulate(program, fresh if cold else schedule, system.chip, event_by_event=event_by_event)
        walls.append(time.perf_counter() - began)
        cpus.append(time.process_time() - began_cpu)
    median = statistics.median(walls)
    floor = floors(program, system.chip).floor_s
    label = Path(schedule_name).name if schedule_name.endswith(".json") else schedule_name
    print(f"{label:20s} batch {batch}{' cold' if cold else ''}: median {median * 1e3:7.1f} ms wall/step "
          f"(min {min(walls) * 1e3:.1f}; CPU median {statistics.median(cpus) * 1e3:.1f}), "
          f"{result.event_count / median:9.0f} events/s, "
          f"{result.event_count} events/step, {result.dma_count} copies, {len(program.ops)} ops; "
          f"simulated step {result.step_s * 1e3:.3f} ms (analytic floor {floor * 1e3:.3f} ms)")
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        if cold:
            forget_issue_plans()
            forget_lowerings()
        simulate(program, schedule, system.chip, event_by_event=event_by_event)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return {"step_s": result.step_s, "exposed_dma_s": result.exposed_dma_s, "vmem_peak_bytes": result.vmem_peak_bytes,
            "breakdown_s": result.breakdown_s, "dma_count": result.dma_count, "op_time_s": list(result.op_time_s)}


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    """Where two result trees differ (numbers: by more than RELATIVE_TOLERANCE relative)."""
    if isinstance(before, dict) and isinstance(after, dict):
        if set(before) != set(after):
            return [f"{path}: keys {sorted(set(before) ^ set(after))}"]
        return [line for key in before for line in differences(before[key], after[key], f"{path}/{key}")]
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} != {len(after)} entries"]
        return [line for i, (b, a) in enumerate(zip(before, after, strict=True))
                for line in differences(b, a, f"{path}[{i}]")]
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        if not math.isclose(before, after, rel_tol=RELATIVE_TOLERANCE, abs_tol=0.0):
            return [f"{path}: {before!r} -> {after!r}"]
        return []
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    add_schedule_option(parser, default="published")
    add_batch_option(parser, default=1, type=int)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--all", action="store_true", help="every built-in schedule at batch 1 and 8")
    parser.add_argument("--profile", action="store_true", help="cProfile one run")
    parser.add_argument("--cold", action="store_true",
                        help="each run a fresh copy of the schedule, issue-plan cache emptied (a sweep's case)")
    parser.add_argument("--event-by-event", action="store_true",
                        help="the reference loop: one entry per piece and per copy event (no running ahead)")
    parser.add_argument("--results-out", type=Path, help="write the simulated results (JSON)")
    parser.add_argument("--results-check", type=Path, help="compare the simulated results with this file")
    args = parser.parse_args()
    cases = ([(name, batch) for batch in (1, 8) for name in BUILTIN_SCHEDULES] if args.all
             else [(args.schedule, args.batch)])
    print(native.description())  # compiled (the install's Cython build) or interpreted
    results = {}
    for name, batch in cases:
        try:
            results[f"{name} b{batch}"] = bench(name, batch, args.runs, profile=args.profile, cold=args.cold,
                                                  event_by_event=args.event_by_event)
        except InfeasibleSchedule as error:  # e.g. layer-double-buffer at batch 8 (docs/vmem.md)
            print(f"{name:20s} batch {batch}: does not fit on-chip memory ({str(error)[:90]}...)")
    if args.results_out:
        args.results_out.write_text(json.dumps(results, indent=1))
    if args.results_check:
        before = json.loads(args.results_check.read_text())
        found = differences({key: before[key] for key in results}, results)
        skipped = sorted(set(before) - set(results))
        if skipped:
            print(f"not compared (no longer fit): {', '.join(skipped)}")
        print("\n".join(found[:20]) if found else f"simulated results identical to {args.results_check} "
              f"(every number within {RELATIVE_TOLERANCE:g} relative)")
        raise SystemExit(1 if found else 0)


if __name__ == "__main__":
    main()
