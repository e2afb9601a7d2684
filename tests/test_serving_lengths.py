"""Serving traffic as benchmark clients draw it (:class:`tpusim.serving.config.Traffic`):
lengths uniform in [L x ratio, L] (SGLang bench_serving's random dataset, ratio 0 by
default), so closed-loop clients desynchronise; the choice is printed; and serving picks a
model's formats as every command does (K3 on GPUs in its GPU variant)."""

from __future__ import annotations

from typing import Any

import pytest

from tpusim.serving.config import DEFAULT_RANGE_RATIO, Traffic
from tpusim.serving.metrics import summarize
from tpusim.serving.simulator import ServingSim
from tpusim.serving.steps import StepTable


class Linear:
    def decode_s(self, batch: int, context_tokens: float) -> float:
        return 0.01 + 1e-4 * batch + 1e-7 * context_tokens

    def prefill_s(self, tokens: int, prefix_tokens: float) -> float:
        return 0.05 + 1e-5 * tokens


def _summary(traffic: Traffic) -> dict[str, Any]:
    from tpusim.serving.config import SchedulerConfig

    sim = ServingSim(StepTable(Linear(), 256), traffic, SchedulerConfig(), kv_pool_bytes=1e18,
                     kv_bytes_of=lambda tokens: float(tokens))
    return summarize(sim.run(), chips=1)


def test_the_default_is_bench_servings_random_range_ratio() -> None:
    traffic = Traffic(mode="concurrency", concurrency=4, requests=200, input_tokens=1000, output_tokens=100)
    assert traffic.range_ratio == DEFAULT_RANGE_RATIO == 0.0
    lengths = traffic.request_lengths()
    inputs, outputs = [i for i, _ in lengths], [o for _, o in lengths]
    assert min(inputs) >= 1 and max(inputs) <= 1000 and min(outputs) >= 1 and max(outputs) <= 100
    assert 400 < sum(inputs) / len(inputs) < 600  # uniform on [1, 1000]
    assert lengths == traffic.request_lengths()  # seeded
    assert lengths != traffic.model_copy(update={"seed": 1}).request_lengths()
    assert "bench_serving" in traffic.lengths_label and "--random-range-ratio 0" in traffic.lengths_label
    assert "closed loop" in traffic.arrivals_label


def test_a_ratio_sets_the_lower_bound_and_one_fixes_the_lengths() -> None:
    half = Traffic(mode="rate", rate_per_s=1.0, requests=100, input_tokens=1000, output_tokens=10, range_ratio=0.5)
    assert min(i for i, _ in half.request_lengths()) >= 500 and min(o for _, o in half.request_lengths()) >= 5
    fixed = half.model_copy(update={"range_ratio": 1.0})
    assert set(fixed.request_lengths()) == {(1000, 10)} and fixed.lengths_label.startswith("fixed")


def test_drawn_lengths_desynchronise_closed_loop_clients() -> None:
    """The issue's case: fixed lengths move every client in lockstep (mean = p50 = p99)."""
    common = {"mode": "concurrency", "concurrency": 4, "requests": 32, "input_tokens": 2000, "output_tokens": 64}
    lockstep = _summary(Traffic(**common, range_ratio=1.0))["tpot_ms"]
    drawn = _summary(Traffic(**common))["tpot_ms"]
    assert lockstep["p50"] == pytest.approx(lockstep["p99"], rel=1e-3)
    assert drawn["p99"] > drawn["p50"] * 1.01


def test_the_cli_refuses_a_ratio_out_of_range_and_length_flags_with_a_trace(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from tpusim.app.cli import main

    with pytest.raises(SystemExit) as refused:  # refused as it is parsed (hwmodels.values), before any work
        main(["serving", "--systems", "tpu-v7:16", "--random-range-ratio", "2"])
    assert refused.value.code == 2
    assert "--random-range-ratio: must be <= 1, got 2" in capsys.readouterr().err
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 10, "output_tokens": 2}\n')
    for flag, value in (("--random-range-ratio", "0.5"), ("--input-tokens", "100"), ("--requests", "4")):
        assert main(["serving", "--systems", "tpu-v7:16", "--trace", str(trace), flag, value]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"tpusim serving: error: {flag}:")


def test_serving_chooses_formats_as_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """K3 on GPUs is served in the format its model file names for GPUs (MXFP4) unless --formats."""
    import tpusim.serving.serve as serve
    from tpusim.compare.rows import SystemSpec
    from tpusim.serving.config import SchedulerConfig
    from tpusim.workload.routing import RoutingModel

    seen: list[Any] = []

    def capture(model: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(model)
        raise LookupError("stop")

    monkeypatch.setattr(serve, "engine_pricer", capture)
    call = {"traffics": [Traffic(mode="concurrency", concurrency=1)], "scheduler": SchedulerConfig(),
            "routing": RoutingModel("uniform"), "seed": 0, "calibrated": False, "plan_choice": None,
            "context_bucket_tokens": 1024, "drafter": None, "draft_tokens": None}
    for spec, formats in ((SystemSpec("b300", 8), None), (SystemSpec("tpu-v7", 16), None),
                          (SystemSpec("b300", 8), "experts=int4")):
        with pytest.raises(LookupError):
            serve._system_rows("kimi-k3", spec, formats=formats, **call)
    gpu, tpu, forced = seen
    assert gpu.variant == "mxfp4" and gpu.format_of("routed_gate_up") == "mxfp4"
    assert tpu.variant is None
    assert forced.variant is None and forced.format_of("routed_gate_up").startswith("int4")
