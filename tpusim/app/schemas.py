"""The formats a user writes by hand, as JSON Schema plus a working example.

Each topic of ``tpusim schema TOPIC`` maps to the pydantic model that validates that kind of
file and to an example taken from the project's own data, so the example is always one the
tools accept:

| topic | model | example |
| --- | --- | --- |
| ``measurement`` | :class:`calibration.sources.measurements.Measurement` (one JSON line each) | the published TPU7x Muse Spark points of one format |
| ``model`` | :class:`tpusim.workload.modelconfig.ModelConfig` (YAML) | ``tpusim/models/kimi-k3-mini.yaml`` |
| ``plan`` | :class:`tpusim.workload.sharding.ShardingPlan` (YAML) | ``tpusim/models/plan-muse-tp8.yaml`` |
| ``schedule`` | :class:`tpusim.schedule.schema.Schedule` (JSON) | ``tpusim/schedules/published.json`` |
| ``hardware`` | :class:`hwmodels.schema.Chip` (YAML) | ``hwmodels/catalog/tpu-v7.yaml`` |

The schema comes from ``model_json_schema()``, so field descriptions, defaults and bounds are
the validator's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

EXAMPLE_FORMAT = "nvfp4+int8"  # the measurement example: the published points of this format


@dataclass(frozen=True)
class Topic:
    """One writable format: its validator, the file kind, and how to make its example."""

    description: str
    model: Callable[[], type[BaseModel]]
    example: Callable[[], str]
    file_kind: str


def _measurement_model() -> type[BaseModel]:
    from calibration.sources.measurements import Measurement

    return Measurement


def _measurement_example() -> str:
    """The published TPU7x points of one weight format, each stating its execution mode."""
    from calibration.sources.tpu7x_published import load_published

    records = [record for record in load_published() if record.format == EXAMPLE_FORMAT]
    lines = []
    for record in records:
        system = record.system.model_copy(update={"execution": "megakernel"})
        lines.append(record.model_copy(update={"system": system, "phases": []}).to_json_line())
    return "\n".join(lines)


def _file_text(path: Path) -> Callable[[], str]:
    return lambda: path.read_text(encoding="utf-8").rstrip("\n")


def _topics() -> dict[str, Topic]:
    from hwmodels.catalog import BUILTIN_DIR
    from hwmodels.schema import Chip
    from tpusim.schedule.schema import SCHEDULES_DIR, Schedule
    from tpusim.workload.model_catalog import MODELS_DIR
    from tpusim.workload.modelconfig import ModelConfig
    from tpusim.workload.sharding import ShardingPlan

    return {
        "measurement": Topic("one measured decode step per JSON line (tpusim calibrate / report)",
                             _measurement_model, _measurement_example, "JSON lines (.jsonl)"),
        "model": Topic("a model config (tpusim ... --model FILE.yaml)", lambda: ModelConfig,
                       _file_text(MODELS_DIR / "kimi-k3-mini.yaml"), "YAML"),
        "plan": Topic("a sharding plan (how tensors and experts split over devices)",
                      lambda: ShardingPlan, _file_text(MODELS_DIR / "plan-muse-tp8.yaml"), "YAML"),
        "schedule": Topic("a prefetch schedule (tpusim simulate/run-kernel --schedule FILE)",
                          lambda: Schedule, _file_text(SCHEDULES_DIR / "published.json"), "JSON"),
        "hardware": Topic("a chip: every figure with value, source and label", lambda: Chip,
                          _file_text(BUILTIN_DIR / "tpu-v7.yaml"), "YAML"),
    }


TOPICS = ("measurement", "model", "plan", "schedule", "hardware")


def topic(name: str) -> Topic:
    return _topics()[name]


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of topic ``name``, from its pydantic model."""
    return topic(name).model().model_json_schema()


def schema_text(name: str) -> str:
    return json.dumps(json_schema(name), indent=2, ensure_ascii=False)


def example_text(name: str) -> str:
    """A valid example of topic ``name`` (for ``measurement``: one record per line)."""
    return topic(name).example()
