"""The issue plan of a whole program: :mod:`tpusim.schedule.issue_plan`'s rule on the flat op list.

The kernel applies the rule window by window (its ops are fixed only between two routing
decisions); here it runs once over a concrete program, whose expert counts are known. The
rings take their slab sizes in bytes from :mod:`tpusim.schedule.vmem` (the same slabs the
engine copies and the arena sizes VMEM accounting reports), and the reads follow the kernel:
a layer's small-parameter row is read by every op in
:data:`tpusim.workload.registry.SMALL_READERS`, and an op reads again what
:data:`tpusim.workload.registry.REREADS` says (``mla.core`` reads ``mla.kv_b``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tpusim.collector import collector_paused
from tpusim.schedule.issue_plan import (
    EXPERT_RING,
    RING_ORDER,
    SMALL_RING,
    IssuePlan,
    Read,
    UnsupportedIssuePlan,
    plan_issues,
)
from tpusim.schedule.schema import SMALL_FAMILY, Schedule
from tpusim.schedule.vmem import (
    RingSpec,
    arena_of,
    family_chunk,
    place,
    slab_bytes,
    slab_rows,
    small_row_bytes,
    tensor_kinds,
)
from tpusim.schedule.vmem import tensor_ring as tensor_ring_of
from tpusim.workload import registry
from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import Family, MoeOp
from tpusim.workload.shapes import TensorSpec, expert_slice_bytes

ROUTED = Family.ROUTED_EXPERT


@dataclass
class ProgramIssuePlan:
    """The issue plan of one program under one schedule (op indices of ``program.ops``)."""

    plan: IssuePlan
    rings: dict[str, RingSpec]
    arena_bytes: dict[str, int]
    routing_op: dict[int, int]  # layer -> op whose routing decision issues its experts
    tensor_ring: dict[str, str]  # tensor name -> ring (weights other than small and experts)
    _rings_seen: dict[tuple[str, str], tuple[str, bool, bool]] = field(
        default_factory=dict, init=False, repr=False, compare=False)  # weight_issue's memo

    def max_lead_ops(self) -> int:
        """The most ops any copy is issued before its consumer."""
        plan = self.plan
        return max((plan.consumer[unit] - op for unit, op in plan.issue.items()), default=0)

    def ring_of(self, tensor: str, family: str) -> str:
        """The ring (engine queue) ``tensor`` streams through."""
        if family == SMALL_FAMILY:
            return SMALL_RING
        if family == ROUTED:
            return EXPERT_RING
        return self.tensor_ring.get(tensor, tensor)

    def weight_issue(self, tensor: str, family: str, layer: int, chunk: int) -> int:
        """Op at whose start slab ``chunk`` of ``tensor`` (of ``layer``) is issued."""
        ring, small, pooled = self.weight_ring(tensor, family)  # the ring and its kind, once per tensor kind
        # plain tuples: equal to (and hashed as) the Unit named tuples, without their constructor call
        if small:
            return self.plan.issue[(ring, layer, 0)]  # type: ignore[index]
        key: object = (tensor, layer) if pooled else layer
        return self.plan.issue[(ring, key, chunk)]  # type: ignore[index]

    def weight_issues(self, tensor: str, family: str, layer: int, count: int) -> list[int]:
        """:meth:`weight_issue` of slabs ``0 .. count - 1`` (the lowering asks per tensor)."""
        return self.weight_issues_in(self.weight_ring(tensor, family), tensor, layer, count)

    def weight_ring(self, tensor: str, family: str) -> tuple[str, bool, bool]:
        """(ring, small, ring pool) of ``tensor``: what :meth:`weight_issues_in` needs (a caller
        that keys its own memo cheaper than by the names keeps it)."""
        where = self._rings_seen.get((tensor, family))
        if where is None:
            ring = self.ring_of(tensor, family)
            where = self._rings_seen[tensor, family] = (ring, ring == SMALL_RING, ring.startswith("pool:"))
        return where

    def weight_issues_in(self, where: tuple[str, bool, bool], tensor: str, layer: int, count: int) -> list[int]:
        """:meth:`weight_issues` of ``tensor`` in the ring ``where`` (:meth:`weight_ring`)."""
        ring, small, pooled = where
        issue = self.plan.issue
        if small:
            return [issue[(ring, layer, 0)]] * count  # type: ignore[index]
        key: object = (tensor, layer) if pooled else layer
        return [issue[(ring, key, chunk)] for chunk in range(count)]  # type: ignore[index]

    def expert_issue(self, layer: int, entry: int) -> tuple[int, bool]:
        """(op, by routing): expert ``entry`` of ``layer`` is issued by that op's routing
        decision, or (False) at that op's start because its slot frees only then."""
        op = self.plan.issue[(EXPERT_RING, (layer, entry), 0)]  # type: ignore[index]  # == the Unit
        return op, op == self.routing_op.get(layer)


def ring_name(tensor_name: str, family: str, schedule: Schedule | None = None) -> str:
    """The ring a program tensor streams through (``pool:NAME`` for a ring-mode pool)."""
    if family == SMALL_FAMILY:
        return SMALL_RING
    if family == ROUTED:
        return EXPERT_RING
    if schedule is not None and schedule.ring_pool(family) is not None:
        return f"pool:{schedule.family(family).pool}"
    return tensor_name


@dataclass
class ProgramFacts:
    """The schedule-independent part: which ring instance each op reads, horizons, routing ops.

    Build once per program (:func:`program_facts`) when planning many schedules."""

    kinds: dict[str, TensorSpec]  # tensor name -> its largest instance
    reads: list[list[tuple[str, str, object, int]]]  # per op: (tensor name, family, key, slabs-of: bytes)
    instances: dict[str, int]  # tensor name (small: "small", experts: "expert") -> instances
    small_bytes: int  # one layer's packed small-parameter row (tpusim.schedule.vmem.small_row_bytes)
    expert_bytes: int
    horizons: list[int]
    topk: dict[int, int]
    router: dict[int, int]
    reads_of: dict[str, list[tuple[int, int]]]  # tensor name -> (op, position in its reads) of each read
    # program_reads' memo: tensor names -> their reads in program order (op, entry)
    _reads_in_order: dict[tuple[str, ...], list[tuple[int, tuple[str, str, object, int]]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)


def program_facts(program: Program) -> ProgramFacts:
    model, plan = program.model, program.plan
    kinds = {t.name: t for tensors in tensor_kinds(model, plan).values() for t in tensors}
    small_layers = {op.layer for op in program.ops for t in op.tensors if t.family == SMALL_FAMILY}
    instances: dict[str, set[object]] = {}
    reads: list[list[tuple[str, str, object, int]]] = []
    topk: dict[int, int] = {}
    router: dict[int, int] = {}
    reads_of: dict[str, list[tuple[int, int]]] = {}
    for index, op in enumerate(program.ops):
        if op.role == registry.ROUTING_OP:
            topk.setdefault(op.layer, index)
        elif op.role == MoeOp.ROUTER:  # speculative expert copies count back from the router
            router.setdefault(op.layer, index)
        op_reads: list[tuple[str, str, object, int]] = []
        for tensor in op.tensors:
            if tensor.family == SMALL_FAMILY:
                entry = (SMALL_RING, SMALL_FAMILY, op.layer, 0)
            elif tensor.family == ROUTED:
                entry = (EXPERT_RING, ROUTED, (op.layer, op.expert_index or 0), 0)
            else:
                entry = (tensor.name, tensor.family, op.layer, tensor.bytes)
            if entry not in op_reads:
                op_reads.append(entry)
        if op.role in registry.SMALL_READERS and op.layer in small_layers and (
                entry := (SMALL_RING, SMALL_FAMILY, op.layer, 0)) not in op_reads:
            op_reads.append(entry)
        for extra in registry.REREADS.get(op.name, ()):
            if extra in kinds:
                op_reads.append((extra, kinds[extra].family, op.layer, kinds[extra].bytes))
        for position, (name, _family, key, _bytes) in enumerate(op_reads):
            instances.setdefault(name, set()).add(key)
            reads_of.setdefault(name, []).append((index, position))
        reads.append(op_reads)
    return ProgramFacts(kinds, reads, {name: len(keys) for name, keys in instances.items()},
                        small_row_bytes(model, plan), expert_slice_bytes(model, plan),
                        horizon_ops(program.ops), topk, router, reads_of)


def program_issue_plan(program: Program, schedule: Schedule, facts: ProgramFacts | None = None,
                       pools: PoolPlanCache | None = None) -> ProgramIssuePlan:
    """The issue plan of ``program`` under ``schedule`` (raises
    :class:`~tpusim.schedule.issue_plan.UnsupportedIssuePlan` when a layout has no issue point).

    ``pools``: plan pool by pool and remember each pool's part (:class:`PoolPlanCache`; the
    same plan, for many schedules of one program)."""
    with collector_paused():
        return _program_issue_plan(program, schedule, facts, pools)


def _program_issue_plan(program: Program, schedule: Schedule, facts: ProgramFacts | None,
                        pools: PoolPlanCache | None) -> ProgramIssuePlan:
    facts = facts or program_facts(program)
    rings, tensor_ring = program_rings(facts, schedule)
    order = [name for name in RING_ORDER if name in rings] + [name for name in rings if name not in RING_ORDER]
    placed, arenas = place([rings[name] for name in order])
    if schedule.expert_issue == "speculative":
        ahead = schedule.expert_speculation_ops
        routing_op = {layer: max(0, facts.router.get(layer, at) - ahead) for layer, at in facts.topk.items()}
    else:
        ahead, routing_op = 0, dict(facts.topk)
    plan = None if pools is None else pools.plan(facts, schedule, placed, tensor_ring, routing_op, ahead)
    if plan is None:
        plan = _plan(facts, schedule, placed, tensor_ring, routing_op, ahead, None)
    return ProgramIssuePlan(plan, placed, arenas, routing_op, tensor_ring)


def _plan(facts: ProgramFacts, schedule: Schedule, placed: dict[str, RingSpec], tensor_ring: dict[str, str],
          routing_op: dict[int, int], ahead: int, only: set[str] | None) -> IssuePlan:
    """The rule on the program's reads (of the rings in ``only``, or all)."""
    reads = program_reads(facts, schedule, placed, tensor_ring, only)
    first_read: dict[object, int] = {}
    for index, op_reads in enumerate(reads):
        for read in op_reads:
            first_read.setdefault(read.key, index)

    def routing(read: Read) -> int:
        layer = read.key[0]  # type: ignore[index]
        return routing_op.get(layer, first_read[read.key])

    return plan_issues(placed, reads, horizon=facts.horizons.__getitem__, routing=routing, lookback=2 + ahead)


class PoolPlanCache:
    """Each pool's part of the issue plan, remembered per setting of what it depends on.

    The rule never looks across pools (``free`` counts only buffers of the copy's own pool;
    ``horizon`` and routing are the program's), so a pool's copies get the same issue points
    whatever the other pools hold. A pool's part depends on its placed rings, the knobs of
    the families streaming through them (chunk, buffers, distance, ring-pool spec) and, for
    the pool of the expert slots only, the routing positions (``expert_issue`` and
    ``expert_speculation_ops``): a sweep's candidates share most pools' parts. A schedule
    with no issue point is planned whole again, so it raises the same error."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._parts: dict[tuple[object, ...], IssuePlan | None] = {}

    def plan(self, facts: ProgramFacts, schedule: Schedule, placed: dict[str, RingSpec],
             tensor_ring: dict[str, str], routing_op: dict[int, int], ahead: int) -> IssuePlan | None:
        """The whole plan merged from the pools' parts (None: some pool has no issue point)."""
        families: dict[str, set[str]] = {}
        for tensor, ring in tensor_ring.items():
            families.setdefault(ring, set()).add(facts.kinds[tensor].family)
        by_pool: dict[str, list[RingSpec]] = {}
        for ring in placed.values():
            by_pool.setdefault(ring.pool, []).append(ring)
        merged = IssuePlan({}, {}, {})
        for members in by_pool.values():
            names = {ring.name for ring in members}
            fams = sorted(set().union(*(families.get(ring.name, {ring.family}) for ring in members)))
            knobs = tuple((f, schedule.family(f).model_dump_json(), family_chunk(schedule, f)) for f in fams)
            routed = EXPERT_RING in names
            key = (tuple(members), knobs, (schedule.expert_issue == "speculative", ahead) if routed else None)
            if key not in self._parts:
                if len(self._parts) >= self.limit:
                    self._parts.clear()
                try:
                    part: IssuePlan | None = _plan(facts, schedule, placed, tensor_ring, routing_op, ahead, names)
                except UnsupportedIssuePlan:
                    part = None
                self._parts[key] = part
            part = self._parts[key]
            if part is None:
                return None
            merged.issue.update(part.issue)
            merged.consumer.update(part.consumer)
            merged.buffer.update(part.buffer)
            merged.refills.update(part.refills)
        return merged


_RECENT: list[tuple[Program, str, ProgramIssuePlan]] = []  # small LRU: re-simulations of one program


def cached_issue_plan(program: Program, schedule: Schedule) -> ProgramIssuePlan:
    """:func:`program_issue_plan`, remembered for the last few (program, schedule) pairs: a
    calibration or an interval re-simulates the same step many times with other chip figures,
    and the plan depends on neither. 32 pairs: a calibration's residual walks all its points in
    turn (the TPU7x set: 12, and its slot-sweep and breakdown stages more), and with 8 remembered most lookups missed (measured: the TPU7x
    part-by-part calibration took 118 s of CPU, 88 s with 32, same results)."""
    digest = schedule.content_hash()
    for index, (known, known_digest, plan) in enumerate(_RECENT):
        if known is program and known_digest == digest:
            _RECENT.append(_RECENT.pop(index))
            return plan
    plan = program_issue_plan(program, schedule, cached_program_facts(program))
    remember_issue_plan(program, schedule, plan, digest)
    return plan


_FACTS: list[tuple[Program, ProgramFacts]] = []  # small LRU: a sweep plans many schedules of one program


def cached_program_facts(program: Program) -> ProgramFacts:
    """:func:`program_facts`, remembered for the last few programs (they depend on the program
    only: every schedule :func:`cached_issue_plan` plans for one program reads the same facts)."""
    for index, (known, facts) in enumerate(_FACTS):
        if known is program:
            _FACTS.append(_FACTS.pop(index))
            return facts
    facts = program_facts(program)
    _FACTS.append((program, facts))
    del _FACTS[:-32]
    return facts


def remember_issue_plan(program: Program, schedule: Schedule, plan: ProgramIssuePlan, digest: str = "") -> None:
    """Let :func:`cached_issue_plan` return ``plan`` for this (program, schedule): a caller that
    planned it already (a sweep's estimate context, memoised per pool) spares the engine a second
    planning. ``plan`` must be :func:`program_issue_plan` of the pair."""
    _RECENT.append((program, digest or schedule.content_hash(), plan))
    del _RECENT[:-32]


def forget_issue_plans() -> None:
    """Empty :func:`cached_issue_plan`'s memory of plans (a benchmark timing a new candidate's
    planning); the program's facts (:func:`cached_program_facts`) are kept, as a sweep keeps
    them across its candidates."""
    _RECENT.clear()


def program_rings(facts: ProgramFacts, schedule: Schedule) -> tuple[dict[str, RingSpec], dict[str, str]]:
    """One ring per tensor kind the program streams (one per ring-mode pool), sized in bytes as
    VMEM accounting sizes it; and tensor name -> ring."""
    rings: dict[str, RingSpec] = {}
    tensor_ring: dict[str, str] = {}
    for name, count in facts.instances.items():
        if name == SMALL_RING:
            fam = schedule.family(SMALL_FAMILY)
            rings[name] = RingSpec(name, SMALL_FAMILY, arena_of(schedule, SMALL_FAMILY), fam.buffers, 1, facts.small_bytes,
                                   fam.prefetch_distance_ops, count)
            continue
        if name == EXPERT_RING:
            fam = schedule.family(ROUTED)
            rings[name] = RingSpec(name, ROUTED, arena_of(schedule, ROUTED), fam.buffers, 1, facts.expert_bytes, 0, count)
            continue
        kind = facts.kinds[name]
        fam = schedule.family(kind.family)
        sized = tensor_ring_of(schedule, kind)
        pool = schedule.ring_pool(kind.family)
        ring = tensor_ring[name] = ring_name(name, kind.family, schedule)
        if pool is not None and pool.banks and pool.bank_bytes:
            rings[ring] = RingSpec(ring, ring, ring, pool.banks, sized.slabs, pool.bank_bytes, 0, count)
        else:
            rings[ring] = RingSpec(ring, kind.family, arena_of(schedule, kind.family), sized.buffers, sized.slabs,
                                   sized.slab_bytes, fam.prefetch_distance_ops, count)
    return rings, tensor_ring


def program_reads(facts: ProgramFacts, schedule: Schedule, rings: dict[str, RingSpec],
                  tensor_ring: dict[str, str], only: set[str] | None = None) -> list[list[Read]]:
    """Per op, the ring instances it reads (of the rings in ``only``, or all), with each
    instance's first ring slab (a ring pool's bank counter runs over every member tensor, in
    consumption order)."""
    ordinals: dict[str, dict[object, int]] = {}
    first_slot: dict[tuple[str, object], int] = {}
    banks_used: dict[str, int] = {}
    slab_count: dict[tuple[str, int], int] = {}  # (tensor, bytes) -> slabs
    ring_distance = {name: schedule.family(name).prefetch_distance_ops for name in schedule.families}
    if only is None:  # every read, in program order
        where: list[tuple[int, tuple[str, str, object, int]]] = [
            (op, entry) for op, op_reads in enumerate(facts.reads) for entry in op_reads]
    else:  # only the reads of those rings, in program order (remembered per set of tensors:
        # a sweep plans the same pool for many schedules)
        names = tuple(name for name in facts.reads_of if rings[tensor_ring.get(name, name)].name in only)
        known = facts._reads_in_order.get(names)
        if known is None:
            known = facts._reads_in_order[names] = [(op, facts.reads[op][at]) for op, at in sorted(
                entry for name in names for entry in facts.reads_of[name])]
        where = known
    out: list[list[Read]] = [[] for _ in facts.reads]
    for op, (name, family, key, nbytes) in where:
        ring = rings[tensor_ring.get(name, name)]
        pooled = ring.name.startswith("pool:")
        slabs = None
        if name == EXPERT_RING:
            first = key[1]  # type: ignore[index]
        elif name == SMALL_RING:
            seen = ordinals.setdefault(name, {})
            first = seen.setdefault(key, len(seen))
        else:
            slabs = slab_count.get((name, nbytes))
            if slabs is None:
                slabs = slab_count[name, nbytes] = _slabs(facts.kinds[name], nbytes, schedule, family)
            if (name, key) not in first_slot:
                if pooled:
                    first_slot[name, key] = banks_used.get(ring.name, 0)
                    banks_used[ring.name] = first_slot[name, key] + slabs
                else:
                    seen = ordinals.setdefault(name, {})
                    first_slot[name, key] = seen.setdefault(key, len(seen)) * ring.num_slabs
            first = first_slot[name, key]
            key = (name, key) if pooled else key
        distance = ring_distance.get(family) if pooled else None
        # Read(...) by tuple.__new__ (all five fields): a named tuple's own __new__ is a Python call
        out[op].append(tuple.__new__(Read, (ring.name, key, first, slabs if slabs != ring.num_slabs else None,
                                            distance)))
    return out


def _slabs(kind: TensorSpec, nbytes: int, schedule: Schedule, family: str) -> int:
    """Slabs of an instance of ``kind`` holding ``nbytes`` (a smaller instance may need fewer)."""
    chunk_bytes, _ = family_chunk(schedule, family)
    slabs = math.ceil(kind.rows / slab_rows(kind, chunk_bytes))
    if nbytes < kind.bytes:
        slabs = max(1, min(slabs, math.ceil(nbytes / slab_bytes(kind, chunk_bytes))))
    return slabs


def horizon_ops(ops: list[Op]) -> list[int]:
    """horizon(c) for every op index (:mod:`tpusim.schedule.issue_plan`'s rule)."""
    out: list[int] = []
    current, topk, topk_layer = 0, None, None
    for index, op in enumerate(ops):
        if op.role == registry.ROUTING_OP:
            topk, topk_layer = index, op.layer
        elif topk is not None and op.layer == topk_layer and op.role in registry.EXPERT_REGION_ROLES:
            current, topk = topk + 1, None
        out.append(current)
    return out
