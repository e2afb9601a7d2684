"""The serving simulator, worked by hand on closed-form step models (tpusim.serving).

A linear step model makes the grid cache exact everywhere (bilinear interpolation of a
function linear in batch and context is the function), so every expectation below is a
hand sum of step times.
"""

from __future__ import annotations

import math

import pytest

from tpusim.serving.config import SchedulerConfig, TraceRequest, Traffic
from tpusim.serving.metrics import summarize
from tpusim.serving.simulator import ServingSim
from tpusim.serving.steps import StepTable, bucket_bracket, power_of_two_bracket


class Linear:
    """decode = a + b * batch + c * context; prefill = p + q * tokens + r * prefix (seconds)."""

    def __init__(self, a: float = 0.01, b: float = 1e-4, c: float = 1e-7, p: float = 0.05, q: float = 1e-5,
                 r: float = 0.0) -> None:
        self.a, self.b, self.c, self.p, self.q, self.r = a, b, c, p, q, r
        self.calls: list[tuple[str, int, int]] = []

    def decode_s(self, batch: int, context_tokens: float) -> float:
        self.calls.append(("decode", batch, int(context_tokens)))
        return self.a + self.b * batch + self.c * context_tokens

    def prefill_s(self, tokens: int, prefix_tokens: float) -> float:
        self.calls.append(("prefill", tokens, int(prefix_tokens)))
        return self.p + self.q * tokens + self.r * prefix_tokens


def _run(steps, traffic, scheduler=None, **kv):
    run = ServingSim(steps, traffic, scheduler or SchedulerConfig(), **kv).run()
    return run, summarize(run, chips=4)


def test_single_request_is_prefill_plus_decode_steps():
    pricer = Linear()
    table = StepTable(pricer, context_bucket_tokens=256)
    inputs, outputs = 1000, 50
    run, summary = _run(table, Traffic(mode="concurrency", range_ratio=1.0, concurrency=1, requests=1, input_tokens=inputs,
                                       output_tokens=outputs))
    request = run.requests[0]
    steps = [pricer.decode_s(1, inputs + k) for k in range(outputs)]  # context before the k-th token
    prefill = pricer.prefill_s(inputs, 0)
    assert request.ttft_s == pytest.approx(prefill + steps[0], rel=1e-12)
    assert request.finish_s == pytest.approx(prefill + sum(steps), rel=1e-12)
    assert request.tpot_s == pytest.approx(sum(steps[1:]) / (outputs - 1), rel=1e-12)
    assert summary["ttft_parts_ms"]["prefill"] == pytest.approx(prefill * 1e3)
    assert summary["ttft_bound"] == "prefill compute" and summary["tpot_bound"] == "decode step"


def test_concurrency_one_tpot_is_the_batch_one_step_at_that_context():
    """Done-means: at concurrency 1 TPOT = the batch-1 decode step at the request's (mean)
    context, TTFT = the prefill prediction + one step."""
    pricer = Linear()
    table = StepTable(pricer)
    inputs, outputs = 8192, 1024
    _, summary = _run(table, Traffic(mode="concurrency", range_ratio=1.0, concurrency=1, requests=3, input_tokens=inputs,
                                       output_tokens=outputs))
    mean_context = inputs + (outputs) / 2  # the tokens after the first: contexts inputs+1 .. inputs+outputs-1
    assert summary["tpot_ms"]["mean"] == pytest.approx(table.decode_s(1, mean_context) * 1e3, rel=1e-9)
    assert summary["ttft_ms"]["p99"] == pytest.approx(
        (table.prefill_s(inputs, 0) + table.decode_s(1, inputs)) * 1e3, rel=1e-9)
    assert summary["ttft_parts_ms"]["queue"] == 0.0


def test_first_token_from_prefill_makes_ttft_the_prefill():
    pricer = Linear()
    run, _ = _run(StepTable(pricer), Traffic(mode="concurrency", range_ratio=1.0, concurrency=1, requests=1, input_tokens=300,
                                             output_tokens=5), SchedulerConfig(first_token_from_prefill=True))
    assert run.requests[0].ttft_s == pytest.approx(pricer.prefill_s(300, 0))


def test_the_request_overhead_adds_to_every_ttft_and_is_its_own_part():
    traffic = Traffic(mode="concurrency", range_ratio=1.0, concurrency=1, requests=2, input_tokens=300,
                      output_tokens=5)
    _, plain = _run(StepTable(Linear()), traffic)
    _, paid = _run(StepTable(Linear()), traffic, SchedulerConfig(request_overhead_s=0.064))
    for stat in ("mean", "p50", "p99"):
        assert paid["ttft_ms"][stat] == pytest.approx(plain["ttft_ms"][stat] + 64.0)
    assert paid["ttft_parts_ms"]["overhead"] == pytest.approx(64.0) and plain["ttft_parts_ms"]["overhead"] == 0.0
    assert paid["tpot_ms"] == plain["tpot_ms"]  # outside the scheduler: no step moves


def test_a_calibrated_gpu_s_request_overhead_reaches_the_scheduler():
    from hwmodels.catalog import load_chip
    from hwmodels.overlay import CalibratedValue, CalibrationOverlay, apply_overlay
    from tpusim.serving.serve import _request_overhead_s

    plain = load_chip("b200", calibrated=False)
    overlay = CalibrationOverlay(chip="b200", fitted_on="test",
                                 parameters={"execution.gpu.request_overhead_s": CalibratedValue(value=0.064)})
    fitted = apply_overlay(plain, overlay, origin="test")
    assert _request_overhead_s(plain, SchedulerConfig()) == 0.0
    assert _request_overhead_s(fitted, SchedulerConfig()) == pytest.approx(0.064)
    assert _request_overhead_s(fitted, SchedulerConfig(request_overhead_s=0.01)) == 0.01  # the caller's wins


def test_saturated_throughput_is_batch_over_step():
    step_s, batch = 0.02, 8
    steps = Linear(a=step_s, b=0.0, c=0.0, p=1e-9, q=0.0)
    _, summary = _run(StepTable(steps), Traffic(mode="concurrency", range_ratio=1.0, concurrency=batch, requests=4 * batch,
                                                input_tokens=64, output_tokens=2000))
    assert summary["output_tokens_per_s"] == pytest.approx(batch / step_s, rel=1e-4)
    assert summary["output_tokens_per_s_per_chip"] == pytest.approx(batch / step_s / 4, rel=1e-4)
    assert summary["tokens_per_s_per_user"] == pytest.approx(1 / step_s, rel=1e-9)
    assert summary["mean_decode_batch"] == pytest.approx(batch, rel=1e-3)


def test_littles_law_holds_on_poisson_arrivals():
    _, summary = _run(StepTable(Linear()), Traffic(mode="rate", range_ratio=1.0, rate_per_s=4.0, requests=200, input_tokens=500,
                                                   output_tokens=40, seed=3))
    assert summary["completed"] == 200
    assert summary["mean_in_system"] == pytest.approx(
        summary["arrival_rate_per_s"] * summary["mean_time_in_system_s"], rel=1e-9)
    assert summary["mean_in_system"] > 1.0  # a loaded system: requests overlap


def test_kv_exhaustion_queues_instead_of_over_committing():
    per_request = 1000.0  # bytes of KV per request (any context)
    run, summary = _run(StepTable(Linear()), Traffic(mode="concurrency", range_ratio=1.0, concurrency=8, requests=16,
                                                     input_tokens=200, output_tokens=30),
                        kv_pool_bytes=2.5 * per_request, kv_bytes_of=lambda tokens: per_request)
    assert summary["completed"] == 16 and summary["refused"] == 0
    assert run.kv_peak_bytes <= run.kv_pool_bytes
    assert run.peak_running == 2
    assert summary["kv_bound"] and summary["requests_waiting_for_kv"] > 0
    assert summary["ttft_parts_ms"]["queue"] > 0


def test_a_request_larger_than_the_pool_is_refused():
    run, summary = _run(StepTable(Linear()), Traffic(mode="trace", trace=(
        TraceRequest(arrival_s=0.0, input_tokens=100, output_tokens=5),
        TraceRequest(arrival_s=0.1, input_tokens=5000, output_tokens=5))),
        kv_pool_bytes=1000.0, kv_bytes_of=lambda tokens: float(tokens))
    assert summary["refused"] == 1 and summary["completed"] == 1
    assert [r.refused for r in run.requests] == [False, True]


def test_max_running_requests_caps_the_batch():
    run, _ = _run(StepTable(Linear()), Traffic(mode="concurrency", range_ratio=1.0, concurrency=10, requests=10, input_tokens=50,
                                               output_tokens=5), SchedulerConfig(max_running_requests=3))
    assert run.peak_running == 3


def test_chunked_prefill_splits_a_long_prompt():
    pricer = Linear()
    run, _ = _run(StepTable(pricer, context_bucket_tokens=1000), Traffic(
        mode="concurrency", range_ratio=1.0, concurrency=1, requests=1, input_tokens=2500, output_tokens=2),
        SchedulerConfig(chunk_tokens=1000))
    assert run.prefill_steps == 3
    assert run.requests[0].own_prefill_s == pytest.approx(
        pricer.prefill_s(1000, 0) + pricer.prefill_s(1000, 1000) + pricer.prefill_s(500, 2000))


def test_step_table_is_exact_at_grid_points_and_prices_each_once():
    class Curved:
        def decode_s(self, batch, context):
            return math.sqrt(batch) + context ** 1.5

        def prefill_s(self, tokens, prefix):
            return tokens ** 1.2 + prefix

    table = StepTable(Curved(), context_bucket_tokens=512)
    assert table.decode_s(16, 2048) == Curved().decode_s(16, 2048)
    assert table.prefill_s(8192, 0) == Curved().prefill_s(8192, 0)
    between = table.decode_s(12, 2048)
    assert Curved().decode_s(8, 2048) < between < Curved().decode_s(16, 2048)
    priced = table.priced
    table.decode_s(16, 2048)
    assert table.priced == priced
    assert power_of_two_bracket(12) == (8, 16) and power_of_two_bracket(16) == (16, 16)
    assert bucket_bracket(100, 512, 1) == (1, 512) and bucket_bracket(1024, 512, 1) == (1024, 1024)
