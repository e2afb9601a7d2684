"""The per-device program: what one device does in one decode step, op by op.

``build_program(model, plan, batch=B, context_tokens=C, routing=R, seed=S)`` turns a
model, a sharding plan and a routing draw into an ordered list of ops for one device. Each
op names the weight tensors it reads (from :mod:`tpusim.workload.shapes`), its matmuls as
``(rows, contraction, cols)`` triples, its vector work, the KV-cache / recurrent-state
bytes it streams, and the collectives issued after it. The engine simulates this list
under a schedule; the analytic floors sum it; the kernel follows the same op order.

Op order per layer: the attention block of the layer's kind, then its MLP block (MoE or
dense), then after the last layer the head, each block's ops in the order
:mod:`tpusim.workload.registry` declares (the kernel's DMA plan walks the same sequences);
this module prices them (:func:`_op_cost`).

Device view: collectives synchronise all devices every layer, so the step runs at the pace
of the device with the most routed experts in each layer. ``device_view="critical"`` (the
default) takes, per layer, the expert group that loads the most distinct experts;
``device_view=g`` (an int) follows expert group ``g`` throughout.

Data-parallel attention (``plan.attention_dp > 1``): the attention ops run over this
device's ``ceil(batch / attention_dp)`` rows and sequences; the MoE / MLP over all rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property

import numpy as np

from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry import (
    EXPERT,
    Block,
    OpSpec,
    attention_block,
    expert_op,
    head_block,
    mlp_block,
)
from tpusim.workload.registry.names import (
    AttnOp,
    ExpertTensor,
    GqaOp,
    HeadOp,
    KdaOp,
    MlaOp,
    MlpOp,
    MlpTensor,
    MoeOp,
    MoeTensor,
)
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
from tpusim.workload.sharding import COLLECTIVE_LISTS, CollectiveSpec, ShardingPlan

# Vector work per element, FLOPs (norm: square, sum, rsqrt-scale, weight; situ: two tanh,
# a sigmoid, products). Rough constants; the VPU is rarely the bottleneck at decode.
NORM_FLOPS_PER_ELEMENT = 5.0
ACTIVATION_FLOPS_PER_ELEMENT = 20.0
TOPK_FLOPS_PER_SCORE = 16.0
DELTA_RULE_FLOPS_PER_STATE_ELEMENT = 8.0


DEFAULT_MATMUL_DTYPE = "bf16"


class StepPhase(StrEnum):
    """What a program's step does: generate one token per sequence, or fill a prompt's cache
    (:mod:`tpusim.workload.prefill`)."""

    DECODE = "decode"
    PREFILL = "prefill"


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
    phase: StepPhase = StepPhase.DECODE
    # Rows whose activations sit in on-chip memory at once (0: all ``batch`` rows). A prefill
    # chunk streams its rows through in tiles of this many (:mod:`tpusim.workload.prefill`).
    resident_row_tile: int = 0

    @property
    def resident_rows(self) -> int:
        """Rows the static on-chip scratch holds activations for (the engine's VMEM check)."""
        return min(self.batch, self.resident_row_tile) if self.resident_row_tile else self.batch

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


# (op name, block context, rows) -> the op's non-weight costs: Op fields (``vector_flops``,
# ``kv_read_bytes``, ``kv_write_bytes``), ``matmuls`` and optionally ``unit``.
OpCost = Callable[[str, "_BlockContext", int], dict[str, object]]


@dataclass(frozen=True)
class _BlockContext:
    """What a block's ops are priced with: the layer, its rows and sequences, its tensors."""

    model: ModelConfig
    plan: ShardingPlan
    layer: int
    rows: int  # rows through this block (attention: this device's share under attention DP)
    sequences: int
    context_tokens: int
    tensors: dict[str, TensorSpec]  # this block's weight tensors on one device, by name
    small: tuple[TensorSpec, ...] = ()  # the layer's small parameters (attention blocks carry them)
    routed_experts: int = 0  # expert ops this device runs in this layer (MoE blocks)
    routed_pairs: int = 0  # (token, expert) pairs those expert ops run: the sum of their rows
    cost: OpCost | None = None  # prices each op (default :func:`_op_cost`, the decode step)
    # (role, rows) -> the collectives an op issues: one dict for a whole program, because the
    # plan's chains are scanned once per role instead of once per op (0.03 ms x 2,800 ops)
    collective_memo: dict[tuple[str, int], tuple[CollectiveCall, ...]] = field(default_factory=dict, compare=False)

    def collectives_after(self, role: str) -> tuple[CollectiveCall, ...]:
        """:func:`_collectives_after` of this context's plan and rows (CollectiveCall is frozen:
        the ops share the tuple)."""
        key = (role, self.rows)
        if key not in self.collective_memo:
            self.collective_memo[key] = _collectives_after(self.plan, role, self.rows)
        return self.collective_memo[key]

    @property
    def norm_passes(self) -> int:
        """RMSNorm passes before a block: attention residuals mix the block snapshots first."""
        return 2 if self.model.residual == "attention_residuals" else 1


def _block_ops(block: Block, ctx: _BlockContext, expert_rows: Sequence[int] = ()) -> list[Op]:
    """``block``'s ops for one layer (:mod:`tpusim.workload.registry`), each priced by
    :func:`_op_cost`; a repeated op (the routed experts) once per entry of ``expert_rows``."""
    ops: list[Op] = []
    for spec in block.present_ops(ctx.tensors):
        if spec.repeated:  # experts of equal rows are one op but for name and index: priced once per rows
            priced: dict[int, Op] = {}
            for index, rows in enumerate(expert_rows):
                like = priced.get(rows)
                if like is None:
                    ops.append(priced.setdefault(rows, _op(block, spec, ctx, expert_op(index), rows,
                                                            expert_index=index)))
                else:
                    ops.append(Op(expert_op(index), like.role, like.layer, like.phase, like.unit, like.tensors,
                                  like.matmuls, like.vector_flops, like.kv_read_bytes, like.kv_write_bytes, index,
                                  like.collectives))
        else:
            ops.append(_op(block, spec, ctx, spec.name, ctx.rows))
    return ops


def _op(block: Block, spec: OpSpec, ctx: _BlockContext, name: str, rows: int,
        expert_index: int | None = None) -> Op:
    tensors = tuple(ctx.tensors[t] for t in spec.tensors)
    cost = (ctx.cost or _op_cost)(spec.name, ctx, rows)
    unit = cost.pop("unit", spec.unit)
    if spec.name == AttnOp.MIX_NORM:
        tensors = ctx.small  # the small-parameter row streams with the layer's first op
    matmuls = cost.pop("matmuls", tuple((rows, t.rows, t.cols) for t in tensors) if unit == "mxu" else ())
    return Op(name=name, role=spec.anchor, layer=ctx.layer, phase=block.phase, unit=unit, tensors=tensors,  # type: ignore[arg-type]
              matmuls=matmuls, expert_index=expert_index,  # type: ignore[arg-type]
              collectives=ctx.collectives_after(spec.anchor), **cost)  # type: ignore[arg-type]


def _op_cost(name: str, ctx: _BlockContext, rows: int) -> dict[str, object]:
    """The vector work, KV/state bytes and non-weight matmuls of op ``name`` (weight matmuls
    are the generic ``rows x tensor`` products)."""
    model, plan, hidden, heads = ctx.model, ctx.plan, ctx.model.hidden_size, ctx.plan.attention_heads_per_device
    if name == AttnOp.MIX_NORM:
        return {"vector_flops": NORM_FLOPS_PER_ELEMENT * hidden * rows * ctx.norm_passes}
    if name == MlpOp.MIX_NORM:
        passes = ctx.norm_passes if model.is_moe_layer(ctx.layer) else 1
        return {"vector_flops": NORM_FLOPS_PER_ELEMENT * hidden * rows * passes}
    if name == HeadOp.NORM:
        return {"vector_flops": NORM_FLOPS_PER_ELEMENT * hidden * rows}
    if name == KdaOp.CORE:
        kda = model.kda
        assert kda is not None
        state = recurrent_state_bytes(model, plan, ctx.layer) * ctx.sequences
        elements = heads * kda.value_heads_per_key_head * kda.head_dim * kda.value_dim * rows
        return {"vector_flops": DELTA_RULE_FLOPS_PER_STATE_ELEMENT * elements, "kv_read_bytes": state,
                "kv_write_bytes": state}
    if name in (MlaOp.CORE, GqaOp.CORE):
        span = attention_span_tokens(model, ctx.layer, ctx.context_tokens)
        kv_per_token = kv_cache_bytes_per_token(model, plan, ctx.layer)
        if name == MlaOp.CORE:
            mla = model.mla
            assert mla is not None
            # Absorbed MLA decode: scores over the compressed cache (kv_lora + rope) then values
            # in the latent space; the cache tiles stream through the MXU like weights.
            latent = mla.kv_lora_rank + mla.qk_rope_head_dim
            core = ((heads * rows, latent, span), (heads * rows, span, mla.kv_lora_rank))
        else:
            gqa = model.gqa
            assert gqa is not None
            group = max(1, heads // plan.kv_heads_per_device)
            core = ((group * rows, gqa.head_dim, span), (group * rows, span, gqa.head_dim)) * plan.kv_heads_per_device
        return {"matmuls": core, "vector_flops": 5.0 * heads * rows * span,
                "kv_read_bytes": kv_per_token * span * ctx.sequences, "kv_write_bytes": kv_per_token * rows}
    moe = model.moe
    if name == MoeOp.LATENT_DOWN:
        assert moe is not None
        return {"vector_flops": NORM_FLOPS_PER_ELEMENT * (moe.latent_size or 0) * rows}
    if name == MoeOp.TOPK:
        assert moe is not None
        return {"vector_flops": TOPK_FLOPS_PER_SCORE * moe.num_experts * rows}
    if name == MoeOp.SHARED_GATE_UP:
        return {"vector_flops": ACTIVATION_FLOPS_PER_ELEMENT * ctx.tensors[MoeTensor.SHARED_DOWN].rows * rows}
    if name == EXPERT.name:
        return {"vector_flops": ACTIVATION_FLOPS_PER_ELEMENT * ctx.tensors[ExpertTensor.DOWN].rows * rows}
    if name == MoeOp.COMBINE:
        # The decode megakernel's combine: every distinct expert's output over all B rows, each
        # weighted by that row's routing weight (zero where the row did not pick it) and summed
        # (megakernel/kernel_moe.expert_loop). A prefill prices it by pairs (prefill_op_cost).
        assert moe is not None
        return {"vector_flops": 2.0 * (moe.latent_size or hidden) * rows * max(1, ctx.routed_experts)}
    if name == MlpOp.GATE_UP:
        return {"vector_flops": ACTIVATION_FLOPS_PER_ELEMENT * ctx.tensors[MlpTensor.DOWN].rows * rows}
    return {}


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
    op_cost: OpCost | None = None,
) -> Program:
    """The per-device op list of one decode step (see the module docstring).

    ``batch`` is the number of rows through the model; ``sequences`` (default: ``batch``) the
    number of sequences whose KV cache and recurrent state those rows read. A speculative
    verify step runs ``draft_tokens + 1`` rows per sequence over one shared cache.
    ``op_cost`` replaces :func:`_op_cost` (the prefill program's pricing).
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
    collective_memo: dict[tuple[str, int], tuple[CollectiveCall, ...]] = {}
    # Data-parallel attention: this device's attention serves its share of the rows only.
    attention_rows, attention_sequences = plan.attention_rows(batch), plan.attention_rows(sequences)
    for layer in range(model.num_layers):
        common = {"model": model, "plan": plan, "layer": layer, "context_tokens": context_tokens, "cost": op_cost,
                  "collective_memo": collective_memo}
        attention = _BlockContext(rows=attention_rows, sequences=attention_sequences,
                                  tensors={t.name: t for t in attention_tensors(model, plan, layer)},
                                  small=tuple(small_param_tensors(model, plan, layer)), **common)  # type: ignore[arg-type]
        ops = _block_ops(attention_block(model.attention_kind(layer)), attention)
        routed = 0
        if model.is_moe_layer(layer):
            group = int(np.argmax(distinct[moe_index])) if device_view == "critical" else int(device_view)
            counts = rows_per_expert[moe_index, group * group_size:(group + 1) * group_size]
            expert_rows = [int(c) for c in counts if c > 0]
            routed = len(expert_rows)
            tensors = moe_dense_tensors(model, plan) + expert_slice_tensors(model, plan)
            mlp = _BlockContext(rows=batch, sequences=sequences, tensors={t.name: t for t in tensors},
                                routed_experts=routed, routed_pairs=sum(expert_rows), **common)  # type: ignore[arg-type]
            ops += _block_ops(mlp_block(True), mlp, expert_rows)
            moe_index += 1
        else:
            mlp = _BlockContext(rows=batch, sequences=sequences, tensors={t.name: t for t in dense_mlp_tensors(model, plan)},
                                **common)  # type: ignore[arg-type]
            ops += _block_ops(mlp_block(False), mlp)
        layers.append(LayerProgram(layer, model.attention_kind(layer), model.is_moe_layer(layer), ops, routed))

    head = _BlockContext(model=model, plan=plan, layer=-1, rows=batch, sequences=sequences,
                         context_tokens=context_tokens, tensors={t.name: t for t in lm_head_tensors(model, plan)},
                         cost=op_cost, collective_memo=collective_memo)
    head_ops = _block_ops(head_block(), head)
    return Program(
        model=model, plan=plan, batch=batch, context_tokens=context_tokens,
        routing_label=routing.label, seed=seed, device_view=str(device_view),
        layers=layers, head_ops=head_ops,
        meta={"distinct_per_group": distinct, "group_size": group_size},
        sequences=sequences,
    )


# the CollectiveSpec fields an algorithm choice rewrites (ShardingPlan.with_algorithms); the
# rest (name, payload, issuing op, consumer, batch range) fix where a program issues it
_ALGORITHM_FIELDS = {"algorithm", "group", "stages"}


def with_collectives(program: Program, plan: ShardingPlan) -> Program:
    """``program`` as ``build_program`` would build it on ``plan``, where ``plan`` is
    ``program.plan`` with other collective algorithms (:meth:`ShardingPlan.with_algorithms`).

    An algorithm changes a collective's messages only, never the ops, weights, routing or
    payloads, so the ops are kept and each call's spec is swapped for the same-position spec
    of ``plan`` (``tests/test_program_variants.py`` checks the result equals a fresh build).
    A joint sweep meets many algorithm variants of few plans; this spares a build per variant
    (measured: 54 builds, 5.3 s of a budget-60 K3 sweep). ValueError when ``plan`` differs in
    anything else."""
    base = program.plan
    if plan is base:
        return program
    old, new = base.all_collectives, plan.all_collectives
    if (base.model_dump(exclude=set(COLLECTIVE_LISTS)) != plan.model_dump(exclude=set(COLLECTIVE_LISTS))
            or len(old) != len(new)
            or any(a.model_dump(exclude=_ALGORITHM_FIELDS) != b.model_dump(exclude=_ALGORITHM_FIELDS)
                   for a, b in zip(old, new, strict=True))):
        raise ValueError(f"plan {plan.name} is not plan {base.name} with other collective algorithms")
    swap = {id(a): b for a, b in zip(old, new, strict=True)}

    def ops(source: list[Op]) -> list[Op]:
        return [op if not op.collectives else replace(op, collectives=tuple(
            CollectiveCall(swap[id(call.spec)], call.payload_bytes_per_peer) for call in op.collectives))
            for op in source]

    layers = [replace(layer, ops=ops(layer.ops)) for layer in program.layers]
    return replace(program, plan=plan, layers=layers, head_ops=ops(list(program.head_ops)), meta=dict(program.meta))
