"""The kernel's DMA plan (fast, no kernel run): arena sizes equal tpusim.schedule.vmem's accounting,
and an independent checker replays the planned event order of whole decode steps and proves
no copy lands in VMEM rows that another copy's data still occupies (in a ring pool, with the
banks counted here from the order the slabs are consumed)."""

from __future__ import annotations

import numpy as np
import pytest

from megakernel.dims import model_dims
from megakernel.dma_plan import UnsupportedSchedule, geometry, peak_in_flight, plan_iteration
from megakernel.events import OP_READS, planned_event_order
from megakernel.examples import chunked_schedule, ring_schedule
from megakernel.kernel import Megakernel
from tpusim.schedule.schema import FamilySchedule, Schedule, load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.workload.model_catalog import load_model, plan_for

BUILTINS = ("naive", "published", "layer-double-buffer")
ARENA_ROW_BYTES = 256  # 128 lanes of uint16

# Last op reading each ring's tensor (the buffer is busy until that op ends).
LAST_READER = {**{ring: op for op, rings in OP_READS.items() for ring in rings},
               "mla.kv_b": "mla.core", "small": ("moe.latent_down", "mlp.mix_norm")}

CHUNKED = chunked_schedule()
RINGS = [ring_schedule(), ring_schedule(3, 128 << 10, members=("mla_proj", "router", "latent_proj", "lm_head"))]


def schedules() -> list[Schedule]:
    return [load_schedule(name) for name in BUILTINS] + [CHUNKED] + RINGS


@pytest.mark.parametrize(("name", "devices", "schedule"),
                         [("kimi-k3-mini", 1, s) for s in schedules()]
                         + [("kimi-k3", 32, load_schedule(n)) for n in (*BUILTINS, "k3-ring")],
                         ids=lambda v: getattr(v, "name", v))
def test_arenas_are_the_vmem_accounting(name, devices, schedule):
    """Each pool is one uint16 arena of exactly tpusim.schedule.vmem's bytes, except that small
    parameters always get their own arena (they are read through the whole layer)."""
    model = load_model(name)
    plan = plan_for(model, devices)
    geo = geometry(model_dims(model, plan), schedule)
    accounting = vmem_plan(schedule, model, plan, 1)
    ours = {pool: rows * ARENA_ROW_BYTES for pool, rows in geo.arenas.items()}
    theirs = dict(accounting.arena_bytes)
    small_theirs = accounting.family_bytes["small_params"]
    assert ours.pop("small_params") == pytest.approx(small_theirs, rel=0.05)
    if "small_params" in theirs:
        assert theirs.pop("small_params") == small_theirs
    for pool, size in theirs.items():
        assert ours[pool] == size, pool


def ring_banks(kernel: Megakernel, events: list[tuple]) -> dict[tuple, int]:
    """(tensor, layer, chunk) -> bank of every slab of a ring-mode pool, by the schema's rule
    alone: the pool's slabs take the banks in turn, in the order they are consumed (waited)."""
    schedule, count, banks = kernel.schedule, 0, {}
    for event in events:
        if event[0] == "dma_wait" and not event[2].startswith("expert.") and schedule.ring_pool(event[1]):
            spec = schedule.ring_pool(event[1])
            if event[2:] not in banks:
                banks[event[2:]] = count % spec.banks
                count += 1
    return banks


def arena_rows(kernel: Megakernel, event: tuple, banks: dict[tuple, int]) -> tuple[str, int, int]:
    """(pool, first row, end row) of the buffer a copy event uses, from the ring geometry
    and the *real* instance index (no conservative regions); a ring pool's bank from ``banks``."""
    _, family, tensor, layer, chunk = event
    dims, geo = kernel.dims, kernel.geo
    if event[2:] in banks:
        start = banks[event[2:]] * kernel.schedule.ring_pool(family).bank_bytes // ARENA_ROW_BYTES
        return kernel.schedule.family(family).pool, start, start + geo.rings[tensor].slab_arena_rows
    if tensor.startswith("expert."):
        ring = geo.rings["expert"]
        start = ring.buffer_row(chunk % ring.buffers)
        slot = geo.expert_slot
        if tensor == "expert.gate_up":
            return ring.pool, start, start + slot.gate_up_total
        return ring.pool, start + slot.gate_up_total, start + slot.total
    ring = geo.rings[tensor]
    if ring.instances == 1:
        m = 0
    elif tensor == "small":
        m = layer
    elif tensor.startswith(("kda.", "mla.")):
        m = dims.kind_index(layer)
    else:
        m = layer - 1
    buffer = (m * ring.num_slabs + chunk) % ring.buffers
    start = ring.buffer_row(buffer)
    return ring.pool, start, start + ring.slab_arena_rows


def op_of_events(kernel: Megakernel, events: list[tuple]) -> list[int]:
    """The op each event belongs to. An op's events are: the copies started at its start, its
    compute marker, then its waits and the copies it starts inside (slab refills ``k >=
    buffers``, and the expert copies a ``moe.topk`` starts while/after selecting)."""
    owner, current, last_compute = [], -1, ""
    for event in events:
        if event[0] == "compute":
            current, last_compute = current + 1, event[1]
            owner.append(current)
        elif event[0] == "dma_wait":
            owner.append(current)
        else:
            tensor, chunk = event[2], event[4]
            refill = not tensor.startswith("expert.") and chunk >= kernel.geo.rings[tensor].buffers
            owner.append(current if refill or (tensor.startswith("expert.") and last_compute == "moe.topk")
                         else current + 1)
    return owner


def replay(kernel: Megakernel, events: list[tuple]) -> None:
    """Check that every copy is waited after it starts, and that no copy starts while rows it
    overwrites still hold data that an op has yet to finish reading."""
    owner = op_of_events(kernel, events)
    banks = ring_banks(kernel, events)
    ops = [(i, e) for i, e in enumerate(events) if e[0] == "compute"]
    first_event_of_op = {}
    for i, op in enumerate(owner):
        first_event_of_op.setdefault(op, i)
    busy: dict[tuple, tuple[str, int, int, int | None]] = {}  # copy -> (pool, lo, hi, release)
    started: set[tuple] = set()
    for i, event in enumerate(events):
        if event[0] == "dma_start":
            pool, lo, hi = arena_rows(kernel, event, banks)
            for other, (o_pool, o_lo, o_hi, release) in busy.items():
                if o_pool == pool and lo < o_hi and o_lo < hi and (release is None or release > i):
                    raise AssertionError(f"event {i} {event} overwrites rows of {other} still in use")
            busy[event[1:]] = (pool, lo, hi, None)
            started.add(event[1:])
        elif event[0] == "dma_wait":
            assert event[1:] in started, f"wait before start: {event}"
            pool, lo, hi, _ = busy[event[1:]]
            last_op = last_reader_op(kernel, ops, owner[i], event)
            release = i + 1 if last_op is None else first_event_of_op.get(last_op + 1, len(events))
            busy[event[1:]] = (pool, lo, hi, release)


def last_reader_op(kernel: Megakernel, ops: list, waiting_op: int, event: tuple) -> int | None:
    """Index of the last op reading the waited copy (None: consumed right after its wait,
    as every slab of a multi-slab tensor is)."""
    _, _, tensor, layer, chunk = event
    if not tensor.startswith("expert.") and kernel.geo.rings[tensor].num_slabs > 1:
        return None
    readers = {f"expert[{chunk}]"} if tensor.startswith("expert.") else LAST_READER[tensor]
    readers = {readers} if isinstance(readers, str) else set(readers)
    last = waiting_op
    for op_index, (_, op) in enumerate(ops):
        if op_index >= waiting_op and op[1] in readers and op[2] == layer:
            last = op_index
    return last


def routing_for(dims, batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = dims.moe
    return np.stack([np.stack([rng.choice(e.scored_experts, e.top_k, replace=False) for _ in range(batch)])
                     for _ in dims.moe_layers])


@pytest.mark.parametrize("schedule", schedules(), ids=lambda s: s.name)
@pytest.mark.parametrize("batch", [1, pytest.param(4, marks=pytest.mark.slow)])  # 4: ~1.5 s per schedule
def test_planned_steps_never_overwrite_live_buffers_mini(schedule, batch):
    model = load_model("kimi-k3-mini")
    dims = model_dims(model, plan_for(model, 1))
    kernel = Megakernel(dims, schedule, batch, 256)
    for seed in range(2):
        replay(kernel, planned_event_order(kernel, routing_for(dims, batch, seed)))


# naive, layer-double-buffer and k3-ring: slow (~1-2 s each); tests/test_issue_plan.py checks their K3 TP32
# issue plans for overwrites in well under a second.
@pytest.mark.parametrize("schedule", [
    pytest.param(load_schedule(name), marks=pytest.mark.slow) if name in ("naive", "layer-double-buffer", "k3-ring")
    else load_schedule(name) for name in (*BUILTINS, "k3-ring")], ids=lambda s: s.name)
def test_planned_steps_never_overwrite_live_buffers_k3_tp32(schedule):
    model = load_model("kimi-k3")
    dims = model_dims(model, plan_for(model, 32))
    kernel = Megakernel(dims, schedule, 1, 512)
    replay(kernel, planned_event_order(kernel, routing_for(dims, 1, 0)))


@pytest.mark.parametrize("schedule", [load_schedule("published"), RINGS[0]], ids=lambda s: s.name)
def test_replay_catches_a_plan_that_ignores_buffer_reuse(schedule):
    model = load_model("kimi-k3-mini")
    dims = model_dims(model, plan_for(model, 1))
    kernel = Megakernel(dims, schedule, 1, 256, unsafe_ignore_buffer_reuse=True)
    with pytest.raises(AssertionError, match="overwrites rows"):
        replay(kernel, planned_event_order(kernel, routing_for(dims, 1, 0)))


def test_published_k3_issues_three_experts_during_selection_and_the_fourth_after_the_shared_expert():
    model = load_model("kimi-k3")
    geo = geometry(model_dims(model, plan_for(model, 32)), load_schedule("published"))
    plan = plan_iteration(geo, "kda", 16)
    issue = {u.slab: pos for u, pos in plan.issue.items() if u.ring == "expert"}
    assert [issue[j] for j in range(4)] == [-3, -3, -3, 0]  # slot 3 overlaps the shared expert
    assert [issue[j] for j in range(4, 16)] == list(range(1, 13))  # refill slot of expert j-4
    assert peak_in_flight(plan) <= load_schedule("published").max_dmas_in_flight


def test_unrealisable_schedules_are_rejected_with_the_rule():
    model = load_model("kimi-k3-mini")
    dims = model_dims(model, plan_for(model, 1))
    with pytest.raises(UnsupportedSchedule, match="speculative"):
        geometry(dims, load_schedule("published").with_changes(expert_issue="speculative", expert_speculation_ops=2))
    families = dict(load_schedule("published").families)
    families["mla_proj"] = FamilySchedule(prefetch_distance_ops=1, chunk_bytes=32768, buffers=4, pool="main")
    with pytest.raises(UnsupportedSchedule, match=r"mla\.kv_b"):
        geometry(dims, load_schedule("published").with_changes(families=families))


def test_refilling_a_single_buffer_while_it_is_read_is_rejected_by_schedule_validation():
    """The deliberately broken schedule (a chunked family prefetching into its only buffer,
    so the next slab would overwrite the one being read) never reaches the kernel."""
    data = load_schedule("naive").model_dump()
    data["families"]["kda_proj"] = {"prefetch_distance_ops": 2, "chunk_bytes": 65536, "buffers": 1}
    with pytest.raises(ValueError, match="needs buffers >= 2"):
        Schedule.model_validate(data)
