"""The prefill program (tpusim.workload.prefill) and the engine-backed serving path.

Hand-checked on the small K3 config (kimi-k3-nano: the K3 block mix at small widths): the
same registry op sequence as decode, many rows per op, distinct experts from the routing
draw, non-absorbed MLA over the causal span, chunked KDA on the matrix unit, the lm_head on
the last row only. Then the served single request equals the engine's own prefill and
decode steps (the issue's done-means, on the real engine).
"""

from __future__ import annotations

import pytest

from tpusim.compare.rows import parse_systems
from tpusim.engine import simulate
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.prefill import (
    LINEAR_CHUNK_TOKENS,
    build_prefill_program,
    causal_keys_per_query,
)
from tpusim.workload.program import StepPhase, build_program
from tpusim.workload.registry.names import HeadOp, KdaOp, MlaOp, MoeOp
from tpusim.workload.shapes import kv_cache_bytes_per_token

MODEL = "kimi-k3-nano"


@pytest.fixture(scope="module")
def nano():
    model = load_model(MODEL)
    return model, plan_for(model, 2)


def _op(program, name, kind):
    layer = next(layer for layer in program.layers if layer.attention_kind == kind)
    return next(op for op in layer.ops if op.name == name)


def test_prefill_walks_the_decode_op_sequence(nano):
    model, plan = nano
    decode = build_program(model, plan, batch=1, context_tokens=256)
    prefill = build_prefill_program(model, plan, tokens=256)
    assert prefill.phase == StepPhase.PREFILL and decode.phase == StepPhase.DECODE
    strip = [op.name for op in decode.ops if op.expert_index is None]
    assert [op.name for op in prefill.ops if op.expert_index is None] == strip
    assert prefill.batch == 256 and prefill.kv_sequences == 1
    assert prefill.resident_rows < prefill.batch  # activations stream through in row tiles


def test_prefill_loads_the_experts_its_tokens_pick(nano):
    model, plan = nano
    prefill = build_prefill_program(model, plan, tokens=512)
    decode = build_program(model, plan, batch=1, context_tokens=512)
    assert sum(prefill.routed_experts_per_layer) > sum(decode.routed_experts_per_layer)
    layer = next(layer for layer in prefill.layers if layer.is_moe)
    rows = sum(op.matmuls[0][0] for op in layer.ops if op.expert_index is not None)
    # the critical device's experts see at most every token's top_k picks
    assert rows <= 512 * model.moe.top_k


@pytest.mark.parametrize("expert_spec", ["tp=2,expert_groups=1,expert_tp=2", "tp=2,expert_groups=2,expert_tp=1"])
def test_prefill_combine_sums_the_pairs_the_device_ran(nano, expert_spec):
    """moe.combine of a prefill sums each token's picks on this device (vLLM moe_sum, the CUTLASS
    MoE finalize): 2 x width x (token, expert) pairs, under expert TP (every pick, a column slice)
    and EP (its group's picks) alike; never every expert over every row (the decode megakernel's
    rule, kept for decode)."""
    model = nano[0]
    plan = plan_for(model, 2, choice=expert_spec)
    prefill = build_prefill_program(model, plan, tokens=512)
    decode = build_program(model, plan, batch=4, context_tokens=512)
    width = model.moe.latent_size or model.hidden_size
    for program, dense in ((prefill, False), (decode, True)):
        layer = next(layer for layer in program.layers if layer.is_moe)
        experts = [op for op in layer.ops if op.expert_index is not None]
        combine = next(op for op in layer.ops if op.name == MoeOp.COMBINE)
        pairs = sum(op.matmuls[0][0] for op in experts)
        rows = program.batch * len(experts) if dense else pairs
        assert combine.vector_flops == 2.0 * width * rows
    if plan.expert_groups == 1:  # expert TP: every token's top_k picks are on every device
        layer = next(layer for layer in prefill.layers if layer.is_moe)
        assert sum(op.matmuls[0][0] for op in layer.ops if op.expert_index is not None) == 512 * model.moe.top_k


def test_prefill_attention_forms(nano):
    model, plan = nano
    tokens, prefix = 128, 384
    prefill = build_prefill_program(model, plan, tokens=tokens, prefix_tokens=prefix)
    heads, mla = plan.attention_heads_per_device, model.mla
    keys = round(causal_keys_per_query(prefix, tokens))
    core = _op(prefill, MlaOp.CORE, "mla")
    assert core.matmuls == ((heads * tokens, mla.qk_head_dim, keys), (heads * tokens, keys, mla.v_head_dim))
    layer = core.layer
    assert core.kv_read_bytes == kv_cache_bytes_per_token(model, plan, layer) * prefix
    assert core.kv_write_bytes == kv_cache_bytes_per_token(model, plan, layer) * tokens
    kv_b = _op(prefill, MlaOp.KV_B, "mla")
    assert kv_b.matmuls[0][0] == prefix + tokens  # not absorbed: the latent of every attended token
    kda = _op(prefill, KdaOp.CORE, "kda")
    assert kda.unit == "mxu" and len(kda.matmuls) == 6
    assert kda.matmuls[0][2] == LINEAR_CHUNK_TOKENS
    head = next(op for op in prefill.head_ops if op.name == HeadOp.LM_HEAD)
    assert head.matmuls[0][0] == 1


def test_prefill_simulates_in_the_engine_and_grows_with_tokens(nano):
    from tpusim.schedule.schema import load_schedule

    model, plan = nano
    from hwmodels.catalog import make_system

    chip = make_system("tpu-v7", 1).chip
    schedule = load_schedule("published")
    short = simulate(build_prefill_program(model, plan, tokens=128), schedule, chip).step_s
    long = simulate(build_prefill_program(model, plan, tokens=1024), schedule, chip).step_s
    decode = simulate(build_program(model, plan, batch=1, context_tokens=1024), schedule, chip).step_s
    assert decode < short < long


@pytest.mark.slow
def test_served_single_request_equals_engine_prefill_plus_steps():
    """Concurrency 1 on the real engine: TTFT = prefill + one decode step, TPOT = the batch-1
    step at that context (context grid of 1 token: every query is a grid point)."""
    from tpusim.serving.config import Traffic
    from tpusim.serving.engine_steps import engine_pricer
    from tpusim.serving.serve import serving_rows
    from tpusim.workload.prefill import PREFILL_ROW_TILE

    inputs = 1024
    rows = serving_rows(MODEL, parse_systems("tpu-v7:1"), [Traffic(mode="concurrency", range_ratio=1.0, concurrency=1, requests=1,
                                                                    input_tokens=inputs, output_tokens=2)],
                        context_bucket_tokens=1)
    model = load_model(MODEL)
    pricer, _ = engine_pricer(model, parse_systems("tpu-v7:1")[0], context_tokens=inputs + 2, reference_batch=1)
    decode_schedule = pricer._schedule(1, 1, inputs)
    prefill_schedule = pricer._schedule(PREFILL_ROW_TILE, PREFILL_ROW_TILE, inputs)
    first = simulate(build_program(model, pricer.plan, batch=1, context_tokens=inputs), decode_schedule, pricer.chip)
    second = simulate(build_program(model, pricer.plan, batch=1, context_tokens=inputs + 1), decode_schedule,
                      pricer.chip)
    prefill = simulate(build_prefill_program(model, pricer.plan, tokens=inputs), prefill_schedule, pricer.chip)
    row = rows[0]
    assert row["ttft_ms"]["mean"] == pytest.approx((prefill.step_s + first.step_s) * 1e3, rel=1e-9)
    assert row["tpot_ms"]["mean"] == pytest.approx(second.step_s * 1e3, rel=1e-9)


def test_simulate_cli_prefill_phase(capsys):
    import json

    from tpusim.app.cli import main

    assert main(["simulate", "--model", MODEL, "--hardware", "tpu-v7", "--chips", "1", "--phase", "prefill",
                 "--tokens", "256", "--prefix-tokens", "256", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["phase"] == "prefill" and data["batch"] == 256 and data["context"] == 512
    assert data["tokens_per_s"] == pytest.approx(256 / (data["step_ms"] / 1e3))


@pytest.mark.slow
def test_serving_cli_reports_ttft_and_tpot(capsys, tmp_path):
    import json

    from tpusim.app.cli import main

    plot = tmp_path / "curve.png"
    assert main(["serving", "--model", MODEL, "--systems", "tpu-v7:1", "--sweep-concurrency", "1,2",
                 "--input-tokens", "256", "--output-tokens", "4", "--plot", str(plot), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [row["concurrency"] for row in data] == [1, 2]
    assert all(row["ttft_ms"]["p99"] > 0 and row["tpot_ms"]["mean"] > 0 for row in data)
    assert plot.stat().st_size > 0
