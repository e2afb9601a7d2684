"""The issue rule worked by hand on small op lists, and its invariant on whole programs.

The invariant (:func:`overwrite_violations`) is an independent reference: no copy is issued
before the *last* reader of anything it overwrites, in its own ring or in any other ring
sharing its arena; the tests below prove it fails on planted overwrites."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence

import pytest

from tpusim.schedule.issue_plan import (
    EXPERT_RING,
    IssuePlan,
    Read,
    RingSpec,
    Unit,
    UnsupportedIssuePlan,
    place,
    plan_issues,
)
from tpusim.schedule.program_issue import (
    ProgramIssuePlan,
    program_facts,
    program_issue_plan,
    program_reads,
)
from tpusim.schedule.schema import SMALL_FAMILY, load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import Program, build_program


def _plan(rings: list[RingSpec], reads: list[list[Read]], horizon: int = 0):  # type: ignore[no-untyped-def]
    """The rule on hand-made rings; every plan it returns passes the overwrite check below."""
    placed, _ = place(rings)
    plan = plan_issues(placed, reads, horizon=lambda c: min(c, horizon), routing=lambda _r: 0)
    assert overwrite_violations(placed, reads, plan) == []
    return plan


def test_distance_horizon_and_free_clamps_by_hand() -> None:
    # Pool "p": ring a (2 units) at rows 0..2, ring b (1 buffer of 2 units) at rows 0..2 (same family
    # sizes, so b overlaps a). a is read by ops 0 and 1 (instance 0), b by op 3 with distance 3.
    a = RingSpec("a", "fa", "p", buffers=1, num_slabs=1, slab_size=2)
    b = RingSpec("b", "fb", "p", buffers=1, num_slabs=1, slab_size=2, distance=3)
    reads = [[Read("a", 0, 0)], [Read("a", 0, 0)], [], [Read("b", 0, 0)]]
    plan = _plan([a, b], reads)
    assert plan.issue[Unit("b", 0, 0)] == 2  # 3 - 3 = 0, but a's rows are read until op 1: free = 2
    b_far = RingSpec("b", "fb", "p2", buffers=1, num_slabs=1, slab_size=2, distance=3)
    assert _plan([a, b_far], reads).issue[Unit("b", 0, 0)] == 0  # own pool: only the distance
    assert _plan([a, b_far], reads, horizon=1).issue[Unit("b", 0, 0)] == 1  # routing horizon


def test_slabs_past_the_ring_are_refills_and_a_busy_buffer_is_an_error() -> None:
    ring = RingSpec("w", "f", "w", buffers=2, num_slabs=5, slab_size=1, distance=4)
    plan = _plan([ring], [[], [], [Read("w", 0, 0)]])
    assert [plan.issue[Unit("w", 0, k)] for k in range(5)] == [0, 0, 2, 2, 2]
    assert plan.refills == {Unit("w", 0, k) for k in (2, 3, 4)}
    # two tensors of one op in one pool whose buffers overlap: no issue point exists
    x = RingSpec("x", "f", "p", buffers=1, num_slabs=1, slab_size=4)
    y = RingSpec("y", "g", "p", buffers=1, num_slabs=1, slab_size=4)
    with pytest.raises(UnsupportedIssuePlan, match="pool 'p'"):
        _plan([x, y], [[Read("x", 0, 0)], [Read("x", 0, 0), Read("y", 0, 0)]])


def test_an_op_reading_more_slabs_of_a_ring_pool_than_it_has_banks_is_refused() -> None:
    # ring pool "r" of 3 banks; one op reads tensor x (2 slabs) then y (2 slabs): y's second
    # slab would take the bank x's first slab still occupies within that op
    ring = RingSpec("pool:r", "f", "r", buffers=3, num_slabs=1, slab_size=1)
    x, y = Read("pool:r", ("x", 0), 0, slabs=2), Read("pool:r", ("y", 0), 2, slabs=2)
    with pytest.raises(UnsupportedIssuePlan, match="reads x and y: 4 slabs, more than its 3 banks"):
        _plan([ring], [[x, y]])
    fits = Read("pool:r", ("y", 0), 2, slabs=1)
    assert _plan([ring], [[x, fits]]).issue[Unit("pool:r", ("y", 0), 0)] == 0


# The reference below is written from the rule's statement (tpusim/schedule/issue_plan.py), not
# from its code: it never calls the planner's `_free`, and it takes who reads what from the ops.

# Ops that read a layer's small-parameter row besides the op that owns the small tensors: the
# kernel reads the row from the layer's attention norm through its routing (top-k).
SMALL_ROW_READERS = ("attn.mix_norm", "mlp.mix_norm", "moe.latent_down", "moe.topk")
# Ops that read another op's tensor again: absorbed MLA attention reads kv_b in mla.core.
REREADS = {"mla.core": "mla.kv_b"}

Instance = tuple[str, object]  # (ring, key): one tensor instance streamed through a ring


def overwrite_violations(rings: dict[str, RingSpec], reads: Sequence[Sequence[Read]], plan: IssuePlan) -> list[str]:
    """Every way ``plan`` lets a copy overwrite bytes an earlier copy's op still reads.

    1. An instance's readers are the ops whose ``reads`` name it: the first is its consumer,
       the *last* frees it. Its copy ``k`` lands in buffer ``(first_slot + k) % buffers``,
       covering that buffer's arena bytes where the ring's buffer index is static, else the
       ring's whole region (the kernel cannot tell which buffer at compile time).
    2. Copies are taken in consumption order (first reader, then position in its reads).
       Two copies *overlap* when they are in one ring and one buffer, or in two rings of one
       pool (one arena) whose byte ranges intersect.
    3. Invariant: a copy is issued after the last reader of every earlier copy it overlaps
       (``issue > last``), and no later than its own consumer.
    4. Refill exception: a refill (``plan.refills``) is issued inside its consumer ``c`` and
       streams in behind what ``c`` consumes, so an overlapped copy may still be read by
       ``c`` itself but by no later op (``last <= issue == c``). Slabs of one instance are
       never checked against each other: slab ``k >= buffers`` is the refill of the buffer
       slab ``k - buffers`` frees within the same op.
    Also reported: a copy no op reads, an instance read but never copied, and a consumer or
    buffer index that differs from the reference's."""
    first: dict[Instance, tuple[int, int]] = {}
    last: dict[Instance, int] = {}
    first_slot: dict[Instance, int] = {}
    for op, op_reads in enumerate(reads):
        for position, read in enumerate(op_reads):
            instance = (read.ring, read.key)
            if instance not in first:
                first[instance], first_slot[instance] = (op, position), read.first_slot
            last[instance] = op
    copies: dict[Instance, list[Unit]] = {}
    for unit in plan.issue:
        copies.setdefault((unit.ring, unit.key), []).append(unit)
    found = [f"{unit} is copied but no op reads it" for i, units in copies.items() if i not in first
             for unit in units]
    found += [f"{i} is read from op {first[i][0]} but never copied" for i in first if i not in copies]
    # per pool: (ring, buffer, byte range) -> (latest last reader of a copy there, that copy)
    occupied: dict[str, dict[tuple[str, int, tuple[int, int]], tuple[int, Unit]]] = {}
    for instance in sorted(set(copies) & set(first), key=first.__getitem__):
        ring, consumer = rings[instance[0]], first[instance][0]
        held = occupied.setdefault(ring.pool, {})
        landed: list[tuple[tuple[str, int, tuple[int, int]], Unit]] = []
        for unit in sorted(copies[instance], key=lambda u: u.slab):
            buffer = (first_slot[instance] + unit.slab) % ring.buffers
            span = _buffer_bytes(ring, buffer) if ring.static_buffers else ring.region
            issue, refill = plan.issue[unit], unit in plan.refills
            if plan.consumer.get(unit) != consumer or plan.buffer.get(unit) != buffer:
                found.append(f"{unit}: plan says consumer {plan.consumer.get(unit)}, buffer "
                             f"{plan.buffer.get(unit)}; its reads say {consumer}, {buffer}")
            if issue > consumer or (refill and issue != consumer):
                found.append(f"{unit} is issued at op {issue}, its consumer is op {consumer}")
            for (ring_name, other_buffer, (lo, hi)), (other_last, other) in held.items():
                overlaps = other_buffer == buffer if ring_name == ring.name else lo < span[1] and span[0] < hi
                if overlaps and other_last >= issue + refill:
                    found.append(f"{unit} issued at op {issue}{' (refill)' if refill else ''} overwrites "
                                 f"{other} (arena {ring.pool!r} bytes {lo}..{hi}) still read by op {other_last}")
            landed.append(((ring.name, buffer, span), unit))
        for where, occupant in landed:
            if where not in held or held[where][0] < last[instance]:
                held[where] = (last[instance], occupant)
    return found


def _buffer_bytes(ring: RingSpec, buffer: int) -> tuple[int, int]:
    """Arena range of ``buffer`` (the placement rule: the expert slots count down from the top)."""
    index = ring.buffers - 1 - buffer if ring.name == EXPERT_RING else buffer
    start = ring.offset + index * ring.slab_size
    return start, start + ring.slab_size


def reads_from_ops(program: Program, planned: ProgramIssuePlan) -> list[list[Read]]:
    """What each op of ``program`` reads, from its tensors (plus the small row and re-reads),
    with each instance's first ring slab: ring slabs are counted over the ring's instances in
    consumption order, a whole ``K`` per instance (a ring pool's banks: the slabs the instance
    copies; an expert: its entry in the layer's list). Slab counts come from the plan."""
    slabs = Counter((unit.ring, unit.key) for unit in planned.plan.issue)
    family = {t.name: t.family for op in program.ops for t in op.tensors}
    small_layers = {op.layer for op in program.ops for t in op.tensors if t.family == SMALL_FAMILY}
    next_slot: dict[str, int] = {}
    first_slot: dict[Instance, int] = {}
    out: list[list[Read]] = []
    for op in program.ops:
        names = [(t.name, t.family) for t in op.tensors]
        if op.role in SMALL_ROW_READERS and op.layer in small_layers:
            names.append(("small", SMALL_FAMILY))
        if op.name in REREADS and REREADS[op.name] in family:
            names.append((REREADS[op.name], family[REREADS[op.name]]))
        op_reads: list[Read] = []
        for name, fam in names:
            ring = planned.ring_of(name, fam)
            key: object = (op.layer, op.expert_index or 0) if ring == EXPERT_RING else (
                (name, op.layer) if ring.startswith("pool:") else op.layer)
            instance = (ring, key)
            if any((read.ring, read.key) == instance for read in op_reads):
                continue
            if instance not in first_slot:
                if ring == EXPERT_RING:
                    first_slot[instance] = key[1]  # type: ignore[index]
                else:
                    first_slot[instance] = next_slot.get(ring, 0)
                    step = slabs[instance] if ring.startswith("pool:") else planned.rings[ring].num_slabs
                    next_slot[ring] = first_slot[instance] + step
            op_reads.append(Read(ring, key, first_slot[instance]))
        out.append(op_reads)
    return out


@functools.cache
def _program(model_name: str, devices: int, batch: int) -> Program:
    model = load_model(model_name)
    return build_program(model, plan_for(model, devices), batch=batch, context_tokens=256)


REAL_PLANS = [pytest.param("kimi-k3", 32, batch, name, id=f"kimi-k3-b{batch}-{name}")
              for batch in (1, 8)
              for name in ("published", "layer-double-buffer", "naive", "k3-ring", "muse-published")]
REAL_PLANS += [pytest.param("muse-spark@int4+bf16", 8, batch, "muse-published", id=f"muse-spark-b{batch}")
               for batch in (1, 8)]


@pytest.mark.parametrize(("model_name", "devices", "batch", "schedule_name"), REAL_PLANS)
def test_no_copy_overwrites_a_buffer_still_read(model_name: str, devices: int, batch: int,
                                                 schedule_name: str) -> None:
    """The invariant on whole steps: every built-in schedule, every pool and arena."""
    program = _program(model_name, devices, batch)
    planned = program_issue_plan(program, load_schedule(schedule_name))
    assert overwrite_violations(planned.rings, reads_from_ops(program, planned), planned.plan) == []


def test_the_checker_catches_an_overwrite_of_a_later_reader() -> None:
    # ring w (one buffer): instance 0 read by ops 0..3, instance 1 first read at op 4. Issued
    # at op 2 (after the first reader, before the last) it overwrites what ops 2 and 3 read.
    ring = RingSpec("w", "f", "w", buffers=1, num_slabs=1, slab_size=1, instances=2)
    reads = [[Read("w", 0, 0)]] * 4 + [[Read("w", 1, 1)]]
    plan = _plan([ring], reads)
    assert plan.issue[Unit("w", 1, 0)] == 4
    plan.issue[Unit("w", 1, 0)] = 2  # planted
    assert overwrite_violations({"w": ring}, reads, plan) == [
        "Unit(ring='w', key=1, slab=0) issued at op 2 overwrites Unit(ring='w', key=0, slab=0) "
        "(arena 'w' bytes 0..1) still read by op 3"]


def test_the_checker_catches_an_overwrite_of_another_rings_bytes() -> None:
    # the hand-worked pool above, planned without the free rule: b lands on a's rows at op 0
    a = RingSpec("a", "fa", "p", buffers=1, num_slabs=1, slab_size=2)
    b = RingSpec("b", "fb", "p", buffers=1, num_slabs=1, slab_size=2, distance=3)
    reads = [[Read("a", 0, 0)], [Read("a", 0, 0)], [], [Read("b", 0, 0)]]
    placed, _ = place([a, b])
    broken = plan_issues(placed, reads, horizon=lambda _c: 0, routing=lambda _r: 0, respect_buffers=False)
    assert overwrite_violations(placed, reads, broken) == [
        "Unit(ring='b', key=0, slab=0) issued at op 0 overwrites Unit(ring='a', key=0, slab=0) "
        "(arena 'p' bytes 0..2) still read by op 1"]


def test_the_checker_catches_a_whole_step_planned_without_the_free_rule() -> None:
    program = _program("kimi-k3", 32, 1)
    schedule = load_schedule("layer-double-buffer")
    planned = program_issue_plan(program, schedule)
    facts = program_facts(program)
    reads = program_reads(facts, schedule, planned.rings, planned.tensor_ring)
    first_read: dict[object, int] = {}
    for op, op_reads in enumerate(reads):
        for read in op_reads:
            first_read.setdefault(read.key, op)
    broken = plan_issues(planned.rings, reads, horizon=facts.horizons.__getitem__, respect_buffers=False,
                         routing=lambda read: planned.routing_op.get(read.key[0], first_read[read.key]))
    found = overwrite_violations(planned.rings, reads_from_ops(program, planned), broken)
    assert found and all("overwrites" in line for line in found)
