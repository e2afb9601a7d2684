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
   the op's matmul time proportional to its bytes); any other op waits for all its slabs,
   computes, and frees them. Vector work follows as one VPU piece.
5. **Collectives** after each op. One whose plan entry names an ``algorithm`` runs as remote
   copies on a megakernel chip (:mod:`tpusim.engine.collectives`: messages sharing the
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

from hwmodels.schema import Chip
from tpusim.engine.collectives import consumer_index, lower_messages
from tpusim.engine.costs import (
    collective_stage_s,
    matmul_time_s,
    op_matmul_dtype,
    resolve_link,
    vector_time_s,
)
from tpusim.engine.execution import ExecutionPolicy
from tpusim.engine.expert_release import place_expert_releases
from tpusim.engine.items import (
    MXU,
    VPU,
    CollectivePlan,
    Descriptor,
    OpPlan,
    Piece,
    Pool,
    Ring,
    Slab,
)
from tpusim.schedule.program_issue import cached_issue_plan
from tpusim.schedule.release import is_mispredicted
from tpusim.schedule.schema import SCHEDULE_FAMILIES, SMALL_FAMILY, FamilySchedule, Schedule
from tpusim.schedule.vmem import VmemPlan, arena_of, family_chunk, slab_rows
from tpusim.workload.formats import scale_bytes, value_bytes
from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import Family, MoeOp, Role, StateBuffer, StateFamily
from tpusim.workload.shapes import TensorSpec, kv_cache_bytes_per_token, recurrent_state_bytes

ROUTED = Family.ROUTED_EXPERT
KV_FAMILY = "kv_cache"
STATE_FAMILY = StateFamily.KDA_STATE
KV_POOL = "<kv tiles>"
STATE_POOL = "<kda state>"
OVERLAP_JOIN_ROLES = (Role.MOE_EXPERT, MoeOp.COMBINE)


@dataclass
class Lowered:
    """Everything the event loop needs, built by :func:`lower`."""

    ops: list[OpPlan]
    pools: list[Pool]
    descriptors: int
    slabs: int
    base_bytes: int  # always-resident scratch (activations)


class _Builder:
    """Counters and lookups shared by the lowering steps."""

    def __init__(self, program: Program, schedule: Schedule, chip: Chip, policy: ExecutionPolicy,
                 vmem: VmemPlan) -> None:
        self.program = program
        self.schedule = schedule
        self.chip = chip
        self.policy = policy
        self.matrix = chip.matrix_unit
        self.compute_scale = 1.0 / policy.compute_efficiency
        self.slab_seq = 0
        self.desc_seq = 0
        self.pools: dict[str, Pool] = {
            name: Pool(name, size, tuple(vmem.arena_members.get(name, ())))
            for name, size in vmem.arena_bytes.items()
        }
        self.message_cache: dict[object, object] = {}  # priced collectives, reused across layers
        self.kv_pool = Pool(KV_POOL, vmem.kv_bytes, (KV_FAMILY,))
        self.state_pool = Pool(STATE_POOL, vmem.state_bytes, (STATE_FAMILY,))
        self.rings: dict[str, Ring] = {}
        self.kv_ring = Ring("kv_tiles", schedule.kv_buffers)
        self.state_ring = Ring(StateFamily.KDA_STATE, 1)
        self.matmul_cache: dict[tuple[int, int, int, float], float] = {}
        self.vector_cache: dict[float, float] = {}
        self.families: dict[str, FamilySchedule] = {name: schedule.family(name) for name in SCHEDULE_FAMILIES}
        speculative = schedule.expert_issue == "speculative" and policy.cross_op_prefetch
        self.miss_rate = schedule.speculation_miss_rate if speculative else 0.0
        self.expert_count = 0  # routed experts lowered so far over the whole step (misses)
        self.kernels = policy.kernel_plan(program)
        self.issue = cached_issue_plan(program, schedule) if policy.cross_op_prefetch else None
        self.plans: list[OpPlan] = []
        self.topology = program.plan.topology  # one Topology per lowering (a key of the message cache)
        # memos of facts that repeat in every layer (the lowering's cost is per op, not per fact)
        self.tensor_queues: dict[tuple[str, str], tuple[Ring, Pool, int | None]] = {}
        self.slab_cuts: dict[tuple[str, str, int, int, int | None], tuple[tuple[int, int, int], ...]] = {}
        self.peaks: dict[str, tuple[float, str]] = {}
        self.state_bytes: dict[int, int] = {}
        self.splits: dict[tuple[str, int, int], tuple[int, int]] = {}
        self.expert_layouts: dict[tuple[object, ...], tuple[tuple[tuple[str, int], ...],
                                                            tuple[tuple[int, ...], ...]]] = {}

    def release_plan(self, index: int, tensor: TensorSpec | None = None, layer: int = 0, chunk: int = 0) -> OpPlan:
        """The op whose start issues slab ``chunk`` of ``tensor`` read by op ``index`` (step 3)."""
        if self.issue is None:
            return self.plans[self.kernels.issue_op(index)]
        if tensor is None:
            return self.plans[index]
        return self.plans[self.issue.weight_issue(tensor.name, tensor.family, layer, chunk)]

    # ----------------------------------------------------------------- small factories

    def pool_of(self, family: str, ring: Ring) -> Pool:
        """The arena's pool; with an issue plan, the ring's own queue (step 3)."""
        if self.issue is not None:  # named after its arena, so diagnoses group by arena
            pool = self.pools.get(ring.name)
            if pool is None:
                pool = self.pools[ring.name] = Pool(arena_of(self.schedule, family), float("inf"), (family,))
            return pool
        name = self.families[family].pool or family
        pool = self.pools.get(name)
        if pool is None:  # a family vmem_plan did not size (no tensor kinds): unbounded
            pool = self.pools[name] = Pool(name, 1 << 62, (family,))
        return pool

    def ring_of(self, key: str, depth: int) -> Ring:
        ring = self.rings.get(key)
        if ring is None:
            ring = self.rings[key] = Ring(key, depth)
        return ring

    def new_slab(self, family: str, label: str, layer: int, op_index: int, pool: Pool, ring: Ring) -> Slab:
        slab = Slab(self.slab_seq, family, label, layer, op_index, pool, ring)
        self.slab_seq += 1
        pool.order.append(slab)
        return slab

    def add_desc(self, slab: Slab | None, family: str, tensor: str, layer: int, chunk: int, nbytes: int,
                 *, write: bool = False, frees_slab: Slab | None = None) -> Descriptor:
        seq = self.desc_seq
        desc = (Descriptor(seq, family, tensor, layer, chunk, nbytes, slab, write=write, frees_slab=frees_slab)
                if write or frees_slab is not None else Descriptor(seq, family, tensor, layer, chunk, nbytes, slab))
        self.desc_seq = seq + 1
        if slab is not None:
            slab.descs.append(desc)
            slab.nbytes += nbytes
            slab.pending += 1
        return desc

    def matmul_s(self, rows: int, contraction: int, cols: int, peak: tuple[float, str]) -> float:
        key = (rows, contraction, cols, peak)
        cached = self.matmul_cache.get(key)
        if cached is None:
            cached = self.matmul_cache[key] = (
                matmul_time_s(rows, contraction, cols, self.matrix, peak[0], peak[1]) * self.compute_scale
            )
        return cached

    def vector_s(self, vector_flops: float) -> float:
        """VPU time of ``vector_flops`` (ops of a kind repeat in every layer: memoised)."""
        cached = self.vector_cache.get(vector_flops)
        if cached is None:
            cached = self.vector_cache[vector_flops] = vector_time_s(vector_flops, self.chip) * self.compute_scale
        return cached

    def peak(self, op: Op) -> tuple[float, str]:
        """(peak FLOP/s, dtype) the matrix unit runs ``op`` at."""
        dtype = op_matmul_dtype(op)
        peak = self.peaks.get(dtype)
        if peak is None:
            peak = self.peaks[dtype] = (self.matrix.peak_for(dtype), dtype)
        return peak

    def recurrent_state_bytes(self, layer: int) -> int:
        """One sequence's KDA recurrent-state bytes in ``layer`` (0: not a KDA layer)."""
        nbytes = self.state_bytes.get(layer)
        if nbytes is None:
            nbytes = self.state_bytes[layer] = recurrent_state_bytes(self.program.model, self.program.plan, layer)
        return nbytes

    def op_matmul_s(self, op: Op) -> float:
        """MXU time of all of ``op``'s matmuls, unsplit."""
        peak = self.peak(op)
        return sum(self.matmul_s(rows, contraction, cols, peak) for rows, contraction, cols in op.matmuls)

    # ----------------------------------------------------------------- tensors → slabs

    def tensor_slabs(self, tensor: TensorSpec, layer: int, op_index: int) -> list[tuple[Slab, int]]:
        """Row slabs of a (non-expert) weight tensor: [(slab, rows in it)] (new_slab and
        add_desc inlined: a step lowers thousands)."""
        ring, pool, chunk_bytes = self.tensor_queue(tensor)
        out: list[tuple[Slab, int]] = []
        family, name = tensor.family, tensor.name
        order, slab_seq, seq = pool.order, self.slab_seq, self.desc_seq
        for chunk, (rows, values, scales) in enumerate(self.slab_cut(tensor, chunk_bytes)):
            slab = Slab(slab_seq, family, name, layer, op_index, pool, ring)
            slab_seq += 1
            order.append(slab)
            descs = slab.descs
            if values:
                descs.append(Descriptor(seq, family, name, layer, chunk, values, slab))
                seq += 1
            if scales:
                descs.append(Descriptor(seq, family, f"{name}.scales", layer, chunk, scales, slab))
                seq += 1
            slab.nbytes, slab.pending = values + scales, len(descs)
            out.append((slab, rows))
        self.slab_seq, self.desc_seq = slab_seq, seq
        return out

    def tensor_queue(self, tensor: TensorSpec) -> tuple[Ring, Pool, int | None]:
        """(ring, pool, chunk bytes) a (non-expert) weight tensor streams through."""
        key = (tensor.name, tensor.family)
        queue = self.tensor_queues.get(key)
        if queue is None:
            chunk_bytes, buffers = family_chunk(self.schedule, tensor.family)
            ring_key = tensor.name
            if self.issue is not None and tensor.family != SMALL_FAMILY:
                ring_key = self.issue.ring_of(tensor.name, tensor.family)
                buffers = self.issue.rings[ring_key].buffers
            ring = self.ring_of(ring_key, buffers)
            queue = self.tensor_queues[key] = (ring, self.pool_of(tensor.family, ring), chunk_bytes)
        return queue

    def slab_cut(self, tensor: TensorSpec, chunk_bytes: int | None) -> tuple[tuple[int, int, int], ...]:
        """(rows, value bytes, scale bytes) of each row slab of ``tensor`` (the last slab takes
        what is left, so the slabs add up to the tensor's bytes exactly)."""
        key = (tensor.name, tensor.format_name, tensor.rows, tensor.cols, chunk_bytes)  # cheaper to hash than the spec
        cut = self.slab_cuts.get(key)
        if cut is None:
            per_slab = slab_rows(tensor, chunk_bytes)
            count = math.ceil(tensor.rows / per_slab)
            fmt, cols = tensor.fmt, tensor.cols
            values_left, scales_left = tensor.value_bytes, tensor.scale_bytes
            slabs = []
            for chunk in range(count):
                rows = min(per_slab, tensor.rows - chunk * per_slab)
                last = chunk == count - 1
                values = values_left if last else value_bytes(fmt, rows, cols)
                scales = scales_left if last else scale_bytes(fmt, rows, cols)
                values_left -= values
                scales_left -= scales
                slabs.append((rows, values, scales))
            cut = self.slab_cuts[key] = tuple(slabs)
        return cut

    def expert_slab(self, op: Op, op_index: int, label_suffix: str = "") -> Slab:
        """One expert slot: every tensor of the expert op, values then scales."""
        ring = self.ring_of(ROUTED, self.families[ROUTED].buffers)
        slab = self.new_slab(ROUTED, f"{op.name}{label_suffix}", op.layer, op_index, self.pool_of(ROUTED, ring), ring)
        # chunk = the expert's entry in the layer's expert list (the kernel's vocabulary)
        entry, layer, seq, descs = op.expert_index or 0, op.layer, self.desc_seq, slab.descs
        for name, nbytes in self.expert_layout(op, label_suffix)[0]:  # add_desc, inlined
            descs.append(Descriptor(seq, ROUTED, name, layer, entry, nbytes, slab))
            seq += 1
            slab.nbytes += nbytes
        self.desc_seq, slab.pending = seq, len(descs)
        return slab

    def expert_layout(self, op: Op, label_suffix: str = "") -> tuple[tuple[tuple[str, int], ...],
                                                                      tuple[tuple[int, ...], ...]]:
        """An expert op's copies as (label, bytes), values then scales per tensor, and per
        tensor the positions of the copies a piece reading it waits for (the copies named
        after it). Every expert of every layer has the same few tensor shapes: memoised."""
        key = (label_suffix, *[(t.name, t.format_name, t.rows, t.cols) for t in op.tensors])
        layout = self.expert_layouts.get(key)
        if layout is None:
            copies: list[tuple[str, int]] = []
            for tensor in op.tensors:
                name = f"{tensor.name}{label_suffix}"
                values, scales = self.split_bytes(tensor)
                if values:
                    copies.append((name, values))
                if scales:
                    copies.append((f"{name}.scales", scales))
            by_tensor: dict[str, list[int]] = {}
            for position, (name, _bytes) in enumerate(copies):
                by_tensor.setdefault(name.removesuffix(".scales"), []).append(position)
            layout = self.expert_layouts[key] = (
                tuple(copies), tuple(tuple(by_tensor.get(tensor.name, ())) for tensor in op.tensors))
        return layout

    def split_bytes(self, tensor: TensorSpec) -> tuple[int, int]:
        """(value bytes, scale bytes) of a whole tensor (an expert's tensors repeat in every slot)."""
        key = (tensor.format_name, tensor.rows, tensor.cols)
        split = self.splits.get(key)
        if split is None:
            split = self.splits[key] = (tensor.value_bytes, tensor.scale_bytes)
        return split


def _is_expert_op(op: Op) -> bool:
    tensors = op.tensors
    return bool(tensors) and tensors[0].family == ROUTED and all(t.family == ROUTED for t in tensors)


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
    b = _Builder(program, schedule, chip, policy, vmem)
    ops = program.ops
    plans = b.plans
    launch_s = policy.launch_overhead_s
    previous_layer: int | None = None
    # per layer: [(real slab, mispredicted slab or None)] in expert order
    layer_experts: dict[int, list[tuple[Slab, Slab | None]]] = {}

    for index, op in enumerate(ops):
        first = op.layer != previous_layer
        previous_layer = op.layer
        plan_ = OpPlan(index, op.name, op.layer, op.phase, first)
        plan_.launches = b.kernels.launches[index]
        plan_.launch_s = plan_.launches * launch_s
        if b.kernels.fixed_s:
            plan_.kernel_fixed_s = b.kernels.fixed_s[index]
        if b.kernels.kernel_names:
            plan_.kernel = b.kernels.kernel_names[index]
        plans.append(plan_)
        vector_s = b.vector_s(op.vector_flops)
        if _is_expert_op(op):
            _lower_expert(b, op, plan_, layer_experts)
        elif op.tensors:
            vector_s = _lower_weights(b, op, plan_, vector_s)
        elif op.kv_read_bytes and b.recurrent_state_bytes(op.layer):
            vector_s = _lower_state(b, op, plan_, vector_s)
        elif op.kv_read_bytes:
            _lower_kv_tiles(b, op, plan_)
        else:
            matmul_s = b.op_matmul_s(op)
            if matmul_s:
                plan_.pieces.append(Piece(matmul_s, MXU))
        if vector_s or not plan_.pieces:
            plan_.pieces.append(Piece(vector_s, VPU))
        if op.kv_write_bytes and not b.recurrent_state_bytes(op.layer):
            write = b.add_desc(None, KV_FAMILY, "kv.append", op.layer, 0, op.kv_write_bytes, write=True)
            last = plan_.pieces[-1]
            plan_.pieces[-1] = last._replace(writes=(*last.writes, write))
        if op.collectives:
            _lower_collectives(b, ops, index, plan_)

    if b.issue is not None:
        place_expert_releases(plans, ops, b.issue, layer_experts, schedule)
    pools = [*b.pools.values(), b.kv_pool, b.state_pool]
    for pool in pools:
        pool.order.sort(key=lambda slab: slab.seq)
    return Lowered(
        ops=plans,
        pools=pools,
        descriptors=b.desc_seq,
        slabs=b.slab_seq,
        base_bytes=vmem.activation_bytes,
    )


def _lower_expert(b: _Builder, op: Op, plan_: OpPlan,
                  layer_experts: dict[int, list[tuple[Slab, Slab | None]]]) -> None:
    """A routed expert: one slot, a piece per matmul, the slot freed after the last."""
    wasted = None
    rate = b.miss_rate
    # only a copy issued ahead of routing can be mispredicted (a slot freeing later issues after it)
    if rate and b.issue is not None and b.issue.expert_issue(op.layer, op.expert_index or 0)[1] \
            and is_mispredicted(b.expert_count, rate):
        wasted = b.expert_slab(op, plan_.index, ".mispredicted")
    b.expert_count += 1
    slab = b.expert_slab(op, plan_.index)
    if b.issue is not None:
        layer_experts.setdefault(op.layer, []).append((slab, wasted))
    else:
        b.release_plan(plan_.index).start_releases.append(slab)
    waits = b.expert_layout(op)[1]
    descs = slab.descs
    peak = b.peak(op)
    matmuls = op.matmuls
    pairs = min(len(op.tensors), len(matmuls))
    pieces = plan_.pieces
    for position in range(pairs):
        rows, contraction, cols = matmuls[position]
        pieces.append(Piece(b.matmul_s(rows, contraction, cols, peak), MXU,
                            tuple([descs[i] for i in waits[position]]), (slab,) if position == pairs - 1 else ()))
    if not pairs:
        plan_.pieces.append(Piece(0.0, MXU, tuple(slab.descs), (slab,)))


def _lower_weights(b: _Builder, op: Op, plan_: OpPlan, vector_s: float) -> float:
    """Weight slabs released ``d`` ops ahead; slab-by-slab matmuls, or wait-all for other ops.

    Returns the vector time still to be added as a trailing VPU piece.
    """
    tensor_slabs = [(tensor, b.tensor_slabs(tensor, op.layer, plan_.index)) for tensor in op.tensors]
    for tensor, slabs in tensor_slabs:
        for chunk, (slab, _rows) in enumerate(slabs):
            b.release_plan(plan_.index, tensor, op.layer, chunk).start_releases.append(slab)
    peak = b.peak(op)
    aligned = op.unit == "mxu" and len(op.matmuls) == len(op.tensors) and all(
        contraction == tensor.rows for tensor, (_m, contraction, _n) in zip(op.tensors, op.matmuls, strict=True))
    if aligned:
        for (tensor, slabs), (rows, contraction, cols) in zip(tensor_slabs, op.matmuls, strict=True):
            # A slab's share of the whole matmul, in proportion to its rows: cutting the
            # contraction into slabs does not add weight-tile pushes (a 32-row slab is not a
            # full 256-row tile, it fills an eighth of one).
            whole_s = b.matmul_s(rows, contraction, cols, peak)
            for slab, slab_rows_ in slabs:
                plan_.pieces.append(Piece(whole_s * slab_rows_ / tensor.rows, MXU, tuple(slab.descs), (slab,)))
        return vector_s
    all_slabs = tuple(slab for _tensor, slabs in tensor_slabs for slab, _rows in slabs)
    waits = tuple(desc for slab in all_slabs for desc in slab.descs)
    matmul_s = b.op_matmul_s(op)
    if op.unit == "mxu" or matmul_s:
        plan_.pieces.append(Piece(matmul_s, MXU, waits, ()))
        waits = ()
    plan_.pieces.append(Piece(vector_s, VPU, waits, all_slabs))
    return 0.0


def _lower_state(b: _Builder, op: Op, plan_: OpPlan, vector_s: float) -> float:
    """KDA core: read the recurrent state, update it, write it back (the write frees it)."""
    slab = b.new_slab(STATE_FAMILY, StateBuffer.KDA_STATE, op.layer, plan_.index, b.state_pool, b.state_ring)
    b.add_desc(slab, STATE_FAMILY, StateBuffer.KDA_STATE, op.layer, 0, op.kv_read_bytes)
    plan_.start_releases.append(slab)
    matmul_s = b.op_matmul_s(op)
    if matmul_s:
        plan_.pieces.append(Piece(matmul_s, MXU, tuple(slab.descs), ()))
    writes: tuple[Descriptor, ...] = ()
    frees: tuple[Slab, ...] = (slab,)
    if op.kv_write_bytes:
        writes = (b.add_desc(None, STATE_FAMILY, StateBuffer.KDA_STATE_WRITEBACK, op.layer, 0, op.kv_write_bytes,
                             write=True, frees_slab=slab),)
        frees = ()
    plan_.pieces.append(Piece(vector_s, VPU, () if matmul_s else tuple(slab.descs), frees, (), writes))
    return 0.0


def _lower_kv_tiles(b: _Builder, op: Op, plan_: OpPlan) -> None:
    """MLA / GQA core: the cache streams in ``kv_tile_tokens`` tiles through ``kv_buffers``."""
    program = b.program
    per_token = kv_cache_bytes_per_token(program.model, program.plan, op.layer) * program.kv_sequences
    tile_bytes = b.schedule.kv_tile_tokens * per_token if per_token else op.kv_read_bytes
    tiles = max(1, math.ceil(op.kv_read_bytes / tile_bytes))
    matmul_s = b.op_matmul_s(op)
    left = op.kv_read_bytes
    for tile in range(tiles):
        size = min(tile_bytes, left)
        left -= size
        slab = b.new_slab(KV_FAMILY, "kv.tile", op.layer, plan_.index, b.kv_pool, b.kv_ring)
        b.add_desc(slab, KV_FAMILY, "kv.tile", op.layer, tile, size)
        plan_.start_releases.append(slab)
        plan_.pieces.append(Piece(matmul_s * size / op.kv_read_bytes, MXU, tuple(slab.descs), (slab,)))


def _lower_collectives(b: _Builder, ops: list[Op], index: int, plan_: OpPlan) -> None:
    """Step 5: each collective after op ``index`` as messages, or priced stage by stage."""
    op = ops[index]
    policy = b.policy
    names = {call.spec.name for call in op.collectives}
    for call in op.collectives:
        if call.spec.algorithm and policy.collective_pricer is None and not policy.collectives_block:
            consumer = consumer_index(ops, index, call.spec.consumed_by)
            lowered = lower_messages(b.chip, b.program.plan, call, consumer, cache=b.message_cache,
                                     topology=b.topology)
            if lowered is not None:
                if call.spec.after in names:
                    lowered = replace(lowered, parent=call.spec.after)
                plan_.collectives.append(CollectivePlan(call.spec.name, True, (), consumer, 0.0, lowered))
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
            plan_.collectives.append(CollectivePlan(call.spec.name, overlapped, tuple(stages), join, launch))
