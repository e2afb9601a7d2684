"""The committed TPU v5e calibration re-simulated on the committed kernel records (no fit, no TPU).

``tpusim calibrate --hardware tpu-v5e`` refits the chip per fold (minutes); the demo and the
guard test cannot afford that. They read ``calibration/data/tpu-v5e-heldout.json`` (written
by ``python -m calibration.reports.tpu_v5e --heldout``: each fold's fitted figures, which
records it held out, the documented held-out MAPE) and re-simulate now:

- way (b): every record on the probe chip (:func:`calibration.sources.tpu_fixed_cost.kernel_probe_chip`);
- way (c): every record the reference held out, on its fold's fitted figures (laid over the
  probe chip), so each prediction still comes from a fit that never saw the record; a
  record added to the file after the reference was written is predicted with the figures
  fitted on every record of the reference (it was in no fit either) and marked ``new``.

Each held-out row's 90 % interval is ``predicted · (1 ± q)``, ``q`` the split-conformal
quantile of the re-simulated residuals of the *other* fold of its split
(:func:`calibration.core.model_error.conformal_quantile`; the refit's parameter spread is not
added: each residual already comes from a refit on other records, see
:mod:`calibration.sources.tpu_kernel_fit`). A new row's interval uses every residual of its
split. Nothing is tuned here; if the engine or the probe records change, these numbers move
and the guard test (``tests/test_tpu_v5e_records.py``) compares them with the documented ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from calibration.core.model_error import conformal_quantile
from calibration.core.parameters import chip_with
from calibration.sources.tpu_chip_records import KERNEL_PATH, ChipRecordPredictor, load_chip_records
from calibration.sources.tpu_fixed_cost import kernel_probe_chip
from calibration.sources.tpu_kernel_fit import CHIP, LABEL, ranking
from calibration.sources.tpu_probes import PROBES_PATH
from hwmodels.catalog import load_chip
from hwmodels.errors import InputError

HELDOUT_PATH = Path(__file__).resolve().parents[1] / "data" / "tpu-v5e-heldout.json"


def replay(split: str = "schedule", records_path: Path | str = KERNEL_PATH, reference_path: Path | str = HELDOUT_PATH,
           probes_path: Path | str = PROBES_PATH, *, with_probes: bool = True) -> dict[str, Any]:
    """Ways (b) and (c, held out by ``split``) re-simulated (module docstring); JSON-able.
    ``with_probes=False`` skips way (b) (its rows say None): half the engine runs."""
    reference = json.loads(Path(reference_path).read_text())
    if split not in reference.get("splits", {}):
        raise InputError(f"{reference_path}: no held-out split {split!r} (regenerate it: {reference.get('command')})")
    entry = reference["splits"][split]
    records = load_chip_records(records_path)
    index = {(r.schedule, r.batch): i for i, r in enumerate(records)}
    predictor = ChipRecordPredictor(records)
    probes = kernel_probe_chip(load_chip(CHIP, calibrated=False), probes_path)
    rows: dict[int, dict[str, Any]] = {}
    for fold, data in entry["folds"].items():
        chip = chip_with(probes, data["values"])
        for point in data["held"]:
            i = index.get((point["schedule"], point["batch"]))
            if i is None:
                raise InputError(f"{records_path}: the reference's record {point['schedule']} b{point['batch']} "
                                 "is gone (regenerate the reference)")
            rows[i] = {"fold": fold, "heldout_ms": predictor.predict_ms(chip, i), "new": False,
                       "reference_ms": point["predicted_ms"]}
    full = chip_with(probes, reference["values_all"])
    for i in range(len(records)):
        if i not in rows:
            rows[i] = {"fold": "new", "heldout_ms": predictor.predict_ms(full, i), "new": True, "reference_ms": None}
    residuals = {i: (records[i].ms_median - row["heldout_ms"]) / row["heldout_ms"] for i, row in rows.items()}
    out_rows = []
    for i, record in enumerate(records):
        row = rows[i]
        others = [residuals[j] for j, other in rows.items() if other["fold"] != row["fold"] and not other["new"]]
        q = conformal_quantile(others)[0]
        out_rows.append({"schedule": record.schedule, "batch": record.batch, "measured_ms": record.ms_median,
                         "probes_ms": predictor.predict_ms(probes, i) if with_probes else None, **row, "half_width": q,
                         "inside": abs(record.ms_median - row["heldout_ms"]) <= q * row["heldout_ms"]})
    held = [r for r in out_rows if not r["new"]]

    def mape(key: str, rows_: list[dict[str, Any]]) -> float | None:
        if not rows_ or any(r[key] is None for r in rows_):
            return None
        return float(np.mean([abs(r[key] - r["measured_ms"]) / r["measured_ms"] for r in rows_]))

    batches = sorted({r.batch for r in records})
    return {
        "label": f"way (c): simulated, {LABEL} (each row by a fold that never saw it); way (b): simulated with "
                 "figures measured on tpu-v5e by probes; measured: the kernel on one TPU v5e",
        "split": split, "command": reference.get("command"), "fitted": reference.get("fitted"),
        "rows": out_rows, "documented_mape": entry["documented_mape"],
        "mape": {"b": mape("probes_ms", out_rows), "c": mape("heldout_ms", held), "c_new": mape(
            "heldout_ms", [r for r in out_rows if r["new"]])},
        "coverage": {"inside": sum(r["inside"] for r in held), "points": len(held),
                     "mean_width_rel": float(np.mean([2 * r["half_width"] for r in held])) if held else None},
        "rankings": {way: [found for b in batches if (found := ranking(
            records, {i: r[key] for i, r in enumerate(out_rows) if r[key] is not None}, b)) is not None]
                     for way, key in (("b", "probes_ms"), ("c", "heldout_ms"))},
    }


def scatter(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Predicted (x) against measured (y): held-out predictions with their 90 % intervals as
    horizontal bars, probe-only predictions hollow, the diagonal dashed (log axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.2, 5.4))
    xs = [r["heldout_ms"] for r in rows]
    ys = [r["measured_ms"] for r in rows]
    ax.errorbar(xs, ys, xerr=[r["half_width"] * r["heldout_ms"] for r in rows], fmt="o", capsize=3,
                label=f"(c) {LABEL}, held out, 90 % interval")
    xb = [r["probes_ms"] for r in rows]
    ax.plot(xb, ys, "s", mfc="none", label="(b) probes only (simulated)")
    low, high = min(xs + ys + xb) * 0.9, max(xs + ys + xb) * 1.1
    ax.plot([low, high], [low, high], "k--", lw=1, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted ms per step (simulated)")
    ax.set_ylabel("measured ms per step (measured on tpu-v5e)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
