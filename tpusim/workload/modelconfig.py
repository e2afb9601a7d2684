"""Model configurations: the architecture of an MoE decoder, as validated data.

A :class:`ModelConfig` is loaded from a YAML file in ``tpusim/models/`` (``kimi-k3``,
``kimi-k3-mini``, ``muse-spark``, ...) or from a Hugging Face ``config.json``
(:mod:`tpusim.workload.hfconfig`). It describes *what* the model computes; how it is split over
devices is a :class:`tpusim.workload.sharding.ShardingPlan`, and the per-device tensors follow from both
in :mod:`tpusim.workload.shapes`.

Attention kinds:

- ``kda``: linear attention with a gated delta rule and a per-value-head
  ``head_dim x value_head_dim`` f32 recurrent state; no KV cache. Two variants share the
  machinery: Kimi Delta Attention (``variant: kda``: channel-wise decay from a low-rank
  projection, as many value heads as key heads) and Gated DeltaNet (``variant:
  gated_deltanet``, Qwen3-Next: a scalar decay per value head from the fused input
  projection, more value heads than key heads).
- ``mla``: multi-head latent attention (DeepSeek/Kimi): a low-rank query path and a
  compressed KV cache of ``kv_lora_rank + qk_rope_head_dim`` values per token.
- ``gqa``: grouped-query attention with an optional sliding window (Muse Spark).

Which layer uses which kind is an :class:`AttentionPattern`: a default kind plus rules
(``every``/``offset`` or an explicit list of layers), later rules winning.

Weight formats are given per *family* (see :data:`tpusim.workload.registry.names.WEIGHT_FAMILIES`); a model can carry
several named format variants (Muse Spark ships three) selected as ``name@variant``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tpusim.workload.formats import FORMATS
from tpusim.workload.registry.names import Family, FormatKey

AttentionKind = Literal["kda", "mla", "gqa"]

# Weight families: the unit a schedule prefetches and a breakdown reports.
# Format keys: a family may store sub-tensors in different formats (K3's routed experts
# keep gate/up in FP8 and down in MXFP4).
FORMAT_KEYS = (
    "dense",  # attention, latent, shared, dense MLP projections (unless given their own key)
    Family.ROUTER,
    Family.SMALL_PARAMS,
    FormatKey.ROUTED_GATE_UP,
    FormatKey.ROUTED_DOWN,
    Family.LM_HEAD,
    "embedding",
)

# Optional format keys: a model file (or ``--formats``) may give these their own format;
# absent, they fall back to the key on the right (the KV cache defaults to bf16).
OPTIONAL_FORMAT_KEYS: dict[str, str] = {
    "attention": "dense",  # kda_proj / mla_proj / gqa_proj
    Family.LATENT_PROJ: "dense",
    Family.SHARED_EXPERT: "dense",
    Family.DENSE_MLP: "dense",
    "kv": "",  # KV cache values; "" = bf16
}


# Bounds on the counts every loop runs over (layers, experts), so that a typo in a model file
# (10**9 layers) is refused where it enters instead of hanging a command: the deepest published
# decoder has 126 layers (Llama 3.1 405B) and the widest MoE a few hundred routed experts
# (K3: 384), so both leave two orders of magnitude of room.
MAX_LAYERS = 1024
MAX_EXPERTS = 65536


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KdaConfig(_Frozen):
    """Linear attention with a gated delta rule: Kimi Delta Attention or Gated DeltaNet."""

    variant: Literal["kda", "gated_deltanet"] = Field(
        default="kda", description="kda: low-rank channel decay; gated_deltanet: scalar decay per value head")
    num_heads: int = Field(ge=1, description="query/key heads")
    head_dim: int = Field(ge=1, description="q/k head dim; the state is head_dim x value_head_dim f32")
    num_value_heads: int | None = Field(default=None, ge=1, description="value heads (default num_heads)")
    value_head_dim: int | None = Field(default=None, ge=1, description="value head dim (default head_dim)")
    conv_kernel: int = Field(default=4, ge=1, description="short causal conv width")
    decay_rank: int = Field(default=0, ge=0, description="low-rank decay gate hidden -> rank -> width (kda); 0: none")
    decay_lower_bound: float = Field(default=-5.0, lt=0.0, description="lower bound of log decay g")

    @model_validator(mode="after")
    def _check(self) -> KdaConfig:
        if self.variant == "kda" and not self.decay_rank:
            raise ValueError("decay_rank is required for variant kda")
        return self

    @property
    def value_heads(self) -> int:
        return self.num_value_heads or self.num_heads

    @property
    def value_dim(self) -> int:
        return self.value_head_dim or self.head_dim

    @property
    def value_heads_per_key_head(self) -> int:
        return self.value_heads // self.num_heads


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
    qk_norm: bool = Field(default=False, description="RMSNorm over each q and k head (Qwen3): 2 x head_dim")



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

    num_experts: int = Field(ge=1, le=MAX_EXPERTS)
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
    routing_groups: int = Field(default=1, ge=1, description="grouped top-k: expert groups (DeepSeek n_group)")
    routing_groups_per_token: int = Field(default=1, ge=1, description="groups a token may pick (topk_group)")

    @model_validator(mode="after")
    def _check(self) -> MoeConfig:
        if self.num_experts % self.routing_groups or self.routing_groups_per_token > self.routing_groups:
            raise ValueError(f"routing_groups ({self.routing_groups}) must divide num_experts and be >= "
                             f"routing_groups_per_token ({self.routing_groups_per_token})")
        if self.routing_groups > 1 and self.top_k > self.routing_groups_per_token * (
                self.num_experts // self.routing_groups):  # top_k vs all experts: model_checks
            raise ValueError(f"top_k ({self.top_k}) exceeds the experts of {self.routing_groups_per_token} groups")
        if self.num_shared_experts and not self.shared_intermediate_size:
            raise ValueError("shared_intermediate_size is required with shared experts")
        return self

    @property
    def expert_input_size(self) -> int | None:
        return self.latent_size


class ModelConfig(_Frozen):
    """A decoder-only transformer: MoE (``moe`` set) or dense (``moe`` absent, every layer
    in ``dense_layers``)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-@+_]*$")
    description: str = ""
    source: str = Field(min_length=1, description="where the architecture facts come from")
    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    rms_norm_eps: float = Field(default=1e-5, gt=0.0)
    attention_pattern: AttentionPattern
    kda: KdaConfig | None = None
    mla: MlaConfig | None = None
    gqa: GqaConfig | None = None
    dense_layers: list[int] = Field(default_factory=list, description="layers with a dense MLP")
    dense_intermediate_size: int = Field(default=0, ge=0)
    moe: MoeConfig | None = Field(default=None, description="routed experts; None: a dense model")
    tied_embeddings: bool = Field(default=False, description="lm_head shares the embedding matrix")
    mtp_layers: int = Field(
        default=0, ge=0, description="multi-token-prediction layers in the checkpoint (DeepSeek-V3: 1); "
        "resident weights, not run by the plain decode step")
    activation: Literal["situ", "silu"] = "silu"
    residual: Literal["standard", "attention_residuals"] = "standard"
    residual_block_layers: int = Field(default=12, ge=1, description="attention-residual block")
    formats: dict[str, str] = Field(description="weight format per format key")
    format_variants: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="named alternatives overriding ``formats``"
    )
    variant: str | None = Field(default=None, description="selected format variant, if any")
    deployment_variants: dict[str, str] = Field(
        default_factory=dict, description="the format variant a chip kind serves the model in by default "
        "(``gpu: mxfp4``: Blackwell takes FP4 experts natively, the TPU re-blocks them); see for_chip_kind")
    logit_softcap: float | None = Field(default=None, gt=0.0)
    max_context_tokens: int | None = Field(
        default=None, ge=1, description="longest context the model supports, tokens (config.json "
        "max_position_embeddings); None where no figure is published")

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        known_keys = (*FORMAT_KEYS, *OPTIONAL_FORMAT_KEYS)
        for key, fmt in self.formats.items():
            if key not in known_keys:
                raise ValueError(f"formats.{key}: unknown format key; known: {', '.join(known_keys)}")
            if fmt not in FORMATS:
                raise ValueError(f"formats.{key}: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
        missing = [key for key in FORMAT_KEYS if key not in self.formats]
        if missing:
            raise ValueError(f"formats: missing keys {', '.join(missing)}")
        for variant, overrides in self.format_variants.items():
            for key, fmt in overrides.items():
                if key not in known_keys or fmt not in FORMATS:
                    raise ValueError(f"format_variants.{variant}.{key}: unknown key or format {fmt!r}")
        for kind, variant in self.deployment_variants.items():
            if variant not in self.format_variants:
                raise ValueError(f"deployment_variants.{kind}: no format variant {variant!r}")
        for layer in self.dense_layers:
            if not 0 <= layer < self.num_layers:
                raise ValueError(f"dense_layers: layer {layer} outside 0..{self.num_layers - 1}")
        if self.dense_layers and not self.dense_intermediate_size:
            raise ValueError("dense_intermediate_size is required with dense_layers")
        if self.moe is None and len(set(self.dense_layers)) != self.num_layers:
            raise ValueError("a model without `moe` must list every layer in dense_layers")
        for layer in range(self.num_layers):
            kind = self.attention_pattern.kind_of(layer)
            if getattr(self, kind) is None:
                raise ValueError(f"layer {layer} uses {kind} attention but `{kind}` is not configured")
        from tpusim.workload.model_checks import config_violations

        problems = config_violations(self)  # the cross-field rules, all at once (one owner)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def attention_kind(self, layer: int) -> AttentionKind:
        return self.attention_pattern.kind_of(layer)

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.dense_layers

    @property
    def num_experts(self) -> int:
        """Routed experts per MoE layer (0 for a dense model)."""
        return self.moe.num_experts if self.moe else 0

    @cached_property
    def moe_layers(self) -> list[int]:
        return [layer for layer in range(self.num_layers) if self.is_moe_layer(layer)]

    def format_of(self, key: str) -> str:
        """The format of ``key``; an optional key falls back to its parent (kv: bf16)."""
        if key in self.formats:
            return self.formats[key]
        if key in OPTIONAL_FORMAT_KEYS:
            parent = OPTIONAL_FORMAT_KEYS[key]
            return self.formats[parent] if parent else "bf16"
        raise KeyError(f"unknown format key {key!r}")

    def with_formats(self, overrides: dict[str, str]) -> ModelConfig:
        """The same model with some format keys replaced (validated)."""
        return ModelConfig.model_validate({**self.model_dump(), "formats": {**self.formats, **overrides}})

    def with_variant(self, variant: str) -> ModelConfig:
        if variant not in self.format_variants:
            known = ", ".join(self.format_variants) or "none"
            raise KeyError(f"model {self.name} has no format variant {variant!r}; known: {known}")
        formats = {**self.formats, **self.format_variants[variant]}
        return self.model_copy(update={"formats": formats, "variant": variant})

    def for_chip_kind(self, kind: str) -> ModelConfig:
        """The model as a ``kind`` chip serves it: its deployment variant for that kind when no
        variant was chosen (a named ``@variant`` or explicit formats win), else unchanged."""
        variant = self.deployment_variants.get(kind)
        return self.with_variant(variant) if variant and self.variant is None else self

    def with_expert_width(self, width: int) -> ModelConfig:
        """The same architecture with routed experts ``width`` columns wide (a MoE model only):
        :func:`tpusim.workload.kernel_support.map_deployment` widens the nano kernel model's
        experts so that a deployment's expert TP cuts them into slices the kernel runs."""
        if self.moe is None:
            raise ValueError(f"model {self.name} has no routed experts to widen")
        data = self.model_dump()
        data["moe"]["expert_intermediate_size"] = width
        return ModelConfig.model_validate(data)

    def with_layers(self, num_layers: int) -> ModelConfig:
        """The same architecture with ``num_layers`` layers (patterns keep their rules)."""
        dense = [layer for layer in self.dense_layers if layer < num_layers]
        if self.moe is None:
            dense = list(range(num_layers))
        data = self.model_dump()
        for rule in data["attention_pattern"]["rules"]:  # explicit layers past the cut do not exist any more
            rule["layers"] = [layer for layer in rule["layers"] if layer < num_layers]
        data.update(num_layers=num_layers, dense_layers=dense)
        return ModelConfig.model_validate(data)
