"""Per-device weight tensors: the one place that owns every shape and byte count.

The simulator's bytes and the kernel's HBM layout both come from these functions. Every
tensor is stored ``rows x cols`` with ``rows`` the contraction dimension (``x @ W``), so
block scales run down the rows. Widths pad to the plan's ``lane_multiple`` per sub-block.

Per device ``d`` of a plan with ``h`` attention heads per device (``H`` hidden, ``P``
padding to the lane multiple; for linear attention ``hv = h x value heads per key head``,
``vd`` the value head dim):

| tensor | family | rows x cols | format key |
| --- | --- | --- | --- |
| ``kda.qkvgb`` | kda_proj | H x (2·P(h·hd) + 2·P(hv·vd) + P(hv) [+ P(hv): Gated DeltaNet decay]) | attention |
| ``kda.decay_a`` | kda_proj | H x decay_rank (KDA only) | attention |
| ``kda.decay_b`` | kda_proj | decay_rank x hv·vd (KDA only) | attention |
| ``kda.o`` | kda_proj | hv·vd x H | attention |
| ``mla.q_a`` | mla_proj | H x q_lora | attention |
| ``mla.q_b`` | mla_proj | q_lora x h·(nope + P(rope)) | attention |
| ``mla.kv_a`` | mla_proj | H x (kv_lora + P(rope)) | attention |
| ``mla.kv_b`` | mla_proj | kv_lora x h·(nope + v) | attention |
| ``mla.gate`` | mla_proj | H x h·v | attention |
| ``mla.o`` | mla_proj | h·v x H | attention |
| ``gqa.q/k/v/gate/o`` | gqa_proj | H x h·hd, H x kvh·hd (x2), H x h·hd, h·hd x H | attention |
| ``small.*`` | small_params | norms, biases, decay and mixture params (1 x n) | small_params |
| ``moe.router`` | router | H x router_cols | router |
| ``moe.latent_down`` / ``moe.latent_up`` | latent_proj | H x ld, L x lu | latent_proj |
| ``moe.shared_gate_up`` / ``moe.shared_down`` | shared_expert | H x 2s, s x H | shared_expert |
| ``expert.gate_up`` / ``expert.down`` | routed_expert | L x 2w, w x L (one slice) | routed_gate_up / routed_down |
| ``mlp.gate_up`` / ``mlp.down`` | dense_mlp | H x 2m, m x H | dense_mlp |
| ``head.lm_head`` | lm_head | H x vocab rows | lm_head |

The ``attention``, ``latent_proj``, ``shared_expert`` and ``dense_mlp`` format keys fall back
to ``dense`` when a model does not set them (:data:`OPTIONAL_FORMAT_KEYS`).

Worked check (K3 TP32, bf16): KDA = 7168·(4·384+128)·2 + 7168·128·2 + 128·384·2 + 384·7168·2
= 29.84 MiB; MLA = 21 + 2.25 + 8.75 + 0.75 + 5.25 + 5.25 = 43.25 MiB; one expert slice =
5.25 MiB FP8 gate/up + 42 KiB scales + 1.3125 MiB MXFP4 down + 84 KiB scales = 7,010,304 B.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from tpusim.workload.formats import (
    WeightFormat,
    scale_bytes,
    tensor_bytes,
    value_bytes,
    weight_format,
)
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import (
    ExpertTensor,
    Family,
    FormatKey,
    GqaTensor,
    HeadTensor,
    KdaTensor,
    MlaTensor,
    MlpTensor,
    MoeTensor,
    MtpTensor,
    SmallParam,
)
from tpusim.workload.sharding import ShardingPlan, round_up


@dataclass(frozen=True)
class TensorSpec:
    """One weight tensor on one device."""

    name: str
    family: str
    format_key: str
    format_name: str
    rows: int
    cols: int

    @cached_property
    def fmt(self) -> WeightFormat:
        return weight_format(self.format_name)

    @cached_property
    def bytes(self) -> int:
        return tensor_bytes(self.fmt, self.rows, self.cols)

    @property
    def value_bytes(self) -> int:
        return value_bytes(self.fmt, self.rows, self.cols)

    @property
    def scale_bytes(self) -> int:
        return scale_bytes(self.fmt, self.rows, self.cols)


@dataclass(frozen=True)
class DeviceWidths:
    """The per-device widths every tensor shape here is built from (columns padded to the
    plan's lane multiple where a kernel needs aligned column blocks). The megakernel takes its
    dimensions from this too (:mod:`megakernel.dims`)."""

    hidden: int
    heads: int  # attention heads on one device
    lane_multiple: int
    kda_width: int  # heads * head_dim
    kda_padded_width: int  # column block of q, k, v, gate in the fused KDA projection
    kda_beta_cols: int  # beta logits per value head
    mla_rope_pad: int  # rope key width padded to the lane multiple
    router_cols: int
    latent_down_cols: int
    latent_up_cols: int
    shared_width: int
    expert_slice_width: int
    local_experts: int
    dense_width: int
    vocab_rows: int


def device_widths(model: ModelConfig, plan: ShardingPlan) -> DeviceWidths:
    """Per-device widths of ``model`` under ``plan``."""
    pad, heads = plan.lane_multiple, plan.attention_heads_per_device
    kda_width = heads * model.kda.head_dim if model.kda else 0
    value_heads = heads * model.kda.value_heads_per_key_head if model.kda else heads
    return DeviceWidths(
        hidden=model.hidden_size, heads=heads, lane_multiple=pad, kda_width=kda_width,
        kda_padded_width=round_up(kda_width, pad), kda_beta_cols=round_up(value_heads, pad),
        mla_rope_pad=round_up(model.mla.qk_rope_head_dim, pad) if model.mla else 0,
        router_cols=plan.router_cols_per_device, latent_down_cols=plan.latent_down_cols_per_device,
        latent_up_cols=plan.latent_up_cols_per_device, shared_width=plan.shared_intermediate_per_device,
        expert_slice_width=plan.expert_slice_width(model), local_experts=plan.experts_per_group(model),
        dense_width=plan.dense_intermediate_per_device, vocab_rows=plan.vocab_rows_per_device,
    )


def _spec(model: ModelConfig, name: str, family: str, key: str, rows: int, cols: int) -> TensorSpec:
    return TensorSpec(name, family, key, model.format_of(key), rows, cols)


def attention_tensors(model: ModelConfig, plan: ShardingPlan, layer: int) -> list[TensorSpec]:
    """Attention projections of ``layer`` on one device."""
    widths = device_widths(model, plan)
    hidden, heads, pad = model.hidden_size, widths.heads, widths.lane_multiple
    kind = model.attention_kind(layer)
    if kind == "kda":
        kda = model.kda
        assert kda is not None
        value_heads = heads * kda.value_heads_per_key_head
        value_width = value_heads * kda.value_dim
        # q, k (key width), v, output gate (value width), beta per value head, and for Gated
        # DeltaNet the decay input per value head too (KDA's decay is the low-rank pair below).
        fused = 2 * widths.kda_padded_width + 2 * round_up(value_width, pad) + widths.kda_beta_cols
        if not kda.decay_rank:
            fused += round_up(value_heads, pad)
        tensors = [_spec(model, KdaTensor.QKVGB, Family.KDA_PROJ, "attention", hidden, fused)]
        if kda.decay_rank:
            tensors += [
                _spec(model, KdaTensor.DECAY_A, Family.KDA_PROJ, "attention", hidden, kda.decay_rank),
                _spec(model, KdaTensor.DECAY_B, Family.KDA_PROJ, "attention", kda.decay_rank, value_width),
            ]
        return [*tensors, _spec(model, KdaTensor.OUT, Family.KDA_PROJ, "attention", value_width, hidden)]
    if kind == "mla":
        mla = model.mla
        assert mla is not None
        q_cols = heads * (mla.qk_nope_head_dim + widths.mla_rope_pad)
        tensors = [
            _spec(model, MlaTensor.Q_A, Family.MLA_PROJ, "attention", hidden, mla.q_lora_rank),
            _spec(model, MlaTensor.Q_B, Family.MLA_PROJ, "attention", mla.q_lora_rank, q_cols),
            _spec(model, MlaTensor.KV_A, Family.MLA_PROJ, "attention", hidden,
                  mla.kv_lora_rank + widths.mla_rope_pad),
            _spec(model, MlaTensor.KV_B, Family.MLA_PROJ, "attention", mla.kv_lora_rank,
                  heads * (mla.qk_nope_head_dim + mla.v_head_dim)),
        ]
        if mla.output_gate:
            tensors.append(_spec(model, MlaTensor.GATE, Family.MLA_PROJ, "attention", hidden, heads * mla.v_head_dim))
        tensors.append(_spec(model, MlaTensor.OUT, Family.MLA_PROJ, "attention", heads * mla.v_head_dim, hidden))
        return tensors
    gqa = model.gqa
    assert gqa is not None
    q_width = heads * gqa.head_dim
    kv_width = plan.kv_heads_per_device * gqa.head_dim
    tensors = [
        _spec(model, GqaTensor.Q, Family.GQA_PROJ, "attention", hidden, q_width),
        _spec(model, GqaTensor.K, Family.GQA_PROJ, "attention", hidden, kv_width),
        _spec(model, GqaTensor.V, Family.GQA_PROJ, "attention", hidden, kv_width),
    ]
    if gqa.output_gate:
        tensors.append(_spec(model, GqaTensor.GATE, Family.GQA_PROJ, "attention", hidden, q_width))
    tensors.append(_spec(model, GqaTensor.OUT, Family.GQA_PROJ, "attention", q_width, hidden))
    return tensors


def small_param_tensors(model: ModelConfig, plan: ShardingPlan, layer: int) -> list[TensorSpec]:
    """Norm weights, router bias, decay and residual-mixture parameters of ``layer`` (f32)."""
    hidden, heads = model.hidden_size, plan.attention_heads_per_device
    sizes: list[tuple[str, int]] = [(SmallParam.ATTN_NORM, hidden), (SmallParam.MLP_NORM, hidden)]
    if model.residual == "attention_residuals":
        sizes.append((SmallParam.RESIDUAL_MIX, 2 * hidden))
    kind = model.attention_kind(layer)
    if kind == "kda" and model.kda:
        kda = model.kda
        width = heads * kda.head_dim
        value_heads = heads * kda.value_heads_per_key_head
        conv_channels = 2 * width + value_heads * kda.value_dim
        if kda.variant == "kda":
            sizes += [(SmallParam.KDA_A_LOG, heads), (SmallParam.KDA_DT_BIAS, width)]
        else:  # Gated DeltaNet: per-value-head decay parameters, gated RMSNorm over a value head
            sizes += [(SmallParam.KDA_A_LOG, value_heads), (SmallParam.KDA_DT_BIAS, value_heads),
                      (SmallParam.KDA_OUT_NORM, kda.value_dim)]
        sizes.append((SmallParam.KDA_CONV, conv_channels * kda.conv_kernel))
    if kind == "mla" and model.mla:
        sizes += [(SmallParam.MLA_Q_NORM, model.mla.q_lora_rank), (SmallParam.MLA_KV_NORM, model.mla.kv_lora_rank)]
    if kind == "gqa" and model.gqa and model.gqa.qk_norm:
        sizes += [(SmallParam.GQA_Q_NORM, model.gqa.head_dim), (SmallParam.GQA_K_NORM, model.gqa.head_dim)]
    if model.moe is not None and model.is_moe_layer(layer):
        if model.moe.router_bias:
            sizes.append((SmallParam.ROUTER_BIAS, model.moe.num_experts))
        if model.moe.latent_norm and model.moe.latent_size:
            sizes.append((SmallParam.LATENT_NORM, model.moe.latent_size))
    return [_spec(model, name, Family.SMALL_PARAMS, Family.SMALL_PARAMS, 1, size) for name, size in sizes]


def moe_dense_tensors(model: ModelConfig, plan: ShardingPlan) -> list[TensorSpec]:
    """Router, latent projections and shared experts of one MoE layer on one device."""
    hidden, moe = model.hidden_size, model.moe
    assert moe is not None, "moe_dense_tensors needs an MoE model"
    tensors = [_spec(model, MoeTensor.ROUTER, Family.ROUTER, Family.ROUTER, hidden, plan.router_cols_per_device)]
    if moe.latent_size:
        tensors += [
            _spec(model, MoeTensor.LATENT_DOWN, Family.LATENT_PROJ, Family.LATENT_PROJ, hidden, plan.latent_down_cols_per_device),
            _spec(model, MoeTensor.LATENT_UP, Family.LATENT_PROJ, Family.LATENT_PROJ, moe.latent_size, plan.latent_up_cols_per_device),
        ]
    if moe.num_shared_experts:
        width = plan.shared_intermediate_per_device
        tensors += [
            _spec(model, MoeTensor.SHARED_GATE_UP, Family.SHARED_EXPERT, Family.SHARED_EXPERT, hidden, 2 * width),
            _spec(model, MoeTensor.SHARED_DOWN, Family.SHARED_EXPERT, Family.SHARED_EXPERT, width, hidden),
        ]
    return tensors


def expert_slice_tensors(model: ModelConfig, plan: ShardingPlan) -> list[TensorSpec]:
    """One routed expert's slice on one device (gate/up fused, then down)."""
    assert model.moe is not None, "expert_slice_tensors needs an MoE model"
    width = plan.expert_slice_width(model)
    expert_input = model.moe.latent_size or model.hidden_size
    return [
        _spec(model, ExpertTensor.GATE_UP, Family.ROUTED_EXPERT, FormatKey.ROUTED_GATE_UP, expert_input, 2 * width),
        _spec(model, ExpertTensor.DOWN, Family.ROUTED_EXPERT, FormatKey.ROUTED_DOWN, width, expert_input),
    ]


def expert_slice_bytes(model: ModelConfig, plan: ShardingPlan) -> int:
    """Bytes of one routed expert's slice on one device (0 for a dense model)."""
    return sum(t.bytes for t in expert_slice_tensors(model, plan)) if model.moe else 0


def dense_mlp_tensors(model: ModelConfig, plan: ShardingPlan) -> list[TensorSpec]:
    width, hidden = plan.dense_intermediate_per_device, model.hidden_size
    return [
        _spec(model, MlpTensor.GATE_UP, Family.DENSE_MLP, Family.DENSE_MLP, hidden, 2 * width),
        _spec(model, MlpTensor.DOWN, Family.DENSE_MLP, Family.DENSE_MLP, width, hidden),
    ]


def lm_head_tensors(model: ModelConfig, plan: ShardingPlan) -> list[TensorSpec]:
    return [_spec(model, HeadTensor.LM_HEAD, Family.LM_HEAD, Family.LM_HEAD, model.hidden_size, plan.vocab_rows_per_device)]


def mtp_tensors(model: ModelConfig, plan: ShardingPlan) -> list[TensorSpec]:
    """What one multi-token-prediction layer adds beyond a copy of the last block, on one
    device: ``eh_proj`` (concatenated embedding and hidden, 2H -> H, column-split) and its
    three H-wide norms (DeepSeek-V3 ``enorm``, ``hnorm``, ``shared_head.norm``). Resident
    weights only: the plain decode step does not run them."""
    hidden = model.hidden_size
    cols = round_up(-(-hidden // plan.devices), plan.lane_multiple)
    return [_spec(model, MtpTensor.EH_PROJ, Family.MTP_PROJ, "dense", 2 * hidden, cols),
            _spec(model, SmallParam.MTP_NORMS, Family.SMALL_PARAMS, Family.SMALL_PARAMS, 1, 3 * hidden)]


def layer_tensors(model: ModelConfig, plan: ShardingPlan, layer: int) -> list[TensorSpec]:
    """Every non-expert tensor ``layer`` reads on one device, in program order."""
    tensors = small_param_tensors(model, plan, layer) + attention_tensors(model, plan, layer)
    if model.is_moe_layer(layer):
        tensors += moe_dense_tensors(model, plan)
    else:
        tensors += dense_mlp_tensors(model, plan)
    return tensors


def kv_cache_bytes_per_token(model: ModelConfig, plan: ShardingPlan, layer: int) -> int:
    """KV-cache bytes one sequence adds per token in ``layer`` on one device, in the ``kv``
    format (bf16 unless the model or ``--formats kv=...`` says otherwise; a block-scaled
    format adds its scales per token vector).

    MLA keeps the compressed latent + rope key (padded to the lane multiple), shared by the
    device's heads; GQA keeps K and V of the device's KV heads; KDA keeps no cache.
    """
    kind = model.attention_kind(layer)
    fmt = weight_format(model.format_of("kv"))
    if kind == "mla" and model.mla:
        return tensor_bytes(fmt, model.mla.kv_lora_rank + device_widths(model, plan).mla_rope_pad, 1)
    if kind == "gqa" and model.gqa:
        return 2 * plan.kv_heads_per_device * tensor_bytes(fmt, model.gqa.head_dim, 1)
    return 0


def attention_span_tokens(model: ModelConfig, layer: int, context_tokens: int) -> int:
    """Tokens a decode step attends over in ``layer`` (sliding windows cap it)."""
    gqa = model.gqa
    if model.attention_kind(layer) == "gqa" and gqa and gqa.sliding_window:
        full = gqa.full_attention_every and layer % gqa.full_attention_every == gqa.full_attention_offset
        if not full:
            return min(context_tokens, gqa.sliding_window)
    return context_tokens


def recurrent_state_bytes(model: ModelConfig, plan: ShardingPlan, layer: int) -> int:
    """Delta-rule recurrent-state bytes one sequence holds in ``layer`` on one device (f32):
    a ``head_dim x value_head_dim`` matrix per value head."""
    if model.attention_kind(layer) == "kda" and model.kda:
        kda = model.kda
        value_heads = plan.attention_heads_per_device * kda.value_heads_per_key_head
        return value_heads * kda.head_dim * kda.value_dim * 4
    return 0
