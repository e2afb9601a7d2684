"""Rules of the engine, one at a time: cost formulas and where expert copies are issued."""

from __future__ import annotations

from functools import cache

import pytest

from hwmodels.catalog import load_chip
from tpusim.engine import SimResult, simulate
from tpusim.engine.costs import matmul_time_s, padded_rows, weight_push_s
from tpusim.engine.execution import conventional_schedule, execution_policy
from tpusim.schedule.schema import FamilySchedule, Schedule, load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import Program, build_program


def test_matmul_cost_pads_rows_and_takes_the_larger_of_flops_and_weight_push() -> None:
    mxu = load_chip("tpu-v7", calibrated=False).matrix_unit  # 256 x 256 tile, 20 ns per push
    peak = mxu.peak_for("bf16")  # 1.1535e15 FLOP/s
    # rows pad to the 8-row sublane tile (row_pad), not to the 256-row array
    assert padded_rows(1, mxu) == 8 and padded_rows(9, mxu) == 16
    # K3 expert gate/up slice at batch 1: 3584 x 1536, 14 x 6 = 84 tiles.
    flop_s = 2 * 8 * 3584 * 1536 / peak  # ≈ 0.076 µs
    push_s = 84 * 20e-9  # 1.68 µs: at decode batch the weight push binds
    assert weight_push_s(3584, 1536, mxu) == pytest.approx(push_s)
    assert matmul_time_s(1, 3584, 1536, mxu, peak) == pytest.approx(max(flop_s, push_s))
    # A 100x slower array is FLOP-bound; at 256 rows the FLOP term takes over again.
    assert matmul_time_s(1, 3584, 1536, mxu, peak / 100) == pytest.approx(flop_s * 100)
    assert matmul_time_s(256, 3584, 1536, mxu, peak) == pytest.approx(2 * 256 * 3584 * 1536 / peak)


@cache
def mini(layers: int = 4) -> Program:
    model = load_model("kimi-k3-mini").with_layers(layers)
    return build_program(model, plan_for(model, 2, devices_per_chip=2), batch=2, context_tokens=256)


def _experts_schedule(issue: str, **extra: object) -> Schedule:
    """Experts in their own 4-slot arena, so nothing but the issue point holds them back."""
    return Schedule.model_validate({
        "name": issue, "expert_issue": issue, "max_dmas_in_flight": 16,
        "families": {"routed_expert": FamilySchedule(buffers=4).model_dump()}, **extra})


def _first_expert_copy_and_topk(result: SimResult, layer: int) -> tuple[float, float, float]:
    """(issue time of the layer's first expert copy, top-k start, top-k end)."""
    assert result.timeline is not None
    issue = min(start for track, spans in result.timeline.tracks.items() if track.startswith("dma")
                for start, _end, label in spans if label.startswith("expert.gate_up") and f" L{layer} " in label)
    topk = [(s, e) for s, e, label in result.timeline.tracks["vpu"] if label == f"moe.topk L{layer}"]
    return issue, topk[0][0], topk[-1][1]


def test_after_routing_issues_experts_when_top_k_ends() -> None:
    result = simulate(mini(), _experts_schedule("after_routing"), load_chip("tpu-v7"), record_timeline=True)
    issue, _start, end = _first_expert_copy_and_topk(result, 1)
    assert issue == pytest.approx(end, abs=1e-15)


def test_during_selection_issues_the_first_winner_inside_top_k() -> None:
    result = simulate(mini(), _experts_schedule("during_selection"), load_chip("tpu-v7"), record_timeline=True)
    issue, start, end = _first_expert_copy_and_topk(result, 1)
    assert start <= issue < end


def test_speculative_issue_starts_before_routing() -> None:
    schedule = _experts_schedule("speculative", expert_speculation_ops=3)
    result = simulate(mini(), schedule, load_chip("tpu-v7"), record_timeline=True)
    issue, start, _end = _first_expert_copy_and_topk(result, 1)
    assert issue < start


def test_speculative_misses_are_refetched_deterministically(speculated_misses) -> None:
    program = mini(8)
    schedule = _experts_schedule("speculative", expert_speculation_ops=3, speculation_miss_rate=0.25)
    first = simulate(program, schedule, load_chip("tpu-v7"), record_events=True)
    again = simulate(program, schedule, load_chip("tpu-v7"), record_events=True)
    assert first == again and first.events == again.events
    mispredicted = [e for e in first.events or [] if e[0] == "dma_start" and ".mispredicted" in e[2]]
    copies_per_expert = 4  # gate/up, its scales, down, its scales
    assert len(mispredicted) == speculated_misses(program, schedule) * copies_per_expert > 0


def test_per_op_launch_policy_disables_cross_op_prefetch() -> None:
    chip = load_chip("h200", calibrated=False)
    policy = execution_policy(chip)
    assert policy.mode == "per_op_launch" and not policy.cross_op_prefetch
    assert policy.hbm_bandwidth_bytes_per_s == pytest.approx(
        chip.hbm.sustained_bandwidth_bytes_per_s.value * chip.execution.per_op_efficiency.value)  # type: ignore[union-attr]
    conventional = conventional_schedule(load_schedule("published"))
    assert all(conventional.family(name).prefetch_distance_ops == 0 for name in conventional.families)
    assert execution_policy(load_chip("tpu-v7")).effective_schedule(load_schedule("naive")) == load_schedule("naive")
