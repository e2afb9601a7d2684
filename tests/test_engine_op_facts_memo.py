"""The lowering's memo of per-op facts (step 5's collectives after each op, the op's kind and
VPU time, per program, chip and policy) gives what lowering them afresh gives, whatever
schedule the memo was filled under."""

from __future__ import annotations

import dataclasses

from hwmodels.catalog import make_system
from tpusim.engine import build, simulate
from tpusim.engine.build import lower
from tpusim.engine.policy import execution_policy
from tpusim.schedule.schema import load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.workload.model_catalog import deployment_plan, load_model
from tpusim.workload.program import build_program


def _collectives(program, schedule, chip):  # type: ignore[no-untyped-def]
    policy = execution_policy(chip)
    vmem = vmem_plan(schedule, program.model, program.plan, program.resident_rows, program.kv_sequences)
    return [tuple(op.collectives) for op in lower(program, schedule, chip, policy, vmem).ops]


def test_remembered_collectives_match_fresh_ones() -> None:
    system = make_system("tpu-v7", 16, calibrated=False)
    model = load_model("kimi-k3").with_layers(4)
    plan = deployment_plan(model, system.chip, system.chips,
                           "base=published,expert_groups=2,expert_tp=16,shared_wait=deferred",
                           {"moe.shared_reduce": "direct_all_gather"})
    program = build_program(model, plan, batch=1)
    published, naive = load_schedule("published"), load_schedule("naive")

    build._OP_FACTS.clear()
    fresh = _collectives(program, naive, system.chip)  # lowered afresh
    assert any(call.messages is not None for calls in fresh for call in calls)  # messages are covered
    build._OP_FACTS.clear()
    first = simulate(program, published, system.chip)  # lowered afresh: fills the memo
    assert len(build._OP_FACTS) == 1
    assert _collectives(program, naive, system.chip) == fresh  # from the memo, filled under another schedule
    again = simulate(program, published, system.chip)  # from the memo
    assert dataclasses.replace(again, timeline=None) == dataclasses.replace(first, timeline=None)

    other_chip = system.chip.model_copy()  # an equal chip, another object: lowered afresh
    assert _collectives(program, naive, other_chip) == fresh
    assert len(build._OP_FACTS) == 2
