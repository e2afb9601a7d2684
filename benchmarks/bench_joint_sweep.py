"""Benchmark the joint sweep of issue 26's "Done means": K3 on 16 TPU v7, batch 1, 2,000 full simulations.

Run::

    .venv/bin/python benchmarks/bench_joint_sweep.py                       # budget 2000, --jobs 2
    .venv/bin/python benchmarks/bench_joint_sweep.py --budget 200 --jobs 1 --out /tmp/j200
    .venv/bin/python benchmarks/bench_joint_sweep.py --budget 60 --jobs 1 --profile /tmp/j60.pstats

It runs the same library call as ``tpusim sweep --model kimi-k3 --hardware tpu-v7 --chips 16
--batch 1 --space joint --budget 2000 --jobs 2 --out DIR`` (published chip figures, seed 0,
no plots) and prints: wall seconds; CPU seconds of this process and of its finished worker
processes, together and apart (``os.times``: what to compare on a machine shared with other
jobs, where wall time counts waiting for a core); the load average before and after; full simulations
and trials (the pruned and screened-out ones included) per wall second and the CPU seconds
per simulation; and the best speedup over the published design (simulated), which
``tpusim simulate --schedule DIR/best.json`` reproduces. Target (issue 26): <= 180 s wall with
``--jobs 2`` on the project's 2-core machine.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import tempfile
import time
from pathlib import Path

from hwmodels.catalog import make_system
from tpusim.sweep.joint import run_joint_sweep
from tpusim.workload.model_catalog import load_model


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=2000, help="full-step simulations")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output folder (default: a temporary one)")
    parser.add_argument("--profile", type=Path, help="also write a cProfile of the client (CPU timer) to this "
                        "file; with --jobs 1 it covers the whole sweep (read it with python -m pstats)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-joint-"))
    load_before = os.getloadavg()
    began, times_before = time.perf_counter(), os.times()
    profile = cProfile.Profile(time.process_time) if args.profile else None
    if profile is not None:
        profile.enable()
    result = run_joint_sweep(load_model("kimi-k3"), make_system("tpu-v7", 16, calibrated=False), 1, out_dir=out,
                             budget=args.budget, seed=args.seed, jobs=args.jobs, quiet=False, plots=False)
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    wall_s = time.perf_counter() - began
    times_after = os.times()
    client_s = sum(getattr(times_after, f) - getattr(times_before, f) for f in ("user", "system"))
    cpu_s = client_s + sum(getattr(times_after, f) - getattr(times_before, f)
                           for f in ("children_user", "children_system"))
    speedup = result.speedup
    print(f"joint sweep, budget {args.budget}, --jobs {args.jobs}: {result.simulated} full simulations, "
          f"{result.trials} trials in {wall_s:.1f} s wall, {cpu_s:.1f} s CPU (this process {client_s:.1f} + "
          f"workers {cpu_s - client_s:.1f}); "
          f"{result.simulated / wall_s:.2f} simulations/s, {result.trials / wall_s:.2f} trials/s, "
          f"{cpu_s / max(result.simulated, 1) * 1e3:.0f} ms CPU per simulation; load average "
          f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"best: {result.best_row['plan']} ({result.best_row['collectives'] or 'plan collectives'}) "
          f"{result.best_row['predicted_ms']:.4f} ms/step (simulated); speedup over published "
          f"{f'{speedup:.3f}x' if speedup else 'n/a'}; best.json in {out}")


if __name__ == "__main__":
    main()
