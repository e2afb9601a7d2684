"""A plan's collective-algorithm variants share its program and estimate context (issue 26).

The joint sweep derives a variant's program with :func:`tpusim.workload.program.with_collectives`
and its estimate context with :meth:`tpusim.sweep.estimate.EstimateContext.for_program`
instead of building them again; both must equal a fresh build.
"""

from __future__ import annotations

import pytest

from hwmodels.catalog import make_system
from tpusim.schedule.schema import Deployment, load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.sweep.estimate import EstimateContext, estimate
from tpusim.sweep.joint_candidates import JointWorkload, _cached
from tpusim.sweep.prune import VmemAccountant
from tpusim.workload.model_catalog import load_model, load_plan
from tpusim.workload.program import build_program, with_collectives

# one variant per collective kind, in each phase that has one (K3 TP32, batch 1)
VARIANTS = [
    {"moe.shared_reduce": "reduce_scatter_all_gather"},
    {"attn.head_exchange": "direct_all_gather", "mlp.allreduce": "direct_all_gather"},
    {"moe.routed_reduce": "reduce_scatter_all_gather", "attn.partial_reduce": "direct_all_gather"},
]


@pytest.fixture(scope="module")
def k3():  # type: ignore[no-untyped-def]
    model, plan = load_model("kimi-k3"), load_plan("k3-tp32")
    return model, plan, build_program(model, plan, batch=1)


@pytest.mark.parametrize("choices", VARIANTS, ids=lambda c: "+".join(c.values()))
def test_derived_program_equals_a_fresh_build(k3, choices) -> None:  # type: ignore[no-untyped-def]
    model, plan, base = k3
    variant = plan.with_algorithms(choices)
    derived = with_collectives(base, variant)
    fresh = build_program(model, variant, batch=1)
    assert derived.plan == fresh.plan
    assert derived.ops == fresh.ops
    assert [layer.routed_experts for layer in derived.layers] == [layer.routed_experts for layer in fresh.layers]
    assert base.ops != fresh.ops  # the variant really changes the program's collectives


def test_a_plan_with_other_weights_is_refused(k3) -> None:  # type: ignore[no-untyped-def]
    _model, plan, base = k3
    other = plan.model_copy(update={"vocab_rows_per_device": plan.vocab_rows_per_device // 2})
    with pytest.raises(ValueError, match="other collective algorithms"):
        with_collectives(base, other)


@pytest.mark.slow
def test_derived_estimate_context_equals_a_fresh_one(k3) -> None:  # type: ignore[no-untyped-def]
    model, plan, base = k3
    chip = make_system("tpu-v7", 16, calibrated=False).chip
    shared = EstimateContext(base, chip)
    schedules = [load_schedule("published"), load_schedule("naive")]
    for choices in VARIANTS[:2]:
        variant = plan.with_algorithms(choices)
        derived = shared.for_program(with_collectives(base, variant))
        fresh = EstimateContext(build_program(model, variant, batch=1), chip)
        assert derived.ops == fresh.ops
        for schedule in schedules:
            assert estimate(derived, schedule) == estimate(fresh, schedule)
            assert derived.issue_plan(schedule) == fresh.issue_plan(schedule)


def test_the_sweep_cache_derives_variants_from_the_plan_as_written() -> None:
    system = make_system("tpu-v7", 16, calibrated=False)
    workload = JointWorkload(load_model("kimi-k3"), system, 1)
    base = Deployment(plan="auto")
    variant = Deployment(plan="auto", collectives=VARIANTS[0])
    program = _cached(workload, variant, "program")
    assert program.plan == workload.plan(variant)
    assert program.layers[0].ops[0] is _cached(workload, base, "program").layers[0].ops[0]  # shared, not rebuilt


def test_a_variants_vmem_accountant_equals_vmem_plan(k3) -> None:  # type: ignore[no-untyped-def]
    model, plan, _base = k3
    shared = VmemAccountant(model, plan, 1)
    published = load_schedule("published")
    assert any(vmem_plan(published, model, plan.with_algorithms(choices), 1).collective_bytes
               != vmem_plan(published, model, plan, 1).collective_bytes for choices in VARIANTS)
    for choices in VARIANTS:
        variant = plan.with_algorithms(choices)
        twin = shared.for_plan(variant)
        for schedule in (load_schedule("published"), load_schedule("naive")):
            for slots in ("shared", "per_message"):
                probe = schedule.model_copy(update={"receive_slots": slots})
                assert twin.plan_for(probe) == vmem_plan(probe, model, variant, 1)
                assert shared.plan_for(probe) == vmem_plan(probe, model, plan, 1)
