"""The megakernel against plain JAX/XLA on the chip, same bytes: the committed records side by side.

Rows come from ``calibration/data/tpu-v5e-xla.jsonl`` (:mod:`megakernel.xla_run` records, each
timed in the same process right after the megakernel run it ``stands_next_to``). Read by
``benchmarks/bench_chip_vs_xla.py`` and the demo's "Measured on a real TPU" section.
"""

from __future__ import annotations

import json
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "data" / "tpu-v5e-xla.jsonl"


def rows(path: Path) -> list[dict]:
    """One row per XLA record: the kernel's ms from the same run next to XLA's."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        kernel = record["stands_next_to"]
        bytes_per_step = record["hbm_bytes_per_step"]
        out.append({
            "model": record["model"] + (f" ({record['shard_of']} shard)" if record.get("shard_of") else ""),
            "batch": record["batch"], "schedule": kernel["schedule"],
            "kernel_ms": kernel["ms_per_step_median"], "xla_ms": record["ms_per_step_median"],
            "xla_spread_ms": record["ms_per_step_spread"], "gb": bytes_per_step / 1e9,
            "xla_compile_s": record["compile_s"], "xla_rel_error": record.get("relative_error"),
            "backend": record["backend"], "line": number,
            # the run's time: the kernel beside it changed over the sessions (its decoders, its panel loops)
            "when": str(record.get("provenance", "")).partition("date=")[2][:16].replace("T", " ")})
    return sorted(out, key=lambda r: (r["model"], r["batch"], r["when"]))


def table(found: list[dict]) -> str:
    lines = ["| program | batch | megakernel ms (schedule; run, UTC) | plain JAX/XLA ms | XLA / kernel | HBM GB/step | "
             "kernel GB/s | XLA GB/s | XLA compile s | XLA vs reference |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in found:
        error = "—" if r["xla_rel_error"] is None else f"{100 * r['xla_rel_error']:.2f} %"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['kernel_ms']:.2f} ({r['schedule']}; {r['when'] or '—'}) | "
            f"{r['xla_ms']:.2f} ± "
            f"{r['xla_spread_ms']:.2f} | {r['xla_ms'] / r['kernel_ms']:.2f}x | {r['gb']:.2f} | "
            f"{r['gb'] / r['kernel_ms'] * 1e3:.0f} | {r['gb'] / r['xla_ms'] * 1e3:.0f} | {r['xla_compile_s']:.1f} | "
            f"{error} |")
    return "\n".join(lines)
