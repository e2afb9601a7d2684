"""Benchmark: the kimi-k3-nano decode on 8 or 32 virtual devices in Pallas TPU interpret mode,
on this CPU.

    .venv/bin/python benchmarks/bench_multi_device.py [--devices 8|32] [--layers 4 93] [--steps 2]
        [--no-races] [--collectives-only]

``--devices 32`` runs the nano TP32 plan (plan-k3-nano-tp32.yaml: 4 hosts x 8 devices,
experts split 4 ways in groups of 4 ranks, each head on 4 devices).

Each configuration runs in a fresh process (virtual devices need ``XLA_FLAGS`` before JAX
starts): ``python -m megakernel.commands.decode_check`` (the K3 decode on sharded weights with the
plan's collectives, greedy steps against the single-device reference) or, with
``--collectives-only``, ``python -m megakernel.commands.multi_device_check`` (the collective program
with its exact integer stand-in payload). It prints the wall time of each step (the first
includes the compile) and whether every device matched. These are interpreter timings on a
CPU, NOT TPU timings: every load, store, remote copy and semaphore operation of every device
goes through the interpreter's Python callbacks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--layers", type=int, nargs="+", default=[4])
    parser.add_argument("--steps", type=int, default=2, help="decode steps (calls); the first compiles")
    parser.add_argument("--no-races", action="store_true", help="race detector off")
    parser.add_argument("--collectives-only", action="store_true", help="the stand-in payload, not the decode")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per configuration")
    args = parser.parse_args()
    for layers in args.layers:
        if args.collectives_only:
            command = [sys.executable, "-m", "megakernel.commands.multi_device_check", "--devices", str(args.devices),
                       "--layers", str(layers), "--repeat", str(args.steps)]
        else:
            command = [sys.executable, "-m", "megakernel.commands.decode_check", "--devices", str(args.devices),
                       "--layers", str(layers), "--steps", str(args.steps)] + (["--no-races"] if args.no_races else [])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=True)
        except subprocess.TimeoutExpired:
            print(f"{args.devices} devices, {layers} layers: no result within {args.timeout:.0f} s")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if args.collectives_only:
            print(f"{args.devices} devices, {result['layers']} layers (stand-in payload): seconds per call "
                  f"{result['seconds_per_call']} (first includes compile), exact: {result['matches_expected']}, "
                  f"races: {result['races']}")
            continue
        seconds = [s["seconds"] for s in result["steps"]]
        errors = [f"{s['logits_relative_error']:.2g}" for s in result["steps"]]
        print(f"{args.devices} devices, {result['layers']} layers decode: seconds per step {seconds} (first includes "
              f"compile), logits relative error {errors}, matches reference: {result['matches_reference']}, "
              f"races: {result['races']} (detector {'off' if args.no_races else 'on'})")


if __name__ == "__main__":
    main()
