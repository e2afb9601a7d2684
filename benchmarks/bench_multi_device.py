"""Benchmark: the plan's in-kernel collectives of one kimi-k3-nano decode step on 8 virtual
devices in Pallas TPU interpret mode (race detector on), on this CPU.

    .venv/bin/python benchmarks/bench_multi_device.py [--devices 8] [--layers 2 4 93] [--repeat 2]

Each configuration runs in a fresh process (``python -m megakernel.multi_device_check``,
virtual devices need ``XLA_FLAGS`` before JAX starts) and prints the wall time of each call
(the first includes the compile) and whether every device matched the expected result.
These are interpreter timings on a CPU, NOT TPU timings: every remote copy and semaphore
operation of 8 devices goes through the interpreter's shared-memory callbacks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per configuration")
    args = parser.parse_args()
    for layers in args.layers:
        command = [sys.executable, "-m", "megakernel.multi_device_check", "--devices", str(args.devices),
                   "--layers", str(layers), "--repeat", str(args.repeat)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=True)
        except subprocess.TimeoutExpired:
            print(f"{args.devices} devices, {layers} layers: no result within {args.timeout:.0f} s")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{args.devices} devices, {result['layers']} layers: seconds per call {result['seconds_per_call']} "
              f"(first includes compile), all devices match: {result['matches_expected']}, races: {result['races']}")


if __name__ == "__main__":
    main()
