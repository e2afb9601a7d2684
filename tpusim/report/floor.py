"""The `tpusim floor` report: per-device bytes and floors for a model on a system.

Routed-expert bytes differ between devices (each expert group loads the experts its rows
picked). The report gives the **expected device** (routed experts at their closed-form
expectation where the routing model has one, else the mean over every group's sampled
program) and the **critical device** (per layer the group loading the most experts: the one
every collective waits for).
"""

from __future__ import annotations

from typing import Any

from hwmodels.schema import System
from tpusim.workload.floors import Floors, floors, hbm_floor_s, tokens_per_s
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import build_program
from tpusim.workload.registry.names import Family, StateFamily
from tpusim.workload.routing import RoutingModel, expected_distinct
from tpusim.workload.shapes import expert_slice_bytes
from tpusim.workload.sharding import ShardingPlan

MS_PER_S = 1000.0


def floor_report(model: ModelConfig, plan: ShardingPlan, system: System, *, batch: int,
                 context_tokens: int, routing: RoutingModel, seed: int = 0) -> dict[str, Any]:
    """Everything `tpusim floor --json` prints (the keys: docs/cli-reference.md)."""
    chip = system.chip
    groups = plan.expert_groups
    group_programs = [build_program(model, plan, batch=batch, context_tokens=context_tokens,
                                    routing=routing, seed=seed, device_view=g) for g in range(groups)]
    group_floors = [floors(p, chip) for p in group_programs]
    critical = build_program(model, plan, batch=batch, context_tokens=context_tokens,
                             routing=routing, seed=seed, device_view="critical")
    critical_floors = floors(critical, chip)

    slice_bytes = expert_slice_bytes(model, plan)
    moe_layers = len(model.moe_layers)
    group_size = plan.experts_per_group(model)
    moe = model.moe
    closed = (expected_distinct(routing, moe.num_experts, moe.top_k, batch, group_size,
                                grouped=moe.routing_groups_per_token < moe.routing_groups) if moe else 0.0)
    sampled_mean = sum(sum(p.routed_experts_per_layer) for p in group_programs) / (groups * max(1, moe_layers))
    experts_per_layer = closed if closed is not None else sampled_mean

    by_family: dict[str, float] = {}
    for fl in group_floors:
        for family, size in fl.bytes_by_family.items():
            by_family[family] = by_family.get(family, 0.0) + size / groups
    by_family[Family.ROUTED_EXPERT] = experts_per_layer * slice_bytes * moe_layers
    by_kind: dict[str, float] = {}
    for fl in group_floors:
        for kind, size in fl.bytes_by_op_kind.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + size / groups
    by_kind[Family.ROUTED_EXPERT] = by_family[Family.ROUTED_EXPERT]
    bytes_per_device = sum(by_family.values())
    weight_bytes = sum(size for family, size in by_family.items() if family not in ("kv_cache", StateFamily.KDA_STATE))

    # The expected device: its bytes, the mean compute over the groups, and the collectives
    # of the critical device (every collective waits for it).
    expected = Floors(hbm_bytes=round(bytes_per_device), hbm_floor_s=hbm_floor_s(bytes_per_device, chip),
                      compute_floor_s=sum(fl.compute_floor_s for fl in group_floors) / groups,
                      collective_floor_s=critical_floors.collective_floor_s)
    per_layer = {}
    first = group_programs[0]
    for layer in first.layers:
        per_layer[layer.layer] = sum(op.weight_bytes for op in layer.ops)
    return {
        "model": model.name,
        "system": f"{chip.name} x {system.chips} chips ({system.devices} devices)",
        "plan": plan.name,
        "batch": batch,
        "context_tokens": context_tokens,
        "routing": routing.label,
        "seed": seed,
        "bytes_per_device": bytes_per_device,
        "weight_bytes_per_device": weight_bytes,
        "bytes_per_device_critical": critical.hbm_bytes,
        "routed_experts_per_device_per_layer": experts_per_layer,
        "routed_experts_closed_form": closed is not None,
        "routed_experts_critical_per_layer": sum(critical.routed_experts_per_layer) / max(1, moe_layers),
        "hbm_floor_ms": expected.hbm_floor_s * MS_PER_S,
        "compute_floor_ms": expected.compute_floor_s * MS_PER_S,
        "collective_floor_ms": expected.collective_floor_s * MS_PER_S,
        "floor_ms": expected.floor_s * MS_PER_S,
        "floor_ms_critical_device": critical_floors.floor_s * MS_PER_S,
        "bound_by": expected.bound_by,
        "tokens_per_s_at_floor": tokens_per_s(batch, expected.floor_s),
        "hbm_peak_bytes_per_s": chip.hbm.peak_bandwidth_bytes_per_s.value,
        "breakdown": {
            "bytes_by_family": by_family,
            "bytes_by_op_kind": by_kind,
            "flops_by_unit": group_floors[0].flops_by_unit,
            "expert_slice_bytes": slice_bytes,
            "weight_bytes_by_layer_group0": per_layer,
        },
        "source": f"analytic floor (bytes / published peak HBM bandwidth {chip.hbm.peak_bandwidth_bytes_per_s.source}; "
                  "FLOPs / published peak; collective stage latencies)",
    }
