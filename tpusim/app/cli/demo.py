"""`tpusim demo`: the main job on built-in defaults (see :mod:`tpusim.app.demo`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "demo", help="the whole loop on defaults: sweep, kernel, calibrate, compare, report.md")
    parser.add_argument("--out", type=Path, default=Path("report"), help="report folder (default ./report)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes for sweeps")
    parser.add_argument("--sweep-budget", type=int, default=32, help="full simulations per sweep")
    parser.add_argument("--quick", action="store_true", help="small budgets (smoke test)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tpusim.app.demo import run_demo
    from tpusim.app.demo_run import DemoConfig

    config = DemoConfig(out_dir=args.out, jobs=args.jobs, sweep_budget=args.sweep_budget, quick=args.quick)
    result = run_demo(config, progress=lambda line: print(line, file=sys.stderr, flush=True))
    report = args.out / "report.md"
    print(f"report: {report}")
    if not result.ok:
        failed = ", ".join(step.name for step in result.steps if not step.ok)
        print(f"tpusim demo: steps failed: {failed} (see {report})", file=sys.stderr)
        return 1
    return 0
