"""VMEM accounting of a schedule: the static scratch both the kernel and the engine use.

Layout rule (the kernel allocates exactly this):

1. Each weight *tensor kind* ``t`` (``kda.qkvgb``, ``mla.q_a``, ...) of a family ``f`` gets
   ``buffers_f`` slab buffers. A slab is ``slab_rows(t)`` whole rows of ``t``: all rows when
   the family is not chunked, else the most rows whose bytes fit ``chunk_bytes``, rounded
   down to a multiple of the row granule (16 rows, or the format's scale block when larger,
   so scales split with their values).
2. ``routed_expert`` buffers are *expert slots*: each holds one whole expert slice (gate/up
   and down, values and scales).
3. A family's footprint is ``buffers_f * sum_t slab_bytes(t)``. Families sharing a pool
   time-share one arena sized for the largest member footprint; an unpooled family is its
   own arena. Small parameters always get an arena of their own, even when the schedule
   names a pool for them: they are read from ``attn.mix_norm`` to ``moe.topk``, so
   at fixed addresses they cannot time-share a pool whose largest member fills it. A pool of
   mode ``ring`` is ``banks * bank_bytes`` (its members' slabs take the banks in turn).
4. KV tiles: ``kv_buffers * kv_tile_tokens * kv_bytes_per_token * sequences`` (MLA/GQA
   layers); KDA recurrent state: one ``sequences x heads x head_dim x head_dim`` f32 buffer
   (``sequences`` = batch rows, or fewer when several rows share a cache as in speculative
   verification).
5. Activations: the residual stream and attention-residual block snapshots in f32, plus
   working rows for the widest projection output, per batch row.
6. Collective buffers (multi-device plans): every in-kernel collective of the plan at this
   batch keeps send and receive buffers in VMEM (remote copies land there), sized by
   :func:`tpusim.workload.collectives.buffer_bytes` from the plan's message list; receive
   slots are double-buffered when the collective runs in more than one layer. The schedule's
   ``receive_slots`` knob picks the layout (:func:`buffer_hosts`): ``per_message`` gives every
   collective its own buffers; ``shared`` (the default) lets a collective that runs once, in
   the dense layers (K3: ``mlp.allreduce`` in layer 0), use the buffers of the MoE collective
   of the same algorithm, group and payload (``moe.shared_reduce``): a peer writes the host's
   parity-0 slots first in the second MoE layer, after this rank issued that collective in
   the first MoE layer, which it does only after reading the guest's result. At batch 8 on K3
   TP32 that saves 1.31 MiB, what the published schedule needs to fit. They are
   ``collective_bytes``; :class:`megakernel.kernel_collectives.KernelLink` allocates exactly
   this for the same knob.
7. Kernel working scratch (``kernel_bytes``): what the kernel keeps besides the above: the
   routing scratch (``2 top_k`` f32 rows of 128 lanes per activation row), one KV-cache entry
   per row (MLA), the KDA short-convolution state (``conv_kernel - 1`` f32 rows of
   ``3 x`` the device's KDA width per row), and the small parameters' lane padding (the kernel
   packs each small-parameter kind at a 128-lane boundary), and, on a speculative verify step
   (fewer KV sequences than rows), the KV tiles and state of the extra rows: the kernel has no
   shared-cache verify mode and keeps one cache per row. The engine does not model these
   (they are not streamed; its KV pool models the shared cache), but they occupy VMEM.

``total_bytes`` (rules 3–7: everything the kernel allocates) is the one figure the feasibility
check, ``simulate``, ``sweep``, ``compare``, ``diff`` and ``lower`` use; the kernel's scratch
(:meth:`megakernel.kernel.Megakernel.scratch_bytes`) equals it byte for byte on the K3 kernel
(``tests/test_vmem_truth.py``).

The total must fit the chip's usable on-chip memory (TPU v7: ≤ 58 MiB of explicit buffers);
:func:`check_fits` raises :class:`InfeasibleSchedule` naming the arenas otherwise.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from hwmodels.units import MIB
from tpusim.schedule.kernel_layout import (
    BF16_BYTES,
    KV_WRITE_TOKENS,
    LANES,
    MATMUL_CHUNK_ROWS,
    ROW_GRANULE,
    expert_list_stage_bytes,
    expert_scale_tile_rows,
    expert_slot_bytes,
    loop_rows,
    matmul_loops,
    matmul_stage_chunks,
    tile_padded_bytes,
)
from tpusim.schedule.schema import SCHEDULE_FAMILIES, SMALL_FAMILY, Schedule
from tpusim.workload.collectives import buffer_bytes
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import Family
from tpusim.workload.shapes import (
    TensorSpec,
    dense_mlp_tensors,
    device_widths,
    expert_slice_tensors,
    kv_cache_bytes_per_token,
    layer_tensors,
    lm_head_tensors,
    recurrent_state_bytes,
)
from tpusim.workload.sharding import COLLECTIVE_LISTS, ShardingPlan


class InfeasibleSchedule(ValueError):
    """The schedule's buffers do not fit on-chip memory (message names what overflows)."""


def row_granule(tensor: TensorSpec) -> int:
    fmt = tensor.fmt
    return max(ROW_GRANULE, fmt.scale_block_values if fmt.scale_block_values else 1)


def slab_rows(tensor: TensorSpec, chunk_bytes: int | None) -> int:
    """Rows per slab of ``tensor`` under ``chunk_bytes`` (all rows when not chunked)."""
    if chunk_bytes is None or tensor.bytes <= chunk_bytes:
        return tensor.rows
    bytes_per_row = tensor.bytes / tensor.rows
    granule = row_granule(tensor)
    rows = int(chunk_bytes // bytes_per_row) // granule * granule
    return max(granule, min(rows, tensor.rows))


def slab_bytes(tensor: TensorSpec, chunk_bytes: int | None) -> int:
    rows = slab_rows(tensor, chunk_bytes)
    return math.ceil(tensor.bytes * rows / tensor.rows)


@dataclass(frozen=True)
class TensorRing:
    """The VMEM ring of one tensor kind (rule 1): ``buffers`` buffers (a ring pool's members:
    its banks) of one ``slab_bytes`` slab each; an instance streams as ``slabs`` slabs."""

    buffers: int
    slabs: int
    slab_bytes: int

    @property
    def footprint_bytes(self) -> int:
        return self.buffers * self.slab_bytes


def tensor_ring(schedule: Schedule, tensor: TensorSpec) -> TensorRing:
    """The ring ``tensor``'s kind streams through under ``schedule``: the one sizing rule the
    accounting, the issue plan and the engine read."""
    chunk_bytes, buffers = family_chunk(schedule, tensor.family)
    return TensorRing(buffers, math.ceil(tensor.rows / slab_rows(tensor, chunk_bytes)), slab_bytes(tensor, chunk_bytes))


def small_row_bytes(model: ModelConfig, plan: ShardingPlan) -> int:
    """Bytes of one layer's small-parameter row as the kernel packs it: every small kind the
    model has (each at its largest instance), the same row for every layer."""
    return sum(t.bytes for t in tensor_kinds(model, plan).get(SMALL_FAMILY, []))


_KINDS: OrderedDict[tuple[str, str], dict[str, list[TensorSpec]]] = OrderedDict()
_KINDS_RECENT: list[tuple[ModelConfig, ShardingPlan, dict[str, list[TensorSpec]]]] = []
KINDS_ENTRIES = 64  # distinct (model, plan weight split) pairs remembered


def tensor_kinds(model: ModelConfig, plan: ShardingPlan) -> dict[str, list[TensorSpec]]:
    """Family -> the distinct tensor kinds (largest instance of each name) the step reads.

    Remembered, because every simulation, VMEM accounting and issue plan sizes its buffers
    with it and it walks every layer (≈ 20 ms for K3): by object for the last few (model,
    plan) pairs (no key to compute), else by value: the model and the plan *without its
    collective lists*, which only name messages (:mod:`tpusim.workload.shapes` never reads
    them), so a joint sweep's collective-algorithm variants of one plan share one entry
    (measured: 393 walks, 8.4 s of a budget-60 K3 sweep, before)."""
    for known_model, known_plan, kinds in _KINDS_RECENT:
        if known_model is model and known_plan is plan:
            return {family: list(tensors) for family, tensors in kinds.items()}
    key = (model.model_dump_json(), plan.model_dump_json(exclude=set(COLLECTIVE_LISTS)))
    kinds = _KINDS.get(key)
    if kinds is None:
        kinds = _KINDS[key] = _tensor_kinds(model, plan)
        while len(_KINDS) > KINDS_ENTRIES:
            _KINDS.popitem(last=False)
    else:
        _KINDS.move_to_end(key)
    _KINDS_RECENT.append((model, plan, kinds))
    del _KINDS_RECENT[:-8]
    return {family: list(tensors) for family, tensors in kinds.items()}


def _tensor_kinds(model: ModelConfig, plan: ShardingPlan) -> dict[str, list[TensorSpec]]:
    by_name: dict[str, TensorSpec] = {}
    tensors = [t for layer in range(model.num_layers) for t in layer_tensors(model, plan, layer)]
    tensors += lm_head_tensors(model, plan)
    if model.dense_layers:
        tensors += dense_mlp_tensors(model, plan)
    for tensor in tensors:
        current = by_name.get(tensor.name)
        if current is None or tensor.bytes > current.bytes:
            by_name[tensor.name] = tensor
    kinds: dict[str, list[TensorSpec]] = {}
    for tensor in by_name.values():
        kinds.setdefault(tensor.family, []).append(tensor)
    return kinds


EXPERT_RING = "expert"  # a layer's routed experts share the expert slots (one whole slice each)
SMALL_RING = "small"  # a layer's small parameters: one packed row, one copy


def arena_sizes(members: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The arena rule (rule 3): each arena is as large as its largest member; ``members`` are
    (arena, member footprint) pairs."""
    sizes: dict[str, int] = {}
    for arena, size in members:
        sizes[arena] = max(sizes.get(arena, 0), size)
    return sizes


@dataclass(frozen=True)
class RingSpec:
    """One VMEM ring: ``buffers`` buffers of ``slab_size`` arena units from ``offset``.

    Units are whatever the caller measures arenas in (bytes here, 16-bit 128-lane rows in the
    kernel); only overlaps matter."""

    name: str
    family: str
    pool: str
    buffers: int
    num_slabs: int  # K: slabs per instance
    slab_size: int
    distance: int = 0
    instances: int = 1
    offset: int = 0

    @property
    def region(self) -> tuple[int, int]:
        return self.offset, self.offset + self.buffers * self.slab_size

    def buffer_range(self, buffer: int) -> tuple[int, int]:
        """Arena range of ``buffer``; expert slot 0 sits at the top, slot 1 below it, ..."""
        if self.name == EXPERT_RING:
            start = self.offset + (self.buffers - 1 - buffer) * self.slab_size
        else:
            start = self.offset + buffer * self.slab_size
        return start, start + self.slab_size

    @property
    def static_buffers(self) -> bool:
        """Whether slab ``k`` of every instance lands in the same buffer (``k % buffers``)."""
        return (self.name == EXPERT_RING or self.name.startswith("pool:") or self.buffers == 1
                or self.instances == 1 or self.num_slabs % self.buffers == 0)


def place(rings: Sequence[RingSpec]) -> tuple[dict[str, RingSpec], dict[str, int]]:
    """Offsets of ``rings`` and each pool's arena size (rule 3): a family's rings back to back
    from the arena's base in the order given (:data:`tpusim.schedule.issue_plan.RING_ORDER`),
    the expert slots at the arena's top, slot 0 highest, so the shared expert and the first
    slots can coexist. Units are the caller's (bytes here, 128-lane rows in the kernel)."""
    footprint = {r.name: r.buffers * r.slab_size for r in rings}
    family_size: dict[str, int] = {}
    for ring in rings:
        family_size[ring.family] = family_size.get(ring.family, 0) + footprint[ring.name]
    arenas = arena_sizes((ring.pool, family_size[ring.family]) for ring in rings)
    cursor: dict[str, int] = {}
    placed: dict[str, RingSpec] = {}
    for ring in rings:
        if ring.name == EXPERT_RING:
            offset = arenas[ring.pool] - footprint[ring.name]
        else:
            offset = cursor.get(ring.family, 0)
            cursor[ring.family] = offset + footprint[ring.name]
        placed[ring.name] = replace(ring, offset=offset)
    return placed, arenas



@dataclass
class VmemPlan:
    """Static on-chip scratch of a schedule, in bytes."""

    family_bytes: dict[str, int]
    arena_bytes: dict[str, int]
    arena_members: dict[str, list[str]]
    kv_bytes: int
    state_bytes: int
    activation_bytes: int
    detail: dict[str, int] = field(default_factory=dict)
    collective_bytes: int = 0  # send/receive buffers of the in-kernel collectives (rule 6; 0 on one device)
    kernel_bytes: int = 0  # the kernel's working scratch the engine does not model (rule 7)

    @property
    def weight_bytes(self) -> int:
        return sum(self.arena_bytes.values())

    @property
    def total_bytes(self) -> int:
        """Everything the kernel allocates (rules 3–7, collective buffers included): the one
        figure the feasibility check and every command use."""
        return (self.weight_bytes + self.kv_bytes + self.state_bytes + self.activation_bytes + self.kernel_bytes
                + self.collective_bytes)

    @property
    def with_collectives_bytes(self) -> int:
        """Kept for callers of the old split: equal to ``total_bytes``."""
        return self.total_bytes

    def parts(self) -> dict[str, int]:
        """``total_bytes`` by part (arenas by name), the groups ``tpusim lower`` sets beside the
        kernel's scratch."""
        out = {f"arena.{pool}": size for pool, size in self.arena_bytes.items()}
        out.update(kv_tiles=self.kv_bytes, states=self.state_bytes, activations=self.activation_bytes,
                   kernel_working=self.kernel_bytes)
        if self.collective_bytes:
            out["collectives"] = self.collective_bytes
        return out


def activation_bytes(model: ModelConfig, batch: int) -> int:
    """Residual stream, attention-residual snapshots and working rows (f32, per row)."""
    blocks = math.ceil(model.num_layers / model.residual_block_layers) + 2
    snapshots = blocks if model.residual == "attention_residuals" else 2
    widest = max(model.hidden_size, (model.moe.latent_size or 0) if model.moe else 0) * 4
    rows = max(batch, 8)  # sublane tile: activations pad to 8 rows
    return rows * 4 * (model.hidden_size * snapshots + widest)


def collective_layers(model: ModelConfig, phase: str) -> int:
    """Layers that run a collective of ``phase`` (attention: all; moe: the MoE layers; mlp:
    the dense layers; head: once)."""
    dense = len(model.dense_layers) if model.moe else model.num_layers
    return {"attention": model.num_layers, "moe": model.num_layers - dense, "mlp": dense}.get(phase, 1)


def buffer_hosts(model: ModelConfig, plan: ShardingPlan, batch: int, receive_slots: str) -> dict[str, str]:
    """Collective name -> the collective whose send and receive buffers it uses (rule 6).

    ``per_message``: none (every collective owns its buffers). ``shared``: a collective of the
    dense MLP (phase ``mlp``) that runs in one layer, all dense layers before every MoE layer,
    uses the first MoE-phase collective of the same algorithm, group and payload per token
    that runs in more than one layer (so it has the parity-0 slots the guest takes)."""
    if receive_slots == "per_message":
        return {}
    if receive_slots != "shared":
        raise ValueError(f"receive_slots {receive_slots!r}: one of per_message, shared")
    moe_layers = [layer for layer in range(model.num_layers) if model.is_moe_layer(layer)]
    dense = [layer for layer in range(model.num_layers) if not model.is_moe_layer(layer)]
    if not model.moe or not dense or not moe_layers or max(dense) > min(moe_layers):
        return {}
    specs = [spec for spec in plan.collectives_at(batch) if spec.algorithm is not None]
    hosts: dict[str, str] = {}
    for guest in specs:
        if guest.phase != "mlp" or collective_layers(model, guest.phase) != 1:
            continue
        host = next((spec for spec in specs if spec.phase == "moe" and collective_layers(model, spec.phase) > 1
                     and (spec.algorithm, spec.group, spec.bytes_per_token)
                     == (guest.algorithm, guest.group, guest.bytes_per_token)), None)
        if host is not None:
            hosts[guest.name] = host.name
    return hosts


def collective_bytes(model: ModelConfig, plan: ShardingPlan, batch: int, receive_slots: str = "shared") -> int:
    """VMEM of the plan's in-kernel collectives at ``batch`` on rank 0 (every rank of these
    symmetric algorithms keeps the same) with the ``receive_slots`` layout; see rule 6 of the
    module docstring. Collectives without a remote-copy algorithm (generic plans, priced per
    stage) keep none; a collective using another's buffers (:func:`buffer_hosts`) adds none."""
    hosted = buffer_hosts(model, plan, batch, receive_slots)
    total = 0
    for spec in plan.collectives_at(batch):
        if spec.algorithm is None or spec.name in hosted:  # priced per stage, or in its host's buffers
            continue
        copies = 2 if collective_layers(model, spec.phase) > 1 else 1
        total += buffer_bytes(spec.algorithm, spec.group, spec.bytes_per_token * batch, 0, plan.topology,
                              copies=copies)
    return total


F32_BYTES = 4


def kernel_bytes(schedule: Schedule, model: ModelConfig, plan: ShardingPlan, batch: int,
                 kv_sequences: int | None = None, memo: dict[object, int] | None = None) -> int:
    """The kernel's working scratch of rule 7, in bytes: :func:`working_bytes`, the small
    parameters' lane padding (:func:`small_padding_bytes`) and the per-row caches of a verify
    step (:func:`row_cache_bytes`).

    ``memo``: a dict the caller keeps for one ``(model, plan, batch)`` (a sweep's VMEM
    accountant), where the parts that do not depend on the schedule, or depend on one
    family's knob only, are remembered."""
    memo = {} if memo is None else memo
    fixed = _remembered(memo, "fixed", lambda: working_bytes(model, plan, batch) + panel_loop_bytes(model, plan, batch))
    small_buffers = family_chunk(schedule, SMALL_FAMILY)[1]
    small = _remembered(memo, ("small", small_buffers), lambda: small_padding_bytes(model, plan, small_buffers))
    return (fixed + small + row_cache_bytes(schedule, model, plan, batch, kv_sequences)
            + matmul_stage_bytes(schedule, model, plan, batch, memo))


def _remembered(memo: dict[object, int], key: object, compute: Callable[[], int]) -> int:
    """``memo[key]``, computed by ``compute`` the first time."""
    value = memo.get(key)
    if value is None:
        value = memo[key] = compute()
    return value


def row_cache_bytes(schedule: Schedule, model: ModelConfig, plan: ShardingPlan, batch: int,
                    kv_sequences: int | None) -> int:
    """KV tiles and recurrent state of the rows beyond ``kv_sequences`` (rule 7): the kernel has
    no shared-cache verify mode, so it keeps one cache per row; the engine's pools model the
    shared cache (rule 4) and leave these out."""
    extra = batch - (kv_sequences or batch)
    if extra <= 0:
        return 0
    kv_per_token = max((kv_cache_bytes_per_token(model, plan, layer) for layer in range(model.num_layers)), default=0)
    state = max((recurrent_state_bytes(model, plan, layer) for layer in range(model.num_layers)), default=0)
    return extra * (schedule.kv_buffers * schedule.kv_tile_tokens * kv_per_token + state)


def matmul_stage_bytes(schedule: Schedule, model: ModelConfig, plan: ShardingPlan, batch: int,
                       memo: dict[object, int] | None = None) -> int:
    """The looped matmuls' input staging (one buffer sized for the largest), in bytes
    (``memo``: as :func:`kernel_bytes`'s, each family's staging per chunk size)."""
    memo = {} if memo is None else memo
    largest = 0
    for family in tensor_kinds(model, plan):
        chunk = family_chunk(schedule, family)[0]
        largest = max(largest, _remembered(memo, ("stage", family, chunk),
                                           lambda f=family, c=chunk: family_stage_bytes(model, plan, batch, f, c)))
    return largest


def family_stage_bytes(model: ModelConfig, plan: ShardingPlan, batch: int, family: str,
                       chunk_bytes: int | None) -> int:
    """The input staging ``family``'s looped matmuls need at ``chunk_bytes`` (0: none loops)."""
    if family in (SMALL_FAMILY, Family.ROUTED_EXPERT):
        return 0
    chunks = 0
    for tensor in tensor_kinds(model, plan).get(family, []):
        rows = slab_rows(tensor, chunk_bytes)
        slabs = math.ceil(tensor.rows / rows)
        if matmul_loops(slabs, rows, math.ceil(tensor.cols / LANES)):
            chunks = max(chunks, matmul_stage_chunks(slabs, rows))
    return chunks * loop_rows(batch) * MATMUL_CHUNK_ROWS * F32_BYTES


def panel_loop_bytes(model: ModelConfig, plan: ShardingPlan, batch: int) -> int:
    """The panel loops' scratch, in bytes: products of one 128-column panel per panel of the
    widest tensor (``panel_out``, f32 [panels, rows, 128]), and the routed expert's scale words
    re-laid one tile per panel (``panel_scales``, u16 [panels, tile rows, 128])."""
    rows = loop_rows(batch)
    panels = max((math.ceil(t.cols / LANES) for family, tensors in tensor_kinds(model, plan).items()
                  if family != SMALL_FAMILY for t in tensors), default=0)
    total = panels * rows * LANES * F32_BYTES
    if model.moe:
        gate_up, down = expert_slice_tensors(model, plan)
        scale_panels = max(math.ceil(gate_up.cols / LANES), math.ceil(down.cols / LANES))
        total += scale_panels * expert_scale_tile_rows(model, plan) * LANES * BF16_BYTES
    return total


def working_bytes(model: ModelConfig, plan: ShardingPlan, batch: int) -> int:
    """Routing rows, the expert list's staging rows, the KV write tile (:data:`KV_WRITE_TOKENS` entries) and the KDA conv
    state (rule 7), in bytes."""
    widths = device_widths(model, plan)
    rows = max(batch, 8)
    total = 0
    if model.moe:
        total += 2 * model.moe.top_k * rows * LANES * F32_BYTES
        total += expert_list_stage_bytes(min(widths.local_experts, batch * model.moe.top_k))
    if model.mla:
        total += batch * KV_WRITE_TOKENS * (model.mla.kv_lora_rank + widths.mla_rope_pad) * BF16_BYTES
    if model.kda:
        total += batch * (model.kda.conv_kernel - 1) * 3 * widths.kda_width * F32_BYTES
    return total


def small_padding_bytes(model: ModelConfig, plan: ShardingPlan, buffers: int) -> int:
    """The small parameters' padding to whole 128-lane kinds and the row to whole tiles, for
    ``buffers`` buffers (rule 7)."""
    small = tensor_kinds(model, plan).get(SMALL_FAMILY, [])
    lane_padded = sum(math.ceil(t.cols / LANES) * LANES * t.bytes // t.cols for t in small)
    # and the row to whole (16, 128) tiles of 16-bit words (the kernel's DMA region)
    return buffers * (tile_padded_bytes(lane_padded) - sum(t.bytes for t in small))


def arena_of(schedule: Schedule, family: str) -> str:
    """The arena ``family``'s buffers live in (its pool; small parameters: always their own)."""
    if family == SMALL_FAMILY:
        return family
    return schedule.family(family).pool or family


def family_chunk(schedule: Schedule, family: str) -> tuple[int | None, int]:
    """(chunk_bytes, buffers) a family's tensors stream with: a ring pool's bank size and one
    bank per slab, else the family's own."""
    ring = schedule.ring_pool(family)
    if ring is not None:
        return ring.bank_bytes, 1
    fam = schedule.family(family)
    return fam.chunk_bytes, fam.buffers


def arenas(schedule: Schedule, family_bytes: dict[str, int]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Arena -> bytes (the largest member footprint, or a ring pool's banks) and -> present members."""
    arena_members: dict[str, list[str]] = {}
    members: list[tuple[str, int]] = []
    for family in SCHEDULE_FAMILIES:
        if family not in family_bytes:
            continue
        arena = arena_of(schedule, family)
        arena_members.setdefault(arena, []).append(family)
        ring = schedule.ring_pool(family)
        size = ring.banks * ring.bank_bytes if ring is not None and ring.banks and ring.bank_bytes else family_bytes[family]
        members.append((arena, size))
    return arena_sizes(members), arena_members


def vmem_plan(schedule: Schedule, model: ModelConfig, plan: ShardingPlan, batch: int,
              kv_sequences: int | None = None, memo: dict[object, int] | None = None) -> VmemPlan:
    """Static scratch for ``batch`` rows; KV tiles and state for ``kv_sequences`` (default: one
    per row; a speculative verify step has ``draft_tokens + 1`` rows per sequence).

    ``memo``: a dict the caller keeps for one ``(model, plan, batch)`` (a sweep's VMEM
    accountant): the per-layer maxima, the collective buffers per ``receive_slots`` and
    :func:`kernel_bytes`' parts are remembered there."""
    kv_sequences = kv_sequences or batch
    memo = {} if memo is None else memo
    kinds = tensor_kinds(model, plan)
    family_bytes: dict[str, int] = {}
    detail: dict[str, int] = {}
    for family in SCHEDULE_FAMILIES:
        fam = schedule.family(family)
        if family == Family.ROUTED_EXPERT:
            if model.num_experts:
                family_bytes[family] = fam.buffers * expert_slot_bytes(model, plan)
            continue
        tensors = kinds.get(family, [])
        if not tensors:
            continue
        total = 0
        ring = schedule.ring_pool(family)
        for tensor in tensors:
            size = tensor_ring(schedule, tensor).footprint_bytes
            if ring is not None and size > (ring.bank_bytes or 0):
                raise InfeasibleSchedule(
                    f"pools.{fam.pool}: the smallest slab of {tensor.name} ({size} bytes, {row_granule(tensor)} "
                    f"rows) is larger than a bank ({ring.bank_bytes} bytes); use larger banks")
            detail[tensor.name] = size
            total += size
        family_bytes[family] = total
    arena_bytes, arena_members = arenas(schedule, family_bytes)
    kv_per_token = _remembered(memo, "kv_per_token", lambda: max(
        (kv_cache_bytes_per_token(model, plan, layer) for layer in range(model.num_layers)), default=0))
    kv = schedule.kv_buffers * schedule.kv_tile_tokens * kv_per_token * kv_sequences
    state_per_sequence = _remembered(memo, "state_per_sequence", lambda: max(
        (recurrent_state_bytes(model, plan, layer) for layer in range(model.num_layers)), default=0))
    collectives = _remembered(memo, ("collectives", schedule.receive_slots),
                              lambda: collective_bytes(model, plan, batch, schedule.receive_slots))
    return VmemPlan(family_bytes, arena_bytes, arena_members, kv, state_per_sequence * kv_sequences,
                    activation_bytes(model, batch), detail, collectives,
                    kernel_bytes(schedule, model, plan, batch, kv_sequences, memo))


def check_fits(vmem: VmemPlan, capacity_bytes: float, *, where: str = "VMEM") -> None:
    """Raise :class:`InfeasibleSchedule` when the static scratch exceeds ``capacity_bytes``."""
    if vmem.total_bytes <= capacity_bytes:
        return
    arenas = sorted(vmem.arena_bytes.items(), key=lambda item: -item[1])
    listing = ", ".join(
        f"{name} {size / MIB:.2f} MiB" + (f" ({'+'.join(vmem.arena_members[name])})" if len(vmem.arena_members[name]) > 1 else "")
        for name, size in arenas
    )
    raise InfeasibleSchedule(
        f"schedule needs {vmem.total_bytes / MIB:.2f} MiB of {where} but {capacity_bytes / MIB:.2f} MiB is usable "
        f"(over by {(vmem.total_bytes - capacity_bytes) / MIB:.2f} MiB) at allocation, before layer 0: "
        f"arenas {listing}; KV tiles {vmem.kv_bytes / MIB:.2f} MiB, state {vmem.state_bytes / MIB:.2f} MiB, "
        f"activations {vmem.activation_bytes / MIB:.2f} MiB, kernel working scratch {vmem.kernel_bytes / MIB:.2f} MiB, "
        f"collective buffers {vmem.collective_bytes / MIB:.2f} MiB"
    )
