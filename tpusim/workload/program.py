"""The per-device program: what one device does in one decode step, op by op.

``build_program(model, plan, batch=B, context_tokens=C, routing=R, seed=S)`` turns a
model, a sharding plan and a routing draw into an ordered list of ops for one device. Each
op names the weight tensors it reads (from :mod:`tpusim.workload.shapes`), its matmuls as
``(rows, contraction, cols)`` triples, its vector work, the KV-cache / recurrent-state
bytes it streams, and the collectives issued after it. The engine simulates this list
under a schedule; the analytic floors sum it; the kernel follows the same op order.

Op order per layer (the vocabulary the kernel's event trace uses too):

- attention, KDA: ``attn.mix_norm, kda.qkvgb, kda.decay, kda.core, kda.o`` (Gated DeltaNet:
  no ``kda.decay``; its decay input is part of ``kda.qkvgb``)
- attention, MLA: ``attn.mix_norm, mla.q_a, mla.kv_a, mla.q_b, mla.kv_b, mla.core, mla.gate, mla.o``
- attention, GQA: ``attn.mix_norm, gqa.q, gqa.k, gqa.v, gqa.core, gqa.gate, gqa.o``
- MoE: ``mlp.mix_norm, moe.router, moe.latent_down, moe.topk, moe.shared_gate_up,
  moe.shared_down, expert[0..n-1], moe.combine, moe.latent_up``
- dense MLP: ``mlp.mix_norm, mlp.gate_up, mlp.down``
- after the last layer: ``head.norm, head.lm_head``

Device view: collectives synchronise all devices every layer, so the step runs at the pace
of the device with the most routed experts in each layer. ``device_view="critical"`` (the
default) takes, per layer, the expert group that loads the most distinct experts;
``device_view=g`` (an int) follows expert group ``g`` throughout.

Data-parallel attention (``plan.attention_dp > 1``): the attention ops run over this
device's ``ceil(batch / attention_dp)`` rows and sequences; the MoE / MLP over all rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.routing import (
    RoutingModel,
    distinct_per_group,
    draw_routing,
    tokens_per_expert,
)
from tpusim.workload.shapes import (
    TensorSpec,
    attention_span_tokens,
    attention_tensors,
    dense_mlp_tensors,
    expert_slice_tensors,
    kv_cache_bytes_per_token,
    lm_head_tensors,
    moe_dense_tensors,
    recurrent_state_bytes,
    small_param_tensors,
)
from tpusim.workload.sharding import CollectiveSpec, ShardingPlan

# Vector work per element, FLOPs (norm: square, sum, rsqrt-scale, weight; situ: two tanh,
# a sigmoid, products). Rough constants; the VPU is rarely the bottleneck at decode.
NORM_FLOPS_PER_ELEMENT = 5.0
ACTIVATION_FLOPS_PER_ELEMENT = 20.0
TOPK_FLOPS_PER_SCORE = 16.0
DELTA_RULE_FLOPS_PER_STATE_ELEMENT = 8.0


DEFAULT_MATMUL_DTYPE = "bf16"

@dataclass(frozen=True)
class CollectiveCall:
    """A collective issued after an op, with its payload for this batch."""

    spec: CollectiveSpec
    payload_bytes_per_peer: int


@dataclass(frozen=True)
class Op:
    """One compute step of the per-device program."""

    name: str
    role: str  # collective anchor: attn.core, attn.out, moe.router, moe.combine, ...
    layer: int  # -1 for the head (final norm + lm_head)
    phase: str  # attention | moe | mlp | head
    unit: str  # mxu | vpu
    tensors: tuple[TensorSpec, ...] = ()
    matmuls: tuple[tuple[int, int, int], ...] = ()  # (rows, contraction, cols)
    vector_flops: float = 0.0
    kv_read_bytes: int = 0  # KV cache / recurrent state streamed in
    kv_write_bytes: int = 0  # new KV entry / updated state written back
    expert_index: int | None = None  # position among this layer's routed experts
    collectives: tuple[CollectiveCall, ...] = ()

    @property
    def weight_bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)

    @property
    def matmul_flops(self) -> float:
        return float(sum(2 * m * k * n for m, k, n in self.matmuls))

    @property
    def matmul_dtype(self) -> str:
        """The dtype the matrix unit runs this op's matmuls at: its first weight tensor's MXU
        dtype (after dequantisation), else bf16 (activation-only ops). The one statement of
        this rule: the engine, the estimate and the floors read it."""
        return self.tensors[0].fmt.mxu_dtype if self.tensors else DEFAULT_MATMUL_DTYPE

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.family for t in self.tensors))


@dataclass
class LayerProgram:
    layer: int
    attention_kind: str
    is_moe: bool
    ops: list[Op]
    routed_experts: int  # distinct routed expert slices this device loads in this layer


@dataclass
class Program:
    """One device's decode step."""

    model: ModelConfig
    plan: ShardingPlan
    batch: int
    context_tokens: int
    routing_label: str
    seed: int
    device_view: str
    layers: list[LayerProgram]
    head_ops: list[Op]
    meta: dict[str, object] = field(default_factory=dict)
    sequences: int = 0  # sequences whose KV cache / state the rows read (0: one per row)

    @property
    def kv_sequences(self) -> int:
        return self.sequences or self.batch

    @cached_property
    def ops(self) -> list[Op]:
        """The flat op sequence of the whole step (layers in order, then the head)."""
        flat = [op for layer in self.layers for op in layer.ops]
        return flat + list(self.head_ops)

    def iter_tensors(self) -> Iterator[tuple[Op, TensorSpec]]:
        for op in self.ops:
            for tensor in op.tensors:
                yield op, tensor

    @property
    def weight_bytes(self) -> int:
        return sum(op.weight_bytes for op in self.ops)

    @property
    def kv_bytes(self) -> int:
        return sum(op.kv_read_bytes + op.kv_write_bytes for op in self.ops)

    @property
    def hbm_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def routed_experts_per_layer(self) -> list[int]:
        return [layer.routed_experts for layer in self.layers if layer.is_moe]


def _collectives_after(plan: ShardingPlan, role: str, batch: int) -> tuple[CollectiveCall, ...]:
    """The collectives the op with ``role`` issues at ``batch``: those issued at its end, then
    those chained behind them (``after`` naming a collective), parents first."""
    specs = plan.collectives_at(batch)
    issued = [s for s in specs if s.after == role]
    for parent in issued:  # grows while iterating: chains of any depth
        issued += [s for s in specs if s.after == parent.name and s not in issued]
    return tuple(CollectiveCall(s, s.bytes_per_token * batch) for s in issued)


def _matmul_op(name: str, role: str, layer: int, phase: str, tensors: list[TensorSpec], rows: int,
               plan: ShardingPlan, batch: int, **extra: object) -> Op:
    return Op(
        name=name, role=role, layer=layer, phase=phase, unit="mxu", tensors=tuple(tensors),
        matmuls=tuple((rows, t.rows, t.cols) for t in tensors),
        collectives=_collectives_after(plan, role, batch), **extra,  # type: ignore[arg-type]
    )


def _attention_ops(model: ModelConfig, plan: ShardingPlan, layer: int, batch: int, context: int,
                   sequences: int) -> list[Op]:
    by_name = {t.name: t for t in attention_tensors(model, plan, layer)}
    small = small_param_tensors(model, plan, layer)
    hidden, heads = model.hidden_size, plan.attention_heads_per_device
    ops = [Op("attn.mix_norm", "attn.mix_norm", layer, "attention", "vpu", tensors=tuple(small),
              vector_flops=NORM_FLOPS_PER_ELEMENT * hidden * batch * (2 if model.residual == "attention_residuals" else 1))]
    kind = model.attention_kind(layer)
    kv_per_token = kv_cache_bytes_per_token(model, plan, layer)

    def mm(name: str, role: str, names: list[str], **extra: object) -> Op:
        return _matmul_op(name, role, layer, "attention", [by_name[n] for n in names], batch, plan, batch, **extra)

    def kv_cache_attention(prefix: str, projections: tuple[str, ...], core_matmuls: tuple[tuple[int, int, int], ...],
                           span: int) -> list[Op]:
        """MLA / GQA: the projections, the core over ``span`` cached tokens (one appended per
        row), the optional output gate, the output projection."""
        out = [mm(f"{prefix}.{p}", f"{prefix}.{p}", [f"{prefix}.{p}"]) for p in projections]
        out.append(Op(f"{prefix}.core", "attn.core", layer, "attention", "mxu", matmuls=core_matmuls,
                      vector_flops=5.0 * heads * batch * span,
                      kv_read_bytes=kv_per_token * span * sequences, kv_write_bytes=kv_per_token * batch,
                      collectives=_collectives_after(plan, "attn.core", batch)))
        if f"{prefix}.gate" in by_name:
            out.append(mm(f"{prefix}.gate", f"{prefix}.gate", [f"{prefix}.gate"]))
        out.append(mm(f"{prefix}.o", "attn.out", [f"{prefix}.o"]))
        return out

    if kind == "kda":
        kda = model.kda
        assert kda is not None
        state = recurrent_state_bytes(model, plan, layer) * sequences
        state_elements = heads * kda.value_heads_per_key_head * kda.head_dim * kda.value_dim * batch
        ops.append(mm("kda.qkvgb", "kda.qkvgb", ["kda.qkvgb"]))
        if "kda.decay_a" in by_name:  # KDA's low-rank decay; Gated DeltaNet's is in qkvgb
            ops.append(mm("kda.decay", "kda.decay", ["kda.decay_a", "kda.decay_b"]))
        ops += [
            Op("kda.core", "attn.core", layer, "attention", "vpu",
               vector_flops=DELTA_RULE_FLOPS_PER_STATE_ELEMENT * state_elements,
               kv_read_bytes=state, kv_write_bytes=state,
               collectives=_collectives_after(plan, "attn.core", batch)),
            mm("kda.o", "attn.out", ["kda.o"]),
        ]
    elif kind == "mla":
        mla = model.mla
        assert mla is not None
        span = attention_span_tokens(model, layer, context)
        # Absorbed MLA decode: scores over the compressed cache (kv_lora + rope) then values
        # in the latent space; the cache tiles stream through the MXU like weights.
        latent = mla.kv_lora_rank + mla.qk_rope_head_dim
        core_matmuls = ((heads * batch, latent, span), (heads * batch, span, mla.kv_lora_rank))
        ops += kv_cache_attention("mla", ("q_a", "kv_a", "q_b", "kv_b"), core_matmuls, span)
    else:
        gqa = model.gqa
        assert gqa is not None
        span = attention_span_tokens(model, layer, context)
        group = max(1, heads // plan.kv_heads_per_device)
        core_matmuls = ((group * batch, gqa.head_dim, span), (group * batch, span, gqa.head_dim)) * plan.kv_heads_per_device
        ops += kv_cache_attention("gqa", ("q", "k", "v"), core_matmuls, span)
    return ops


def _moe_ops(model: ModelConfig, plan: ShardingPlan, layer: int, batch: int,
             expert_rows: list[int]) -> list[Op]:
    by_name = {t.name: t for t in moe_dense_tensors(model, plan)}
    moe, hidden = model.moe, model.hidden_size
    assert moe is not None
    ops = [
        Op("mlp.mix_norm", "mlp.mix_norm", layer, "moe", "vpu",
           vector_flops=NORM_FLOPS_PER_ELEMENT * hidden * batch * (2 if model.residual == "attention_residuals" else 1)),
        _matmul_op("moe.router", "moe.router", layer, "moe", [by_name["moe.router"]], batch, plan, batch),
    ]
    if "moe.latent_down" in by_name:  # before the top-k, so its all-gather overlaps the selection
        ops.append(_matmul_op("moe.latent_down", "moe.latent_down", layer, "moe",
                              [by_name["moe.latent_down"]], batch, plan, batch,
                              vector_flops=NORM_FLOPS_PER_ELEMENT * (moe.latent_size or 0) * batch))
    ops.append(Op("moe.topk", "moe.topk", layer, "moe", "vpu",
                  vector_flops=TOPK_FLOPS_PER_SCORE * moe.num_experts * batch,
                  collectives=_collectives_after(plan, "moe.topk", batch)))
    if "moe.shared_gate_up" in by_name:
        shared = by_name["moe.shared_down"].rows
        ops += [
            _matmul_op("moe.shared_gate_up", "moe.shared_gate_up", layer, "moe",
                       [by_name["moe.shared_gate_up"]], batch, plan, batch,
                       vector_flops=ACTIVATION_FLOPS_PER_ELEMENT * shared * batch),
            _matmul_op("moe.shared_down", "moe.shared", layer, "moe", [by_name["moe.shared_down"]], batch, plan, batch),
        ]
    slice_tensors = expert_slice_tensors(model, plan)
    width = slice_tensors[1].rows
    for index, rows in enumerate(expert_rows):
        ops.append(_matmul_op(f"expert[{index}]", "moe.expert", layer, "moe", slice_tensors, rows, plan, batch,
                              vector_flops=ACTIVATION_FLOPS_PER_ELEMENT * width * rows, expert_index=index))
    expert_width = moe.latent_size or hidden
    ops.append(Op("moe.combine", "moe.combine", layer, "moe", "vpu",
                  vector_flops=2.0 * expert_width * batch * max(1, len(expert_rows)),
                  collectives=_collectives_after(plan, "moe.combine", batch)))
    if "moe.latent_up" in by_name:
        ops.append(_matmul_op("moe.latent_up", "moe.latent_up", layer, "moe", [by_name["moe.latent_up"]], batch, plan, batch))
    return ops


def _dense_mlp_ops(model: ModelConfig, plan: ShardingPlan, layer: int, batch: int) -> list[Op]:
    gate_up, down = dense_mlp_tensors(model, plan)
    return [
        Op("mlp.mix_norm", "mlp.mix_norm", layer, "mlp", "vpu",
           vector_flops=NORM_FLOPS_PER_ELEMENT * model.hidden_size * batch),
        _matmul_op("mlp.gate_up", "mlp.gate_up", layer, "mlp", [gate_up], batch, plan, batch,
                   vector_flops=ACTIVATION_FLOPS_PER_ELEMENT * down.rows * batch),
        _matmul_op("mlp.down", "mlp.down", layer, "mlp", [down], batch, plan, batch),
    ]


def build_program(
    model: ModelConfig,
    plan: ShardingPlan,
    *,
    batch: int,
    context_tokens: int = 1024,
    routing: RoutingModel | None = None,
    seed: int = 0,
    device_view: str | int = "critical",
    sequences: int | None = None,
) -> Program:
    """The per-device op list of one decode step (see the module docstring).

    ``batch`` is the number of rows through the model; ``sequences`` (default: ``batch``) the
    number of sequences whose KV cache and recurrent state those rows read. A speculative
    verify step runs ``draft_tokens + 1`` rows per sequence over one shared cache.
    """
    sequences = sequences or batch
    if batch % sequences:
        raise ValueError(f"batch ({batch}) must be a multiple of sequences ({sequences})")
    if batch < 1:
        raise ValueError("batch must be >= 1")
    if context_tokens < 1:
        raise ValueError("context_tokens must be >= 1")
    routing = routing or RoutingModel("uniform")
    moe = model.moe
    groups = plan.expert_groups
    if moe is not None:
        choices = draw_routing(routing, num_moe_layers=len(model.moe_layers), batch=batch,
                               num_experts=moe.num_experts, top_k=moe.top_k, seed=seed,
                               groups=moe.routing_groups, groups_per_token=moe.routing_groups_per_token)
        distinct = distinct_per_group(choices, moe.num_experts, groups)  # [moe_layers, groups]
        rows_per_expert = tokens_per_expert(choices, moe.num_experts)  # [moe_layers, experts]
    else:  # a dense model: no routed experts anywhere
        distinct = np.zeros((0, groups), dtype=np.int64)
        rows_per_expert = np.zeros((0, 0), dtype=np.int64)
    group_size = model.num_experts // groups
    if isinstance(device_view, int) and not 0 <= device_view < groups:
        raise ValueError(f"device_view group {device_view} outside 0..{groups - 1}")

    layers: list[LayerProgram] = []
    moe_index = 0
    # Data-parallel attention: this device's attention serves its share of the rows only.
    attention_rows, attention_sequences = plan.attention_rows(batch), plan.attention_rows(sequences)
    for layer in range(model.num_layers):
        ops = _attention_ops(model, plan, layer, attention_rows, context_tokens, attention_sequences)
        routed = 0
        if model.is_moe_layer(layer):
            group = int(np.argmax(distinct[moe_index])) if device_view == "critical" else int(device_view)
            counts = rows_per_expert[moe_index, group * group_size:(group + 1) * group_size]
            expert_rows = [int(c) for c in counts if c > 0]
            routed = len(expert_rows)
            ops += _moe_ops(model, plan, layer, batch, expert_rows)
            moe_index += 1
        else:
            ops += _dense_mlp_ops(model, plan, layer, batch)
        layers.append(LayerProgram(layer, model.attention_kind(layer), model.is_moe_layer(layer), ops, routed))

    head_ops = [
        Op("head.norm", "head.norm", -1, "head", "vpu", vector_flops=NORM_FLOPS_PER_ELEMENT * model.hidden_size * batch),
        _matmul_op("head.lm_head", "head.lm_head", -1, "head", lm_head_tensors(model, plan), batch, plan, batch),
    ]
    return Program(
        model=model, plan=plan, batch=batch, context_tokens=context_tokens,
        routing_label=routing.label, seed=seed, device_view=str(device_view),
        layers=layers, head_ops=head_ops,
        meta={"distinct_per_group": distinct, "group_size": group_size},
        sequences=sequences,
    )
