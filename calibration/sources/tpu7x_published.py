"""The published TPU7x Muse Spark measurements as :class:`~calibration.sources.measurements.Measurement`\\ s.

The public TPU megakernel release measured one grid-less ``pallas_call`` per decode step of
Muse Spark 1.2 (62 MoE layers) on one host of 4 TPU7x chips = 8 TensorCores, TP8, in three
weight formats at batch 1, 2, 4, 8: twelve step times. A copy of that reference file ships
as package data (``calibration/data/tpu7x-musespark-measurements.json``); this module turns
it into twelve records:

| record field | value | why |
| --- | --- | --- |
| ``model`` | ``muse-spark@<format>`` | the catalog model and its format variant |
| ``system`` | ``tpu-v7`` x 4 chips | ``deployment.chips``; 2 TensorCores per chip = 8 devices |
| ``context`` | 151 + 128 / 2 = 215 | every row a 151-token prompt, 128 timed steps: the mean cache length over the timed steps |
| ``routing`` | ``identical`` | identical prompts: every row routes to the same top-8 experts |
| ``schedule`` | ``muse-published`` | ``tpusim/schedules/muse-published.json``, the kernel's design |
| ``backend`` | ``tpu7x (published)`` | published, not measured here |
| ``ms_per_step_spread`` | ``None`` | not published |

The b1 nvfp4+int8 row also carries the published per-layer breakdown (dense-weight ring
25 µs, collectives 14 µs, experts 9 µs, attention 1.5 µs, routing 0.7 µs of a 55 µs layer)
and the fixed per-step cost (195 µs, of which lm_head 126 µs) as :class:`PhaseTiming`\\ s:
useful sanity checks for a simulated breakdown.

Every assumption the mapping makes about the file is checked where the data enters; a file
that breaks one raises an InputError naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from calibration.sources.measurements import MS_PER_S, US_PER_S, Measurement, PhaseTiming, SystemRef
from hwmodels.catalog import display_path
from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
PUBLISHED_DATASETS = {"tpu7x-musespark": "tpu7x-musespark-measurements.json"}
PUBLISHED_SCHEDULE = "muse-published"
PUBLISHED_BACKEND = "tpu7x (published)"
PROMPT_TOKENS = 151
TIMED_STEPS = 128
CATALOG_MODEL = "muse-spark"
CATALOG_CHIP = "tpu-v7"
FORMATS = ("nvfp4+int8", "nvfp4+bf16", "int4+bf16")


def published_path(name: str = "tpu7x-musespark") -> Path:
    """The package-data file of published dataset ``name``."""
    if name not in PUBLISHED_DATASETS:
        known = ", ".join(sorted(PUBLISHED_DATASETS))
        raise InputError(f"unknown published dataset {name!r}; known: {known}")
    return DATA_DIR / PUBLISHED_DATASETS[name]


def read_published(name: str = "tpu7x-musespark") -> dict[str, Any]:
    """The raw JSON of published dataset ``name`` (for reports quoting its notes)."""
    path = published_path(name)
    data = read_user_json(path, shown=display_path(path))  # package data, same one-line errors
    if not isinstance(data, dict):
        raise InputError(f"{display_path(path)}: expected a JSON object at the top level")
    return data


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise InputError(f"{where}: {message}")


def _breakdown_phases(data: dict[str, Any], source: str) -> list[PhaseTiming]:
    """The b1 nvfp4+int8 breakdown as phases (per layer and per step), in milliseconds."""
    breakdown = data.get("breakdown_b1_nvfp4_int8")
    if not isinstance(breakdown, dict):
        return []
    where = f"{source}: breakdown_b1_nvfp4_int8 (published, µs)"
    phases = [
        PhaseTiming(name="layer_total" if name == "total" else name,
                    ms=float(us) * MS_PER_S / US_PER_S, scope="per_layer", source=where)
        for name, us in breakdown.get("per_layer_us", {}).items()
    ]
    phases += [
        PhaseTiming(name="fixed_total" if name == "total" else name,
                    ms=float(us) * MS_PER_S / US_PER_S, scope="per_step", source=where)
        for name, us in breakdown.get("fixed_per_step_us", {}).items()
    ]
    return phases


def load_published(name: str = "tpu7x-musespark") -> list[Measurement]:
    """The published step times of dataset ``name`` as measurement records (12 for Muse)."""
    data = read_published(name)
    path = display_path(published_path(name))
    model = data.get("model", {})
    deployment = data.get("deployment", {})
    _require(isinstance(model, dict) and model.get("layers") == 62, path,
             "model.layers: expected the 62-layer Muse Spark 1.2")
    _require(deployment.get("chips") == 4 and deployment.get("devices") == 8, path,
             "deployment: expected 4 chips = 8 devices (TP8)")
    notes = " ".join(data.get("measurement_notes", []))
    _require("identical prompts" in notes, path,
             "measurement_notes: expected the identical-prompt note (routing assumption)")
    rows = data.get("measurements")
    _require(isinstance(rows, list) and bool(rows), path, "measurements: expected a non-empty list")
    context = PROMPT_TOKENS + TIMED_STEPS // 2
    source = str(data.get("source", "published"))
    phases = _breakdown_phases(data, path)
    records = []
    for index, row in enumerate(rows):
        where = f"{path}: measurements[{index}]"
        _require(isinstance(row, dict), where, "expected an object")
        fmt, batch, ms = row.get("format"), row.get("batch"), row.get("ms_per_step")
        _require(fmt in FORMATS, where, f"format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
        _require(isinstance(batch, int) and batch >= 1, where, "batch: expected a positive integer")
        _require(isinstance(ms, int | float) and ms > 0, where, "ms_per_step: expected a positive number")
        records.append(Measurement(
            model=f"{CATALOG_MODEL}@{fmt}",
            system=SystemRef(chip=CATALOG_CHIP, chips=4),
            batch=batch,
            context=context,
            routing="identical",
            schedule=PUBLISHED_SCHEDULE,
            backend=PUBLISHED_BACKEND,
            ms_per_step_median=float(ms),
            ms_per_step_spread=None,
            spread_kind="not published",
            steps=TIMED_STEPS,
            phases=phases if (fmt, batch) == ("nvfp4+int8", 1) else [],
            provenance=f"{source}; {where}",
            label="published",
        ))
    return records
