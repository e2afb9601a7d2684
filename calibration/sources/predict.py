"""Predict a measurement with the simulator: ``predict(chip, measurement) -> seconds``.

A :class:`~calibration.sources.measurements.Measurement` names everything the simulator needs:

1. the **model** (:func:`resolve_model`: a catalog name such as ``muse-spark@int4+bf16``,
   optionally with width/layer overrides in brackets, ``kimi-k3-mini[width=512,layers=4]``,
   which the CPU loop uses to sweep model sizes);
2. the **system** (chip name x chips) and so the device count and the sharding plan
   (:func:`tpusim.workload.model_catalog.plan_for_system`: the published ``muse-tp8`` plan for Muse on 8
   devices);
3. the **workload** (batch, context, routing) and so the per-device program
   (:func:`tpusim.workload.program.build_program`);
4. the **schedule** (:func:`resolve_schedule`: ``muse-published`` from this package's data, a
   built-in schedule name, or a schedule JSON path).

:class:`Predictor` caches programs and schedules (they do not depend on the chip's figures,
only on the chip's device count), so a fit that re-simulates the same points under many
candidate chips pays only for the engine: ``Predictor.predict(chip, m)`` builds nothing after
the first call for ``m``. It also keeps every engine result it computed, keyed by the chip's
figures (:func:`figures_key`), the workload and the schedule: a calibration evaluates the same chip on
the same point many times (each identifiability round restarts from the same chip, the
"before" and published predictions repeat the first evaluation, a stage's pins re-predict
its fitted chip), and the engine is deterministic, so a repeat costs a dictionary lookup.
The engine is :func:`tpusim.engine.simulate`.

:func:`simulate_measured` is the one call of the engine on a measured record, whatever the
record's kind: a :class:`~calibration.sources.measurements.Measurement` here, a K3-shard
kernel record (:func:`calibration.sources.tpu_chip_records.simulate_record`, which the
fixed-cost probe and the kernel fit read too). ``tests/test_record_predictor.py`` holds every
other module to it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.sources.measurements import Measurement
from hwmodels.errors import InputError
from hwmodels.schema import Chip
from tpusim.schedule.kernel_layout import LANES
from tpusim.schedule.schema import BUILTIN_SCHEDULES, MODEL_SCHEDULES, Schedule, load_schedule
from tpusim.workload.model_catalog import load_model, plan_for_system
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import Program, build_program
from tpusim.workload.registry.names import FormatKey
from tpusim.workload.routing import parse_routing
from tpusim.workload.sharding import ShardingPlan, round_up

if TYPE_CHECKING:
    from tpusim.engine.result import SimResult

PredictFn = Callable[[Chip, Measurement], float]

_OVERRIDES = re.compile(r"^(?P<base>[^\[\]]+)\[(?P<body>[^\[\]]*)\]$")


# --------------------------------------------------------------------------- models


def _scaled(value: int, factor: float) -> int:
    """``value`` scaled, kept a multiple of the TPU lane width (0 stays 0)."""
    return max(LANES, round_up(math.ceil(value * factor), LANES)) if value else 0


def scale_width(model: ModelConfig, width: int) -> ModelConfig:
    """``model`` with hidden size ``width`` and every other width scaled by the same factor.

    Scaled: ``hidden_size``, the MoE latent, routed-expert, shared and dense intermediate
    sizes (to multiples of 128). Kept: head counts and head dims, expert counts, vocabulary,
    layers. Used by the CPU loop to sweep model sizes of one architecture.
    """
    factor = width / model.hidden_size
    moe = model.moe.model_copy(update={
        "expert_intermediate_size": _scaled(model.moe.expert_intermediate_size, factor),
        "latent_size": _scaled(model.moe.latent_size or 0, factor) or None,
        "shared_intermediate_size": _scaled(model.moe.shared_intermediate_size, factor),
    }) if model.moe else None
    data = model.model_dump()
    data.update(hidden_size=width, dense_intermediate_size=_scaled(model.dense_intermediate_size, factor),
                moe=moe.model_dump() if moe else None)
    return ModelConfig.model_validate(data)


@lru_cache(maxsize=64)
def resolve_model(spec: str) -> ModelConfig:
    """A model from ``name[@variant][[key=value,...]]``.

    Override keys: ``width`` (:func:`scale_width`), ``layers`` (:meth:`ModelConfig.with_layers`),
    ``experts`` (routed experts), ``top_k``, ``vocab``, and ``formats=bf16|f32`` (every
    weight family in that dtype, for the CPU replay). Example:
    ``kimi-k3-mini[width=512,layers=4,formats=bf16]``.
    """
    match = _OVERRIDES.match(spec.strip())
    base, body = (match.group("base"), match.group("body")) if match else (spec, "")
    model = load_model(base.strip())
    overrides: dict[str, int] = {}
    formats: str | None = None
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, _, value = item.partition("=")
        if key == "formats" and value in ("bf16", "f32"):
            formats = value
            continue
        if key not in ("width", "layers", "experts", "top_k", "vocab") or not value.isdigit():
            raise InputError(
                f"model {spec!r}: override {item!r} must be width|layers|experts|top_k|vocab=<int> "
                "or formats=bf16|f32"
            )
        overrides[key] = int(value)
    if "width" in overrides:
        model = scale_width(model, overrides["width"])
    if "layers" in overrides:
        model = model.with_layers(overrides["layers"])
    if {"experts", "top_k"} & overrides.keys():
        if model.moe is None:
            raise InputError(f"model {spec!r}: experts/top_k overrides need an MoE model")
        moe = model.moe.model_copy(update={
            "num_experts": overrides.get("experts", model.moe.num_experts),
            "top_k": overrides.get("top_k", model.moe.top_k),
        })
        data = model.model_dump()
        data["moe"] = moe.model_dump()
        model = ModelConfig.model_validate(data)
    if "vocab" in overrides:
        data = model.model_dump()
        data["vocab_size"] = overrides["vocab"]
        model = ModelConfig.model_validate(data)
    if formats is not None:
        # Every weight family in one CPU-native dtype; norms and biases stay f32.
        data = model.model_dump()
        data["formats"] = {key: ("f32" if key == FormatKey.SMALL_PARAMS else formats) for key in data["formats"]}
        data["format_variants"] = {}
        data["deployment_variants"] = {}  # they name format variants, gone with them
        data["variant"] = None
        model = ModelConfig.model_validate(data)
    return model


# --------------------------------------------------------------------------- schedules


@lru_cache(maxsize=32)
def resolve_schedule(name: str) -> Schedule:
    """A built-in schedule name (``muse-published`` is one) or a JSON path."""
    if name in BUILTIN_SCHEDULES or name in MODEL_SCHEDULES or Path(name).exists():
        return load_schedule(name)
    known = ", ".join([*BUILTIN_SCHEDULES, *MODEL_SCHEDULES])
    raise InputError(f"schedule {name!r}: not a file and not one of {known}")


def default_schedule(chip: Chip) -> str:
    """The schedule a measurement without one is predicted with: the built-in
    ``published`` schedule on a megakernel chip, ``naive`` (each op reads its weights when
    it starts) on a per-op-launch chip."""
    return "published" if chip.execution.mode == "megakernel" else "naive"


# The measurement's execution word -> the engine's execution variant (tpusim.compare.rows).
# graphs: the GPU serving stack (CUDA graphs), the catalog default for a GPU.
EXECUTION_VARIANTS = {"eager": "eager", "graphs": "stack", "megakernel": "megakernel"}


def with_measured_execution(chip: Chip, m: Measurement) -> Chip:
    """``chip`` switched to the execution the record states (unchanged when it states none)."""
    if m.system.execution is None:
        return chip
    from tpusim.compare.rows import with_execution

    return with_execution(chip, EXECUTION_VARIANTS[m.system.execution])


# --------------------------------------------------------------------------- predictor


def _values_only(data: Any) -> Any:
    if isinstance(data, dict):
        if "value" in data and "source" in data:  # a Figure: only its value reaches the engine
            return data["value"]
        return {key: _values_only(item) for key, item in data.items()}
    if isinstance(data, list):
        return [_values_only(item) for item in data]
    return data


def figures_key(chip: Chip) -> str:
    """What the engine reads of ``chip``: its structure and figure values, without sources,
    labels or the calibration record (two chips with equal keys simulate identically)."""
    return json.dumps(_values_only(chip.model_dump(mode="json", exclude={"calibration", "description"})),
                      sort_keys=True)


def simulate_measured(program: Program, schedule: Schedule, chip: Chip,
                      panel_unroll: tuple[int, int] | None = None) -> SimResult:
    """The engine's prediction of a step that was measured: ``program`` under ``schedule`` on
    ``chip`` (``panel_unroll``: the measured kernel build's, :func:`tpusim.engine.simulate`),
    without the static VMEM check (a measured step ran on its hardware whatever the accounting
    says; the result reports the disagreement). Every predictor of a record calls this."""
    from tpusim.engine import simulate  # imported late: the engine is the heavy part

    return simulate(program, schedule, chip, check_capacity=False, panel_unroll=panel_unroll)


@dataclass
class Predictor:
    """Simulates measurements on candidate chips; programs and schedules are cached."""

    seed: int = 0
    _programs: dict[tuple[Any, ...], Program] = field(default_factory=dict, repr=False)
    _plans: dict[tuple[Any, ...], ShardingPlan] = field(default_factory=dict, repr=False)
    _results: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)
    calls: int = 0  # engine runs
    reused: int = 0  # results served from ``_results``

    def plan(self, chip: Chip, m: Measurement) -> ShardingPlan:
        devices = m.system.chips * chip.devices_per_chip
        key = (m.model, devices, chip.devices_per_chip, chip.kind)
        if key not in self._plans:
            self._plans[key] = plan_for_system(resolve_model(m.model), chip, m.system.chips)
        return self._plans[key]

    def program(self, chip: Chip, m: Measurement) -> Program:
        """The per-device program of ``m`` (built once per model/system/workload)."""
        plan = self.plan(chip, m)
        key = (m.model, plan.name, plan.devices, m.batch, m.context, m.routing, self.seed)
        if key not in self._programs:
            self._programs[key] = build_program(
                resolve_model(m.model), plan, batch=m.batch, context_tokens=m.context,
                routing=parse_routing(m.routing), seed=self.seed,
            )
        return self._programs[key]

    def schedule(self, chip: Chip, m: Measurement) -> Schedule:
        return resolve_schedule(m.schedule or default_schedule(chip))

    def simulate(self, chip: Chip, m: Measurement, schedule: Schedule | None = None) -> SimResult:
        """The engine's full result (``step_s``, ``breakdown``, ...) for ``m`` on ``chip``,
        under ``schedule`` (default: the one ``m`` names). Results are kept (module docstring):
        callers must not modify them."""
        if chip.name != m.system.chip:
            raise InputError(f"{m.key()}: measured on {m.system.chip}, predicted on {chip.name}")
        chip = with_measured_execution(chip, m)
        schedule = schedule or self.schedule(chip, m)
        key = (figures_key(chip), schedule.model_dump_json(), m.model, m.system.chips, m.batch,
               m.context, m.routing, self.seed)
        result = self._results.get(key)
        if result is None:
            self.calls += 1
            result = self._results[key] = simulate_measured(self.program(chip, m), schedule, chip)
        else:
            self.reused += 1
        return result

    def predict(self, chip: Chip, m: Measurement) -> float:
        """Simulated step time of ``m`` on ``chip``, seconds."""
        return float(self.simulate(chip, m).step_s)

    __call__ = predict


_DEFAULT = Predictor()


def predict(chip: Chip, point: Measurement) -> float:
    """Simulated step time of ``point`` on ``chip`` in seconds (shared program cache)."""
    return _DEFAULT.predict(chip, point)
