"""Benchmark the engine on one full 93-layer Kimi K3 decode step.

Run::

    .venv/bin/python benchmarks/bench_engine.py                      # published, batch 1, 7 runs
    .venv/bin/python benchmarks/bench_engine.py --schedule naive --batch 8 --runs 11
    .venv/bin/python benchmarks/bench_engine.py --all                # every built-in, batch 1 and 8

For each case it builds the program once (K3 on tpu-v7 x16, the published TP32 plan, per
device), simulates it ``--runs`` times on the fast path (no timeline, no events) and prints
the median wall time per step, SimPy events per second, copies per step and the simulated
step time. Target: <= 0.5 s per full K3 step on a 2-core machine (a 1000-schedule sweep
depends on it). ``--profile`` prints the top of a cProfile of one run.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from hwmodels.catalog import make_system
from tpusim.engine import simulate
from tpusim.schedule.schema import BUILTIN_SCHEDULES, load_schedule
from tpusim.workload.floors import floors
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program


def bench(schedule_name: str, batch: int, runs: int, *, profile: bool = False) -> None:
    system = make_system("tpu-v7", 16, calibrated=False)
    model = load_model("kimi-k3")
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    program = build_program(model, plan, batch=batch)
    schedule = load_schedule(schedule_name)
    result = simulate(program, schedule, system.chip)  # warm-up (imports, caches)
    walls = []
    for _ in range(runs):
        began = time.perf_counter()
        result = simulate(program, schedule, system.chip)
        walls.append(time.perf_counter() - began)
    median = statistics.median(walls)
    floor = floors(program, system.chip).floor_s
    print(f"{schedule_name:20s} batch {batch}: median {median * 1e3:7.1f} ms wall/step "
          f"(min {min(walls) * 1e3:.1f}), {result.event_count / median:9.0f} events/s, "
          f"{result.event_count} events, {result.dma_count} copies, {len(program.ops)} ops; "
          f"simulated step {result.step_s * 1e3:.3f} ms (analytic floor {floor * 1e3:.3f} ms)")
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        simulate(program, schedule, system.chip)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="published", help="built-in name or schedule JSON")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--all", action="store_true", help="every built-in schedule at batch 1 and 8")
    parser.add_argument("--profile", action="store_true", help="cProfile one run")
    args = parser.parse_args()
    cases = ([(name, batch) for batch in (1, 8) for name in BUILTIN_SCHEDULES] if args.all
             else [(args.schedule, args.batch)])
    for name, batch in cases:
        bench(name, batch, args.runs, profile=args.profile)


if __name__ == "__main__":
    main()
