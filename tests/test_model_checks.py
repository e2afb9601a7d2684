"""A model config is checked against itself (:mod:`tpusim.workload.model_checks`): every
violation named, all of them in one line, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hwmodels.errors import InputError
from tpusim.app.cli import main
from tpusim.workload.hfconfig import model_from_hf_dict
from tpusim.workload.model_catalog import load_model
from tpusim.workload.modelconfig import ModelConfig

DATA = Path(__file__).parent / "data"


def _llama(**changes: Any) -> dict[str, Any]:
    data = json.loads((DATA / "llama-3.2-1b" / "config.json").read_text())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_the_issue_case_hidden_1000_with_7_heads_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_llama(hidden_size=1000, num_attention_heads=7,
                                                          num_key_value_heads=7, head_dim=None)))
    assert main(["simulate", "--model", str(folder / "config.json"), "--hardware", "tpu-v7", "--chips", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hidden_size (1000) is not a multiple of num_attention_heads (7)" in err[0]


def test_an_explicit_head_dim_may_differ_from_hidden_over_heads() -> None:
    """Qwen3 (and Llama with ``head_dim``) give head_dim; heads x head_dim != hidden is legal there."""
    model = model_from_hf_dict(_llama(hidden_size=1000, num_attention_heads=8, num_key_value_heads=8,
                                      head_dim=128), source="t", name="t")
    assert model.gqa is not None and model.gqa.head_dim == 128


@pytest.mark.parametrize(("changes", "expected"), [
    ({"num_attention_heads": 12, "num_key_value_heads": 8}, "not a multiple of num_kv_heads"),
    ({"num_attention_heads": 8, "num_key_value_heads": 16}, "exceeds num_query_heads"),
])
def test_hf_head_counts(changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(InputError, match=expected):
        model_from_hf_dict(_llama(**changes), source="t", name="t")


def test_hf_layer_lists_against_the_layer_count() -> None:
    qwen = json.loads((DATA / "qwen3-30b-a3b" / "config.json").read_text())
    with pytest.raises(InputError, match=r"mlp_only_layers: \[99\]"):
        model_from_hf_dict({**qwen, "mlp_only_layers": [99]}, source="t", name="t")
    nxt = json.loads((DATA / "qwen3-next-80b-a3b" / "config.json").read_text())
    with pytest.raises(InputError, match="layer_types has 3 entries"):
        model_from_hf_dict({**nxt, "layer_types": ["full_attention"] * 3}, source="t", name="t")
    ds = json.loads((DATA / "deepseek-v3" / "config.json").read_text())
    with pytest.raises(InputError, match="first_k_dense_replace"):
        model_from_hf_dict({**ds, "first_k_dense_replace": 1000}, source="t", name="t")


def _k3(**changes: Any) -> dict[str, Any]:
    data = load_model("kimi-k3-nano").model_dump()
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split("__")
        for key in path:
            node = node[key]
        node[last] = value
    return data


@pytest.mark.parametrize(("changes", "expected"), [
    ({"moe__top_k": 10**4}, "moe.top_k"),
    ({"moe__num_shared_experts": 3, "moe__shared_intermediate_size": 100}, "not divisible by num_shared_experts"),
    ({"kda__num_value_heads": 3}, "kda.num_value_heads"),
    ({"dense_layers": [0, 0]}, "listed twice"),
])
def test_yaml_cross_field_rules(changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        ModelConfig.model_validate(_k3(**changes))


def test_every_violation_is_named_at_once() -> None:
    data = _k3(moe__top_k=10**4, dense_layers=[0, 0])
    with pytest.raises(ValueError) as error:
        ModelConfig.model_validate(data)
    assert "moe.top_k" in str(error.value) and "listed twice" in str(error.value)


def test_attention_pattern_layers_must_exist() -> None:
    data = _k3()
    data["attention_pattern"]["rules"].append({"kind": "mla", "layers": [data["num_layers"] + 5]})
    with pytest.raises(ValueError, match=r"outside 0\.\."):
        ModelConfig.model_validate(data)


@pytest.mark.parametrize("name", ["kimi-k3", "kimi-k3-mini", "kimi-k3-nano", "kimi-k3-draft", "muse-spark",
                                  "llama-3.2-1b", "qwen3-30b-a3b"])
def test_the_catalog_models_are_consistent(name: str) -> None:
    load_model(name)  # the validator runs config_violations; a catalog model breaking one fails here
