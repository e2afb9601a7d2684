"""Reading a Hugging Face ``config.json`` of a DeepSeek-V3-style MoE model (DeepSeek-V3,
Kimi K2 and their relatives) into a :class:`ModelConfig`.

Key names read (``model_type`` ``deepseek_v3`` / ``kimi_k2``):

| config.json key | ModelConfig field |
| --- | --- |
| hidden_size, vocab_size, num_hidden_layers, rms_norm_eps | same |
| num_attention_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim | ``mla`` |
| n_routed_experts, num_experts_per_tok, moe_intermediate_size | ``moe`` |
| n_shared_experts (x moe_intermediate_size) | shared experts |
| first_k_dense_replace, intermediate_size | dense layers 0..k-1 |
| scoring_func, routed_scaling_factor, topk_method == noaux_tc | router |
| quantization_config.fmt == e4m3 / weight_block_size | FP8 experts |

Every assumption is checked where the data enters: a config without the MoE keys raises an
error naming the file and the missing key. DeepSeek-V3 layers have no output gate and no
latent projection; all layers are MLA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hwmodels.errors import InputError
from hwmodels.textfile import read_user_text
from tpusim.workload.modelconfig import ModelConfig

REQUIRED_KEYS = (
    "hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
)
MOE_KEYS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")


def model_from_hf_dict(data: dict[str, Any], *, source: str, name: str) -> ModelConfig:
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise InputError(f"{source}: missing key {missing[0]!r} (needed for MLA attention)")
    missing_moe = [key for key in MOE_KEYS if data.get(key) in (None, 0)]
    if missing_moe:
        raise InputError(f"{source}: missing MoE key {missing_moe[0]!r}: not a DeepSeek-V3-style MoE config")
    layers = int(data["num_hidden_layers"])
    first_dense = int(data.get("first_k_dense_replace", 0) or 0)
    moe_width = int(data["moe_intermediate_size"])
    shared = int(data.get("n_shared_experts", 0) or 0)
    quant = data.get("quantization_config") or {}
    fp8 = quant.get("fmt") == "e4m3" or quant.get("quant_method") == "fp8"
    expert_format = "fp8_e4m3_b128x128" if fp8 else "bf16"
    config = {
        "name": name,
        "description": f"read from {source} (model_type {data.get('model_type', 'unknown')})",
        "source": f"Hugging Face config.json: {source}",
        "hidden_size": data["hidden_size"],
        "vocab_size": data["vocab_size"],
        "num_layers": layers,
        "rms_norm_eps": data.get("rms_norm_eps", 1e-6),
        "max_context_tokens": data.get("max_position_embeddings"),
        "attention_pattern": {"default": "mla"},
        "mla": {
            "num_heads": data["num_attention_heads"],
            "q_lora_rank": data.get("q_lora_rank") or data["hidden_size"],
            "kv_lora_rank": data["kv_lora_rank"],
            "qk_nope_head_dim": data["qk_nope_head_dim"],
            "qk_rope_head_dim": data["qk_rope_head_dim"],
            "v_head_dim": data["v_head_dim"],
            "output_gate": False,
        },
        "dense_layers": list(range(min(first_dense, layers))),
        "dense_intermediate_size": data.get("intermediate_size", 0) if first_dense else 0,
        "moe": {
            "num_experts": data["n_routed_experts"],
            "top_k": data["num_experts_per_tok"],
            "expert_intermediate_size": moe_width,
            "num_shared_experts": shared,
            "shared_intermediate_size": shared * moe_width,
            "router_scoring": "sigmoid" if data.get("scoring_func", "softmax") == "sigmoid" else "softmax",
            "router_bias": data.get("topk_method") == "noaux_tc",
            "routed_scaling": data.get("routed_scaling_factor", 1.0) or 1.0,
            "router_dtype": "f32" if data.get("topk_method") == "noaux_tc" else "bf16",
        },
        "activation": "silu",
        "residual": "standard",
        "formats": {
            "dense": expert_format,
            "router": "bf16",
            "small_params": "f32",
            "routed_gate_up": expert_format,
            "routed_down": expert_format,
            "lm_head": "bf16",
            "embedding": "bf16",
        },
    }
    try:
        return ModelConfig.model_validate(config)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{source}: {where}: {first['msg']}") from None


def load_hf_config(path: Path) -> ModelConfig:
    """Read ``path`` (a config.json) into a ModelConfig named after its folder or file."""
    try:
        data = json.loads(read_user_text(path, kind="JSON"))
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: line {error.lineno}: invalid JSON: {error.msg}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    stem = Path(path).parent.name if Path(path).name == "config.json" else Path(path).stem
    name = "".join(c if c.isalnum() or c in ".-_" else "-" for c in stem.lower()).strip("-.") or "hf-model"
    return model_from_hf_dict(data, source=str(path), name=name)
