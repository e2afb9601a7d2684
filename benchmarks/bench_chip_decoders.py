"""The kernel's expert decoders side by side on the chip: ``words32`` against ``bytes``.

Measured on a TPU v5e in one run (the dequant probes of :mod:`calibration.tpu_bench.probes_compute`
time both decoders on the same K3 TP32 expert slice, per-panel loop as the kernel runs it);
each figure is ``(t(R=16) - t(R=4)) / 12``: one slice's dequantization, the call's launch and
copy-in differenced out. To measure again, from a machine with the device tool::

    run(command='TPU_BENCH_PROBE_ARGS="--probe dequant_fp8_gate_up --probe dequant_mxfp4_down" '
                'bash calibration/tpu_bench/run_on_device.sh v5e-n', carry=[".whl-tpu"])
    python -m calibration.tpu_bench.ingest FILES_AT     # -> calibration/data/tpu-v5e-probes.jsonl

This script prints the committed records (no TPU needed), the latest run holding both::

    .venv/bin/python benchmarks/bench_chip_decoders.py [--probes calibration/data/tpu-v5e-probes.jsonl]

Exit 2 when the file is missing, malformed, or holds no run that timed both decoders.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from calibration.sources.tpu_probes import DEQUANT_PROBES, PROBES_PATH, record_decoder

LOW, HIGH = 4, 16  # repeats_in_kernel differenced


def slice_us(records: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[float, str]]:
    """(probe, decoder) -> (µs a slice, date) from the latest run that timed both decoders."""
    points: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in records:
        p = r.get("params", {})
        if r.get("kind") != "probe" or r.get("probe") not in DEQUANT_PROBES or p.get("form") != "per_panel_loop":
            continue
        key = (r["probe"], record_decoder(r), str(r["date"])[:10])
        points.setdefault(key, {})[p["repeats_in_kernel"]] = r["seconds_median"]
    dates = sorted({d for (_, dec, d) in points if dec != "bytes"} & {d for (_, dec, d) in points if dec == "bytes"})
    if not dates:
        return {}
    return {(probe, dec): ((t[HIGH] - t[LOW]) / (HIGH - LOW) * 1e6, d)
            for (probe, dec, d), t in points.items() if d == dates[-1] and LOW in t and HIGH in t}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--probes", type=Path, default=PROBES_PATH)
    args = parser.parse_args(argv)
    try:
        records = [json.loads(line) for line in args.probes.read_text().splitlines() if line.strip()]
        found = slice_us(records)
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        sys.stderr.write(f"error: --probes {args.probes}: {type(error).__name__}: {error}\n")
        return 2
    if not found:
        sys.stderr.write(f"error: --probes {args.probes}: no run timed both decoders\n")
        return 2
    date = next(iter(found.values()))[1]
    print(f"measured on tpu-v5e ({date}), one K3 TP32 expert slice, µs (t(R=16) - t(R=4)) / 12:")
    print("| probe | words32 µs | bytes µs | bytes / words32 |")
    print("| --- | ---: | ---: | ---: |")
    for probe in DEQUANT_PROBES:
        new, old = found.get((probe, "words32")), found.get((probe, "bytes"))
        if new and old:
            print(f"| {probe} | {new[0]:.1f} | {old[0]:.1f} | {old[0] / new[0]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
