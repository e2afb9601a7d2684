"""Per-device dimensions of the K3 decode step, derived from a model config and a plan.

Every width the reference, the layout and the kernel use comes from here, and every width
here comes from :mod:`tpusim.workload.shapes` (the one owner of per-device shapes and bytes:
:func:`~tpusim.workload.shapes.device_widths` and the tensor lists), so the simulator and the
kernel cannot drift apart.

Single device (``plan_for(model, 1)``): every width is the model's. On a multi-device plan
:class:`megakernel.kernel_collectives.CollectiveMegakernel` runs the plan's collectives inside
the kernel (``routes_all_experts=True``), so nothing is stood in for. The one-device
:class:`megakernel.kernel.Megakernel` can still be built at one device's widths of the K3
TP32 plan with the collectives omitted (a lowering-only configuration); where the widths do
not compose without a collective it uses these stand-ins, all named in docs/megakernel.md:

- the latent all-gather: the local ``latent_down`` columns fill the first columns of the
  latent, the rest stay zero;
- the MoE output all-gather: ``latent_up``'s local columns fill the first hidden columns;
- routing: the router's local columns score the first ``scored_experts =
  min(router_cols, num_experts, experts per group)`` experts, all owned by this device, so
  every winner is local.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from megakernel.math_kda import KdaDims
from megakernel.math_mla import MlaDims
from megakernel.residual import num_block_slots
from tpusim.schedule.kernel_layout import LANES
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import (
    ExpertTensor,
    Family,
    FormatKey,
    HeadTensor,
    KdaTensor,
    MlaTensor,
    MlpTensor,
    MoeTensor,
    SmallParam,
)
from tpusim.workload.shapes import (
    TensorSpec,
    attention_tensors,
    dense_mlp_tensors,
    device_widths,
    expert_slice_tensors,
    lm_head_tensors,
    moe_dense_tensors,
    small_param_tensors,
)
from tpusim.workload.sharding import ShardingPlan, round_up

STREAMED_FORMAT = "bf16"  # the kernel streams every dense matrix in bf16 (experts keep their formats)
STREAMED = (
    KdaTensor.QKVGB, KdaTensor.DECAY_A, KdaTensor.DECAY_B, KdaTensor.OUT, MlaTensor.Q_A, MlaTensor.Q_B, MlaTensor.KV_A, MlaTensor.KV_B,
    MlaTensor.GATE, MlaTensor.OUT, MoeTensor.ROUTER, MoeTensor.LATENT_DOWN, MoeTensor.LATENT_UP, MoeTensor.SHARED_GATE_UP,
    MoeTensor.SHARED_DOWN, ExpertTensor.GATE_UP, ExpertTensor.DOWN, MlpTensor.GATE_UP, MlpTensor.DOWN, HeadTensor.LM_HEAD,
)

# Small parameters of a layer, packed in one f32 row in this order; each kind starts at a
# multiple of 128 lanes. Layers without a kind (KDA params on an MLA layer) hold zeros there.
SMALL_KINDS = (
    SmallParam.ATTN_NORM, SmallParam.MLP_NORM, SmallParam.RESIDUAL_MIX, SmallParam.KDA_A_LOG,
    SmallParam.KDA_DT_BIAS, SmallParam.KDA_CONV, SmallParam.MLA_Q_NORM, SmallParam.MLA_KV_NORM,
    SmallParam.ROUTER_BIAS, SmallParam.LATENT_NORM,
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
    shapes: dict[str, tuple[int, int]] = field(default_factory=dict, hash=False)  # from tpusim shapes
    families: dict[str, str] = field(default_factory=dict, hash=False)  # tensor -> weight family (same)
    # The config and plan the widths came from: the kernel asks the simulator's issue plan
    # (tpusim.schedule.program_issue) where a ring pool's slabs land, on this model's program.
    model: ModelConfig | None = field(default=None, hash=False, compare=False, repr=False)
    plan: ShardingPlan | None = field(default=None, hash=False, compare=False, repr=False)
    # Weight banks (0: off). With N > 0 every stacked weight (small parameters, each attention
    # kind's projections, the MoE dense tensors, the routed experts) holds N distinct entries
    # and the tensor of stack index i is entry i % N. One chip then runs a program whose own
    # weights would not fit its HBM (K3's TP32 per-device program: 112 experts x 92 layers);
    # every copy still reads its full bytes from HBM (no cache), so DMA bytes and time are the
    # program's. Only the weight *values* repeat, which the reference follows (stack_entry).
    weight_banks: int = 0

    def stack_entry(self, index: Any) -> Any:
        """HBM stack entry of stack index ``index`` (an int or a traced i32)."""
        if not self.weight_banks:
            return index
        if isinstance(index, int):
            return index % self.weight_banks
        return jax.lax.rem(index, jnp.int32(self.weight_banks))

    def stack_size(self, instances: int) -> int:
        """Entries of a stack of ``instances`` tensors in HBM."""
        return min(instances, self.weight_banks) if self.weight_banks else instances

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


def model_dims(model: ModelConfig, plan: ShardingPlan, *, routes_all_experts: bool = False) -> ModelDims:
    """Validate that ``model`` is a K3-structured model and derive its per-device widths.

    ``routes_all_experts``: the multi-device decode kernel (:mod:`megakernel.multi_device_decode`)
    assembles every expert's score with the router exchange, so top-k runs over all
    ``num_experts`` (no single-device stand-in)."""
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
    expected = {FormatKey.ROUTED_GATE_UP: "fp8_e4m3_b256", FormatKey.ROUTED_DOWN: "mxfp4", "dense": "bf16",
                Family.ROUTER: "bf16", Family.LM_HEAD: "bf16", "embedding": "bf16", Family.SMALL_PARAMS: "f32"}
    for key, fmt in expected.items():
        if model.format_of(key) != fmt:
            problems.append(f"format {key} must be {fmt}, got {model.format_of(key)}")
    if problems:
        raise UnsupportedModel(f"model {model.name}: the K3 megakernel " + "; ".join(problems))
    kda, mla, moe = model.kda, model.mla, model.moe
    assert kda is not None and mla is not None and moe.latent_size is not None
    widths = device_widths(model, plan)
    heads = widths.heads
    offsets: dict[str, tuple[int, int]] = {}
    lengths = {t.name: t.cols for layer in (0, 1, 3) for t in small_param_tensors(model, plan, layer)}
    cursor = 0
    for kind in SMALL_KINDS:
        offsets[kind] = (cursor, lengths[kind])
        cursor += round_up(lengths[kind], LANES)
    dims = ModelDims(
        hidden=widths.hidden,
        vocab_rows=widths.vocab_rows,
        num_layers=model.num_layers,
        eps=model.rms_norm_eps,
        block_layers=model.residual_block_layers,
        kda=KdaDims(heads=heads, head_dim=kda.head_dim, padded_width=widths.kda_padded_width,
                    beta_cols=widths.kda_beta_cols, conv_kernel=kda.conv_kernel,
                    decay_rank=kda.decay_rank, lower_bound=kda.decay_lower_bound),
        mla=MlaDims(heads=heads, q_lora=mla.q_lora_rank, kv_lora=mla.kv_lora_rank,
                    nope=mla.qk_nope_head_dim, rope=mla.qk_rope_head_dim,
                    rope_pad=widths.mla_rope_pad, v_dim=mla.v_head_dim),
        moe=MoeDims(num_experts=moe.num_experts, local_experts=widths.local_experts,
                    scored_experts=(moe.num_experts if routes_all_experts
                                    else min(widths.router_cols, moe.num_experts, widths.local_experts)),
                    top_k=moe.top_k, latent=moe.latent_size,
                    latent_down_cols=widths.latent_down_cols,
                    latent_up_cols=widths.latent_up_cols,
                    slice_width=widths.expert_slice_width,
                    shared_width=widths.shared_width,
                    router_cols=widths.router_cols, routed_scaling=moe.routed_scaling),
        dense_width=widths.dense_width,
        kinds=tuple(model.attention_kind(layer) for layer in range(model.num_layers)),
        small_offsets=offsets,
        small_cols=cursor,
        shapes={t.name: (t.rows, t.cols) for t in _streamed_tensors(model, plan)},
        families={t.name: t.family for t in _streamed_tensors(model, plan)},
        model=model,
        plan=plan,
    )
    if dims.moe.top_k > dims.moe.scored_experts:
        raise UnsupportedModel(f"model {model.name}: top_k exceeds the experts scored per device")
    return dims


def _streamed_tensors(model: ModelConfig, plan: ShardingPlan) -> list[TensorSpec]:
    """Every matrix the kernel streams, from :mod:`tpusim.workload.shapes`."""
    kda_layer = next(layer for layer in range(model.num_layers) if model.attention_kind(layer) == "kda")
    mla_layer = next(layer for layer in range(model.num_layers) if model.attention_kind(layer) == "mla")
    tensors = (attention_tensors(model, plan, kda_layer) + attention_tensors(model, plan, mla_layer)
               + moe_dense_tensors(model, plan) + expert_slice_tensors(model, plan)
               + dense_mlp_tensors(model, plan) + lm_head_tensors(model, plan))
    return tensors


def weight_shapes(dims: ModelDims) -> list[tuple[str, tuple[int, int]]]:
    """(name, (rows, cols)) of every streamed matrix, rows = contraction, in the kernel's order."""
    return [(name, dims.shapes[name]) for name in STREAMED if name in dims.shapes]
