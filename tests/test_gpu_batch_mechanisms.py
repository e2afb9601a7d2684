"""What grows with the batch on a GPU serving stack (tpusim.engine.gpu_batch) and the
chunked-prefill stall of aggregated serving (tpusim.serving.interference)."""

from __future__ import annotations

import pytest

from calibration.core.parameters import chip_with
from hwmodels.catalog import load_chip
from tpusim.engine import simulate
from tpusim.engine.gpu import gpu_breakdown, gpu_variant
from tpusim.engine.gpu_batch import (
    BATCH_TERMS,
    batch_terms,
    distinct_by_layer,
    expected_distinct,
    graph_batch_size,
    host_bound_s,
    local_experts,
    prefill_step_s,
)
from tpusim.schedule.schema import load_schedule
from tpusim.serving.config import SchedulerConfig, TraceRequest, Traffic
from tpusim.serving.interference import prefill_stall_s
from tpusim.serving.metrics import summarize
from tpusim.serving.simulator import ServingSim
from tpusim.serving.steps import StepTable
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.prefill import build_prefill_program
from tpusim.workload.program import build_program

FIGURES = {"execution.gpu.grouped_gemm_expert_s": 1e-6, "execution.gpu.attention_sequence_s": 2e-7,
           "execution.gpu.sampling_sequence_s": 5e-6}


def _program(batch: int, context: int = 2048):
    model = load_model("kimi-k3-nano")
    plan = plan_for(model, 8, devices_per_chip=1, intra_link="nvlink", choice="tp=8,expert_groups=8,expert_tp=1")
    return build_program(model, plan, batch=batch, context_tokens=context, sequences=batch)


def _chip(figures: dict[str, float] | None = None):
    chip = load_chip("b200", calibrated=False)
    return gpu_variant(chip_with(chip, figures) if figures else chip, "stack")


def test_graph_batch_buckets_pad_to_the_captured_sizes():
    assert graph_batch_size(100, "vllm") == 104 and graph_batch_size(12, "vllm") == 16
    assert graph_batch_size(12, "sglang") == 12 and graph_batch_size(13, "sglang") == 16
    assert graph_batch_size(64, "vllm") == 64 and graph_batch_size(1000, "vllm") == 1000  # beyond: eager


def test_expected_distinct_experts_is_the_uniform_routing_expectation():
    assert expected_distinct(96, 8, 384, 1) == pytest.approx(96 * 8 / 384)
    assert expected_distinct(96, 8, 384, 10_000) == pytest.approx(96)


def test_no_figures_no_terms_and_the_step_is_unchanged():
    program = _program(8)
    assert batch_terms(_chip(), program) == {}
    assert simulate(program, load_schedule("naive"), _chip()).batch_terms_s == {}


def test_terms_by_hand_and_paid_serially_on_the_step():
    """Each term by its formula; the engine's step grows by exactly their sum and the breakdown
    names each and still sums to the step."""
    batch = 12
    program = _program(batch)
    chip = _chip(FIGURES)
    terms = batch_terms(chip, program)
    model = program.model
    experts = local_experts(program)
    first = expected_distinct(experts, model.moe.top_k, model.moe.num_experts, 1)
    extra = sum(max(0.0, d - first) for d in distinct_by_layer(program).values())
    assert terms["expert_groups"] == pytest.approx(1e-6 * 2 * extra)
    assert terms["attention_seqs"] == pytest.approx(2e-7 * model.num_layers * (batch - 1))
    assert terms["sampling_sched"] == pytest.approx(5e-6 * (batch - 1))
    padded = expected_distinct(experts, model.moe.top_k, model.moe.num_experts, 16) - expected_distinct(
        experts, model.moe.top_k, model.moe.num_experts, batch)  # vLLM pads 12 to 16
    assert terms["graph_padding"] == pytest.approx(1e-6 * 2 * len(model.moe_layers) * padded)
    without = simulate(program, load_schedule("naive"), _chip()).step_s
    result = simulate(program, load_schedule("naive"), chip)
    assert result.step_s == pytest.approx(without + sum(terms.values()), rel=1e-9)
    breakdown = gpu_breakdown(result)
    assert all(breakdown[key] == pytest.approx(terms[key]) for key in BATCH_TERMS)
    assert sum(breakdown.values()) == pytest.approx(result.step_s, rel=1e-9)


def test_terms_grow_with_the_batch_and_vanish_at_one_sequence():
    chip = _chip(FIGURES)
    one, many = batch_terms(chip, _program(1)), batch_terms(chip, _program(32))
    assert one["attention_seqs"] == one["sampling_sched"] == 0.0
    assert sum(many.values()) > sum(one.values()) + 31 * 5e-6


class _Constant:
    """decode = a, prefill = p seconds, whatever the batch and context."""

    def __init__(self, a: float, p: float) -> None:
        self.a, self.p = a, p

    def decode_s(self, batch: int, context_tokens: float) -> float:
        return self.a

    def prefill_s(self, tokens: int, prefix_tokens: float) -> float:
        return self.p


def test_prefill_stall_matches_the_serving_simulator_in_steady_state():
    """Staggered requests keep about C in flight; the simulator's mean TPOT is the decode step
    plus (C - 1) prefills per OSL tokens (the closed form), within 10 %."""
    a, p, osl, concurrency = 0.02, 0.2, 200, 8
    tpot = a + prefill_stall_s(concurrency, p, osl)
    lifetime = p + osl * tpot
    trace = tuple(TraceRequest(arrival_s=i * lifetime / concurrency, input_tokens=1000, output_tokens=osl)
                  for i in range(12 * concurrency))
    run = ServingSim(StepTable(_Constant(a, p), context_bucket_tokens=256), Traffic(mode="trace", trace=trace),
                     SchedulerConfig()).run()
    steady = [r.tpot_s for r in run.requests[3 * concurrency:-3 * concurrency]]
    assert sum(steady) / len(steady) == pytest.approx(tpot, rel=0.10)
    assert summarize(run, chips=1)["tpot_ms"]["mean"] > a * 1e3  # the stall is there
    assert prefill_stall_s(concurrency, p, osl, disaggregated=True) == 0.0


def test_a_mixed_prefill_chunk_costs_only_its_time_beyond_the_decode_step():
    assert prefill_stall_s(9, 0.2, 100, mixed_step_s=0.05) == pytest.approx(8 * 0.15 / 100)
    assert prefill_stall_s(9, 0.02, 100, mixed_step_s=0.05) == 0.0


def test_a_prefill_without_a_cuda_graph_lasts_at_least_its_host_time():
    """prefill_step_s: the engine's step, or its launches x eager_host_op_s when longer; no figure
    or a GPU megakernel (one launch) leaves the step alone."""
    model = load_model("kimi-k3-nano")
    plan = plan_for(model, 8, devices_per_chip=1, intra_link="nvlink", choice="tp=8,expert_groups=8,expert_tp=1")
    short = build_prefill_program(model, plan, tokens=64, prefix_tokens=0)
    plain = simulate(short, load_schedule("naive"), _chip())
    assert plain.launch_count > 0 and host_bound_s(_chip(), plain) == 0.0
    assert prefill_step_s(_chip(), plain) == plain.step_s
    slow_host = plain.step_s / plain.launch_count * 3  # the host needs 3x the GPU's time
    chip = _chip({"execution.gpu.eager_host_op_s": slow_host})
    result = simulate(short, load_schedule("naive"), chip)
    assert result.step_s == pytest.approx(plain.step_s)  # the engine's step itself is unchanged
    assert prefill_step_s(chip, result) == pytest.approx(result.launch_count * slow_host)
    assert prefill_step_s(chip, result) == pytest.approx(3 * plain.step_s, rel=1e-6)
    fast_host = _chip({"execution.gpu.eager_host_op_s": plain.step_s / plain.launch_count / 3})
    assert prefill_step_s(fast_host, result) == result.step_s  # GPU-bound: the host keeps ahead
    megakernel = gpu_variant(chip, "megakernel")
    assert host_bound_s(megakernel, simulate(short, load_schedule("naive"), megakernel)) == 0.0

