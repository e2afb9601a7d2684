"""Predict the unrolled kernel's runs from the measured variants, before they run.

The simulator does not yet price the panel loops' unroll (:data:`tpusim.schedule.kernel_layout.PANEL_UNROLL`):
its prediction of an unrolled kernel is the plain one's (:mod:`calibration.reports.tpu_v5e_plan`
records it anyway). This module writes the second prediction a run is judged by, **derived**
from committed measurements of the kernel and its variants (``tpu-v5e-kernel-variants.jsonl``),
never from the runs it predicts:

- published at a batch a variant with the expert loop at the new unroll ran: that variant's
  time plus the dense unroll's step from it (measured at batch 1: the dense variants' difference),
  assumed the same at every batch (the dense products do not grow with the batch's rows);
- published at another batch: the ``fp8-pairs`` kernel's time there, scaled by the predicted /
  ``fp8-pairs`` ratio at the nearest batch predicted above;
- any other schedule: its ``fp8-pairs`` time at that batch scaled by published's ratio.

``python -m calibration.reports.tpu_v5e_derived --set NAME [--write]`` (rows appended to
``tpu-v5e-predictions.jsonl`` with the label ``derived (...)``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from calibration.reports.tpu_v5e_plan import PREDICTIONS_PATH, emit_predictions
from megakernel.quant_pairs import FP8_PAIRS_DECODER, KERNEL_DECODER
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL

DATA = Path(__file__).resolve().parents[1] / "data"
LABEL = ("derived (committed measurements: the kernel's variants' times and differences, assumed "
         "additive; other batches and schedules scaled by fp8-pairs ratios; not the simulator)")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _name(schedule: str) -> str:
    """A schedule's name as records carry it (a file's own ``name``, else its stem)."""
    if not schedule.endswith(".json"):
        return schedule
    path = Path(schedule)
    if not path.is_absolute():
        path = Path(__file__).resolve().parents[2] / path
    return json.loads(path.read_text()).get("name", path.stem) if path.exists() else path.stem


def published_ms(batch: int, variants: list[dict[str, Any]], dense: int, expert: int) -> float | None:
    """Published at ``batch`` with panel loops at (``dense``, ``expert``) panels an iteration,
    from the variants: the one at ``expert`` plus the dense step measured at batch 1."""
    def ms(b: int, knobs: dict[str, int]) -> float | None:
        hits = [r["ms_per_step_median"] for r in variants if r["batch"] == b and r["schedule"] == "published"
                and r["kernel_variant"] == knobs]
        return hits[-1] if hits else None

    dense_at = {u: ms(1, {"panel_unroll": u}) for u in (2, dense)}
    base = ms(batch, {"panel_unroll": 2, "expert_panel_unroll": expert})
    if base is None or None in dense_at.values():
        return None
    return base + (dense_at[dense] - dense_at[2])


def predict(set_name: str, data: Path = DATA) -> list[dict[str, Any]]:
    from calibration.tpu_bench.device_run import load_cases

    variants = _rows(data / "tpu-v5e-kernel-variants.jsonl")
    pairs = {(r["schedule"], r["batch"]): r["ms_per_step_median"] for r in _rows(data / "tpu-v5e-kernel.jsonl")
             if r.get("decoder") == FP8_PAIRS_DECODER and r.get("shard_of") == "k3-tp32" and r.get("expert_cap") is None}
    direct = {b: published_ms(b, variants, PANEL_UNROLL, EXPERT_PANEL_UNROLL) for b in (1, 2, 4, 8, 16)}
    direct = {b: v for b, v in direct.items() if v is not None}
    now, rows = dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), []
    for case in load_cases(set_name):
        if case.shard_of != "k3-tp32" or case.expert_cap is not None or case.panel_unroll or case.expert_panel_unroll:
            continue
        b, name = case.batch, _name(case.schedule)
        nearest = min(direct, key=lambda d: abs(d - b)) if direct else None
        if nearest is None or ("published", nearest) not in pairs:
            continue
        ratio = direct[nearest] / pairs[("published", nearest)]
        if name == "published" and b in direct:
            ms = direct[b]
        elif (name, b) in pairs:
            ms = pairs[(name, b)] * ratio
        else:
            sys.stderr.write(f"{case.schedule} b{b}: no fp8-pairs run to scale; not predicted\n")
            continue
        rows.append({"kind": "prediction", "set": set_name, "decoder": KERNEL_DECODER, "model": case.model,
                     "shard_of": case.shard_of, "schedule": case.schedule, "batch": b, "context": case.context,
                     "predicted_ms": ms, "label": LABEL, "date": now,
                     "panel_unroll": [PANEL_UNROLL, EXPERT_PANEL_UNROLL]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.reports.tpu_v5e_derived", allow_abbrev=False)
    parser.add_argument("--set", required=True, help="a set of calibration/tpu_bench/sets.json")
    parser.add_argument("--write", action="store_true", help=f"append the rows to {PREDICTIONS_PATH.name}")
    args = parser.parse_args(argv)
    emit_predictions(predict(args.set), args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
