"""The formats a user writes by hand, as JSON Schema plus a working example.

Each topic of ``tpusim schema TOPIC`` maps to the pydantic model that validates that kind of
file and to an example taken from the project's own data, so the example is always one the
tools accept. ``tpusim``'s own topics are below; a layer above adds its formats through the
``tpusim.schemas`` entry points (:mod:`tpusim.app.plugins`): calibration's ``measurement``
(:mod:`calibration.commands.schemas`: one measured step per JSON line, the published TPU7x
Muse Spark points of one format as its example).

| topic | model | example |
| --- | --- | --- |
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


@dataclass(frozen=True)
class Topic:
    """One writable format: its validator, the file kind, and how to make its example."""

    description: str
    model: Callable[[], type[BaseModel]]
    example: Callable[[], str]
    file_kind: str


def _file_text(path: Path) -> Callable[[], str]:
    return lambda: path.read_text(encoding="utf-8").rstrip("\n")


def _topics() -> dict[str, Topic]:
    from hwmodels.catalog import BUILTIN_DIR
    from hwmodels.schema import Chip
    from tpusim.schedule.schema import SCHEDULES_DIR, Schedule
    from tpusim.workload.model_catalog import MODELS_DIR
    from tpusim.workload.modelconfig import ModelConfig
    from tpusim.workload.sharding import ShardingPlan

    own = {
        "model": Topic("a model config (tpusim ... --model FILE.yaml)", lambda: ModelConfig,
                       _file_text(MODELS_DIR / "kimi-k3-mini.yaml"), "YAML"),
        "plan": Topic("a sharding plan (how tensors and experts split over devices)",
                      lambda: ShardingPlan, _file_text(MODELS_DIR / "plan-muse-tp8.yaml"), "YAML"),
        "schedule": Topic("a prefetch schedule (tpusim simulate/run-kernel --schedule FILE)",
                          lambda: Schedule, _file_text(SCHEDULES_DIR / "published.json"), "JSON"),
        "hardware": Topic("a chip: every figure with value, source and label", lambda: Chip,
                          _file_text(BUILTIN_DIR / "tpu-v7.yaml"), "YAML"),
    }
    added = {name: make() for name, make in _added().items()}
    return {name: {**own, **added}[name] for name in topic_names()}


OWN_TOPICS = ("model", "plan", "schedule", "hardware")
# The order ``tpusim schema`` lists the topics in, by name (those of the layers above come from
# entry points); a topic not named here follows these, by name.
ORDER = ("measurement", *OWN_TOPICS)


def _added() -> dict[str, Callable[[], Topic]]:
    """Topic name -> the function making it, from the ``tpusim.schemas`` entry points (their
    modules are light: a topic's validator and example are imported when asked for)."""
    from tpusim.app.plugins import REINSTALL, SCHEMAS, PluginError, load

    added = load(SCHEMAS)
    taken = sorted(set(added) & set(OWN_TOPICS))
    if taken:
        raise PluginError(f"schema topic {', '.join(taken)} declared twice (tpusim's own and an entry point of "
                          f"group {SCHEMAS}); {REINSTALL}")
    return added


def topic_names() -> tuple[str, ...]:
    """Every topic, in :data:`ORDER`."""
    names = {*OWN_TOPICS, *_added()}
    return tuple(sorted(names, key=lambda name: (ORDER.index(name) if name in ORDER else len(ORDER), name)))


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
