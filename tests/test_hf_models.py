"""Hugging Face config.json models: readers, parameter counts, formats, plans, capacity.

References are independent of the code under test: published parameter totals from each
model's card (``tests/data/<name>/SOURCE``), tensor widths from the architectures' own
definitions, byte counts worked out by hand in the comments.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hwmodels.catalog import make_system
from hwmodels.errors import InputError
from tpusim.app.cli import main
from tpusim.workload.capacity import capacity_report, resident_weight_bytes
from tpusim.workload.format_choice import apply_formats, parse_formats
from tpusim.workload.model_catalog import load_model, plan_for, plan_for_system
from tpusim.workload.params import parameter_count
from tpusim.workload.program import build_program
from tpusim.workload.shapes import (
    attention_tensors,
    expert_slice_bytes,
    kv_cache_bytes_per_token,
    recurrent_state_bytes,
)

DATA = Path(__file__).parent / "data"
SHIPPED = sorted(p.parent.name for p in DATA.glob("*/config.json"))


def _source(name: str) -> dict:
    return yaml.safe_load((DATA / name / "SOURCE").read_text())


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_family_is_shipped() -> None:
    assert {"llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-8b", "qwen3-30b-a3b", "qwen3-235b-a22b",
            "qwen3-next-80b-a3b", "deepseek-v3", "kimi-k2"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_parameter_count_matches_published_total(name: str) -> None:
    source = _source(name)
    count = parameter_count(load_model(str(DATA / name / "config.json")))
    published = float(source["published_total_parameters"])
    assert abs(count.total - published) <= 0.01 * published, (count.total, published)
    if "published_non_embedding_parameters" in source:
        non_embedding = float(source["published_non_embedding_parameters"])
        assert abs(count.total - count.embedding_and_head - non_embedding) <= 0.01 * non_embedding
    if "published_main_model_parameters" in source:
        main_model = float(source["published_main_model_parameters"])
        assert abs(count.main_model - main_model) <= 0.01 * main_model


def test_readers_map_architecture_keys() -> None:
    llama = load_model(str(DATA / "llama-3.2-1b" / "config.json"))
    assert llama.moe is None and llama.tied_embeddings and llama.gqa and llama.gqa.num_kv_heads == 8
    assert llama.dense_layers == list(range(16)) and llama.dense_intermediate_size == 8192
    qwen_moe = load_model(str(DATA / "qwen3-30b-a3b" / "config.json"))
    assert qwen_moe.moe and qwen_moe.moe.router_scoring == "softmax" and not qwen_moe.dense_layers
    assert qwen_moe.gqa and qwen_moe.gqa.qk_norm
    deepseek = load_model(str(DATA / "deepseek-v3" / "config.json"))
    assert deepseek.mtp_layers == 1 and deepseek.moe and deepseek.moe.routing_groups == 8
    assert deepseek.moe.routing_groups_per_token == 4 and deepseek.dense_layers == [0, 1, 2]
    assert deepseek.formats["routed_gate_up"] == "fp8_e4m3_b128x128"
    kimi = load_model(str(DATA / "kimi-k2" / "config.json"))
    assert kimi.moe and kimi.moe.num_experts == 384 and kimi.dense_layers == [0]


def test_qwen3_next_hybrid_layers_and_gated_deltanet_shapes() -> None:
    model = load_model(str(DATA / "qwen3-next-80b-a3b" / "config.json"))
    kinds = [model.attention_kind(layer) for layer in range(8)]
    assert kinds == ["kda", "kda", "kda", "gqa"] * 2  # full attention every 4th layer
    plan = plan_for(model, 1)
    by_name = {t.name: t for t in attention_tensors(model, plan, 0)}
    assert "kda.decay_a" not in by_name
    # modeling_qwen3_next: in_proj_qkvz = 2*16*128 + 2*32*128 = 12288, in_proj_ba = 2*32 = 64
    # (each sub-block padded to the 128 lanes: 64 -> 128 for each of b and a)
    assert by_name["kda.qkvgb"].cols == 12288 + 2 * 128
    assert (by_name["kda.o"].rows, by_name["kda.o"].cols) == (32 * 128, 2048)
    assert recurrent_state_bytes(model, plan, 0) == 32 * 128 * 128 * 4  # f32 state per value head
    gated = {t.name for t in attention_tensors(model, plan, 3)}
    assert "gqa.gate" in gated  # gated full attention


def test_llama_floor_weight_bytes_are_bf16_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "floor", "--model", str(DATA / "llama-3.2-1b" / "config.json"), "--hardware", "h100",
                        "--chips", "1", "--batch", "1", "--json")
    assert code == 0
    published = float(_source("llama-3.2-1b")["published_total_parameters"])
    weight_bytes = json.loads(out)["weight_bytes_per_device"]
    assert abs(weight_bytes - 2 * published) <= 0.01 * 2 * published  # tied embedding counted once


def test_deepseek_nvfp4_experts_on_a_plan_spec(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--model", str(DATA / "deepseek-v3" / "config.json"), "--formats", "experts=nvfp4",
            "--plan", "tp=8,expert_groups=2,expert_tp=4")
    code, out, _ = _cli(capsys, "floor", *args, "--hardware", "b200", "--chips", "8", "--batch", "1", "--json")
    assert code == 0
    report = json.loads(out)
    # One expert slice, width 2048/4 = 512, NVFP4 (4-bit values + an e4m3 scale per 16):
    # gate_up 7168 x 1024: 3,670,016 + 458,752; down 512 x 7168: 1,835,008 + 229,376.
    assert report["breakdown"]["expert_slice_bytes"] == 3_670_016 + 458_752 + 1_835_008 + 229_376
    assert report["plan"] == "tp=8,expert_groups=2,expert_tp=4"
    # a GPU serving stack runs no prefetch schedule: --schedule here would be refused (flag_rules)
    code, out, _ = _cli(capsys, "compare", *args, "--systems", "b200:8", "--batch", "1", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["fits"] and row["step_ms"] > 0 and row["plan"] == "tp=8,expert_groups=2,expert_tp=4"


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_model_simulates(name: str) -> None:
    from tpusim.engine import simulate
    from tpusim.schedule.schema import load_schedule
    from tpusim.workload.floors import floors

    model = load_model(str(DATA / name / "config.json")).with_layers(4)
    system = make_system("tpu-v7", 8)
    plan = plan_for_system(model, system.chip, system.chips)
    program = build_program(model, plan, batch=2, context_tokens=128)
    result = simulate(program, load_schedule("naive"), system.chip)
    bound = floors(program, system.chip)
    # the naive schedule waits each weight where it is used: never under the step's floor, and
    # it moves the program's bytes (no copy dropped or doubled)
    assert bound.floor_s <= result.step_s < 100 * bound.floor_s
    assert result.dma_bytes == pytest.approx(bound.hbm_bytes, rel=0.02)


def test_qwen3_next_compare_gives_tpu_and_gpu_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "compare", "--model", str(DATA / "qwen3-next-80b-a3b" / "config.json"),
                        "--systems", "tpu-v7:4,b200:4", "--batch", "1", "--schedule", "naive", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["system"] for r in rows] == ["tpu-v7:4", "b200:4"] and all(r["fits"] for r in rows)


def _write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


def _llama(**changes: object) -> dict:
    data = json.loads((DATA / "llama-3.2-1b" / "config.json").read_text())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


B200_8 = ("--hardware", "b200", "--chips", "8")
B200_6 = ("--hardware", "b200", "--chips", "6")


@pytest.mark.parametrize(
    ("argv", "config", "message"),
    [
        (("floor", *B200_8), _llama(intermediate_size=None), "missing key 'intermediate_size'"),
        (("floor", *B200_8), _llama(architectures=["MambaForCausalLM"], model_type="mamba"), "unknown architecture"),
        (("floor", "--plan", "tp=6,expert_groups=6,attention=dp", *B200_6), None,
         "128 experts do not split into 6 expert groups"),
        (("floor", "--plan", "tp=6", *B200_6), None, "32 attention heads do not split 6 ways"),
        (("plan", "--plan", "tp=8,expert_groups=3,expert_tp=3"), None, "must equal devices (8)"),
        (("floor", "--plan", "tp=4", *B200_8), None, "spans tp=4 devices but the system has 8"),
        (("floor", "--formats", "experts=fp2", *B200_8), None, "unknown weight format 'fp2'"),
        (("compare", "--formats", "wings=fp8"), None, "unknown family 'wings'"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                      config: dict | None, message: str) -> None:
    model = _write(tmp_path, config) if config is not None else str(DATA / "qwen3-30b-a3b" / "config.json")
    code, _, err = _cli(capsys, *argv, "--model", model)
    assert code == 2
    assert err.count("\n") == 1 and message in err, err
    if config is not None:
        assert model in err  # names the file


@pytest.mark.parametrize(
    ("quant", "key", "expected"),
    [({"quant_method": "mxfp4"}, "routed_down", "mxfp4"),
     ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "dense", "nvfp4"),
     ({"quant_method": "gptq", "bits": 4}, "routed_gate_up", "int4_g128"),
     ({"quant_method": "awq", "bits": 8}, "dense", "int8_channel")],
)
def test_quantization_config_sets_default_formats(tmp_path: Path, quant: dict, key: str, expected: str) -> None:
    data = json.loads((DATA / "qwen3-30b-a3b" / "config.json").read_text())
    model = load_model(_write(tmp_path, {**data, "quantization_config": quant}))
    assert model.format_of(key) == expected and model.format_of("lm_head") == "bf16"


def test_unknown_quantization_is_one_line(tmp_path: Path) -> None:
    data = {**_llama(), "quantization_config": {"quant_method": "bitsandbytes"}}
    with pytest.raises(InputError, match="quant_method 'bitsandbytes' is not read"):
        load_model(_write(tmp_path, data))


def test_formats_per_family_and_kv_layout() -> None:
    model = load_model(str(DATA / "llama-3.2-1b" / "config.json"))
    plan = plan_for(model, 1)
    assert kv_cache_bytes_per_token(model, plan, 0) == 2 * 8 * 64 * 2  # K and V, 8 heads x 64, bf16
    fp8 = apply_formats(model, "kv=fp8,attention=int8,dense_mlp=int4")
    # fp8 with an f32 scale per 128 values: each 64-value head vector is 64 B + 4 B
    assert kv_cache_bytes_per_token(fp8, plan, 0) == 2 * 8 * (64 + 4)
    assert fp8.format_of("attention") == "int8_channel" and fp8.format_of("dense_mlp") == "int4_g128"
    assert fp8.format_of("lm_head") == "bf16"
    assert parse_formats("experts=mxfp4") == {"routed_gate_up": "mxfp4", "routed_down": "mxfp4"}


def test_system_to_plan_rule() -> None:
    k3 = load_model("kimi-k3")
    tpu = make_system("tpu-v7", 16).chip
    assert plan_for_system(k3, tpu, 16).name == "k3-tp32"
    assert plan_for_system(k3, tpu, 16, "generic").name == "generic-32"
    dp = plan_for_system(k3, tpu, 16, "tp=32,expert_groups=8,expert_tp=4,attention=dp")
    assert dp.attention_dp == 32 and dp.attention_heads_per_device == 96
    with pytest.raises(InputError, match="plan k3-tp32 is for 32 devices"):
        plan_for_system(k3, tpu, 8, "k3-tp32")


def test_data_parallel_attention_serves_a_share_of_the_rows() -> None:
    model = load_model(str(DATA / "qwen3-30b-a3b" / "config.json")).with_layers(2)
    plan = plan_for(model, 8, choice="tp=8,attention=dp")
    program = build_program(model, plan, batch=16, context_tokens=64)
    q = next(op for op in program.ops if op.name == "gqa.q")
    assert q.matmuls[0][0] == 2 and q.tensors[0].cols == 32 * 128  # 16 rows / 8 groups, all heads
    gathers = [c.spec for op in program.ops if op.role == "attn.out" for c in op.collectives]
    assert [g.name for g in gathers][:1] == ["attn.dp_allgather"] and gathers[0].kind == "all_gather"


@settings(max_examples=15, deadline=None)
@given(groups=st.sampled_from([1, 2, 4, 8]), devices=st.sampled_from([8, 16]))
def test_routed_experts_are_split_not_duplicated(groups: int, devices: int) -> None:
    model = load_model(str(DATA / "qwen3-30b-a3b" / "config.json"))
    plan = plan_for(model, devices, choice=f"tp={devices},expert_groups={groups}")
    _, experts = resident_weight_bytes(model, plan)
    whole = plan_for(model, 1)
    # every device holds 1/devices of every expert's bytes: the parts add up to the whole
    assert experts * devices == resident_weight_bytes(model, whole)[1]
    assert expert_slice_bytes(model, plan) * plan.expert_tp == expert_slice_bytes(model, whole)


def test_capacity_says_why_a_model_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    model = load_model(str(DATA / "llama-3.1-70b" / "config.json"))
    chip = make_system("h100", 1).chip
    report = capacity_report(model, plan_for_system(model, chip, 1), chip, batch=1, context_tokens=1024)
    assert not report.fits and report.weight_bytes > 140e9
    code, out, _ = _cli(capsys, "plan", "--model", str(DATA / "llama-3.1-70b" / "config.json"),
                        "--hardware", "h100", "--chips", "1", "--json")
    assert code == 0
    capacity = json.loads(out)["capacity"]
    assert not capacity["fits"] and "does not fit on 1 x h100" in capacity["reason"]


def test_plan_command_prints_collectives(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "plan", "--model", str(DATA / "deepseek-v3" / "config.json"),
                        "--plan", "tp=8,expert_groups=2,expert_tp=4", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["plan"]["expert_groups"] == 2 and report["experts_per_group"] == 128
    assert report["expert_slice_width"] == 512
    names = [c["name"] for c in report["collectives"]]
    assert names == ["attn.allreduce", "moe.allreduce", "mlp.allreduce"]  # 3 dense layers, then MoE


@pytest.mark.parametrize("kind", ["uniform", "identical", "zipf:1.2"])
def test_grouped_top_k_keeps_each_row_in_its_groups(kind: str) -> None:
    from tpusim.workload.routing import draw_routing, parse_routing

    choices = draw_routing(parse_routing(kind), num_moe_layers=20, batch=16, num_experts=256, top_k=8, seed=3,
                           groups=8, groups_per_token=4)
    groups_per_row = {len(set(row // 32)) for layer in choices for row in layer}
    assert max(groups_per_row) <= 4 and all(len(set(row)) == 8 for layer in choices for row in layer)
    ungrouped = draw_routing(parse_routing(kind), num_moe_layers=20, batch=16, num_experts=256, top_k=8, seed=3)
    assert max(len(set(row // 32)) for layer in ungrouped for row in layer) > 4  # the rule is what confines them


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b"])
def test_catalog_twins_match_their_config_json(name: str) -> None:
    """The catalog YAMLs of the GPU harness's models describe the same tensors as the cards."""
    catalog, card = load_model(name), load_model(str(DATA / name / "config.json"))
    assert parameter_count(catalog) == parameter_count(card)
    assert catalog.tied_embeddings == card.tied_embeddings and (catalog.moe is None) == (card.moe is None)
