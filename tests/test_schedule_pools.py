"""Ring-mode pools: schema, VMEM accounting, issue plan, engine, sweep and kernel on one schedule."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from hwmodels.catalog import load_chip
from hwmodels.units import MIB
from megakernel.dims import model_dims
from megakernel.dma_plan import UnsupportedSchedule, geometry
from tpusim.engine import simulate
from tpusim.schedule.program_issue import program_issue_plan
from tpusim.schedule.schema import PoolSpec, Schedule, load_schedule
from tpusim.schedule.vmem import InfeasibleSchedule, vmem_plan
from tpusim.sweep.candidates import sample
from tpusim.sweep.estimate import EstimateContext, estimate
from tpusim.sweep.space import default_space, pool_pattern_name
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program


@pytest.fixture(scope="module")
def muse() -> tuple:
    model = load_model("muse-spark@int4+bf16")
    plan = plan_for(model, 8)
    return model, plan, build_program(model, plan, batch=1, context_tokens=512)


def test_schema_checks_the_ring_mode() -> None:
    with pytest.raises(ValidationError, match="needs banks and bank_bytes"):
        PoolSpec(mode="ring", banks=12)
    base = load_schedule("muse-published").model_dump()
    with pytest.raises(ValidationError, match="no family names this pool"):
        Schedule.model_validate({**base, "pools": {"other": {"mode": "ring", "banks": 2, "bank_bytes": 1 << 20}}})
    experts_in_ring = {**base["families"], "routed_expert": {"buffers": 4, "pool": "ring"}}
    with pytest.raises(ValidationError, match="own slots"):
        Schedule.model_validate({**base, "families": experts_in_ring})


def test_ring_arena_is_its_banks_and_each_bank_holds_one_slab_at_a_time(muse: tuple) -> None:
    model, plan, program = muse
    schedule = load_schedule("muse-published")
    vmem = vmem_plan(schedule, model, plan, 1)
    assert vmem.arena_bytes["ring"] == 12 * 2 * MIB
    assert set(vmem.arena_members["ring"]) == {"gqa_proj", "latent_proj", "router", "lm_head"}
    issue = program_issue_plan(program, schedule).plan
    ring_units = sorted((u for u in issue.issue if u.ring == "pool:ring"), key=lambda u: (issue.consumer[u], u.slab))
    assert len(ring_units) > 12 * model.num_layers  # 24 MiB cannot hold a layer: the banks cycle
    slots = [issue.buffer[u] for u in ring_units]
    assert slots == [i % 12 for i in range(len(slots))]  # banks taken in turn, in consumption order
    last_consumer: dict[int, int] = {}
    for unit in ring_units:  # a bank is refilled only after its previous slab's op started
        assert issue.issue[unit] >= last_consumer.get(issue.buffer[unit], -1)
        last_consumer[issue.buffer[unit]] = issue.consumer[unit]


def test_small_parameters_naming_a_ring_pool_keep_their_own_arena(muse: tuple) -> None:
    """Small parameters are read through the whole layer, so they never stream through a
    ring: naming one leaves their arena (and the ring's) as if they had not."""
    model, plan, _program = muse
    schedule = load_schedule("muse-published")
    named = schedule.model_dump()
    named["families"]["small_params"] = {**named["families"].get("small_params", {}), "pool": "ring"}
    alone, pooled = vmem_plan(schedule, model, plan, 1), vmem_plan(Schedule.model_validate(named), model, plan, 1)
    assert pooled.arena_bytes["small_params"] == alone.arena_bytes["small_params"] < 2 * MIB
    assert pooled.arena_bytes["ring"] == 12 * 2 * MIB


def test_a_slab_larger_than_a_bank_is_infeasible(muse: tuple) -> None:
    """The smallest slab of a ring member (its row granule) must fit one bank: the accounting
    would otherwise count banks * bank_bytes for data that cannot be there."""
    model, plan, program = muse
    data = load_schedule("muse-published").model_dump()
    data["pools"]["ring"]["bank_bytes"] = 65536
    tiny = Schedule.model_validate(data)
    with pytest.raises(InfeasibleSchedule, match=r"pools\.ring: the smallest slab of .* is larger than a bank \(65536"):
        vmem_plan(tiny, model, plan, 1)
    with pytest.raises(InfeasibleSchedule, match="larger than a bank"):
        simulate(program, tiny, load_chip("tpu-v7"))


def test_more_expert_slots_slow_the_muse_step(muse: tuple) -> None:
    """The published 8-slot run is 26 % slower than 4 slots; the engine must at least agree in sign."""
    _, _, program = muse
    chip = load_chip("tpu-v7", calibrated=False)
    four = load_schedule("muse-published")
    data = four.model_dump()
    data["families"]["routed_expert"]["buffers"] = 8
    eight = Schedule.model_validate(data)
    assert simulate(program, eight, chip).step_s > simulate(program, four, chip).step_s


def test_sweep_space_samples_and_estimates_ring_pools(muse: tuple) -> None:
    _, _, program = muse
    base = default_space()
    dense = ["gqa_proj", "latent_proj", "router", "lm_head"]
    space = base.model_copy(update={
        "pool_patterns": {"dense-ring": {"ring": dense}},
        "pool_modes": {"dense-ring": {"ring": PoolSpec(mode="ring", banks=8, bank_bytes=2 * MIB)}}})
    present = ["gqa_proj", "small_params", "router", "latent_proj", "routed_expert", "lm_head"]
    schedule = sample(space, present, np.random.default_rng(3), 0)
    assert schedule.pools["ring"].mode == "ring"
    assert pool_pattern_name(schedule, space, present) == "dense-ring"
    result = estimate(EstimateContext(program, load_chip("tpu-v7", calibrated=False)), schedule)
    assert result.step_s > 0


def test_the_kernel_lays_out_a_ring_pool_as_vmem_accounting_sizes_it() -> None:
    """The kernel runs ring pools (tests/test_megakernel_ring.py and the kernel runs); its ring
    arena is the pool's banks, and a layout it cannot run is refused with the rule."""
    model = load_model("kimi-k3-mini")
    plan = plan_for(model, 1)
    dims = model_dims(model, plan)
    schedule = Schedule(name="ring", families={"kda_proj": {"pool": "ring"}, "mla_proj": {"pool": "ring"}},
                        pools={"ring": {"mode": "ring", "banks": 4, "bank_bytes": 1 << 20}})
    geo = geometry(dims, schedule)
    assert geo.arenas["ring"] * 256 == vmem_plan(schedule, model, plan, 1).arena_bytes["ring"] == 4 << 20
    small_banks = schedule.with_changes(pools={"ring": {"mode": "ring", "banks": 4, "bank_bytes": 65536}})
    with pytest.raises(UnsupportedSchedule, match=r"mla\.kv_b"):
        geometry(dims, small_banks)  # absorbed attention reads mla.kv_b twice: it must fit one bank
