"""Planning pool by pool (the sweep's :class:`PoolPlanCache`) gives the whole plan's issue points."""

from __future__ import annotations

import numpy as np
import pytest

from tpusim.schedule.issue_plan import UnsupportedIssuePlan
from tpusim.schedule.program_issue import PoolPlanCache, program_facts, program_issue_plan
from tpusim.schedule.schema import PoolSpec, load_schedule
from tpusim.sweep.candidates import sample
from tpusim.sweep.space import default_space
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program


def _outcome(plan_of):  # type: ignore[no-untyped-def]
    """The plan's four tables, or the error a layout without an issue point raises."""
    try:
        plan = plan_of().plan
    except UnsupportedIssuePlan as error:
        return str(error)
    return plan.issue, plan.consumer, plan.buffer, plan.refills


@pytest.mark.parametrize("batch", [1, 8])
def test_pool_by_pool_matches_the_whole_plan(batch: int) -> None:
    model = load_model("kimi-k3").with_layers(6)
    program = build_program(model, plan_for(model, 16), batch=batch, context_tokens=256)
    present = sorted({t.family for op in program.ops for t in op.tensors})
    space = default_space()
    rng = np.random.default_rng(batch)
    schedules = [sample(space, present, rng, index) for index in range(24)]
    published = load_schedule("published")
    schedules += [published, load_schedule("naive"), published.model_copy(update={
        "expert_issue": "speculative", "expert_speculation_ops": 2, "speculation_miss_rate": 0.25})]
    # a ring pool holding experts and attention (shared banks), and repeats: parts come from the cache
    families = {f: spec.model_copy(update={"pool": "main"}) for f, spec in published.families.items()}
    ring_pool = {"main": PoolSpec(mode="ring", banks=4, bank_bytes=1 << 20)}
    schedules.append(published.model_copy(update={"families": families, "pools": ring_pool}))
    # the same ring pool, one member's distance changed: its members keep their own distances
    farther = families["mla_proj"].model_copy(update={"prefetch_distance_ops": 0})
    schedules.append(published.model_copy(update={"families": {**families, "mla_proj": farther}, "pools": ring_pool}))
    schedules += schedules[:6]
    facts, cache = program_facts(program), PoolPlanCache()
    failed = 0
    for schedule in schedules:
        whole = _outcome(lambda s=schedule: program_issue_plan(program, s))
        parts = _outcome(lambda s=schedule: program_issue_plan(program, s, facts, cache))
        assert parts == whole, schedule.name
        failed += isinstance(whole, str)
    assert failed < len(schedules)  # the comparison covered plans, not only errors
