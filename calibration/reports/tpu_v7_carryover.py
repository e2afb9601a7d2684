"""What the TPU v5e probes say about TPU v7 (issue 34, item 5): the K3 TPU v7 prediction with
v5e's measured architecture figures as priors, before and after the published-figure fit.

``python -m calibration.reports.tpu_v7_carryover``

The figures a v5e probe measured that belong to the *architecture* (the DMA descriptor path,
the kernel's layer loop), not to the chip (HBM, MXU size and clock, VPU width, VMEM), and
that replace an *assumption* in ``hwmodels/catalog/tpu-v7.yaml``:

- ``execution.per_layer_overhead_s`` (assumed 1 µs): the ``layer_loop`` probe's slope (the
  output's ``per_layer_probe`` gives it with its least-squares standard error: how well the
  probe resolves it);
- ``links.ici.message_issue_s`` and ``links.sibling.message_issue_s`` (assumed 0.1 µs): the
  ``dma_issue`` probe's per-copy issue cost (4 KiB copies, 16 in flight: the descriptor issue
  throughput of the same DMA engine that issues remote copies).

Neither is scaled by clock: the reference set gives no TPU v7 clock, and it says not to
derive one (its MXU counts and clocks do not multiply out), so they are carried in seconds,
as the catalog already carries TPU v4's DMA cost. For each prior set (the catalog's; the
catalog's with these three replaced) this runs the part-by-part calibration on the published
TPU7x measurements (:func:`calibration.sources.tpu_calibration.calibrate_by_parts`, no
leave-one-group-out refits: the central values only) and predicts K3 on 16 tpu-v7 chips at
batch 1 with the ``published`` schedule before and after the fit. Nothing is tuned to the
published figures: the prior sets are fixed before the fit runs. The catalog is not changed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from calibration.core.fitting import fit_line
from calibration.core.parameters import chip_with
from calibration.sources.loaders import load_measurements, usable_for
from calibration.sources.measurements import Measurement
from calibration.sources.predict import Predictor
from calibration.sources.tpu_calibration import calibrate_by_parts
from calibration.sources.tpu_components import load_components
from calibration.sources.tpu_probes import PER_LAYER, issue_throughput_s, load_probes, probe_figures
from hwmodels.catalog import load_chip
from hwmodels.schema import Chip

K3 = {"model": "kimi-k3", "system": {"chip": "tpu-v7", "chips": 16}, "batch": 1, "context": 1024,
      "schedule": "published", "backend": "simulated", "ms_per_step_median": 1.0}
ISSUE_PATHS = ("links.ici.message_issue_s", "links.sibling.message_issue_s")


def v5e_priors() -> dict[str, float]:
    """The v5e-measured architecture figures that replace tpu-v7 assumptions (module docstring)."""
    probes = load_probes()
    issue = issue_throughput_s(probes)
    out = {PER_LAYER: probe_figures(probes)[PER_LAYER].value}
    if issue is not None:
        out.update({path: issue for path in ISSUE_PATHS})
    return out


def per_layer_probe() -> dict[str, float]:
    """The ``layer_loop`` probe's least-squares slope over its empty-layer counts (the per-layer
    prior above, before clipping at 0) and the slope's standard error, in seconds."""
    loop = [r for r in load_probes() if r["probe"] == "layer_loop"]
    layers = [r["params"]["layers"] for r in loop]
    seconds = [r["seconds_median"] for r in loop]
    line = fit_line(layers, seconds, standard_error=True)
    return {"slope_s": line.slope, "standard_error_s": line.slope_standard_error, "points": len(loop)}


def k3_ms(chip: Chip, predictor: Predictor) -> float:
    return predictor.predict(chip, Measurement.model_validate(K3)) * 1e3


def run() -> dict[str, Any]:
    published = load_chip("tpu-v7", calibrated=False)
    records = usable_for(load_measurements("published:tpu7x-musespark"), published.name, published.kind)
    components = load_components("tpu7x-components")
    out: dict[str, Any] = {"v5e_priors": v5e_priors(), "per_layer_probe": per_layer_probe(), "rows": {}}
    for name, priors in (("catalog priors", {}), ("v5e-measured architecture priors", out["v5e_priors"])):
        predictor = Predictor()
        chip = chip_with(published, priors) if priors else published
        result = calibrate_by_parts(chip, records, components, holdout="format=int4+bf16", predictor=predictor,
                                    logo=False)
        summary = result.to_json()
        out["rows"][name] = {
            "k3_before_ms": k3_ms(chip, predictor), "k3_after_ms": k3_ms(result.chip, predictor),
            "muse_mape_priors": summary["mape_e2e_published"], "muse_mape_parts_only": summary["mape_e2e_parts_only"],
            "muse_mape_fitted": summary["mape_calibration"], "muse_mape_holdout": summary["mape_holdout"],
            "held": sorted(summary["unidentifiable_held"])}
    return out


def main() -> None:
    data = run()
    sys.stdout.write(json.dumps(data, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
