"""The issue plan: for every weight copy of a step, the op at whose start it is issued.

This module is the one statement of the schedule's issue rule. The engine
(:mod:`tpusim.engine.build`), the sweep's estimate (:mod:`tpusim.sweep.estimate`) and the
kernel's DMA plan (:mod:`megakernel.dma_plan`) all read it, so kernel and simulator issue
every copy at the same op.

**Copies, rings and buffers.** A *ring* is the VMEM home of one tensor kind
(``kda.qkvgb``, ``moe.router``, ...): ``buffers`` slab buffers of equal size. Three rings
are special: a layer's small parameters are one copy (ring ``small``: the kernel packs them
in one row and reads it from ``attn.mix_norm`` to ``moe.topk``); the routed experts
of a layer share the *expert slots* (ring ``expert``, one whole expert slice per slot); and
in a pool of mode ``ring`` (:class:`tpusim.schedule.schema.PoolSpec`) every member tensor is
cut into bank-sized slabs that take the pool's banks in turn (one ring named ``pool:NAME``).
Ring slab ``g`` (counted over all instances of the kind in consumption order; for an
expert, its entry ``j`` in the layer's expert list) lives in buffer ``g % buffers``.

**Placement.** The families of a pool share one arena sized for the largest member
(:mod:`tpusim.schedule.vmem` owns the sizes). Members start at the arena's base, the rings of
a family back to back in :data:`RING_ORDER`; the expert slots sit at the arena's top, slot 0
highest, so the shared expert and the first slots can coexist. Small parameters always get an
arena of their own: they are read through the whole layer.

**The issue rule.** The copy of slab ``k < buffers`` of an instance first read by op ``c``
(whose family has prefetch distance ``d``) is issued at the start of op::

    issue = max(c - d, horizon(c), free(c))

- ``horizon(c)``: the op after the last ``moe.topk`` whose expert region (its layer's first
  ``expert[*]`` or ``moe.combine``) starts before ``c``; 0 before the first. A distance that
  reaches back past a routing decision is clamped there: before it, how many ops lie between
  issue and use is unknown to a kernel compiled once for every routing.
- ``free(c)``: the op after the last reader of every buffer the copy overwrites: the previous
  occupant of its own ring buffer and, in a pool, any other ring's buffer whose arena bytes
  overlap (exactly where the ring's buffer index is static, else the ring's whole region).
  ``mla.core`` reads ``mla.kv_b`` again (absorbed attention), so it counts as a reader.
- Slabs ``k >= buffers`` are issued inside their consumer op, as slab ``k - buffers`` is
  consumed (a refill: ``issue = c``, ``refill`` set); so is a ring pool's slab whose bank
  is still read by the same op (another tensor of that op).
- Routed expert ``j``: ``max(routing, free)``, where ``routing`` is the layer's ``moe.topk``
  (``after_routing``: as it ends; ``during_selection``: during it) or, for ``speculative``,
  op ``moe.router - expert_speculation_ops``. Expert ``j >= buffers`` thus waits for the slot
  of expert ``j - buffers``: it is issued at the start of ``expert[j - buffers + 1]``.

If ``free(c) > c`` for a first copy the buffer it needs is still read by its own consumer:
no kernel can run the layout, and :class:`UnsupportedIssuePlan` says which pool; so it does
when one op reads more slabs of a ring pool than the pool has banks.
``max_dmas_in_flight`` is not part of the plan: it limits how many issued copies move at
once (the engine's HBM queue), not when they are issued.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from tpusim.schedule.vmem import EXPERT_RING, SMALL_RING, InfeasibleSchedule, RingSpec, place
from tpusim.workload import registry
from tpusim.workload.registry.names import Family

# Arena placement order within a family (the kernel's ring order): the registry's tensor
# order, the expert slice collapsed into its slots.
RING_ORDER: tuple[str, ...] = (SMALL_RING, *dict.fromkeys(
    EXPERT_RING if registry.TENSORS[name].family == Family.ROUTED_EXPERT else name for name in registry.TENSOR_ORDER))
FAR = 10**9

# RingSpec and place (the arena rule) live in tpusim.schedule.vmem; re-exported for readers of the plan.
__all__ = ["EXPERT_RING", "RING_ORDER", "SMALL_RING", "IssuePlan", "Read", "RingSpec", "Unit",
           "UnsupportedIssuePlan", "place", "plan_issues"]


class UnsupportedIssuePlan(InfeasibleSchedule):
    """No issue point exists: a copy's buffer is still read by the copy's own consumer."""


class Read(NamedTuple):
    """An op reads instance ``key`` of ring ``ring``; its slab 0 is ring slab ``first_slot``.

    ``slabs`` overrides the ring's K for this instance (a smaller tensor of the kind);
    ``distance`` the ring's prefetch distance (a ring pool's members keep their own)."""

    ring: str
    key: object
    first_slot: int
    slabs: int | None = None
    distance: int | None = None


class Unit(NamedTuple):
    """One copy: slab ``slab`` of instance ``key`` of ring ``ring`` (a named tuple: planning
    and its readers hash thousands per schedule)."""

    ring: str
    key: object
    slab: int


@dataclass
class IssuePlan:
    """Issue and consumer op positions of every copy (``refills``: issued inside the consumer)."""

    issue: dict[Unit, int]
    consumer: dict[Unit, int]
    buffer: dict[Unit, int]
    refills: set[Unit] = field(default_factory=set)


@dataclass
class _Instance:
    read: Read
    first: int
    last: int


def _instances(op_reads: Sequence[Sequence[Read]], first: int) -> dict[tuple[str, object], _Instance]:
    seen: dict[tuple[str, object], _Instance] = {}
    for i, reads in enumerate(op_reads):
        for read in reads:
            key = (read.ring, read.key)
            known = seen.get(key)
            if known is None:
                seen[key] = _Instance(read, first + i, first + i)
            else:
                known.last = first + i
    return seen


def plan_issues(rings: dict[str, RingSpec], op_reads: Sequence[Sequence[Read]], *, first: int = 0,
                horizon: Callable[[int], int], routing: Callable[[Read], int],
                respect_buffers: bool = True, min_consumer: int = 0, lookback: int = 1) -> IssuePlan:
    """Apply the issue rule to ops ``first, first + 1, ...`` reading ``op_reads``.

    ``routing(read)`` is an expert read's routing position; ``min_consumer``: copies first
    read before it are planned elsewhere (the kernel's window lead-in).
    ``respect_buffers=False`` drops ``free`` for weights: a deliberately broken plan for the
    kernel's race-detector test only. ``horizon`` must not decrease along the ops; ``lookback``
    bounds how far before ``horizon(c)`` an expert's routing position may lie (an occupant
    whose last reader is older cannot delay any copy)."""
    if any(name.startswith("pool:") for name in rings):  # only ring pools can wrap within an op
        for index, reads in enumerate(op_reads):
            _check_op_fits_its_pools(first + index, reads, rings)
    instances = sorted(_instances(op_reads, first).values(), key=lambda inst: inst.first)
    plan = IssuePlan({}, {}, {})
    issue, consumer, buffers, refills = plan.issue, plan.consumer, plan.buffer, plan.refills
    # ``free`` by cells: a cell is one buffer of one ring; per cell the latest last reader of
    # the occupants entered so far (first read before the current op), and per cell the cells
    # it overlaps (its own, and any other ring's buffer of its pool whose arena bytes overlap).
    # free(c) is the op after the latest last reader over the overlapping cells: the same as
    # scanning the pool's occupants by last reader (the rule's statement), at one max per copy.
    cells_of: dict[str, list[int]] = {}  # ring -> its buffers' cells
    cell_count = 0
    for inst in instances:
        name = inst.read.ring
        if name not in cells_of:
            cells_of[name] = list(range(cell_count, cell_count + rings[name].buffers))
            cell_count += rings[name].buffers
    overlaps = _overlaps(rings, cells_of)
    latest = [-FAR] * len(overlaps)  # per cell: the latest last reader entered
    latest_of = latest.__getitem__
    # named tuples built by tuple.__new__ (their own __new__ and _make are Python calls; a
    # plan builds thousands)
    new_tuple = tuple.__new__
    entering, current, horizon_c, oldest, total = 0, None, 0, 0, len(instances)
    instance_cells: list[list[int]] = []
    for inst in instances:
        read = inst.read
        ring = rings[read.ring]
        count = read.slabs if read.slabs is not None else ring.num_slabs
        cells, ring_buffers, first_slot = cells_of[read.ring], ring.buffers, read.first_slot
        instance_cells.append([cells[(first_slot + k) % ring_buffers] for k in range(count)])
    for index, inst in enumerate(instances):
        read, c = inst.read, inst.first
        name, key = read.ring, read.key
        ring = rings[name]
        ring_buffers = ring.buffers
        first_slot = read.first_slot
        cells = instance_cells[index]
        if c != current:
            current = c
            horizon_c = horizon(c)
            oldest = horizon_c - lookback
            while entering < total and instances[entering].first < c:
                last = instances[entering].last
                for cell in instance_cells[entering]:
                    if latest[cell] < last:
                        latest[cell] = last
                entering += 1
        units = [new_tuple(Unit, (name, key, k)) for k in range(len(cells))]
        for k, unit in enumerate(units):
            consumer[unit] = c
            buffers[unit] = (first_slot + k) % ring_buffers
        if c < min_consumer:
            continue
        expert = name == EXPERT_RING
        if expert:
            floor = routing(read)
        else:
            floor = c - (ring.distance if read.distance is None else read.distance)
            if horizon_c > floor:
                floor = horizon_c
        check_free = respect_buffers or expert
        pooled = name.startswith("pool:")
        for k, unit in enumerate(units):
            if k >= ring_buffers and not expert:
                issue[unit] = c
                refills.add(unit)
                continue
            when = floor
            if check_free:
                # occupants whose last reader is older than the lookback cannot delay it
                newest = max(map(latest_of, overlaps[cells[k]]))
                if newest >= oldest and newest >= floor:
                    when = newest + 1
            if when == c + 1 and pooled:  # the bank's occupant is read by op c too:
                issue[unit] = c  # refilled inside c as that occupant is consumed
                refills.add(unit)
                continue
            if when > c:
                raise UnsupportedIssuePlan(
                    f"pool {ring.pool!r}: {ring.name} (first read at op {c}) needs a buffer still read by that "
                    "op; give the families separate pools or more room")
            issue[unit] = when
    return plan


def _overlaps(rings: dict[str, RingSpec], cells_of: dict[str, list[int]]) -> list[tuple[int, ...]]:
    """Per cell (``cells_of``: ring -> its buffers' cells), the cells a copy into it overwrites:
    itself and every other ring's buffer of its pool whose arena range overlaps (each buffer's
    range where the ring's buffers are static, else the ring's whole region)."""
    spans: dict[int, tuple[RingSpec, int, tuple[int, int]]] = {}
    for name, cells in cells_of.items():
        ring = rings[name]
        for buffer, cell in enumerate(cells):
            spans[cell] = (ring, buffer, ring.buffer_range(buffer) if ring.static_buffers else ring.region)
    out: list[tuple[int, ...]] = []
    for cell in range(len(spans)):
        ring, buffer, (a, b) = spans[cell]
        out.append(tuple(other for other, (other_ring, other_buffer, (c, d)) in spans.items()
                         if other_ring.pool == ring.pool and (
                             other_buffer == buffer if other_ring is ring else a < d and c < b)))
    return out


def _check_op_fits_its_pools(op: int, reads: Sequence[Read], rings: dict[str, RingSpec]) -> None:
    """An op reading several tensors of one ring pool needs their slabs in distinct banks: it
    streams one tensor after the other, so a bank taken twice within the op would be refilled
    while the op still needs it, a wrap the ``free`` rule (which looks at earlier ops) does not
    see."""
    slabs: dict[str, dict[object, int]] = {}
    for read in reads:
        if read.ring.startswith("pool:"):
            count = read.slabs if read.slabs is not None else rings[read.ring].num_slabs
            slabs.setdefault(read.ring, {})[read.key] = count
    for ring, by_tensor in slabs.items():
        total, banks = sum(by_tensor.values()), rings[ring].buffers
        if len(by_tensor) > 1 and total > banks:
            names = " and ".join(str(key[0] if isinstance(key, tuple) else key) for key in by_tensor)
            raise UnsupportedIssuePlan(f"pool {rings[ring].pool!r}: op {op} reads {names}: {total} slabs, more "
                                       f"than its {banks} banks; use more or larger banks")
