"""One reader per Hugging Face decoder architecture: ``config.json`` keys -> ModelConfig fields.

Each reader takes the parsed ``config.json`` and returns the :class:`ModelConfig` fields
except ``name``, ``description``, ``source`` and ``formats`` (those come from
:mod:`tpusim.workload.hfconfig`, which also reads ``quantization_config``). A key a reader
needs and the file lacks raises :class:`MissingKey`; keys no reader uses are ignored.

| architecture (``model_type``) | attention | MLP | keys beyond the common ones |
| --- | --- | --- | --- |
| ``LlamaForCausalLM`` (llama) | GQA | dense | num_key_value_heads, head_dim, intermediate_size, tie_word_embeddings |
| ``Qwen3ForCausalLM`` (qwen3) | GQA + q/k RMSNorm | dense | as Llama |
| ``Qwen3MoeForCausalLM`` (qwen3_moe) | GQA + q/k RMSNorm | MoE, softmax router | num_experts, num_experts_per_tok, moe_intermediate_size, decoder_sparse_step, mlp_only_layers |
| ``Qwen3NextForCausalLM`` (qwen3_next) | Gated DeltaNet, gated GQA every ``full_attention_interval`` | MoE + shared expert | linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim, shared_expert_intermediate_size, layer_types |
| ``DeepseekV3ForCausalLM`` (deepseek_v3, kimi_k2) | MLA | MoE, sigmoid router, grouped top-k | q_lora_rank, kv_lora_rank, qk_nope/rope_head_dim, v_head_dim, n_routed_experts, n_shared_experts, first_k_dense_replace, n_group, topk_group, num_nextn_predict_layers |

Common keys: hidden_size, vocab_size, num_hidden_layers, num_attention_heads (required),
rms_norm_eps. Assumptions, checked where the data enters: SwiGLU MLPs (``hidden_act`` silu);
no attention or MLP biases are counted (none of these models has them); Qwen3-Next's
per-layer ``shared_expert_gate`` (hidden x 1, under 0.001 % of its weights) is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class MissingKey(Exception):
    """A key a reader needs is absent (``key``, ``why``)."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(key, why)
        self.key, self.why = key, why


Config = dict[str, Any]


def need(data: Config, key: str, why: str) -> Any:
    value = data.get(key)
    if value is None:
        raise MissingKey(key, why)
    return value


def _common(data: Config, arch: str) -> Config:
    return {
        "hidden_size": need(data, "hidden_size", arch),
        "vocab_size": need(data, "vocab_size", arch),
        "num_layers": need(data, "num_hidden_layers", arch),
        "rms_norm_eps": data.get("rms_norm_eps", 1e-6),
        "tied_embeddings": bool(data.get("tie_word_embeddings", False)),
        "activation": "silu",
        "residual": "standard",
    }


def _gqa(data: Config, arch: str, *, qk_norm: bool, output_gate: bool = False) -> Config:
    heads = need(data, "num_attention_heads", arch)
    return {
        "num_query_heads": heads,
        "num_kv_heads": data.get("num_key_value_heads") or heads,
        "head_dim": data.get("head_dim") or need(data, "hidden_size", arch) // heads,
        "qk_norm": qk_norm,
        "output_gate": output_gate,
    }


def _dense(data: Config, arch: str, *, qk_norm: bool) -> Config:
    config = _common(data, arch)
    config.update(
        attention_pattern={"default": "gqa"},
        gqa=_gqa(data, arch, qk_norm=qk_norm),
        dense_layers=list(range(config["num_layers"])),
        dense_intermediate_size=need(data, "intermediate_size", f"{arch} MLP"),
    )
    return config


def read_llama(data: Config) -> Config:
    return _dense(data, "Llama", qk_norm=False)


def read_qwen3(data: Config) -> Config:
    return _dense(data, "Qwen3", qk_norm=True)


def _qwen_moe(data: Config, arch: str, layers: int) -> tuple[Config, list[int]]:
    """Qwen MoE block (softmax router, no bias) and the dense layers (``mlp_only_layers`` and
    the layers ``decoder_sparse_step`` skips)."""
    step = int(data.get("decoder_sparse_step", 1) or 1)
    dense = sorted(set(data.get("mlp_only_layers") or []) | {layer for layer in range(layers) if (layer + 1) % step})
    shared = int(data.get("shared_expert_intermediate_size", 0) or 0)
    moe = {
        "num_experts": need(data, "num_experts", f"{arch} MoE"),
        "top_k": need(data, "num_experts_per_tok", f"{arch} MoE"),
        "expert_intermediate_size": need(data, "moe_intermediate_size", f"{arch} MoE"),
        "num_shared_experts": 1 if shared else 0,
        "shared_intermediate_size": shared,
        "router_scoring": "softmax",
        "router_bias": False,
    }
    return moe, dense


def read_qwen3_moe(data: Config) -> Config:
    config = _common(data, "Qwen3-MoE")
    moe, dense = _qwen_moe(data, "Qwen3-MoE", config["num_layers"])
    config.update(
        attention_pattern={"default": "gqa"},
        gqa=_gqa(data, "Qwen3-MoE", qk_norm=True),
        moe=moe,
        dense_layers=dense,
        dense_intermediate_size=need(data, "intermediate_size", "Qwen3-MoE dense layers") if dense else 0,
    )
    return config


def read_qwen3_next(data: Config) -> Config:
    """Hybrid: Gated DeltaNet layers, with gated full attention on every
    ``full_attention_interval``-th layer (or where ``layer_types`` says full_attention)."""
    arch = "Qwen3-Next"
    config = _common(data, arch)
    layers = config["num_layers"]
    types = data.get("layer_types")
    if types:
        full = [layer for layer, kind in enumerate(types) if kind == "full_attention"]
        rule: Config = {"kind": "gqa", "layers": full}
    else:
        interval = int(data.get("full_attention_interval", 4))
        rule = {"kind": "gqa", "every": interval, "offset": interval - 1}
    linear = f"{arch} linear attention"
    moe, dense = _qwen_moe(data, arch, layers)
    config.update(
        attention_pattern={"default": "kda", "rules": [rule]},
        kda={
            "variant": "gated_deltanet",
            "num_heads": need(data, "linear_num_key_heads", linear),
            "head_dim": need(data, "linear_key_head_dim", linear),
            "num_value_heads": need(data, "linear_num_value_heads", linear),
            "value_head_dim": need(data, "linear_value_head_dim", linear),
            "conv_kernel": data.get("linear_conv_kernel_dim", 4),
        },
        gqa=_gqa(data, arch, qk_norm=True, output_gate=True),
        moe=moe,
        dense_layers=dense,
        dense_intermediate_size=need(data, "intermediate_size", f"{arch} dense layers") if dense else 0,
    )
    return config


def read_deepseek_v3(data: Config) -> Config:
    """MLA attention, ``first_k_dense_replace`` dense layers, shared + routed experts with a
    sigmoid router, bias-corrected (``noaux_tc``) grouped top-k, MTP layers."""
    arch, moe_arch = "MLA attention", "DeepSeek-V3 MoE"
    config = _common(data, "DeepSeek-V3")
    layers = config["num_layers"]
    first_dense = min(int(data.get("first_k_dense_replace", 0) or 0), layers)
    width = need(data, "moe_intermediate_size", moe_arch)
    shared = int(data.get("n_shared_experts", 0) or 0)
    noaux = data.get("topk_method") == "noaux_tc"
    config.update(
        attention_pattern={"default": "mla"},
        mla={
            "num_heads": need(data, "num_attention_heads", arch),
            "q_lora_rank": data.get("q_lora_rank") or config["hidden_size"],
            "kv_lora_rank": need(data, "kv_lora_rank", arch),
            "qk_nope_head_dim": need(data, "qk_nope_head_dim", arch),
            "qk_rope_head_dim": need(data, "qk_rope_head_dim", arch),
            "v_head_dim": need(data, "v_head_dim", arch),
            "output_gate": False,
        },
        dense_layers=list(range(first_dense)),
        dense_intermediate_size=need(data, "intermediate_size", "DeepSeek-V3 dense layers") if first_dense else 0,
        moe={
            "num_experts": need(data, "n_routed_experts", moe_arch),
            "top_k": need(data, "num_experts_per_tok", moe_arch),
            "expert_intermediate_size": width,
            "num_shared_experts": shared,
            "shared_intermediate_size": shared * width,
            "router_scoring": "sigmoid" if data.get("scoring_func", "softmax") == "sigmoid" else "softmax",
            "router_bias": noaux,
            "routed_scaling": data.get("routed_scaling_factor", 1.0) or 1.0,
            "router_dtype": "f32" if noaux else "bf16",
            "routing_groups": int(data.get("n_group", 1) or 1),
            "routing_groups_per_token": int(data.get("topk_group", 1) or 1),
        },
        mtp_layers=int(data.get("num_nextn_predict_layers", 0) or 0),
    )
    return config


Reader = Callable[[Config], Config]

# architecture or model_type -> reader
READERS: dict[str, Reader] = {
    "LlamaForCausalLM": read_llama, "llama": read_llama,
    "Qwen3ForCausalLM": read_qwen3, "qwen3": read_qwen3,
    "Qwen3MoeForCausalLM": read_qwen3_moe, "qwen3_moe": read_qwen3_moe,
    "Qwen3NextForCausalLM": read_qwen3_next, "qwen3_next": read_qwen3_next,
    "DeepseekV3ForCausalLM": read_deepseek_v3, "deepseek_v3": read_deepseek_v3,
    "KimiK2ForCausalLM": read_deepseek_v3, "kimi_k2": read_deepseek_v3,
}
