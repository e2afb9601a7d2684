"""Model configs, sharding plans, per-device shapes, routing and the per-device program."""

from __future__ import annotations

import numpy as np
import pytest

from hwmodels.errors import InputError
from hwmodels.units import MIB
from tpusim.workload.model_catalog import list_models, load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.routing import (
    RoutingModel,
    distinct_per_group,
    draw_routing,
    expected_distinct_uniform,
    parse_routing,
)
from tpusim.workload.shapes import (
    attention_tensors,
    dense_mlp_tensors,
    expert_slice_bytes,
    lm_head_tensors,
    moe_dense_tensors,
)


@pytest.fixture(scope="module")
def k3():
    model = load_model("kimi-k3")
    return model, plan_for(model, 32, devices_per_chip=2)


def test_catalog_lists_the_models() -> None:
    assert {"kimi-k3", "kimi-k3-mini", "muse-spark"} <= set(list_models())


def test_k3_layer_pattern(k3) -> None:
    model, _ = k3
    mla = [layer for layer in range(93) if model.attention_kind(layer) == "mla"]
    assert len(mla) == 24 and 92 in mla and 3 in mla and 7 in mla
    assert model.moe_layers == list(range(1, 93))


def test_k3_per_device_bytes_match_the_reference(k3) -> None:
    """Per-layer dense bytes per rank from shared/reference/kimi-k3.md."""
    model, plan = k3
    kda = sum(t.bytes for t in attention_tensors(model, plan, 1)) / MIB
    mla = sum(t.bytes for t in attention_tensors(model, plan, 3)) / MIB
    moe = {t.name: t.bytes / MIB for t in moe_dense_tensors(model, plan)}
    assert kda == pytest.approx(29.84, abs=0.01)
    assert mla == pytest.approx(43.25, abs=0.01)
    assert moe["moe.router"] == pytest.approx(7.0)
    assert moe["moe.latent_down"] == pytest.approx(1.75)
    assert moe["moe.latent_up"] == pytest.approx(7.0)
    assert moe["moe.shared_gate_up"] + moe["moe.shared_down"] == pytest.approx(7.875)
    assert expert_slice_bytes(model, plan) == 7_010_304
    assert lm_head_tensors(model, plan)[0].bytes / MIB == pytest.approx(70.0)
    # layer-0 dense MLP: 33792 / 32 = 1056 wide, gate+up+down in bf16
    assert sum(t.bytes for t in dense_mlp_tensors(model, plan)) == 3 * 7168 * 1056 * 2


@pytest.mark.parametrize(
    ("variant", "expert_mib", "dense_mib"),
    [("int4+bf16", 3.19, 76.0), ("nvfp4+int8", 3.38, 42.0), ("nvfp4+bf16", 3.38, 76.0)],
)
def test_muse_spark_per_core_bytes(variant: str, expert_mib: float, dense_mib: float) -> None:
    model = load_model(f"muse-spark@{variant}")
    plan = plan_for(model, 8, devices_per_chip=2)
    assert plan.name == "muse-tp8"
    assert expert_slice_bytes(model, plan) / MIB == pytest.approx(expert_mib, abs=0.01)
    dense = sum(t.bytes for t in attention_tensors(model, plan, 0) + moe_dense_tensors(model, plan)) / MIB
    assert dense == pytest.approx(dense_mib, rel=0.01)


@pytest.mark.slow  # 16000 sampled routings (~3 s)
def test_uniform_distinct_experts_match_closed_form(k3) -> None:
    """K3 uniform routing: distinct experts per device per layer vs G·(1-(1-k/E)^B), within 1 %."""
    model, plan = k3
    moe = model.moe
    group = moe.num_experts // plan.expert_groups
    for batch in (1, 2, 4, 8):
        choices = draw_routing(RoutingModel("uniform"), num_moe_layers=4000, batch=batch,
                               num_experts=moe.num_experts, top_k=moe.top_k, seed=batch)
        sampled = distinct_per_group(choices, moe.num_experts, plan.expert_groups).mean()
        expected = expected_distinct_uniform(moe.num_experts, moe.top_k, batch, group)
        assert sampled == pytest.approx(expected, rel=0.01), batch


def test_identical_rows_load_top_k_experts(k3) -> None:
    model, _plan = k3
    choices = draw_routing(RoutingModel("identical"), num_moe_layers=10, batch=8,
                           num_experts=model.moe.num_experts, top_k=16, seed=0)
    assert (distinct_per_group(choices, 896, 8).sum(axis=1) == 16).all()


def test_zipf_routing_is_skewed_and_valid() -> None:
    choices = draw_routing(parse_routing("zipf:1.2"), num_moe_layers=50, batch=64,
                           num_experts=64, top_k=4, seed=1)
    assert choices.shape == (50, 64, 4)
    assert all(len(set(row)) == 4 for row in choices.reshape(-1, 4).tolist())
    uniform = draw_routing(RoutingModel("uniform"), num_moe_layers=50, batch=64, num_experts=64, top_k=4, seed=1)
    assert distinct_per_group(choices, 64, 1).mean() < distinct_per_group(uniform, 64, 1).mean()


def test_trace_routing(tmp_path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text('{"layers": [[[0, 1], [2, 3]], [[4, 5], [4, 5]]]}')
    choices = draw_routing(parse_routing(f"trace:{trace}"), num_moe_layers=3, batch=2,
                           num_experts=8, top_k=2, seed=0)
    assert choices[0].tolist() == [[0, 1], [2, 3]] and choices[2].tolist() == [[0, 1], [2, 3]]
    trace.write_text('{"layers": [[[0, 0]]]}')
    with pytest.raises(InputError, match=r"layers\[0\]\[0\]"):
        draw_routing(parse_routing(f"trace:{trace}"), num_moe_layers=1, batch=1, num_experts=8, top_k=2, seed=0)


def test_program_structure_and_determinism(k3) -> None:
    model, plan = k3
    first = build_program(model, plan, batch=4, seed=3)
    second = build_program(model, plan, batch=4, seed=3)
    assert [op.name for op in first.ops] == [op.name for op in second.ops]
    assert first.hbm_bytes == second.hbm_bytes
    assert len(first.layers) == 93 and first.ops[-1].name == "head.lm_head"
    layer3 = [op.name for op in first.layers[3].ops]
    assert layer3[:8] == ["attn.mix_norm", "mla.q_a", "mla.kv_a", "mla.q_b", "mla.kv_b", "mla.core", "mla.gate", "mla.o"]
    assert [op.name for op in first.layers[0].ops][-3:] == ["mlp.mix_norm", "mlp.gate_up", "mlp.down"]
    # the critical device loads at least as many experts as any fixed group
    fixed = build_program(model, plan, batch=4, seed=3, device_view=0)
    assert first.weight_bytes >= fixed.weight_bytes
    collectives = {call.spec.name for op in first.layers[1].ops for call in op.collectives}
    assert {"attn.partial_reduce", "attn.half_gather", "moe.routed_reduce", "moe.latent_allgather"} <= collectives


def test_expert_rows_sum_to_routed_tokens(k3) -> None:
    model, plan = k3
    program = build_program(model, plan, batch=8, seed=0, device_view=2)
    moe = model.moe
    choices = draw_routing(RoutingModel("uniform"), num_moe_layers=92, batch=8,
                           num_experts=moe.num_experts, top_k=moe.top_k, seed=0)
    lo, hi = 2 * 112, 3 * 112
    for index, layer in enumerate(program.layers[1:]):
        rows = sum(op.matmuls[0][0] for op in layer.ops if op.expert_index is not None)
        assert rows == int(np.sum((choices[index] >= lo) & (choices[index] < hi)))


def test_with_layers_keeps_structure() -> None:
    model = load_model("kimi-k3").with_layers(8)
    assert model.num_layers == 8 and model.attention_kind(7) == "mla" and model.dense_layers == [0]


def test_hf_config_is_read() -> None:
    model = load_model("tests/data/deepseek-v3/config.json")
    assert model.name == "deepseek-v3"
    assert model.moe.num_experts == 256 and model.moe.top_k == 8
    assert model.dense_layers == [0, 1, 2] and model.attention_kind(10) == "mla"
    assert model.formats["routed_gate_up"] == "fp8_e4m3_b128x128"


@pytest.mark.parametrize(
    ("name", "match"),
    [("nope", "unknown model 'nope'"), ("muse-spark@fp2", "no format variant 'fp2'")],
)
def test_bad_model_names(name: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        load_model(name)


def test_hf_config_without_moe_keys(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "deepseek_v3", "hidden_size": 64, "vocab_size": 10, "num_hidden_layers": 2,'
                    ' "num_attention_heads": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,'
                    ' "v_head_dim": 8, "moe_intermediate_size": 32}')
    with pytest.raises(InputError, match=rf"{path}: missing key 'n_routed_experts' \(needed for DeepSeek-V3 MoE\)"):
        load_model(str(path))


def test_model_yaml_errors_name_file_and_field(tmp_path) -> None:
    good = load_model("kimi-k3-mini").model_dump()
    import yaml

    bad = dict(good, hidden_size=-4)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(InputError, match=r"bad.yaml: hidden_size: "):
        load_model(str(path))
    del bad["hidden_size"]
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(InputError, match=r"bad.yaml: missing field hidden_size .*tpusim schema model"):
        load_model(str(path))
    path.write_text("name: [unclosed\n")
    with pytest.raises(InputError, match=r"bad.yaml: line \d+: invalid YAML"):
        load_model(str(path))
