"""Model configurations: the architecture of an MoE decoder, as validated data.

A :class:`ModelConfig` is loaded from a YAML file in ``tpusim/models/`` (``kimi-k3``,
``kimi-k3-mini``, ``muse-spark``, ...) or from a Hugging Face ``config.json``
(:mod:`tpusim.workload.hfconfig`). It describes *what* the model computes; how it is split over
devices is a :class:`tpusim.workload.sharding.ShardingPlan`, and the per-device tensors follow from both
in :mod:`tpusim.workload.shapes`.

Attention kinds:

- ``kda``: Kimi Delta Attention, a gated delta-rule linear attention with a per-head
  ``head_dim x head_dim`` f32 recurrent state; no KV cache.
- ``mla``: multi-head latent attention (DeepSeek/Kimi): a low-rank query path and a
  compressed KV cache of ``kv_lora_rank + qk_rope_head_dim`` values per token.
- ``gqa``: grouped-query attention with an optional sliding window (Muse Spark).

Which layer uses which kind is an :class:`AttentionPattern`: a default kind plus rules
(``every``/``offset`` or an explicit list of layers), later rules winning.

Weight formats are given per *family* (see :data:`WEIGHT_FAMILIES`); a model can carry
several named format variants (Muse Spark ships three) selected as ``name@variant``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tpusim.workload.formats import FORMATS

AttentionKind = Literal["kda", "mla", "gqa"]

# Weight families: the unit a schedule prefetches and a breakdown reports.
WEIGHT_FAMILIES = (
    "kda_proj",  # KDA fused q/k/v/gate/beta, decay low-rank, output projection
    "mla_proj",  # MLA q_a/q_b/kv_a/kv_b, output gate, output projection
    "gqa_proj",  # GQA q/k/v/o (+ output gate)
    "small_params",  # norms, router bias, decay parameters, residual-mixture weights (f32)
    "router",  # router projection
    "latent_proj",  # latent_down / latent_up (or a MoE input/output projection)
    "shared_expert",  # shared experts' gate/up/down
    "routed_expert",  # routed experts' gate/up/down (per expert slice)
    "dense_mlp",  # dense MLP of the dense layers (layer 0 in K3)
    "lm_head",  # vocabulary projection
)

# Format keys: a family may store sub-tensors in different formats (K3's routed experts
# keep gate/up in FP8 and down in MXFP4).
FORMAT_KEYS = (
    "dense",  # attention, latent, shared, dense MLP projections
    "router",
    "small_params",
    "routed_gate_up",
    "routed_down",
    "lm_head",
    "embedding",
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KdaConfig(_Frozen):
    """Kimi Delta Attention (gated delta rule, linear attention)."""

    num_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1, description="q/k/v head dim; the state is head_dim x head_dim f32")
    conv_kernel: int = Field(default=4, ge=1, description="short causal conv width")
    decay_rank: int = Field(ge=1, description="low-rank decay gate: hidden -> rank -> heads*head_dim")
    decay_lower_bound: float = Field(default=-5.0, lt=0.0, description="lower bound of log decay g")


class MlaConfig(_Frozen):
    """Multi-head latent attention."""

    num_heads: int = Field(ge=1)
    q_lora_rank: int = Field(ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=0)
    v_head_dim: int = Field(ge=1)
    output_gate: bool = Field(default=True, description="full-rank sigmoid gate on the output")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_values_per_token(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


class GqaConfig(_Frozen):
    """Grouped-query attention with an optional sliding window."""

    num_query_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    sliding_window: int | None = Field(default=None, ge=1, description="tokens; None = full")
    full_attention_every: int | None = Field(
        default=None, ge=1, description="layers where l % every == full_attention_offset are full"
    )
    full_attention_offset: int = Field(default=0, ge=0)
    output_gate: bool = Field(default=False, description="hidden -> heads*head_dim sigmoid gate")

    @model_validator(mode="after")
    def _check(self) -> GqaConfig:
        if self.num_query_heads % self.num_kv_heads:
            raise ValueError("num_query_heads must be a multiple of num_kv_heads")
        return self


class AttentionRule(_Frozen):
    kind: AttentionKind
    every: int | None = Field(default=None, ge=1, description="layers with l % every == offset")
    offset: int = Field(default=0, ge=0)
    layers: list[int] = Field(default_factory=list, description="explicit layer indices")


class AttentionPattern(_Frozen):
    default: AttentionKind
    rules: list[AttentionRule] = Field(default_factory=list)

    def kind_of(self, layer: int) -> AttentionKind:
        kind = self.default
        for rule in self.rules:
            if layer in rule.layers or (rule.every and layer % rule.every == rule.offset):
                kind = rule.kind
        return kind


class MoeConfig(_Frozen):
    """Routed + shared experts of the MoE layers."""

    num_experts: int = Field(ge=1)
    top_k: int = Field(ge=1)
    expert_intermediate_size: int = Field(ge=1, description="gate/up width of one routed expert")
    latent_size: int | None = Field(
        default=None,
        ge=1,
        description="experts work in this width: a hidden->latent projection before them and "
        "latent->hidden after (K3: 3584 with an RMSNorm on the latent; Muse Spark: 4096)",
    )
    latent_norm: bool = Field(default=False, description="RMSNorm on the latent (K3)")
    num_shared_experts: int = Field(default=0, ge=0)
    shared_intermediate_size: int = Field(default=0, ge=0, description="total over shared experts")
    router_scoring: Literal["sigmoid", "softmax"] = "sigmoid"
    router_bias: bool = Field(default=True, description="per-expert correction bias for selection")
    routed_scaling: float = Field(default=1.0, gt=0.0)
    router_dtype: Literal["bf16", "f32"] = "bf16"

    @model_validator(mode="after")
    def _check(self) -> MoeConfig:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.num_shared_experts and not self.shared_intermediate_size:
            raise ValueError("shared_intermediate_size is required with shared experts")
        return self

    @property
    def expert_input_size(self) -> int | None:
        return self.latent_size


class ModelConfig(_Frozen):
    """An MoE decoder-only transformer."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-@+_]*$")
    description: str = ""
    source: str = Field(min_length=1, description="where the architecture facts come from")
    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    rms_norm_eps: float = Field(default=1e-5, gt=0.0)
    attention_pattern: AttentionPattern
    kda: KdaConfig | None = None
    mla: MlaConfig | None = None
    gqa: GqaConfig | None = None
    dense_layers: list[int] = Field(default_factory=list, description="layers with a dense MLP")
    dense_intermediate_size: int = Field(default=0, ge=0)
    moe: MoeConfig
    activation: Literal["situ", "silu"] = "silu"
    residual: Literal["standard", "attention_residuals"] = "standard"
    residual_block_layers: int = Field(default=12, ge=1, description="attention-residual block")
    formats: dict[str, str] = Field(description="weight format per format key")
    format_variants: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="named alternatives overriding ``formats``"
    )
    variant: str | None = Field(default=None, description="selected format variant, if any")
    logit_softcap: float | None = Field(default=None, gt=0.0)
    max_context_tokens: int | None = Field(
        default=None, ge=1, description="longest context the model supports, tokens (config.json "
        "max_position_embeddings); None where no figure is published")

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        for key, fmt in self.formats.items():
            if key not in FORMAT_KEYS:
                raise ValueError(f"formats.{key}: unknown format key; known: {', '.join(FORMAT_KEYS)}")
            if fmt not in FORMATS:
                raise ValueError(f"formats.{key}: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
        missing = [key for key in FORMAT_KEYS if key not in self.formats]
        if missing:
            raise ValueError(f"formats: missing keys {', '.join(missing)}")
        for variant, overrides in self.format_variants.items():
            for key, fmt in overrides.items():
                if key not in FORMAT_KEYS or fmt not in FORMATS:
                    raise ValueError(f"format_variants.{variant}.{key}: unknown key or format {fmt!r}")
        for layer in self.dense_layers:
            if not 0 <= layer < self.num_layers:
                raise ValueError(f"dense_layers: layer {layer} outside 0..{self.num_layers - 1}")
        if self.dense_layers and not self.dense_intermediate_size:
            raise ValueError("dense_intermediate_size is required with dense_layers")
        for layer in range(self.num_layers):
            kind = self.attention_pattern.kind_of(layer)
            if getattr(self, kind) is None:
                raise ValueError(f"layer {layer} uses {kind} attention but `{kind}` is not configured")
        return self

    def attention_kind(self, layer: int) -> AttentionKind:
        return self.attention_pattern.kind_of(layer)

    def is_moe_layer(self, layer: int) -> bool:
        return layer not in self.dense_layers

    @cached_property
    def moe_layers(self) -> list[int]:
        return [layer for layer in range(self.num_layers) if self.is_moe_layer(layer)]

    def format_of(self, key: str) -> str:
        return self.formats[key]

    def with_variant(self, variant: str) -> ModelConfig:
        if variant not in self.format_variants:
            known = ", ".join(self.format_variants) or "none"
            raise KeyError(f"model {self.name} has no format variant {variant!r}; known: {known}")
        formats = {**self.formats, **self.format_variants[variant]}
        return self.model_copy(update={"formats": formats, "variant": variant})

    def with_layers(self, num_layers: int) -> ModelConfig:
        """The same architecture with ``num_layers`` layers (patterns keep their rules)."""
        dense = [layer for layer in self.dense_layers if layer < num_layers]
        data = self.model_dump()
        data.update(num_layers=num_layers, dense_layers=dense)
        return ModelConfig.model_validate(data)
