"""Property tests: random small models and random valid schedules through the engine.

Models are ``kimi-k3-mini`` cut to a few layers (``ModelConfig.with_layers``) on TPU v7
with 1-8 devices; schedules are drawn over every knob the schedule schema has.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwmodels.catalog import load_chip
from hwmodels.schema import Chip
from tpusim.engine import simulate
from tpusim.schedule.schema import SCHEDULE_FAMILIES, Schedule, load_schedule
from tpusim.workload.floors import floors
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import Program, build_program
from tpusim.workload.routing import RoutingModel

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POOLS = (None, "a", "b")
CHUNKS = (None, 4096, 16384, 65536, 262144)


@cache
def chip() -> Chip:
    return load_chip("tpu-v7", calibrated=False)


@cache
def mini_program(layers: int, devices: int, batch: int, routing: str = "uniform", seed: int = 0,
                 *, all_moe: bool = False) -> Program:
    model = load_model("kimi-k3-mini").with_layers(layers)
    if all_moe:  # no dense layer 0: every layer is alike but for its attention kind
        model = ModelConfig.model_validate({**model.model_dump(), "dense_layers": []})
    plan = plan_for(model, devices, devices_per_chip=2)
    return build_program(model, plan, batch=batch, context_tokens=256, routing=RoutingModel(routing), seed=seed)


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    families: dict[str, dict[str, Any]] = {}
    for name in SCHEDULE_FAMILIES:
        distance = draw(st.integers(0, 12))
        chunk = None if name == "routed_expert" else draw(st.sampled_from(CHUNKS))
        buffers = draw(st.integers(1, 4))
        if distance >= 1 and chunk is not None:
            buffers = max(buffers, 2)
        families[name] = {"prefetch_distance_ops": distance, "chunk_bytes": chunk, "buffers": buffers,
                          "pool": draw(st.sampled_from(POOLS))}
    issue = draw(st.sampled_from(("after_routing", "during_selection", "speculative")))
    speculative = issue == "speculative"
    return Schedule.model_validate({
        "name": "random",
        "families": families,
        "max_dmas_in_flight": draw(st.integers(1, 16)),
        "expert_issue": issue,
        "expert_speculation_ops": draw(st.integers(1, 8)) if speculative else 0,
        "speculation_miss_rate": draw(st.sampled_from((0.0, 0.25, 0.5))) if speculative else 0.0,
        "kv_tile_tokens": draw(st.sampled_from((16, 64, 128, 256))),
        "kv_buffers": draw(st.integers(1, 4)),
    })


workloads = st.tuples(st.integers(2, 6), st.sampled_from((1, 2, 8)), st.sampled_from((1, 3, 8)))


@PROPERTY_SETTINGS
@given(workload=workloads, schedule=schedules())
def test_step_is_never_below_any_floor(workload: tuple[int, int, int], schedule: Schedule) -> None:
    program = mini_program(*workload)
    result = simulate(program, schedule, chip())
    floor = floors(program, chip())
    slack = 1.0 - 1e-9
    assert result.step_s >= floor.hbm_floor_s * slack
    assert result.step_s >= (floor.compute_floor_s + floor.collective_floor_s) * slack
    assert result.step_s >= floor.floor_s * slack
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_s, rel=1e-9)
    assert 0.0 <= result.overlap_fraction <= 1.0
    assert all(0.0 <= value <= 1.0 + 1e-9 for value in result.busy_fraction.values())
    assert result.dma_bytes >= program.hbm_bytes


@PROPERTY_SETTINGS
@given(workload=workloads, schedule=schedules())
def test_vmem_never_exceeds_capacity(workload: tuple[int, int, int], schedule: Schedule) -> None:
    program = mini_program(*workload)
    result = simulate(program, schedule, chip(), record_timeline=True)
    capacity = chip().staging_memory.usable_bytes
    assert result.timeline is not None
    samples = result.timeline.counters["vmem_bytes"]
    assert max(value for _, value in samples) == result.vmem_peak_bytes
    assert result.vmem_peak_bytes <= result.vmem_static_bytes <= capacity


@PROPERTY_SETTINGS
@given(workload=workloads)
def test_naive_exposes_at_least_as_much_dma_as_published(workload: tuple[int, int, int]) -> None:
    program = mini_program(*workload)
    naive = simulate(program, load_schedule("naive"), chip())
    published = simulate(program, load_schedule("published"), chip())
    assert naive.exposed_dma_s >= published.exposed_dma_s
    assert naive.step_s >= published.step_s


@settings(max_examples=15, deadline=None)
@given(workload=workloads, schedule=schedules(), seed=st.integers(0, 3))
def test_same_inputs_and_seed_give_identical_results(workload: tuple[int, int, int], schedule: Schedule,
                                                     seed: int) -> None:
    layers, devices, batch = workload
    first = simulate(mini_program(layers, devices, batch, seed=seed), schedule, chip(), record_events=True)
    model = load_model("kimi-k3-mini").with_layers(layers)
    rebuilt = build_program(model, plan_for(model, devices, devices_per_chip=2), batch=batch,
                            context_tokens=256, routing=RoutingModel("uniform"), seed=seed)
    second = simulate(rebuilt, schedule, chip(), record_events=True)
    assert first == second
    assert first.events == second.events


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(schedule=schedules(), layers=st.sampled_from((12, 16)), batch=st.sampled_from((1, 4)))
def test_doubling_layers_doubles_layer_time(schedule: Schedule, layers: int, batch: int) -> None:
    """Layer time (the step less its per-step overhead, the head and the drain) scales with depth.

    One device, identical routing and no dense layer 0: every layer loads the same weights
    and experts but for its attention kind, whose KDA/MLA mix is the same for n and 2n
    layers (n a multiple of 4). Only the first layer (nothing prefetched yet) is special.
    """
    short = simulate(mini_program(layers, 1, batch, "identical", all_moe=True), schedule, chip())
    long = simulate(mini_program(2 * layers, 1, batch, "identical", all_moe=True), schedule, chip())

    def layer_time(result: Any) -> float:
        return sum(value for layer, value in result.layer_s.items() if layer >= 0)

    assert layer_time(long) / layer_time(short) == pytest.approx(2.0, rel=0.05)
