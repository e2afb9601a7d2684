"""The megakernel against what a user would run instead on the chip: plain JAX/XLA, same bytes.

Measured on a TPU v5e, in one process per case (:mod:`calibration.tpu_bench.device_run`, a
group with ``"xla_baseline": true``): the megakernel's decode step, then
:mod:`megakernel.xla_baseline` on the same weights, state and tokens (one ``jax.jit`` of the
step, layers in a ``fori_loop``, the MoE reading only the distinct chosen experts, so the
HBM bytes per step are the kernel's), each compiled apart, checked against the reference on
the chip, warmed up once and timed over the same number of steps. To measure again, from a
machine with the device tool::

    run(command="TPU_BENCH_PROBES=0 bash calibration/tpu_bench/run_on_device.sh v5e-h", carry=[".whl-tpu"])
    python -m calibration.tpu_bench.ingest FILES_AT     # -> calibration/data/tpu-v5e-xla.jsonl

This script prints the committed records side by side (no TPU needed)::

    .venv/bin/python benchmarks/bench_chip_vs_xla.py [--records calibration/data/tpu-v5e-xla.jsonl]

Exit 2 when the records file is missing or malformed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from calibration.reports.chip_vs_xla import RECORDS, rows, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    try:
        found = rows(args.records)
    except (OSError, json.JSONDecodeError, KeyError) as error:
        sys.stderr.write(f"error: --records {args.records}: {type(error).__name__}: {error}\n")
        return 2
    kinds = sorted({r["backend"] for r in found})
    sys.stdout.write(f"measured on {', '.join(kinds)} (median step, warm-up excluded, compile timed apart)\n\n")
    sys.stdout.write(table(found) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
