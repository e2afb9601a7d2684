"""The sweep's analytic estimate: bounded by the floors, close to the engine, ranks like it."""

from __future__ import annotations

import random
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwmodels.catalog import make_system
from tpusim.engine import simulate
from tpusim.schedule.schema import BUILTIN_SCHEDULES, load_schedule
from tpusim.sweep.candidates import candidates
from tpusim.sweep.estimate import EstimateContext, estimate
from tpusim.sweep.estimate_resources import AdmissionPool, FluidHbm
from tpusim.sweep.prune import VmemAccountant, check_candidate
from tpusim.sweep.report import spearman
from tpusim.sweep.space import default_space
from tpusim.workload.floors import floors
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program

K3_FAMILIES = ["kda_proj", "mla_proj", "small_params", "router", "latent_proj", "shared_expert",
               "routed_expert", "dense_mlp", "lm_head"]


@cache
def workload(name: str, chips: int, batch: int) -> tuple:
    model = load_model(name)
    system = make_system("tpu-v7", chips)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    program = build_program(model, plan, batch=batch)
    return model, plan, system, program, EstimateContext(program, system.chip)


def test_estimate_is_never_below_the_analytic_floor() -> None:
    for name, chips, batch in (("kimi-k3", 16, 1), ("kimi-k3", 16, 8), ("kimi-k3-mini", 2, 2)):
        _model, _plan, system, program, ctx = workload(name, chips, batch)
        floor_s = floors(program, system.chip).floor_s
        for builtin in BUILTIN_SCHEDULES:
            result = estimate(ctx, load_schedule(builtin))
            assert result.step_s >= floor_s, (name, batch, builtin)
            assert 0.0 <= result.exposed_dma_s < result.step_s
            assert result.tokens_per_s == batch / result.step_s


@pytest.mark.slow
def test_estimate_tracks_the_engine_on_the_builtins() -> None:
    """Within 22 % of the simulated step for every built-in (K3 batch 1 and 8, and the mini).

    The estimate ranks; the 12-layer engine screen refines. Worst case measured: K3 batch 1
    published, estimate 20.4 % under the engine (3.52 vs 4.42 ms), layer-double-buffer 19.2 %:
    with collectives as remote copies the stream waits 0.8 ms on collectives instead of
    2.7 ms, so the ~1 ms of exposed copies the estimate's fluid misses (many copies in flight
    sharing the bandwidth) is a larger share of a shorter step."""
    for name, chips, batch in (("kimi-k3", 16, 1), ("kimi-k3", 16, 8), ("kimi-k3-mini", 2, 2)):
        _model, _plan, system, program, ctx = workload(name, chips, batch)
        for builtin in BUILTIN_SCHEDULES:
            schedule = load_schedule(builtin)
            if (name, batch, builtin) == ("kimi-k3", 8, "layer-double-buffer"):
                continue  # 58.89 MiB with its collective buffers: does not fit (docs/vmem.md)
            simulated = simulate(program, schedule, system.chip).step_s
            estimated = estimate(ctx, schedule).step_s
            assert abs(estimated - simulated) / simulated < 0.22, (name, batch, builtin, estimated, simulated)


@pytest.mark.slow  # the engine on random K3 candidates (~4.5 s)
def test_estimate_ranks_random_k3_candidates_like_the_engine() -> None:
    model, plan, system, program, ctx = workload("kimi-k3", 16, 1)
    space = default_space().with_capacity(system.chip.staging_memory.usable_bytes, "test")
    space = space.model_copy(update={"samples": 200, "neighbours": False})
    accountant = VmemAccountant(model, plan, 1)
    pool = [c for c in candidates(space, K3_FAMILIES, seed=11, guide=accountant)
            if check_candidate(c.schedule, space, accountant).feasible]
    picked = random.Random(0).sample(pool, 16)
    estimated = [estimate(ctx, c.schedule, accountant.plan_for(c.schedule)).step_s for c in picked]
    simulated = [simulate(program, c.schedule, system.chip).step_s for c in picked]
    rho = spearman(estimated, simulated)
    assert rho is not None and rho > 0.7, rho


def test_naive_is_estimated_slowest_and_published_fastest_of_the_builtins() -> None:
    for batch in (1, 8):
        ctx = workload("kimi-k3", 16, batch)[4]
        times = {name: estimate(ctx, load_schedule(name)).step_s for name in BUILTIN_SCHEDULES}
        assert times["published"] < times["layer-double-buffer"] < times["naive"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e-3), st.floats(1e3, 5e7)), min_size=1, max_size=40),
       st.integers(1, 16))
def test_fluid_hbm_never_exceeds_its_bandwidth(copies: list[tuple[float, float]], max_in_flight: int) -> None:
    """Invariant of the HBM model: by any time T it has moved at most bandwidth x T bytes."""
    ctx = workload("kimi-k3-mini", 2, 2)[4]
    hbm = FluidHbm(ctx.bandwidth_bytes_per_s, ctx.issue_latency_s, ctx.dma, max_in_flight)
    landed = []
    for ready, nbytes in copies:
        land = hbm.copy(ready, nbytes)
        assert land >= ready + nbytes / ctx.bandwidth_bytes_per_s
        landed.append((land, nbytes))
    for horizon, _ in landed:
        moved = sum(n for land, n in landed if land <= horizon)
        assert moved <= ctx.bandwidth_bytes_per_s * horizon * (1 + 1e-9) + 1.0


@given(st.lists(st.tuples(st.floats(0, 1.0), st.integers(1, 100), st.floats(0, 1.0)), min_size=1, max_size=30))
def test_pool_admits_in_order_and_never_overfills(slabs: list[tuple[float, int, float]]) -> None:
    """Invariant of a pool: admissions are in order and held bytes never exceed the arena."""
    pool = AdmissionPool(100)
    admitted = []
    for ready, nbytes, hold_s in slabs:
        at = pool.admit(ready, nbytes)
        assert at >= ready and (not admitted or at >= admitted[-1][0])
        resident = sum(n for start, end, n in admitted if start <= at < end)
        assert resident + nbytes <= 100
        admitted.append((at, at + hold_s, nbytes))
        pool.hold(at + hold_s, nbytes)


def test_a_verify_step_reads_its_sequences_kv_not_its_rows() -> None:
    """16 rows of 2 sequences at a 65536-token context, where KV reads dominate: the estimate
    stays within 5 % of the engine (it was 41 % under when it sized KV tiles by rows)."""
    model = load_model("kimi-k3-mini")
    system = make_system("tpu-v7", 2)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    program = build_program(model, plan, batch=16, sequences=2, context_tokens=65536)
    context = EstimateContext(program, system.chip)
    for name in ("published", "naive"):
        simulated = simulate(program, load_schedule(name), system.chip).step_s
        estimated = estimate(context, load_schedule(name)).step_s
        assert abs(estimated - simulated) / simulated < 0.05, (name, estimated, simulated)
