"""The issue rule worked by hand on small op lists, and its invariant on whole programs."""

from __future__ import annotations

import pytest

from tpusim.schedule.issue_plan import (
    Read,
    RingSpec,
    Unit,
    UnsupportedIssuePlan,
    place,
    plan_issues,
)
from tpusim.schedule.program_issue import program_issue_plan
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program


def _plan(rings: list[RingSpec], reads: list[list[Read]], horizon: int = 0):  # type: ignore[no-untyped-def]
    placed, _ = place(rings)
    return plan_issues(placed, reads, horizon=lambda c: min(c, horizon), routing=lambda _r: 0)


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


@pytest.mark.parametrize("schedule_name", ["published", "layer-double-buffer", "naive"])
def test_no_copy_overwrites_a_buffer_still_read(schedule_name: str) -> None:
    """Invariant on a whole K3 step: a first copy is issued after the last reader of every
    earlier occupant of its ring buffer, and never after its own consumer."""
    model = load_model("kimi-k3")
    program = build_program(model, plan_for(model, 32), batch=1, context_tokens=256)
    plan = program_issue_plan(program, load_schedule(schedule_name)).plan
    last_reader: dict[tuple[str, int], int] = {}
    for unit in sorted(plan.issue, key=lambda u: (plan.consumer[u], u.slab)):
        issue, consumer = plan.issue[unit], plan.consumer[unit]
        assert issue <= consumer
        key = (unit.ring, plan.buffer[unit])
        if unit not in plan.refills:
            assert issue > last_reader.get(key, -1), unit
        last_reader[key] = max(last_reader.get(key, -1), consumer)
