"""Closed-form floors of a decode step: no schedule can beat these.

For one device's program on one chip:

- **HBM floor** = bytes read and written (weights with their scales, KV cache, recurrent
  state) / the chip's *published peak* HBM bandwidth. A true lower bound: no copy engine
  moves bytes faster than the peak.
- **Compute floor** = matmul FLOPs / peak FLOP/s of the matrix unit at each op's dtype,
  plus vector FLOPs / vector peak (no tile padding, no weight-push cost: a bound, not an
  estimate).
- **Collective floor** = the sum over non-overlapped collectives of their stage latencies
  (latency only; the bytes are tiny at decode).

``floor_s = max(hbm, compute + collective)`` — copies can overlap everything in the best
case (weights prefetch across compute and collectives alike), but a blocking collective
stalls the compute stream: the next op needs its result. Tokens/s at the floor = ``batch / floor_s`` (aggregate over the
batch: ``batch * 1000 / step_ms``).

The floors deliberately ignore fixed overheads (:func:`fixed_overheads_s` gives those
separately): a floor is physics, not an estimate.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from hwmodels.schema import Chip, LinkSpec
from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import Family, KdaOp, StateFamily


@dataclass
class Floors:
    """Lower bounds of one device's step, seconds (bytes in bytes)."""

    hbm_bytes: int
    hbm_floor_s: float
    compute_floor_s: float
    collective_floor_s: float
    bytes_by_family: dict[str, int] = field(default_factory=dict)
    bytes_by_op_kind: dict[str, int] = field(default_factory=dict)
    flops_by_unit: dict[str, float] = field(default_factory=dict)

    @property
    def floor_s(self) -> float:
        """The step floor: ``max(hbm, compute + collective)`` (the one place it is written)."""
        return max(self.hbm_floor_s, self.compute_floor_s + self.collective_floor_s)

    @property
    def bound_by(self) -> str:
        """Which floor sets :attr:`floor_s`: ``hbm``, ``collective latency`` or ``compute``."""
        if self.hbm_floor_s >= self.compute_floor_s + self.collective_floor_s:
            return "hbm"
        return "collective latency" if self.collective_floor_s > self.compute_floor_s else "compute"


def hbm_floor_s(hbm_bytes: float, chip: Chip) -> float:
    """Seconds to move ``hbm_bytes`` at the chip's *published peak* HBM bandwidth."""
    return hbm_bytes / chip.hbm.peak_bandwidth_bytes_per_s.value


def link_for(chip: Chip, name: str) -> LinkSpec | None:
    """The chip link a plan stage names (``ici`` falls back to NVLink on GPUs)."""
    order = {"sibling": ("sibling", "ici", "nvlink"), "ici": ("ici", "nvlink", "pcie"),
             "nvlink": ("nvlink", "ici", "pcie"), "pcie": ("pcie", "nvlink", "ici"),
             "local": ("sibling", "ici", "nvlink")}.get(name, (name,))
    for candidate in order:
        for link in chip.links:
            if link.name == candidate:
                return link
    return None


def op_kind(op: Op) -> str:
    """Coarse kind of an op for breakdowns: attention/moe_dense/routed_expert/mlp/head."""
    if op.phase == "moe":
        return Family.ROUTED_EXPERT if op.expert_index is not None else "moe_dense"
    return op.phase


def collective_latency_s(chip: Chip, op: Op) -> float:
    """Latency floor of ``op``'s blocking collectives: per stage the link's stage latency, or
    for a collective run as remote copies (``algorithm`` set, priced message by message) per
    phase one copy's issue cost plus the link latency (the least a phase can take)."""
    total = 0.0
    for call in op.collectives:
        if call.spec.overlapped:
            continue
        for stage in call.spec.stages:
            link = link_for(chip, stage.link)
            if link is None:
                continue
            if call.spec.algorithm is None or chip.kind == "gpu":  # GPU pricers keep stages
                total += link.collective_stage_latency_s.value
            else:
                issue = link.message_issue_s.value if link.message_issue_s is not None else 0.0
                total += link.latency_s.value + issue
    return total


def floors(program: Program, chip: Chip) -> Floors:
    """The HBM, compute and collective floors of ``program`` on ``chip``."""
    by_family: dict[str, int] = defaultdict(int)
    by_kind: dict[str, int] = defaultdict(int)
    flops: dict[str, float] = defaultdict(float)
    matrix, vector = chip.matrix_unit, chip.vector_unit
    compute_s = 0.0
    collective_s = 0.0
    for op in program.ops:
        for tensor in op.tensors:
            by_family[tensor.family] += tensor.bytes
            by_kind[op_kind(op)] += tensor.bytes
        kv = op.kv_read_bytes + op.kv_write_bytes
        if kv:
            by_family["kv_cache" if op.name != KdaOp.CORE else StateFamily.KDA_STATE] += kv
            by_kind[op_kind(op)] += kv
        if op.matmuls:
            dtype = op.matmul_dtype
            peak = matrix.peak_for(dtype)
            compute_s += op.matmul_flops / peak
            flops[matrix.name] += op.matmul_flops
        if op.vector_flops:
            compute_s += op.vector_flops / vector.peak_for("f32")
            flops[vector.name] += op.vector_flops
        collective_s += collective_latency_s(chip, op)
    hbm_bytes = program.hbm_bytes
    return Floors(
        hbm_bytes=hbm_bytes,
        hbm_floor_s=hbm_floor_s(hbm_bytes, chip),
        compute_floor_s=compute_s,
        collective_floor_s=collective_s,
        bytes_by_family=dict(by_family),
        bytes_by_op_kind=dict(by_kind),
        flops_by_unit=dict(flops),
    )


def tokens_per_s(batch: int, step_s: float) -> float:
    """Aggregate decode tokens/s of a batch: ``batch * 1000 / step_ms``."""
    return batch / step_s if step_s > 0 else float("inf")


def fixed_overheads_s(program: Program, chip: Chip) -> float:
    execution = chip.execution
    total = execution.per_step_overhead_s.value + execution.per_layer_overhead_s.value * len(program.layers)
    if execution.mode == "per_op_launch":
        total += execution.launch_overhead_s.value * len(program.ops)
    return total
