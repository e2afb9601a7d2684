"""What `tpusim plan` prints: a deployment plan, its collectives and what it puts on a device.

:func:`plan_report` gathers, for a model and a sharding plan (and optionally a chip, for the
capacity check): the model's parameter count and weight formats; the plan's split (attention
TP/DP, expert groups x TP within an expert, per-device widths); every collective with its
phase, the op it follows, its payload per token and its stages; and the per-device resident
weights, KV cache and state at the given batch and context. Every number is *derived* from
the model file and the plan (no simulation).
"""

from __future__ import annotations

from typing import Any

from hwmodels.schema import Chip
from tpusim.workload.capacity import (
    cache_bytes,
    capacity_report,
    check_capacity,
    resident_weight_bytes,
)
from tpusim.workload.modelconfig import FORMAT_KEYS, OPTIONAL_FORMAT_KEYS, ModelConfig
from tpusim.workload.params import parameter_count
from tpusim.workload.sharding import ShardingPlan

SPLIT_FIELDS = (
    "devices", "devices_per_chip", "attention_dp", "attention_heads_per_device", "kv_heads_per_device",
    "expert_groups", "expert_tp", "router_cols_per_device", "latent_down_cols_per_device",
    "latent_up_cols_per_device", "shared_intermediate_per_device", "dense_intermediate_per_device",
    "vocab_rows_per_device",
)


def plan_collectives(plan: ShardingPlan) -> list[dict[str, Any]]:
    """Every collective of one layer (and the head), in phase order, as plain data."""
    specs = plan.attention_collectives + plan.moe_collectives + plan.mlp_collectives + plan.head_collectives
    return [spec.model_dump(mode="json") for spec in specs]


def plan_report(model: ModelConfig, plan: ShardingPlan, chip: Chip | None = None, *, batch: int = 1,
                context_tokens: int = 1024) -> dict[str, Any]:
    """The plan, its collectives and per-device bytes (see the module docstring)."""
    params = parameter_count(model)
    weights, experts = resident_weight_bytes(model, plan)
    kv = cache_bytes(model, plan, batch=batch, context_tokens=context_tokens)
    report: dict[str, Any] = {
        "model": model.name,
        "parameters": {"total": params.total, "main_model": params.main_model,
                       "routed_experts": params.routed_experts, "label": "derived from the model file"},
        "formats": {key: model.format_of(key) for key in (*FORMAT_KEYS, *OPTIONAL_FORMAT_KEYS)},
        "plan": {"name": plan.name, "description": plan.description, "source": plan.source,
                 "attention_tp": plan.attention_tp, **{f: getattr(plan, f) for f in SPLIT_FIELDS}},
        "experts_per_group": plan.experts_per_group(model),
        "expert_slice_width": plan.expert_slice_width(model),
        "collectives": plan_collectives(plan),
        "per_device": {"weight_bytes": weights, "routed_expert_bytes": experts, "kv_and_state_bytes": kv,
                       "batch": batch, "context_tokens": context_tokens, "label": "derived"},
    }
    if chip is not None:
        fit = capacity_report(model, plan, chip, batch=batch, context_tokens=context_tokens)
        report["capacity"] = {"chip": chip.name, "hbm_bytes_per_device": fit.capacity_bytes,
                              "needed_bytes_per_device": fit.total_bytes, "fits": fit.fits}
        if not fit.fits:
            try:
                check_capacity(model, plan, chip, chips=plan.chips, batch=batch, context_tokens=context_tokens)
            except ValueError as error:
                report["capacity"]["reason"] = str(error)
    return report
