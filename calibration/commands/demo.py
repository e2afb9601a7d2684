"""`tpusim demo`: the main job on built-in defaults (see :mod:`calibration.commands.demo_steps`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpusim.app.cli.common import jobs, output_folder
from tpusim.cli_options import positive_int


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "demo", help="the main job on defaults in minutes: sweep, floor, simulate, measured, compare, report.md",
        description="Run the main job on built-in defaults: a schedule sweep for Kimi K3 on 16 TPU v7 "
        "chips, whose answer (the best schedule and its speed-up over the published one) is printed "
        "as soon as it is known, then the floors, the chosen schedule simulated beside the built-ins, "
        "the kernel's committed step times on a TPU v5e against the simulator, and TPU v7 against "
        "GB200 at batch 1 and 8; writes OUT/report.md with every figure labelled (a few minutes on 2 "
        "cores). --full adds the long steps: the Pallas megakernel with the chosen schedule on "
        "kimi-k3-mini (TPU interpret mode on a CPU), calibration of tpu-v7 on the published TPU7x "
        "points and of this host, the deployment search, Mosaic compiles for 32 TPU7x devices and "
        "batch 4 (about ten minutes). Overlays go to OUT/local (or --local-dir), and a previous run's "
        "overlays there are removed first; the demo prints the command that reuses them.")
    parser.add_argument("--out", type=output_folder, default=Path("report"), help="report folder (default ./report)")
    parser.add_argument("--jobs", type=jobs, default=2, help="worker processes for sweeps")
    parser.add_argument("--sweep-budget", type=positive_int, default=32, help="full simulations per sweep")
    parser.add_argument("--quick", action="store_true", help="small budgets (smoke test)")
    parser.add_argument("--full", action="store_true",
                        help="also the long steps: kernel run in interpret mode, calibrations, deployment search, "
                        "Mosaic compiles, a batch-4 sweep (about ten minutes on 2 cores)")
    # flags the chosen path ignores are refused (tpusim.app.cli.flag_rules), before any work
    parser.set_defaults(func=run, output_lock="folder", flag_rules=(("sweep_budget", _quick_budget),))


def _quick_budget(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "quick", False):
        return "--quick sets its own small budgets (8 simulations a sweep); give --quick or --sweep-budget, not both"
    return None


def run(args: argparse.Namespace) -> int:
    from calibration.commands.demo_run import DemoConfig
    from calibration.commands.demo_steps import run_demo
    from tpusim.app.cli.common import usable_cores

    jobs = args.jobs if "jobs" in getattr(args, "given", ()) else min(args.jobs, usable_cores())  # 2, or 1 core
    config = DemoConfig(out_dir=args.out, jobs=jobs, sweep_budget=args.sweep_budget, quick=args.quick, full=args.full)
    # the streams as they are now: a step's output is captured while it runs, its progress lines are not
    stdout, stderr = sys.stdout, sys.stderr
    result = run_demo(config, progress=lambda line: print(line, file=stderr, flush=True),
                      answer=lambda line: print(line, file=stdout, flush=True))
    from calibration.commands.demo_steps import demo_local_dir, reuse_line

    report = args.out / "report.md"
    print(f"report: {report}")
    if config.full:  # the default run calibrates nothing
        print(reuse_line(demo_local_dir(args.out)))
    if not result.ok:
        failed = ", ".join(step.name for step in result.steps if not step.ok)
        print(f"tpusim demo: steps failed: {failed} (see {report})", file=sys.stderr)
        return 1
    return 0
