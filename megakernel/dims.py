"""Per-device dimensions of the K3 decode step, derived from a model config and a plan.

Every width the reference, the layout and the kernel use comes from here, and
:func:`ModelDims.check_against_shapes` asserts they equal :mod:`tpusim.workload.shapes` (the one place
that owns per-device shapes and bytes), so the simulator and the kernel cannot drift apart.

Single device (``plan_for(model, 1)``): every width is the model's. On the K3 TP32 plan the
kernel is built at one device's sizes with the collectives omitted (a lowering-only
configuration); where the plan's per-device widths do not compose without a collective we
use these stand-ins, all named in README:

- the latent all-gather: the local ``latent_down`` columns fill the first columns of the
  latent, the rest stay zero;
- the MoE output all-gather: ``latent_up``'s local columns fill the first hidden columns;
- routing: the router's local columns score the first ``scored_experts =
  min(router_cols, num_experts, experts per group)`` experts, all owned by this device, so
  every winner is local.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megakernel.math_kda import KdaDims
from megakernel.math_mla import MlaDims
from megakernel.residual import num_block_slots
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.shapes import (
    attention_tensors,
    dense_mlp_tensors,
    expert_slice_tensors,
    lm_head_tensors,
    moe_dense_tensors,
    small_param_tensors,
)
from tpusim.workload.sharding import ShardingPlan, round_up

LANES = 128

# Small parameters of a layer, packed in one f32 row in this order; each kind starts at a
# multiple of 128 lanes. Layers without a kind (KDA params on an MLA layer) hold zeros there.
SMALL_KINDS = (
    "small.attn_norm", "small.mlp_norm", "small.residual_mix", "small.kda_a_log",
    "small.kda_dt_bias", "small.kda_conv", "small.mla_q_norm", "small.mla_kv_norm",
    "small.router_bias", "small.latent_norm",
)


class UnsupportedModel(ValueError):
    """The model is outside what this kernel implements (message says what)."""


@dataclass(frozen=True)
class MoeDims:
    num_experts: int  # experts of the model
    local_experts: int  # expert slices stored on this device
    scored_experts: int  # experts the local router columns score
    top_k: int
    latent: int  # expert input width L
    latent_down_cols: int
    latent_up_cols: int
    slice_width: int  # w: this device's part of an expert's intermediate width
    shared_width: int
    router_cols: int
    routed_scaling: float


@dataclass(frozen=True)
class ModelDims:
    hidden: int
    vocab_rows: int
    num_layers: int
    eps: float
    block_layers: int
    kda: KdaDims
    mla: MlaDims
    moe: MoeDims
    dense_width: int  # layer-0 MLP intermediate on this device
    kinds: tuple[str, ...]  # attention kind per layer ("kda" | "mla")
    small_offsets: dict[str, tuple[int, int]] = field(hash=False)  # kind -> (offset, length)
    small_cols: int = 0

    @property
    def kda_layers(self) -> list[int]:
        return [layer for layer, kind in enumerate(self.kinds) if kind == "kda"]

    @property
    def mla_layers(self) -> list[int]:
        return [layer for layer, kind in enumerate(self.kinds) if kind == "mla"]

    @property
    def moe_layers(self) -> list[int]:
        return list(range(1, self.num_layers))

    def kind_index(self, layer: int) -> int:
        """Position of ``layer`` in the stack of its attention kind."""
        return self.kinds[:layer].count(self.kinds[layer])

    @property
    def block_slots(self) -> int:
        return num_block_slots(self.num_layers, self.block_layers)

    def small(self, row, kind: str):
        """Slice kind ``kind`` out of a packed small-parameter row ``[..., small_cols]``."""
        offset, length = self.small_offsets[kind]
        return row[..., offset: offset + length]


def model_dims(model: ModelConfig, plan: ShardingPlan) -> ModelDims:
    """Validate that ``model`` is a K3-structured model and derive its per-device widths."""
    problems = []
    if model.kda is None or model.mla is None:
        problems.append("needs both KDA and MLA attention")
    if model.dense_layers != [0]:
        problems.append(f"needs dense_layers == [0], got {model.dense_layers}")
    if not model.moe.latent_size or not model.moe.latent_norm:
        problems.append("needs a latent MoE with a latent RMSNorm")
    if model.activation != "situ" or model.residual != "attention_residuals":
        problems.append("needs activation 'situ' and attention_residuals")
    if model.moe.router_scoring != "sigmoid" or not model.moe.router_bias:
        problems.append("needs sigmoid routing with a correction bias")
    expected = {"routed_gate_up": "fp8_e4m3_b256", "routed_down": "mxfp4", "dense": "bf16",
                "router": "bf16", "lm_head": "bf16", "embedding": "bf16", "small_params": "f32"}
    for key, fmt in expected.items():
        if model.format_of(key) != fmt:
            problems.append(f"format {key} must be {fmt}, got {model.format_of(key)}")
    if problems:
        raise UnsupportedModel(f"model {model.name}: the K3 megakernel " + "; ".join(problems))
    kda, mla, moe = model.kda, model.mla, model.moe
    assert kda is not None and mla is not None and moe.latent_size is not None
    heads, pad = plan.attention_heads_per_device, plan.lane_multiple
    local = plan.experts_per_group(model)
    offsets: dict[str, tuple[int, int]] = {}
    lengths = {t.name: t.cols for layer in (0, 1, 3) for t in small_param_tensors(model, plan, layer)}
    cursor = 0
    for kind in SMALL_KINDS:
        offsets[kind] = (cursor, lengths[kind])
        cursor += round_up(lengths[kind], LANES)
    dims = ModelDims(
        hidden=model.hidden_size,
        vocab_rows=plan.vocab_rows_per_device,
        num_layers=model.num_layers,
        eps=model.rms_norm_eps,
        block_layers=model.residual_block_layers,
        kda=KdaDims(heads=heads, head_dim=kda.head_dim, padded_width=round_up(heads * kda.head_dim, pad),
                    beta_cols=round_up(heads, pad), conv_kernel=kda.conv_kernel,
                    decay_rank=kda.decay_rank, lower_bound=kda.decay_lower_bound),
        mla=MlaDims(heads=heads, q_lora=mla.q_lora_rank, kv_lora=mla.kv_lora_rank,
                    nope=mla.qk_nope_head_dim, rope=mla.qk_rope_head_dim,
                    rope_pad=round_up(mla.qk_rope_head_dim, pad), v_dim=mla.v_head_dim),
        moe=MoeDims(num_experts=moe.num_experts, local_experts=local,
                    scored_experts=min(plan.router_cols_per_device, moe.num_experts, local),
                    top_k=moe.top_k, latent=moe.latent_size,
                    latent_down_cols=plan.latent_down_cols_per_device,
                    latent_up_cols=plan.latent_up_cols_per_device,
                    slice_width=plan.expert_slice_width(model),
                    shared_width=plan.shared_intermediate_per_device,
                    router_cols=plan.router_cols_per_device, routed_scaling=moe.routed_scaling),
        dense_width=plan.dense_intermediate_per_device,
        kinds=tuple(model.attention_kind(layer) for layer in range(model.num_layers)),
        small_offsets=offsets,
        small_cols=cursor,
    )
    if dims.moe.top_k > dims.moe.scored_experts:
        raise UnsupportedModel(f"model {model.name}: top_k exceeds the experts scored per device")
    check_against_shapes(dims, model, plan)
    return dims


def check_against_shapes(dims: ModelDims, model: ModelConfig, plan: ShardingPlan) -> None:
    """Assert every matrix the kernel streams has the (rows, cols) of :mod:`tpusim.workload.shapes`."""
    ours = dict(weight_shapes(dims))
    theirs = {}
    for layer in (0, 1, 3):
        for t in attention_tensors(model, plan, layer):
            theirs[t.name] = (t.rows, t.cols)
    for t in moe_dense_tensors(model, plan) + expert_slice_tensors(model, plan):
        theirs[t.name] = (t.rows, t.cols)
    for t in dense_mlp_tensors(model, plan) + lm_head_tensors(model, plan):
        theirs[t.name] = (t.rows, t.cols)
    for name, shape in theirs.items():
        if ours.get(name) != shape:
            raise AssertionError(f"{name}: kernel shape {ours.get(name)} != tpusim.workload.shapes {shape}")


def weight_shapes(dims: ModelDims) -> list[tuple[str, tuple[int, int]]]:
    """(name, (rows, cols)) of every streamed matrix, rows = contraction."""
    h, k, m, e = dims.hidden, dims.kda, dims.mla, dims.moe
    return [
        ("kda.qkvgb", (h, k.qkvgb_cols)), ("kda.decay_a", (h, k.decay_rank)),
        ("kda.decay_b", (k.decay_rank, k.width)), ("kda.o", (k.width, h)),
        ("mla.q_a", (h, m.q_lora)), ("mla.q_b", (m.q_lora, m.heads * m.q_head_cols)),
        ("mla.kv_a", (h, m.kv_cols)), ("mla.kv_b", (m.kv_lora, m.heads * m.kv_b_head_cols)),
        ("mla.gate", (h, m.heads * m.v_dim)), ("mla.o", (m.heads * m.v_dim, h)),
        ("moe.router", (h, e.router_cols)), ("moe.latent_down", (h, e.latent_down_cols)),
        ("moe.latent_up", (e.latent, e.latent_up_cols)),
        ("moe.shared_gate_up", (h, 2 * e.shared_width)), ("moe.shared_down", (e.shared_width, h)),
        ("expert.gate_up", (e.latent, 2 * e.slice_width)), ("expert.down", (e.slice_width, e.latent)),
        ("mlp.gate_up", (h, 2 * dims.dense_width)), ("mlp.down", (dims.dense_width, h)),
        ("head.lm_head", (h, dims.vocab_rows)),
    ]
