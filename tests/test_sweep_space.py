"""The sweep space: knobs, seeded candidates, VMEM-guided sampling and cheap pruning."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache

import pytest
from pydantic import ValidationError

from hwmodels.catalog import make_system
from tpusim.schedule.schema import BUILTIN_SCHEDULES, Schedule, load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.sweep.candidates import candidates, neighbours
from tpusim.sweep.prune import VmemAccountant, check_candidate
from tpusim.sweep.space import (
    FamilySpace,
    SweepSpace,
    default_space,
    knob_names,
    pool_pattern_name,
    schedule_knobs,
)
from tpusim.workload.model_catalog import load_model, plan_for

K3_FAMILIES = ["kda_proj", "mla_proj", "small_params", "router", "latent_proj", "shared_expert",
               "routed_expert", "dense_mlp", "lm_head"]


@cache
def k3() -> tuple:
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    space = default_space().with_capacity(system.chip.staging_memory.usable_bytes, "tpu-v7 usable VMEM")
    return model, plan, system, space


def test_default_space_round_trips_as_json() -> None:
    space = default_space()
    again = SweepSpace.model_validate(json.loads(json.dumps(space.model_dump(mode="json"))))
    assert again == space
    assert space.constraints.vmem_capacity_bytes is None  # filled in per chip
    filled = space.with_capacity(60817408, "test")
    assert filled.constraints.vmem_capacity_bytes == 60817408
    assert filled.with_capacity(1.0, "ignored") == filled  # an explicit capacity wins


def test_space_rejects_unknown_families_and_chunked_experts() -> None:
    with pytest.raises(ValidationError, match="unknown family"):
        SweepSpace.model_validate({**default_space().model_dump(), "families": {"bogus": FamilySpace(
            distances=[0], chunk_bytes=[None], buffers=[1])}})
    with pytest.raises(ValidationError, match="copied whole"):
        SweepSpace.model_validate({**default_space().model_dump(), "families": {"routed_expert": FamilySpace(
            distances=[0], chunk_bytes=[1 << 20], buffers=[2])}})
    with pytest.raises(ValidationError, match="two pools"):
        SweepSpace.model_validate({**default_space().model_dump(),
                                   "pool_patterns": {"x": {"a": ["router"], "b": ["router"]}}})


@pytest.mark.parametrize(("field", "values", "bound"), [
    ("buffers", [2, 0], "buffers: 0"), ("buffers", [65], "buffers: 65"),
    ("distances", [-1], "distances: -1"), ("chunk_bytes", [None, 1024], "chunk_bytes: 1024"),
])
def test_family_space_values_must_be_ones_the_schedule_schema_accepts(field: str, values: list, bound: str) -> None:
    knobs = {"distances": [0], "chunk_bytes": [None], "buffers": [2], field: values}
    with pytest.raises(ValidationError, match=bound):
        FamilySpace(**knobs)


def test_family_triples_exclude_what_the_schema_forbids() -> None:
    triples = FamilySpace(distances=[0, 2], chunk_bytes=[None, 1 << 20], buffers=[1, 2]).triples()
    assert (2, 1 << 20, 1) not in triples  # distance > 0, chunked, one buffer: rejected by Schedule
    assert (0, 1 << 20, 1) in triples and (2, None, 1) in triples and (2, 1 << 20, 2) in triples


def test_candidates_are_deterministic_unique_and_start_with_the_builtins() -> None:
    model, plan, _system, space = k3()
    small = space.model_copy(update={"samples": 60})
    guide = VmemAccountant(model, plan, 1)
    first = candidates(small, K3_FAMILIES, seed=7, guide=guide)
    again = candidates(small, K3_FAMILIES, seed=7, guide=VmemAccountant(model, plan, 1))
    other = candidates(small, K3_FAMILIES, seed=8, guide=guide)
    assert [c.hash for c in first] == [c.hash for c in again]
    assert [c.hash for c in first] != [c.hash for c in other]
    assert len({c.hash for c in first}) == len(first)
    assert [c.schedule.name for c in first[:3]] == list(BUILTIN_SCHEDULES)
    assert Counter(c.source for c in first)["sample"] == 60


def test_default_space_gives_k3_over_a_thousand_candidates() -> None:
    model, plan, _system, space = k3()
    cands = candidates(space, K3_FAMILIES, seed=0, guide=VmemAccountant(model, plan, 1))
    assert len(cands) >= 1000


def test_guided_samples_fit_vmem_and_uniform_ones_mostly_do_not() -> None:
    model, plan, _system, space = k3()
    for batch in (1, 8):
        accountant = VmemAccountant(model, plan, batch)
        guided = space.model_copy(update={"samples": 80, "neighbours": False})
        cands = [c for c in candidates(guided, K3_FAMILIES, seed=3, guide=accountant) if c.source == "sample"]
        assert all(check_candidate(c.schedule, guided, accountant).feasible for c in cands)
    uniform = space.model_copy(update={"samples": 80, "neighbours": False, "sampler": "uniform"})
    cands = [c for c in candidates(uniform, K3_FAMILIES, seed=3, guide=accountant) if c.source == "sample"]
    verdicts = [check_candidate(c.schedule, uniform, accountant) for c in cands]
    pruned = [v for v in verdicts if not v.feasible]
    assert len(pruned) > len(verdicts) / 2
    assert all(v.reason.startswith("vmem: schedule needs") and "MiB" in v.reason for v in pruned)


def test_memoised_vmem_accounting_equals_vmem_plan() -> None:
    model, plan, _system, space = k3()
    for batch in (1, 8):
        accountant = VmemAccountant(model, plan, batch)
        mixed = space.model_copy(update={"samples": 25, "sampler": "uniform"})
        for cand in candidates(mixed, K3_FAMILIES, seed=batch)[::7]:
            fast = accountant.plan_for(cand.schedule)
            slow = vmem_plan(cand.schedule, model, plan, batch)
            assert fast.total_bytes == slow.total_bytes
            assert fast.arena_bytes == slow.arena_bytes
            assert fast.family_bytes == slow.family_bytes
        assert accountant.calls < 60  # memoised: far fewer vmem_plan calls than schedules


def test_dma_limit_prunes_with_a_reason() -> None:
    model, plan, _system, space = k3()
    schedule = load_schedule("published").with_changes(max_dmas_in_flight=64)
    verdict = check_candidate(schedule, space, VmemAccountant(model, plan, 1))
    assert not verdict.feasible and verdict.reason.startswith("dmas: max_dmas_in_flight 64")


def test_builtin_pool_patterns_and_knobs() -> None:
    _model, _plan, _system, space = k3()
    published, naive = load_schedule("published"), load_schedule("naive")
    assert pool_pattern_name(published, space, K3_FAMILIES) == "attention+mlp"
    assert pool_pattern_name(naive, space, K3_FAMILIES) == "all"
    knobs = schedule_knobs(published, space, K3_FAMILIES)
    assert list(knobs) == knob_names(K3_FAMILIES)
    assert knobs["mla_proj.chunk_mib"] == 2.75 and knobs["kda_proj.chunk_mib"] == ""
    assert knobs["expert_issue"] == "during_selection" and knobs["routed_expert.buffers"] == 4


def test_neighbours_change_exactly_one_knob() -> None:
    _model, _plan, _system, space = k3()
    base = load_schedule("published")
    base_knobs = schedule_knobs(base, space, K3_FAMILIES)
    seen = 0
    for schedule in neighbours(base, space, K3_FAMILIES):
        assert isinstance(schedule, Schedule)
        changed = [k for k, v in schedule_knobs(schedule, space, K3_FAMILIES).items() if base_knobs[k] != v]
        assert len(changed) == 1, (schedule.name, changed)
        seen += 1
    assert seen > 80


def ring_space(samples: int) -> SweepSpace:
    """The default space with its attention+experts pool a ring of banks, which the schema
    forbids (routed_expert keeps its own slots): every draw of that pattern is rejected."""
    data = default_space().model_dump(mode="json")
    ring = {"mode": "ring", "banks": 4, "bank_bytes": 1 << 20}
    return SweepSpace.model_validate({**data, "samples": samples, "pool_modes": {"attention+experts": {"main": ring}}})


def test_schema_rejections_stay_candidates_with_a_one_line_reason() -> None:
    space = ring_space(40)
    first = candidates(space, K3_FAMILIES, seed=0)
    rejected = [c for c in first if c.rejected]
    again = [c for c in candidates(space, K3_FAMILIES, seed=0) if c.rejected]
    assert [(c.hash, c.rejected) for c in rejected] == [(c.hash, c.rejected) for c in again]  # stable for --resume
    assert len({c.hash for c in first}) == len(first)
    by_source = Counter(c.source for c in rejected)
    assert by_source["sample"] and by_source["neighbour"]
    assert any(c.schedule.name.endswith("~pools=attention+experts") and "routed_expert" in c.rejected
               for c in rejected)  # a built-in moved into the ring pool
    assert any(c.source == "neighbour" and "buffers >= 2" in c.rejected for c in rejected)  # a chunked single buffer
    for cand in first:  # the schema itself, asked again, agrees with every verdict
        data = cand.schedule.model_dump(mode="json")
        if cand.rejected:
            assert cand.rejected.startswith("schema: ") and "\n" not in cand.rejected
            with pytest.raises(ValidationError):
                Schedule.model_validate(data)
        else:
            Schedule.model_validate(data)
    valid = {s.content_hash() for base in map(load_schedule, BUILTIN_SCHEDULES)
             for s in neighbours(base, space, K3_FAMILIES)}
    assert valid.isdisjoint(c.hash for c in rejected)  # neighbours() yields only valid schedules
