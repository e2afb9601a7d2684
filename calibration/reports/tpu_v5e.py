"""Predicted vs measured on the TPU v5e K3-shard kernel records, three ways (issue 34).

``python -m calibration.reports.tpu_v5e [--out docs/tpu-v5e-measured.md] [--json PATH]``

- **(a) catalog priors**: ``tpu-v5e`` as published (assumed figures included, the VPU
  dequantisation at its assumed rates); also shown: the engine without the dequantisation
  (what ``tpusim simulate`` predicted before it, "a0");
- **(b) probes only**: the catalog with the probe figures in place
  (:func:`calibration.sources.tpu_probes.probe_chip`); no kernel step time is read;
- **(c) fitted on kernel step times** through the one calibration core: the sustained HBM
  rate and the FP8 dequant rate (:mod:`calibration.core.parameters`), starting from the
  probe chip, in log space, each point predicted by a refit that never saw it
  (:func:`calibration.core.holdout.leave_one_group_out`): the schedules split in two halves
  (fit on one, predict the other, then swap), and the batches split in two (batch 1 vs 2
  and 8). The 90 % interval of a held-out point is the core's conformal model error
  (:func:`calibration.core.model_error.conformal_quantile`) over the *other* fold's residuals
  of the same split; ways (a) and (b) fit nothing, so they have no measured model error and
  no interval.

Ranking: the batch-1 schedules ordered by prediction vs by measurement (Kendall τ,
``scipy.stats.kendalltau``) and the regret of the simulator's pick
(measured ms of the predicted best / measured best - 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from calibration.core.holdout import Fold, leave_one_group_out
from calibration.core.model_error import conformal_quantile
from calibration.core.parameters import parameters
from calibration.core.problem import Problem
from calibration.core.solver import SolverOptions
from calibration.sources.tpu_chip_records import ChipRecord, ChipRecordPredictor, load_chip_records
from calibration.sources.tpu_probes import dequant_path, probe_chip
from hwmodels.catalog import load_chip
from hwmodels.schema import Chip

CHIP = "tpu-v5e"
FITTED = ("hbm.sustained_bandwidth_bytes_per_s", dequant_path("fp8_e4m3_b256"))
OPTIONS = SolverOptions(max_nfev=6, diff_step=1e-2, uncertainty="none", drop_at_bound=False)
SCHEDULE_HALF_A = ("k3-ring", "naive", "published-after-routing", "published-slots2")
HELDOUT_PATH = Path(__file__).resolve().parents[1] / "data" / "tpu-v5e-heldout.json"
COMMAND = ("JAX_PLATFORMS=cpu .venv/bin/python -m calibration.reports.tpu_v5e --out docs/tpu-v5e-measured.md "
           "--heldout calibration/data/tpu-v5e-heldout.json")


def without_dequant(chip: Chip) -> Chip:
    """``chip`` with no VPU dequantisation figure (the engine before issue 34)."""
    compute = [unit.model_copy(update={"dequant_s_per_element": {}}) for unit in chip.compute]
    return chip.model_copy(update={"compute": compute})


def groups(records: Sequence[ChipRecord]) -> dict[str, tuple[str, ...]]:
    """The two splits of way (c): schedule halves A/B, batch 1 vs 2+8."""
    return {"schedule": tuple("A" if r.schedule in SCHEDULE_HALF_A else "B" for r in records),
            "batch": tuple("1" if r.batch == 1 else "2+8" for r in records)}


def problem(records: Sequence[ChipRecord], predictor: ChipRecordPredictor, catalog: Chip, probes: Chip) -> Problem:
    def predict(chip: Chip, indices: Sequence[int]) -> np.ndarray:
        return np.array([predictor.predict_ms(chip, i) for i in indices], dtype=float)

    return Problem(name="tpu-v5e K3-shard kernel step times", base=probes, published=catalog,
                   parameters=parameters(*FITTED), predict=predict,
                   measured=np.array([r.ms_median for r in records], dtype=float),
                   groups=groups(records), start=probes, transform="log")


def interval_q(folds: Sequence[Fold], fold: Fold) -> float:
    """The conformal 90 % half-width for ``fold``: the other folds of its split."""
    others = [f for f in folds if f.dimension == fold.dimension and f is not fold]
    return conformal_quantile(np.concatenate([f.residuals for f in others]))[0] if others else float("nan")


def ranking(records: Sequence[ChipRecord], predicted: dict[int, float]) -> dict[str, Any]:
    """Kendall τ and regret over the batch-1 schedules."""
    at = [i for i, r in enumerate(records) if r.batch == 1 and i in predicted]
    measured = [records[i].ms_median for i in at]
    guess = [predicted[i] for i in at]
    tau = float(kendalltau(guess, measured).statistic)
    pick = at[int(np.argmin(guess))]
    best = min(measured)
    return {"tau": tau, "pick": records[pick].schedule, "best": records[at[int(np.argmin(measured))]].schedule,
            "regret": records[pick].ms_median / best - 1.0}


def run() -> dict[str, Any]:
    started = time.perf_counter()
    records = load_chip_records()
    predictor = ChipRecordPredictor(records)
    catalog = load_chip(CHIP, calibrated=False)
    probes = probe_chip(catalog)
    ways: dict[str, dict[int, float]] = {}
    for name, chip in (("a0", without_dequant(catalog)), ("a", catalog), ("b", probes)):
        ways[name] = {i: predictor.predict_ms(chip, i) for i in range(len(records))}
    prob = problem(records, predictor, catalog, probes)
    folds = leave_one_group_out(prob, OPTIONS, folds=[("schedule", "A"), ("schedule", "B"),
                                                      ("batch", "1"), ("batch", "2+8")])
    fold_rows = []
    for fold in folds:
        q = interval_q(folds, fold)
        for i, point in enumerate(fold.points):
            fold_rows.append({"split": fold.dimension, "fold": fold.value, "index": point,
                              "predicted_ms": fold.predicted[i], "measured_ms": fold.measured[i], "q": q,
                              "values": fold.values})
        ways[f"c:{fold.dimension}"] = {**ways.get(f"c:{fold.dimension}", {}),
                                       **dict(zip(fold.points, fold.predicted, strict=True))}
    return {"records": [r.__dict__ for r in records], "ways": {k: {str(i): v for i, v in w.items()} for k, w in ways.items()},
            "folds": fold_rows, "rankings": {k: ranking(records, w) for k, w in ways.items()},
            "mape": {k: float(np.mean([abs(records[i].ms_median - v) / records[i].ms_median for i, v in w.items()]))
                     for k, w in ways.items()},
            "engine_runs": predictor.runs, "seconds": time.perf_counter() - started,
            "probe_figures": {p: f.value for p, f in _probe_figures().items()}}


def _probe_figures() -> dict[str, Any]:
    from calibration.sources.tpu_probes import load_probes, probe_figures
    return probe_figures(load_probes())


WAY_TITLES = {"a0": "(a0) catalog, engine without the VPU dequantisation (before issue 34)",
              "a": "(a) catalog priors only", "b": "(b) probes only (no kernel timing)",
              "c:schedule": "(c) fitted on kernel step times, held out by schedule half",
              "c:batch": "(c) fitted on kernel step times, held out by batch (1 vs 2+8)"}


NOTES = [
    "- **The mechanism.** v5e's MXU takes bf16/int8, not FP8 or FP4: every routed expert's FP8 gate/up "
    "and MXFP4 down slices are converted to bf16 on the VPU after they land in VMEM. The chip schema "
    "carries it as `compute.<vector unit>.dequant_s_per_element.<format>` (absent on every other chip: "
    "their results do not move); the engine (`tpusim/engine/build.py`, `Builder.dequant_s` in "
    "`lowering.py`) puts a VPU piece between a tensor's copies landing and its matmul, so the stream "
    "converts one expert while the next expert's slot is being filled. `tpusim simulate` shows it as "
    "VPU busy time (0.1 % before, most of the step now).",
    "- **Using (b).** `python -m calibration.sources.tpu_probes --save` writes the probe figures as the "
    "tpu-v5e overlay (`hwmodels.overlay`); `tpusim simulate --hardware tpu-v5e ...` then predicts way (b) "
    "(no interval: the overlay holds no fit, so no samples and no model error).",
    "- **(a) vs (a0).** The catalog's dequant rates are assumed (≈ 4 and 6 VPU ops per element at the "
    "assumed VPU rate); they are 2.6-3.7x faster than the probes measure, so (a) moves only part of the way.",
    "- **Sustained rate.** The probes' rule (`probes_dma`: whole-call time, subtract `empty_call`) gives "
    "≈ 0.75 TB/s for copies >= 4 MiB; the whole-call plateau without the subtraction is 414-426 GB/s. "
    "Way (b) takes the rule as written.",
    "- **Ranking.** published, published-after-routing and published-slots2 measure within 0.03 ms of "
    "each other at batch 1 (spreads 0.05-0.09 ms): a regret of a few hundredths of a percent is noise. "
    "In (a) and (b) published and published-after-routing predict the same time (the engine issues the "
    "experts at the same point for both at batch 1).",
    "- **Intervals (c).** A held-out point's 90 % half-width is the conformal quantile of the other "
    "fold's residuals in the same split (4-7 residuals: the rank exceeds n, so the largest is used, "
    "as `calibration.core.model_error` does when it is not exact).",
    "- **What the fits say.** The two schedule halves fit very different sustained rates (see the last "
    "table): the step times of one half do not pin the rate once the dequant rate is free. (b) "
    "under-predicts layer-double-buffer, naive and no-lookahead at batch 1 by 12-14 %, the schedules "
    "that expose the most copy time: something on the copy path (per-copy cost at the kernel's "
    "copy sizes, the probes' `dma_issue` figure, which the engine has no figure for) is missing.",
]


def markdown(result: dict[str, Any]) -> str:
    records = result["records"]
    lines = ["# TPU v5e: predicted vs measured on the K3-shard kernel records (issue 34)", "",
             "Generated by:", "", "```bash", COMMAND, "```", "",
             f"({result['engine_runs']} engine runs, {result['seconds']:.0f} s on the shared 2-core CPU host.) "
             "Records: `calibration/data/tpu-v5e-kernel.jsonl`, rows `shard_of: k3-tp32` (one device's "
             "program of K3's TP32 plan, real widths, 93 layers, context 1024, the kernel router's own "
             "routing replayed), repeated runs merged by median. Measured ms is the kernel's median step "
             "(host launch included). Error = (predicted - measured) / measured.", "",
             "## Probe figures (way b)", "", "| figure | measured on tpu-v5e |", "| --- | ---: |"]
    for path, value in result["probe_figures"].items():
        lines.append(f"| `{path}` | {value:.4g} |")
    lines += ["", "## Summary", "", "| way | MAPE | Kendall τ (batch 1) | simulator's pick | regret |",
              "| --- | ---: | ---: | --- | ---: |"]
    for way, title in WAY_TITLES.items():
        rank = result["rankings"][way]
        lines.append(f"| {title} | {100 * result['mape'][way]:.1f} % | {rank['tau']:+.2f} | {rank['pick']} | "
                     f"{100 * rank['regret']:.2f} % |")
    lines.append(f"\nMeasured best at batch 1: {result['rankings']['b']['best']}.")
    lines += ["", "## Reading", "", *NOTES]
    by_index = {(row["split"], row["index"]): row for row in result["folds"]}
    for way, title in WAY_TITLES.items():
        lines += ["", f"## {title}", "", "| schedule | batch | predicted ms | measured ms | error | inside 90 % |",
                  "| --- | ---: | ---: | ---: | ---: | --- |"]
        for key, predicted in sorted(result["ways"][way].items(), key=lambda kv: int(kv[0])):
            record = records[int(key)]
            measured = record["ms_median"]
            inside = "no interval (nothing fitted: no measured model error)"
            if way.startswith("c:"):
                row = by_index[(way[2:], int(key))]
                q = row["q"]
                inside = f"{'yes' if abs(measured - predicted) <= q * predicted else 'no'} (±{100 * q:.1f} %)"
            lines.append(f"| {record['schedule']} | {record['batch']} | {predicted:.2f} | {measured:.2f} | "
                         f"{100 * (predicted - measured) / measured:+.1f} % | {inside} |")
    lines += ["", "## Fitted values per fold (way c)", "", "| split | fold held out | sustained HBM (GB/s) | "
              "FP8 dequant (ps/element) |", "| --- | --- | ---: | ---: |"]
    seen = set()
    for row in result["folds"]:
        if (row["split"], row["fold"]) in seen:
            continue
        seen.add((row["split"], row["fold"]))
        values = row["values"]
        lines.append(f"| {row['split']} | {row['fold']} | {values[FITTED[0]] / 1e9:.1f} | {values[FITTED[1]] * 1e12:.2f} |")
    return "\n".join(lines) + "\n"


def heldout_reference(result: dict[str, Any]) -> dict[str, Any]:
    """What the guard test re-predicts: way (c) by schedule half, each fold's fitted figures,
    its held-out points and the documented held-out MAPE."""
    out: dict[str, Any] = {
        "what": "way (c) of calibration.reports.tpu_v5e held out by schedule half: each fold's fitted figures "
                "(fit on the other half's K3-shard step times) and the held-out MAPE documented in "
                "docs/tpu-v5e-measured.md; read by tests/test_tpu_v5e_records.py",
        "command": COMMAND, "split": "schedule", "documented_mape": result["mape"]["c:schedule"], "folds": {}}
    for row in result["folds"]:
        if row["split"] != "schedule":
            continue
        fold = out["folds"].setdefault(row["fold"], {"values": row["values"], "held": []})
        record = result["records"][row["index"]]
        fold["held"].append({"schedule": record["schedule"], "batch": record["batch"],
                             "predicted_ms": row["predicted_ms"]})
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the markdown tables here")
    parser.add_argument("--json", type=Path, default=None, help="write the full result as JSON here")
    parser.add_argument("--heldout", type=Path, default=None,
                        help="write the guard test's reference (way c by schedule half) here")
    args = parser.parse_args(argv)
    result = run()
    text = markdown(result)
    if args.out:
        args.out.write_text(text)
    if args.heldout:
        args.heldout.write_text(json.dumps(heldout_reference(result), indent=1) + "\n")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=float) + "\n")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
