"""``tpusim run-kernel``: run the Pallas megakernel and append a measurement record.

Usage::

    tpusim run-kernel --model kimi-k3-mini --schedule published --batch 1 --steps 2 \\
        --out measurements.jsonl
    tpusim run-kernel --schedule my-sweep-best.json --backend interpret --steps 1

On a TPU (``--backend auto`` finds it) the steps are timed natively after a warm-up. On a
CPU the kernel runs in Pallas TPU interpret mode, is checked against the pure-JAX
reference, and the record says ``backend: cpu-interpret`` with a note that the time is the
interpreter's, not a TPU's. Records are appended, never rewritten (see
:mod:`megakernel.runner`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hwmodels.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run-kernel",
        help="run the megakernel for N decode steps and record the timing",
        description="Run the Pallas megakernel (TPU natively, or TPU interpret mode on a CPU), check it "
        "against the reference and append a measurement record.",
    )
    parser.add_argument("--model", default="kimi-k3-mini", help="model name (single device; default kimi-k3-mini)")
    parser.add_argument("--schedule", help="built-in schedule name or schedule JSON file (required with one device)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    parser.add_argument("--steps", type=int, default=2, help="timed decode steps (default 2)")
    parser.add_argument("--context", type=int, default=16, help="tokens already cached per sequence (default 16)")
    parser.add_argument("--backend", choices=("auto", "tpu", "interpret"), default="auto",
                        help="auto: a TPU if JAX sees one, else TPU interpret mode on the CPU; tpu: "
                        "fail without a TPU; interpret: the CPU interpreter (a check, not a TPU time)")
    parser.add_argument("--weights", type=Path, help="folder of safetensors weights (default: seeded random)")
    parser.add_argument("--seed", type=int, default=0, help="weights, state and first tokens (default 0)")
    parser.add_argument("--label", default="measured", help="record label (default measured)")
    parser.add_argument("--out", type=Path, default=Path("measurements.jsonl"), help="JSON-lines file to append to")
    parser.add_argument("--devices", type=int, default=1,
                        help="N > 1: run the K3 decode on N virtual devices with the plan's in-kernel collectives "
                        "(interpret mode, race detector on, a fresh process), --steps greedy steps against the "
                        "single-device reference, and report per-device records (default 1: the single-device kernel)")
    parser.add_argument("--layers", type=int, default=0,
                        help="with --devices: run only the first N layers (default 0: all)")
    parser.add_argument("--json", action="store_true", help="with --devices: print the result as JSON")
    parser.set_defaults(func=run, output_lock="file")


def run(args: argparse.Namespace) -> int:

    if args.devices > 1:
        return run_devices(args)
    if not args.schedule:
        raise InputError("--schedule is required with one device")
    from megakernel.runner import RunConfig, resolve_backend
    from megakernel.runner import run as run_kernel
    from tpusim.app.cli.capacity_gate import check_kernel_fits

    if args.batch >= 1 and args.steps >= 1 and args.context >= 1:  # capacity first (the runner checks >= 1)
        try:
            check_kernel_fits(args.model, batch=args.batch, context_tokens=args.context + args.steps,
                              backend=resolve_backend(args.backend))
        except InputError as error:
            raise InputError(f"{error}. To check the full-size kernel without running it, lower it for "
                             f"TPU: tpusim lower --model {args.model} --schedule {args.schedule}") from None

    config = RunConfig(model=args.model, schedule=args.schedule, batch=args.batch, steps=args.steps,
                       context=args.context, backend=args.backend, seed=args.seed, weights=args.weights,
                       label=args.label)
    record = run_kernel(config, args.out)
    print(
        f"{record['model']} {record['schedule']} b{record['batch']} on {record['backend']}: "
        f"{record['ms_per_step_median']:.1f} ms/step (spread {record['ms_per_step_spread']:.1f} ms, "
        f"{record['steps']} steps), max |kernel - reference| = {record['max_abs_error']:.3g}"
    )
    if record["backend"] == "cpu-interpret":
        print(f"note: {record['timing_note']}")
    print(f"appended to {args.out}")
    return 0


def run_devices(args: argparse.Namespace) -> int:
    """The multi-device run: a fresh process (virtual devices need XLA_FLAGS before JAX)."""
    import json
    import subprocess
    import sys


    command = [sys.executable, "-m", "megakernel.decode_check", "--devices", str(args.devices),
               "--model", args.model, "--seed", str(args.seed), "--layers", str(args.layers),
               "--steps", str(args.steps), "--context", str(args.context)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"--devices {args.devices}: {last}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for record in result["records"]:
        print(f"device {record['rank']}: matches_reference={record['matches_reference']} "
              f"logits_relative_error={record['logits_relative_error']:.3g} "
              f"log_matches_plan={record['log_matches_plan']}")
    seconds = ", ".join(f"{step['seconds']:.1f}" for step in result["steps"])
    print(f"{result['model']} on {result['devices']} devices, {result['layers']} layers, {len(result['steps'])} "
          f"greedy steps against {result['reference']}: {seconds} s per step, races={result['races']}\n"
          f"note: {result['timing_note']}")
    return 0
