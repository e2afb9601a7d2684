"""The issue plan of a whole program: :mod:`tpusim.schedule.issue_plan`'s rule on the flat op list.

The kernel applies the rule window by window (its ops are fixed only between two routing
decisions); here it runs once over a concrete program, whose expert counts are known. The
rings take their slab sizes in bytes from :mod:`tpusim.schedule.vmem` (the same slabs the
engine copies and the arena sizes VMEM accounting reports), and the reads follow the kernel:
a layer's small-parameter row is read by every op in
:data:`~tpusim.schedule.issue_plan.SMALL_READER_ROLES`, ``mla.core`` reads ``mla.kv_b``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpusim.schedule.issue_plan import (
    EXPERT_RING,
    EXTRA_READS,
    REGION_ROLES,
    RING_ORDER,
    SMALL_READER_ROLES,
    SMALL_RING,
    IssuePlan,
    Read,
    RingSpec,
    Unit,
    place,
    plan_issues,
)
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import slab_bytes, slab_rows, tensor_kinds
from tpusim.workload.program import Op, Program
from tpusim.workload.shapes import expert_slice_bytes

SMALL_FAMILY = "small_params"
ROUTED = "routed_expert"


@dataclass
class ProgramIssuePlan:
    """The issue plan of one program under one schedule (op indices of ``program.ops``)."""

    plan: IssuePlan
    rings: dict[str, RingSpec]
    arena_bytes: dict[str, int]
    routing_op: dict[int, int]  # layer -> op whose routing decision issues its experts

    def weight_issue(self, tensor: str, family: str, layer: int, chunk: int) -> int:
        """Op at whose start slab ``chunk`` of ``tensor`` (of ``layer``) is issued."""
        ring = ring_name(tensor, family)
        return self.plan.issue[Unit(ring, layer, 0 if ring == SMALL_RING else chunk)]

    def expert_issue(self, layer: int, entry: int) -> tuple[int, bool]:
        """(op, by routing): expert ``entry`` of ``layer`` is issued by that op's routing
        decision, or (False) at that op's start because its slot frees only then."""
        op = self.plan.issue[Unit(EXPERT_RING, (layer, entry), 0)]
        return op, op == self.routing_op.get(layer)


def ring_name(tensor_name: str, family: str) -> str:
    """The ring a program tensor streams through."""
    if family == SMALL_FAMILY:
        return SMALL_RING
    if family == ROUTED:
        return EXPERT_RING
    return tensor_name


def program_issue_plan(program: Program, schedule: Schedule) -> ProgramIssuePlan:
    """The issue plan of ``program`` under ``schedule`` (raises
    :class:`~tpusim.schedule.issue_plan.UnsupportedIssuePlan` when a layout has no issue point)."""
    rings = program_rings(program, schedule)
    order = [name for name in RING_ORDER if name in rings] + [name for name in rings if name not in RING_ORDER]
    placed, arenas = place([rings[name] for name in order])
    reads = program_reads(program, placed)
    horizons = horizon_ops(program.ops)
    routing_op = routing_ops(program.ops, schedule)
    first_read = {}
    for index, op_reads in enumerate(reads):
        for read in op_reads:
            first_read.setdefault(read.key, index)

    def routing(read: Read) -> int:
        layer = read.key[0]  # type: ignore[index]
        return routing_op.get(layer, first_read[read.key])

    ahead = schedule.expert_speculation_ops if schedule.expert_issue == "speculative" else 0
    plan = plan_issues(placed, reads, horizon=horizons.__getitem__, routing=routing, lookback=2 + ahead)
    return ProgramIssuePlan(plan, placed, arenas, routing_op)


def program_rings(program: Program, schedule: Schedule) -> dict[str, RingSpec]:
    """One ring per tensor kind the program streams, sized in bytes as VMEM accounting sizes it."""
    model, plan = program.model, program.plan
    kinds = {t.name: t for tensors in tensor_kinds(model, plan).values() for t in tensors}
    instances: dict[str, set[object]] = {}
    small_bytes: dict[int, int] = {}
    for op in program.ops:
        for tensor in op.tensors:
            name = ring_name(tensor.name, tensor.family)
            instances.setdefault(name, set()).add(op.layer if name != EXPERT_RING else op.expert_index)
            if name == SMALL_RING:
                small_bytes[op.layer] = small_bytes.get(op.layer, 0) + tensor.bytes
    rings: dict[str, RingSpec] = {}
    for name, keys in instances.items():
        if name == SMALL_RING:
            fam = schedule.family(SMALL_FAMILY)
            rings[name] = RingSpec(name, SMALL_FAMILY, SMALL_FAMILY, fam.buffers, 1, max(small_bytes.values()),
                                   fam.prefetch_distance_ops, len(keys))
        elif name == EXPERT_RING:
            fam = schedule.family(ROUTED)
            rings[name] = RingSpec(name, ROUTED, fam.pool or ROUTED, fam.buffers, 1,
                                   expert_slice_bytes(model, plan), 0, len(keys))
        else:
            kind = kinds[name]
            fam = schedule.family(kind.family)
            slabs = math.ceil(kind.rows / slab_rows(kind, fam.chunk_bytes))
            rings[name] = RingSpec(name, kind.family, fam.pool or kind.family, fam.buffers, slabs,
                                   slab_bytes(kind, fam.chunk_bytes), fam.prefetch_distance_ops, len(keys))
    return rings


def program_reads(program: Program, rings: dict[str, RingSpec]) -> list[list[Read]]:
    """Per op, the ring instances it reads (module docstring)."""
    ordinals: dict[str, dict[object, int]] = {}
    small_layers = {op.layer for op in program.ops for t in op.tensors if t.family == SMALL_FAMILY}

    def read(name: str, key: object, slabs: int | None = None, entry: int = 0) -> Read:
        seen = ordinals.setdefault(name, {})
        ordinal = seen.setdefault(key, len(seen))
        ring = rings[name]
        first = entry if name == EXPERT_RING else ordinal * ring.num_slabs
        return Read(name, key, first, slabs if slabs is not None and slabs < ring.num_slabs else None)

    out: list[list[Read]] = []
    for op in program.ops:
        reads: list[Read] = []
        for tensor in op.tensors:
            name = ring_name(tensor.name, tensor.family)
            if name == EXPERT_RING:
                entry = op.expert_index or 0
                new = read(name, (op.layer, entry), entry=entry)
            elif name == SMALL_RING:
                new = read(name, op.layer)
            else:
                fam_chunk = _chunk(rings[name], tensor.bytes)
                new = read(name, op.layer, fam_chunk)
            if new not in reads:
                reads.append(new)
        _extra_reads(op, reads, read, small_layers, rings)
        out.append(reads)
    return out


def _chunk(ring: RingSpec, nbytes: int) -> int:
    """Slabs of a tensor of ``nbytes`` in ``ring`` (a smaller instance may need fewer)."""
    return max(1, min(ring.num_slabs, math.ceil(nbytes / ring.slab_size)))


def _extra_reads(op: Op, reads: list[Read], read, small_layers: set[int],  # type: ignore[no-untyped-def]
                 rings: dict[str, RingSpec]) -> None:
    if op.role in SMALL_READER_ROLES and op.layer in small_layers:
        new = read(SMALL_RING, op.layer)
        if new not in reads:
            reads.append(new)
    extra = EXTRA_READS.get(op.name)
    if extra is not None and extra in rings:
        reads.append(read(extra, op.layer))


def horizon_ops(ops: list[Op]) -> list[int]:
    """horizon(c) for every op index (:mod:`tpusim.schedule.issue_plan`'s rule)."""
    out: list[int] = []
    current, topk, topk_layer = 0, None, None
    for index, op in enumerate(ops):
        if op.role == "moe.topk":
            topk, topk_layer = index, op.layer
        elif topk is not None and op.layer == topk_layer and op.role in REGION_ROLES:
            current, topk = topk + 1, None
        out.append(current)
    return out


def routing_ops(ops: list[Op], schedule: Schedule) -> dict[int, int]:
    """layer -> the op whose routing decision issues the layer's experts."""
    topk: dict[int, int] = {}
    router: dict[int, int] = {}
    for index, op in enumerate(ops):
        if op.role == "moe.topk":
            topk.setdefault(op.layer, index)
        elif op.role == "moe.router":
            router.setdefault(op.layer, index)
    if schedule.expert_issue == "speculative":
        ahead = schedule.expert_speculation_ops
        return {layer: max(0, router.get(layer, at) - ahead) for layer, at in topk.items()}
    return topk
