"""Lowering: a program + a schedule + a chip → the copies, buffers and pieces to simulate.

Run once per simulation, before the event loop. The steps, with what each guarantees:

1. **Pools and rings.** One :class:`~tpusim.engine.items.Pool` per VMEM arena of
   :func:`tpusim.schedule.vmem.vmem_plan` (capacity = the arena's bytes), plus one for the KV tiles
   (``kv_buffers`` tiles) and one for the KDA recurrent state. One
   :class:`~tpusim.engine.items.Ring` per weight tensor kind with the family's ``buffers``
   as depth; the routed experts share one ring (the expert slots). *Invariant:* no slab is
   larger than its pool, since an arena is sized for its largest member's full ring.
2. **Slabs and descriptors**, op by op in program order (so ``seq`` is consumption order):
   every weight tensor is cut into row slabs by :func:`tpusim.schedule.vmem.slab_rows` (the same
   function the kernel uses); each slab is one or two descriptors (values, then block scales
   if the format has any). A routed expert is one slab (the slot) of four descriptors
   (gate/up, scales, down, scales). KV tiles: ``kv_tile_tokens`` tokens per descriptor.
   KDA state: one read descriptor, and a write-back descriptor after the op.
3. **Release points** — when a slab's copies are issued: the op of
   :mod:`tpusim.schedule.issue_plan` (the rule the kernel follows too; read through
   :func:`tpusim.schedule.program_issue.program_issue_plan`), at that op's *start*; a refill
   (slab ``k >= buffers``) at its consumer's start, admitted as its ring buffer frees. The
   plan places every buffer at a fixed arena address and issues a copy only once every
   buffer it overwrites is free, so with cross-op prefetch each ring is its own queue (no
   byte count per arena: the addresses already keep the arena within its size). Routed
   experts (:mod:`tpusim.engine.expert_release`) issued at their routing decision, by ``expert_issue``:
   ``after_routing`` when the layer's ``moe.topk`` *ends*; ``during_selection`` at
   fraction ``(k + 1) / n`` of ``moe.topk`` (the top-k op is cut into ``n`` pieces);
   ``speculative`` when op ``moe.router - expert_speculation_ops`` starts, and a
   deterministic fraction ``speculation_miss_rate`` of them (every expert where
   ``floor((j + 1) * rate)`` steps up, counting experts ``j`` over the whole step)
   mispredicts: its speculative copy is wasted (it holds a slot until it has landed and
   routing is known) and the right expert is refetched when ``moe.topk`` ends. An expert
   whose slot frees later is issued at the start of the op the plan names. KV tiles and
   KDA state: when their op starts (``kv_buffers`` tiles stream in flight).

   Without cross-op prefetch (per-op launch execution) every slab is released when the
   kernel its op runs in starts: the op's own start, or — for ops a GPU stack fuses into one
   kernel (a grouped GEMM over every routed expert of a layer) — the start of the first op
   of that kernel (:class:`~tpusim.engine.execution.KernelPlan`).
4. **Pieces**: a matmul op whose matmuls pair with its tensors computes slab by slab (wait
   for the slab's copies, compute the slab's rows, free the slab); an expert frees its slot
   after its last matmul; KV-tiled attention computes tile by tile (each tile a share of
   the op's matmul time proportional to its bytes; on a chip that prices the kernel's KV loop
   from its compiled code, ``execution.attention_core_s_per_token``, the tile's whole code
   instead, vector work included); any other op waits for all its slabs,
   computes, and frees them. Vector work follows as one VPU piece. Weights stored in a
   format the matrix unit cannot take (the vector unit's ``dequant_s_per_element`` lists
   it: FP8 and MXFP4 on tpu-v5e) are converted first, a VPU piece per tensor of an expert
   (per slab of a streamed tensor) between its copies landing and its matmul: the stream
   converts one expert while the next expert's copy is in flight, as the kernel does. An
   expert part's products follow its conversion panel by panel, so only what the MXU needs
   beyond the VPU, plus one panel (the pipeline's fill), comes after it.
5. **Collectives** after each op. One whose plan entry names an ``algorithm`` runs as remote
   copies on a megakernel chip (:mod:`tpusim.engine.collective_messages`: messages sharing the
   links, the stream waiting only at the consuming op). Otherwise priced per stage by :mod:`tpusim.engine.costs` (or by the
   policy's ``collective_pricer``: GPU chips). An overlapped one (the latent all-gather) must
   be complete before the next ``moe.expert`` or ``moe.combine`` op of its layer starts (its
   output feeds the experts), else before the next layer starts; a policy whose collectives
   block (a conventional GPU stack) runs it in line. A policy with ``collective_launches``
   pays one kernel launch before each call.
6. **Launches**: every op carries the kernel launches the policy's
   :class:`~tpusim.engine.execution.KernelPlan` charges before it, and the kernels' fixed
   time (``KernelPlan.fixed_s``: a serving stack's per-kernel fixed cost and ramp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from hwmodels.schema import Chip
from tpusim.engine.collective_messages import consumer_index, lower_messages
from tpusim.engine.costs import collective_stage_s, resolve_link
from tpusim.engine.execution import ExecutionPolicy
from tpusim.engine.expert_release import place_expert_releases
from tpusim.engine.items import MXU, VPU, CollectivePlan, Descriptor, OpPlan, Piece, Pool, Slab
from tpusim.engine.lowering import KV_FAMILY, STATE_FAMILY, Builder
from tpusim.engine.lowering_facts import ALIGNED_WEIGHT_OP, EXPERT_OP, KEPT_PROGRAMS, WEIGHT_OP
from tpusim.schedule.release import is_mispredicted
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import VmemPlan
from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import MoeOp, Role, StateBuffer

OVERLAP_JOIN_ROLES = (Role.MOE_EXPERT, MoeOp.COMBINE)
_SEQ = attrgetter("seq")  # a C key function: every slab of every pool is keyed
new_piece = tuple.__new__  # Piece without its Python-level __new__ (all six fields given): thousands per step


@dataclass
class Lowered:
    """Everything the event loop needs, built by :func:`lower`."""

    ops: list[OpPlan]
    pools: list[Pool]
    descriptors: int
    slabs: int
    base_bytes: int  # always-resident scratch (activations)
    runs: int = 0  # runs started on it: the current run's number (its copies' and slabs' flags, items)
    # each op's fields the compute stream reads, one tuple an op: made by its first run, read by
    # the next (an op plan does not change once lowered; tpusim.engine.stream.compute_stream)
    op_rows: list[tuple[Any, ...]] | None = None


def _overlap_join_index(ops: list[Op], index: int) -> int:
    layer = ops[index].layer
    for later in range(index + 1, len(ops)):
        op = ops[later]
        if op.layer != layer:
            return later
        if op.role in OVERLAP_JOIN_ROLES:
            return later
    return len(ops)


def lower(program: Program, schedule: Schedule, chip: Chip, policy: ExecutionPolicy, vmem: VmemPlan) -> Lowered:
    """Lower ``program`` under ``schedule`` (see the module docstring for the steps)."""
    b = Builder(program, schedule, chip, policy, vmem)
    ops = program.ops
    plans = b.plans
    launch_s = policy.launch_overhead_s
    previous_layer: int | None = None
    # per layer: [(real slab, mispredicted slab or None)] in expert order
    layer_experts: dict[int, list[tuple[Slab, Slab | None]]] = {}

    launches, fixed_s, kernel_names = b.kernels.launches, b.kernels.fixed_s, b.kernels.kernel_names
    collectives = _program_collectives(b)
    facts = b.facts
    kinds, dtypes = facts.kinds, facts.dtypes
    vector_times = b.vector_cache  # b.vector_s's memo, read inline: once per op
    for index, op in enumerate(ops):
        first = op.layer != previous_layer
        previous_layer = op.layer
        plan_ = OpPlan(index, op.name, op.layer, op.phase, first)
        plan_.launches = launches[index]
        plan_.launch_s = plan_.launches * launch_s
        if fixed_s:
            plan_.kernel_fixed_s = fixed_s[index]
        if kernel_names:
            plan_.kernel = kernel_names[index]
        plans.append(plan_)
        vector_s = vector_times.get(op.vector_flops)
        if vector_s is None:
            vector_s = b.vector_s(op.vector_flops)
        kind = kinds[index]
        if kind == EXPERT_OP:
            _lower_expert(b, op, plan_, layer_experts)
        elif kind <= WEIGHT_OP:
            vector_s = _lower_weights(b, op, plan_, vector_s, kind == ALIGNED_WEIGHT_OP)
        elif op.kv_read_bytes and b.recurrent_state_bytes(op.layer):
            vector_s = _lower_state(b, op, plan_, vector_s)
        elif op.kv_read_bytes:
            vector_s = _lower_kv_tiles(b, op, plan_, vector_s)
        else:
            matmul_s = b.op_matmul_s(op, dtypes[index])
            if matmul_s:
                plan_.pieces.append(Piece(matmul_s, MXU))
        if vector_s or not plan_.pieces:
            plan_.pieces.append(new_piece(Piece, (vector_s, VPU, (), (), (), ())))
        if op.kv_write_bytes and not b.recurrent_state_bytes(op.layer):
            write = b.add_desc(None, KV_FAMILY, "kv.append", op.layer, 0, op.kv_write_bytes, write=True)
            last = plan_.pieces[-1]
            plan_.pieces[-1] = last._replace(writes=(*last.writes, write))
        if op.collectives:
            plan_.collectives = collectives[index]  # the remembered plans themselves (read-only)

    if b.issue is not None:
        place_expert_releases(plans, ops, b.issue, layer_experts, schedule)
    for plan_ in plans:  # an empty list left as the shared (): fewer objects for the collector to walk
        if not plan_.start_releases:
            plan_.start_releases = ()
        if not plan_.end_releases:
            plan_.end_releases = ()
        if not plan_.resolves:
            plan_.resolves = ()
    pools = [*b.pools.values(), b.kv_pool, b.state_pool]
    for pool in pools:
        pool.order.sort(key=_SEQ)
    return Lowered(
        ops=plans,
        pools=pools,
        descriptors=b.desc_seq,
        slabs=b.slab_seq,
        base_bytes=vmem.activation_bytes,
    )


def _lower_expert(b: Builder, op: Op, plan_: OpPlan,
                  layer_experts: dict[int, list[tuple[Slab, Slab | None]]]) -> None:
    """A routed expert: one slot, a piece per matmul, the slot freed after the last."""
    wasted = None
    rate = b.miss_rate
    # only a copy issued ahead of routing can be mispredicted (a slot freeing later issues after it)
    if rate and b.issue is not None and b.issue.expert_issue(op.layer, op.expert_index or 0)[1] \
            and is_mispredicted(b.expert_count, rate):
        wasted = b.expert_slab(op, plan_.index, ".mispredicted", b.facts.mispredicted_layouts[plan_.index])
    b.expert_count += 1
    layout = b.facts.expert_layouts[plan_.index]
    slab = b.expert_slab(op, plan_.index, "", layout)
    if b.issue is not None:
        layer_experts.setdefault(op.layer, []).append((slab, wasted))
    else:
        b.release_plan(plan_.index).start_releases.append(slab)
    descs = slab.descs
    pieces = plan_.pieces
    parts = b.expert_parts(op, plan_.index, layout)
    last = len(parts) - 1
    for position, (waits, dequant_s, mxu_s) in enumerate(parts):
        landed = tuple([descs[i] for i in waits])
        if dequant_s:  # the VPU converts the landed tensor (FP8/MXFP4 -> bf16), the MXU reads it
            pieces.append(new_piece(Piece, (dequant_s, VPU, landed, (), (), ())))
            landed = ()
        pieces.append(new_piece(Piece, (mxu_s, MXU, landed, (slab,) if position == last else (), (), ())))
    if not parts:
        plan_.pieces.append(Piece(0.0, MXU, slab.descs, (slab,)))


def _lower_weights(b: Builder, op: Op, plan_: OpPlan, vector_s: float, aligned: bool) -> float:
    """Weight slabs released ``d`` ops ahead; slab-by-slab matmuls (``aligned``:
    :func:`~tpusim.engine.lowering_facts.is_aligned`),
    or wait-all for other ops.

    Returns the vector time still to be added as a trailing VPU piece.
    """
    index, layer = plan_.index, op.layer
    tensor_slabs = [(tensor, b.tensor_slabs(tensor, shape, layer, index))
                    for tensor, shape in zip(op.tensors, b.facts.tensor_shapes[index], strict=True)]
    if aligned:
        pieces = plan_.pieces
        dtype = b.facts.dtypes[index]
        for (tensor, slabs), shape, matmul in zip(tensor_slabs, b.facts.tensor_shapes[index], op.matmuls,
                                                  strict=True):
            # Piece(...) by tuple.__new__: no Python call per slab
            for (slab, _rows), (dequant_s, mxu_s) in zip(slabs, b.slab_parts(tensor, shape, matmul, dtype, slabs),
                                                         strict=True):
                landed = slab.descs  # the slab's own list (read-only once lowered): no copy per piece
                if dequant_s is not None:  # the slab is converted on the VPU before the MXU reads it
                    pieces.append(new_piece(Piece, (dequant_s, VPU, landed, (), (), ())))
                    landed = ()
                pieces.append(new_piece(Piece, (mxu_s, MXU, landed, (slab,), (), ())))
        return vector_s
    all_slabs = tuple(slab for _tensor, slabs in tensor_slabs for slab, _rows in slabs)
    waits = tuple(desc for slab in all_slabs for desc in slab.descs)
    matmul_s = b.op_matmul_s(op, b.facts.dtypes[plan_.index]) + sum(b.dots_s(len(slabs), slabs[0][1], cols) for (_tensor, slabs), (_r, _k, cols)
                                       in zip(tensor_slabs, op.matmuls, strict=False))
    dequant_s = sum(b.dequant_s(tensor) for tensor in op.tensors)
    if dequant_s:  # weights the MXU cannot read natively are converted on the VPU first
        plan_.pieces.append(Piece(dequant_s, VPU, waits, ()))
        waits = ()
    if op.unit == "mxu" or matmul_s:
        plan_.pieces.append(Piece(matmul_s, MXU, waits, ()))
        waits = ()
    plan_.pieces.append(Piece(vector_s, VPU, waits, all_slabs))
    return 0.0


def _lower_state(b: Builder, op: Op, plan_: OpPlan, vector_s: float) -> float:
    """KDA core: read the recurrent state, update it, write it back (the write frees it)."""
    slab = b.new_slab(STATE_FAMILY, StateBuffer.KDA_STATE, op.layer, plan_.index, b.state_pool, b.state_ring)
    b.add_desc(slab, STATE_FAMILY, StateBuffer.KDA_STATE, op.layer, 0, op.kv_read_bytes)
    plan_.start_releases.append(slab)
    matmul_s = b.op_matmul_s(op, b.facts.dtypes[plan_.index])
    if matmul_s:
        plan_.pieces.append(Piece(matmul_s, MXU, slab.descs, ()))
    writes: tuple[Descriptor, ...] = ()
    frees: tuple[Slab, ...] = (slab,)
    if op.kv_write_bytes:
        writes = (b.add_desc(None, STATE_FAMILY, StateBuffer.KDA_STATE_WRITEBACK, op.layer, 0, op.kv_write_bytes,
                             write=True, frees_slab=slab),)
        frees = ()
    plan_.pieces.append(Piece(vector_s, VPU, () if matmul_s else slab.descs, frees, (), writes))
    return 0.0


def kv_tile_prices(b: Builder, op: Op, dtype: str) -> tuple[list[tuple[int, float, Any]], bool]:
    """The MLA / GQA core's KV tiles as (bytes, seconds, unit), in order, and whether the chip
    prices the tile's code (``execution.attention_core_s_per_token`` set: one VPU piece a tile,
    products and vector work together) rather than its products (an MXU piece a tile, the op's
    vector work after the last). One owner for the lowering and :mod:`tpusim.engine.reprice`."""
    program = b.program
    per_token = b.facts.kv_bytes_per_token(program, op.layer) * program.kv_sequences
    tile_bytes = b.schedule.kv_tile_tokens * per_token if per_token else op.kv_read_bytes
    tiles = max(1, math.ceil(op.kv_read_bytes / tile_bytes))
    execution = b.chip.execution
    coded = bool(execution.attention_core_s_per_token is not None and per_token)
    if coded:
        token_s = execution.attention_core_s_per_token.value
        tile_s = execution.attention_core_s_per_tile.value if execution.attention_core_s_per_tile is not None else 0.0
    else:
        matmul_s = b.op_matmul_s(op, dtype)
    out = []
    left = op.kv_read_bytes
    for _tile in range(tiles):
        size = min(tile_bytes, left)
        left -= size
        if coded:
            out.append((size, tile_s + token_s * size / per_token, VPU))
        else:
            out.append((size, matmul_s * size / op.kv_read_bytes, MXU))
    return out, coded


def _lower_kv_tiles(b: Builder, op: Op, plan_: OpPlan, vector_s: float) -> float:
    """MLA / GQA core: the cache streams in ``kv_tile_tokens`` tiles through ``kv_buffers``; each
    tile's products as it lands, the op's vector work after the last (returned). A chip whose
    ``execution.attention_core_s_per_token`` is set (the kernel's KV loop from the compiler's
    schedule or the ``mla_core`` probe) prices each tile's whole code instead, products and
    vector work together, as a VPU piece at that tile (the kernel folds a tile before it refills
    its buffer): 0.0 left (:func:`kv_tile_prices`)."""
    prices, coded = kv_tile_prices(b, op, b.facts.dtypes[plan_.index])
    for tile, (size, seconds, unit) in enumerate(prices):
        slab = b.new_slab(KV_FAMILY, "kv.tile", op.layer, plan_.index, b.kv_pool, b.kv_ring)
        b.add_desc(slab, KV_FAMILY, "kv.tile", op.layer, tile, size)
        plan_.start_releases.append(slab)
        plan_.pieces.append(Piece(seconds, unit, slab.descs, (slab,)))
    return 0.0 if coded else vector_s


# Step 5 depends on the program, the chip and the policy, not on the schedule, and its plans are
# read-only during a run: a sweep's candidates (one program, one chip, many schedules) share them.
_COLLECTIVES: list[tuple[Program, Chip, ExecutionPolicy, dict[int, tuple[CollectivePlan, ...]]]] = []


def _program_collectives(b: Builder) -> dict[int, tuple[CollectivePlan, ...]]:
    """Step 5 for every op with collectives (op index -> its plans), remembered for the last few
    (program, chip, policy): the program by identity (held here), the chip and policy by ``==``."""
    program, chip, policy = b.program, b.chip, b.policy
    for position, (known, known_chip, known_policy, plans) in enumerate(_COLLECTIVES):
        if known is program and (known_chip is chip or known_chip == chip) and known_policy == policy:
            _COLLECTIVES.append(_COLLECTIVES.pop(position))
            return plans
    ops = program.ops
    plans = {index: tuple(_lower_collectives(b, ops, index)) for index, op in enumerate(ops) if op.collectives}
    _COLLECTIVES.append((program, chip, policy, plans))
    del _COLLECTIVES[:-KEPT_PROGRAMS]
    return plans


def _lower_collectives(b: Builder, ops: list[Op], index: int) -> list[CollectivePlan]:
    """Step 5: each collective after op ``index`` as messages, or priced stage by stage."""
    op = ops[index]
    policy = b.policy
    names = {call.spec.name for call in op.collectives}
    out: list[CollectivePlan] = []
    for call in op.collectives:
        if call.spec.algorithm and policy.collective_pricer is None and not policy.collectives_block:
            consumer = consumer_index(ops, index, call.spec.consumed_by)
            lowered = lower_messages(b.chip, b.program.plan, call, consumer, cache=b.message_cache,
                                     topology=b.topology)
            if lowered is not None:
                if call.spec.after in names:
                    lowered = replace(lowered, parent=call.spec.after)
                out.append(CollectivePlan(call.spec.name, True, (), consumer, 0.0, lowered))
                continue
        if policy.collective_pricer is not None:
            stages = list(policy.collective_pricer(b.chip, call, b.program.plan.devices))
        else:
            stages = []
            for stage in call.spec.stages:
                link = resolve_link(b.chip, stage.link)
                if link is not None:
                    stages.append((link.name, collective_stage_s(link, stage, call.payload_bytes_per_peer)))
        if stages:
            overlapped = call.spec.overlapped and not policy.collectives_block
            join = index + 1
            if overlapped:  # waited at its consumer when the plan names one (a generic plan's shared reduce)
                join = (consumer_index(ops, index, call.spec.consumed_by) if call.spec.consumed_by
                        else _overlap_join_index(ops, index))
            launch = policy.launch_overhead_s if policy.collective_launches else 0.0
            out.append(CollectivePlan(call.spec.name, overlapped, tuple(stages), join, launch))
    return out
