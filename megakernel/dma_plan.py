"""From a :class:`tpusim.schedule.schema.Schedule` to the kernel's static DMA plan.

**The program.** A decode step is a flat sequence of ops: per layer its attention block and its
MLP block, then the head, each block's ops as :mod:`tpusim.workload.registry` declares them
(this module turns those :class:`~tpusim.workload.registry.OpSpec` sequences into window ops
with layer offsets; it holds no op order of its own). For K3:

    layer 0:  attn.mix_norm kda.qkvgb kda.decay kda.core kda.o  mlp.mix_norm mlp.gate_up mlp.down
    layer l:  attn.mix_norm <kda.qkvgb kda.decay kda.core kda.o | mla.q_a mla.kv_a mla.q_b mla.kv_b
              mla.core mla.gate mla.o>  mlp.mix_norm moe.router moe.latent_down moe.topk
              moe.shared_gate_up moe.shared_down expert[0] .. expert[n_l - 1] moe.combine moe.latent_up
    head:     head.norm head.lm_head

``n_l`` (distinct experts the batch routes to in layer ``l``) is known only once
``moe.topk`` has run, so the kernel is organised in **windows** cut at expert regions:
the *prologue* is layer 0 plus layer 1 up to ``moe.shared_down``; *window i* (i = 1..92) is
``expert[*](i) moe.combine moe.latent_up`` followed by layer ``i+1`` up to its
``moe.shared_down`` (or by the head for i = 92). Positions inside window i count from its
``expert[0]`` = 0; its *lead-in* is the ops before it from ``moe.topk`` (-3) to
``moe.shared_down`` (-1) of layer i (:data:`LEAD_IN`). Given ``n_i`` and the kind of layer ``i+1`` (the
*template*: ``kda``, ``mla`` or ``head``) every position in the window is fixed.

**Rings and arenas.** Each tensor kind (``kda.qkvgb``, ``moe.router``, ...) is a ring of
``buffers`` slabs (``tpusim.schedule.vmem.slab_rows`` rows each); the routed-expert ring's slots
hold one whole expert slice. Ring slab ``g`` (counted over all instances, ``g = m*K + k``
for slab ``k`` of instance ``m`` of a K-slab tensor) lives in buffer ``g % buffers``. The
families of a pool share one uint16 arena of 128-lane rows sized for the largest member
(placed by :func:`tpusim.schedule.vmem.place`, the accounting's own rule, in arena rows);
members start at row 0 except the routed experts, whose slots are placed at the arena's top
so the shared expert and the first slots can coexist. Everything in an arena is 16-bit words: bf16 as is, FP8/MXFP4/E8M0 bytes
paired (:mod:`megakernel.quant`), the f32 small parameters as high and low halves. Small
parameters are read from ``attn.mix_norm`` to ``moe.topk``, so at fixed addresses they
cannot time-share a pool whose largest member fills it: they always get an arena of their
own, even when the schedule names a pool for them (:func:`tpusim.schedule.vmem.arena_of`).

**Ring pools.** A pool of mode ``ring`` is one arena of ``banks`` banks; its members' slabs
(cut at ``bank_bytes``) take the banks in turn across tensors and layers, so a slab's bank is
not ``g % buffers`` of its own kind: :mod:`megakernel.ring_pool` reads it from the issue plan
(per layer from SMEM, per kind a static offset). A member ring keeps its kind's shapes and
HBM stack; its ``buffers`` are the pool's banks and its buffer stride is a bank. The window
plans read each pooled slab's bank in a representative window of each template (checked to
hold for every window of that template), so the issue tables stay per window.

**Issue rule**: :mod:`tpusim.schedule.issue_plan` states it and applies it; the kernel runs
it window by window (horizon -2 for a window, 0 for the prologue, routing at ``moe.topk`` =
-3), the simulator over its whole program, so both issue every copy at the same op. Slabs
``k >= buffers`` are refilled inside the consumer op as slab ``k - buffers`` is consumed;
expert ``j >= buffers`` at the start of ``expert[j - buffers + 1]``.

``max_dmas_in_flight`` is not enforced by the kernel (a TPU queues DMA descriptors in
hardware); :func:`peak_in_flight` reports the plan's peak so a test can compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hwmodels.units import MIB
from megakernel.dims import STREAMED_FORMAT, ModelDims, weight_shapes
from megakernel.errors import UnsupportedSchedule
from megakernel.ring_pool import PoolBanks, pool_banks
from tpusim.schedule.issue_plan import (
    EXPERT_RING,
    RING_ORDER,
    SMALL_RING,
    Read,
    UnsupportedIssuePlan,
    plan_issues,
)
from tpusim.schedule.kernel_layout import LANES, tile_rows
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import RingSpec, arena_of, family_chunk, place, slab_rows
from tpusim.workload import registry
from tpusim.workload.formats import tensor_bytes, weight_format
from tpusim.workload.registry.names import Family, FormatKey, MlaTensor
from tpusim.workload.shapes import TensorSpec, expert_slice_tensors


def check_expert_cap(schedule: Schedule, expert_cap: int | None) -> None:
    """A fixed-cost probe run's cap: at least the schedule's expert slots (the kernel fills every
    slot before the list ends), else :class:`UnsupportedSchedule`."""
    slots = schedule.family(Family.ROUTED_EXPERT).buffers
    if expert_cap is not None and expert_cap < slots:
        raise UnsupportedSchedule(f"expert cap {expert_cap}: at least the {slots} expert slots")


def ring_family(dims: ModelDims, ring: str) -> str:
    """The weight family of ring ``ring``: :mod:`tpusim.workload.shapes` says (``small`` and
    ``expert`` are the small-parameter row and the expert slots)."""
    if ring == SMALL_RING:
        return Family.SMALL_PARAMS
    if ring == EXPERT_RING:
        return Family.ROUTED_EXPERT
    return dims.families[ring]
NEVER = -1000  # table code: the unit is not part of this window


@dataclass(frozen=True)
class Ring:
    """One tensor kind's VMEM ring."""

    name: str
    family: str
    pool: str
    buffers: int
    rows: int  # logical rows (contraction) of one instance
    cols: int
    slab_rows: int  # logical rows per slab
    num_slabs: int  # K
    slab_arena_rows: int  # 128-lane uint16 rows one slab occupies (small: f32 row count 1)
    offset: int = 0  # arena row where the ring's region starts
    distance: int = 0
    instances: int = 1  # tensors of this kind in a step (layers that have it)
    bank_rows: int = 0  # member of a ring pool: rows per bank (its buffer stride); 0 otherwise

    @property
    def stride(self) -> int:
        """Arena rows from one buffer to the next (a bank in a ring pool, else a slab)."""
        return self.bank_rows or self.slab_arena_rows

    @property
    def sem_key(self) -> str:
        """Semaphore array of the ring's buffers: a ring pool's banks share one (a bank has
        one copy in flight at a time, whichever kind it holds)."""
        return f"pool:{self.pool}" if self.bank_rows else self.name

    @property
    def padded_cols(self) -> int:
        """Columns padded to whole 128-lane panels (K3 TP32's layer-0 gate/up is 2112 wide)."""
        return -(-self.cols // LANES) * LANES

    @property
    def panels(self) -> int:
        return self.padded_cols // LANES

    @property
    def region(self) -> tuple[int, int]:
        return self.offset, self.offset + self.buffers * self.stride

    def buffer_row(self, buffer: int) -> int:
        """First arena row of ``buffer``. Expert slot 0 sits at the arena's top, slot 1 below
        it, ...: the slots the shared expert's rows overlap are the last to be used."""
        if self.name == EXPERT_RING:
            return self.offset + (self.buffers - 1 - buffer) * self.slab_arena_rows
        return self.offset + buffer * self.stride

    def buffer_range(self, buffer: int) -> tuple[int, int]:
        start = self.buffer_row(buffer)
        return start, start + self.slab_arena_rows

    @property
    def spec(self) -> RingSpec:
        """The ring as :mod:`tpusim.schedule.issue_plan` sees it (sizes in arena rows)."""
        return RingSpec(self.name, self.family, self.pool, self.buffers, self.num_slabs, self.slab_arena_rows,
                        self.distance, self.instances, self.offset)

    @property
    def static_buffers(self) -> bool:
        """Whether slab k of every instance lands in the same buffer (k % buffers)."""
        return self.spec.static_buffers


@dataclass(frozen=True)
class ExpertSlot:
    """Rows of one routed-expert slot (uint16 words, 128 lanes), in slot order.

    Each of the two copies (gate/up values + scales, down values + scales) lands at a
    whole (16, 128) tile: its region is padded to :data:`TILE_ROWS` rows (Mosaic slices a
    tiled VMEM dimension only at tile multiples), and the HBM stack has the same padding, so
    the DMA moves exactly the region's bytes."""

    gate_up_rows: int  # fp8 value word rows, all panels
    gate_up_scale_rows: int
    down_rows: int
    down_scale_rows: int

    @property
    def gate_up_total(self) -> int:
        return tile_rows(self.gate_up_rows + self.gate_up_scale_rows)

    @property
    def down_total(self) -> int:
        return tile_rows(self.down_rows + self.down_scale_rows)

    @property
    def total(self) -> int:
        return self.gate_up_total + self.down_total


@dataclass
class Geometry:
    """Every ring and arena of one (model, schedule)."""

    rings: dict[str, Ring]
    arenas: dict[str, int]  # pool -> uint16 rows of 128 lanes
    expert_slot: ExpertSlot
    kv_tile_tokens: int
    kv_buffers: int
    expert_issue: str
    detail: dict[str, int] = field(default_factory=dict)
    pools: dict[str, PoolBanks] = field(default_factory=dict)  # ring-mode pools by name
    pool_specs: dict[str, RingSpec] = field(default_factory=dict)  # their issue-plan rings (``pool:NAME``)
    window_layer: dict[str, int] = field(default_factory=dict)  # with ring pools: template -> a window of it


ARENA_ROW_BYTES = LANES * 2  # one 128-lane row of 16-bit words


def expert_slot(dims: ModelDims) -> ExpertSlot:
    """An expert slot's rows: each part's value and scale bytes (:mod:`tpusim.workload.formats`,
    the slice's own formats) in 16-bit 128-lane rows (:mod:`megakernel.quant` packs them)."""
    assert dims.model is not None and dims.plan is not None, "model_dims keeps the model and plan"
    gate_up, down = expert_slice_tensors(dims.model, dims.plan)
    parts = (gate_up.value_bytes, gate_up.scale_bytes, down.value_bytes, down.scale_bytes)
    if any(size % ARENA_ROW_BYTES for size in parts):
        raise UnsupportedSchedule(f"an expert slice's parts ({parts} bytes) do not fill whole {LANES}-lane rows")
    return ExpertSlot(*(size // ARENA_ROW_BYTES for size in parts))


def instance_count(dims: ModelDims, ring: str) -> int:
    """How many tensors of kind ``ring`` one step reads (the ring's instance stack): one per
    layer whose block owns the tensor (:mod:`tpusim.workload.registry`)."""
    if ring == SMALL_RING:
        return dims.num_layers
    if ring == EXPERT_RING or ring in _block_tensors(registry.MOE):
        return len(dims.moe_layers)
    for kind in registry.ATTENTION_KINDS:
        if ring in _block_tensors(registry.BLOCKS[kind]):
            return dims.kinds.count(kind)
    return 1


def _block_tensors(block: registry.Block) -> set[str]:
    return {decl.name for decl in block.tensors}


def geometry(dims: ModelDims, schedule: Schedule) -> Geometry:
    """Rings, arena sizes and offsets for ``schedule`` (raises :class:`UnsupportedSchedule`)."""
    if schedule.expert_issue == "speculative":
        raise UnsupportedSchedule("expert_issue=speculative is not implemented by the kernel "
                                  "(it needs an expert predictor); use after_routing or during_selection")
    shapes = dict(weight_shapes(dims))
    rings: dict[str, Ring] = {}
    slot = expert_slot(dims)
    for name in RING_ORDER:
        if name not in (SMALL_RING, EXPERT_RING) and name not in dims.families:
            continue
        family = ring_family(dims, name)
        fam = schedule.family(family)
        pool = arena_of(schedule, family)  # small parameters: always an arena of their own
        count = instance_count(dims, name)
        if name == SMALL_RING:  # f32 row stored as hi/lo 16-bit halves: 2 * S / 128 arena rows
            rings[name] = Ring(name, family, pool, fam.buffers, 1, dims.small_cols, 1, 1,
                               tile_rows(2 * dims.small_cols // LANES), distance=fam.prefetch_distance_ops, instances=count)
            continue
        if name == EXPERT_RING:
            rings[name] = Ring(name, family, pool, fam.buffers, 1, LANES, 1, 1, slot.total,
                               distance=fam.prefetch_distance_ops, instances=count)
            continue
        rows, cols = shapes[name]
        spec = TensorSpec(name, family, FormatKey.DENSE, STREAMED_FORMAT, rows, cols)
        chunk_bytes, _ = family_chunk(schedule, family)  # a ring pool's members: the bank size
        ring_spec = schedule.ring_pool(family)
        buffers = ring_spec.banks if ring_spec is not None and ring_spec.banks else fam.buffers
        srows = slab_rows(spec, chunk_bytes)
        panels = -(-cols // LANES)
        rings[name] = Ring(name, family, pool, buffers, rows, cols, srows, math.ceil(rows / srows),
                           srows * panels, distance=fam.prefetch_distance_ops, instances=count)
    _check_kv_b(rings[MlaTensor.KV_B], schedule)
    pools = pool_banks(dims, schedule, {n: r.num_slabs for n, r in rings.items() if schedule.ring_pool(r.family)})
    for name, ring in rings.items():
        banks = pools.get(ring.pool) if schedule.ring_pool(ring.family) else None
        if banks is not None:
            if ring.slab_arena_rows > banks.bank_rows:
                raise UnsupportedSchedule(
                    f"pools.{ring.pool}: a slab of {name} takes {ring.slab_arena_rows * 256} bytes in VMEM (columns "
                    f"padded to {ring.padded_cols}), more than a bank ({banks.bank_rows * 256}); give "
                    f"{ring.family} its own pool or use larger banks")
            rings[name] = replace(ring, bank_rows=banks.bank_rows)
    # Arena placement: tpusim.schedule.issue_plan's rule (members from row 0, experts at the top);
    # a ring pool is one ring of banks.
    pool_specs = {b.ring: RingSpec(b.ring, b.ring, b.pool, b.banks, 1, b.bank_rows) for b in pools.values()}
    specs, arenas = place([ring.spec for ring in rings.values() if not ring.bank_rows] + list(pool_specs.values()))
    placed = {name: replace(ring, offset=specs[pools[ring.pool].ring if ring.bank_rows else name].offset)
              for name, ring in rings.items()}
    geo = Geometry(placed, arenas, slot, schedule.kv_tile_tokens, schedule.kv_buffers, schedule.expert_issue,
                   pools=pools, pool_specs={name: specs[name] for name in pool_specs})
    if pools:
        geo.window_layer = _window_layers(dims, geo)
    return geo


def _check_kv_b(kv_b: Ring, schedule: Schedule) -> None:
    """Two ops read mla.kv_b (absorbed attention): the kernel holds it whole in one buffer."""
    if kv_b.num_slabs == 1:
        return
    size = tensor_bytes(weight_format(STREAMED_FORMAT), kv_b.rows, kv_b.cols)
    chunk, _ = family_chunk(schedule, Family.MLA_PROJ)
    knob = (f"pools.{schedule.family(Family.MLA_PROJ).pool}.bank_bytes" if schedule.ring_pool(Family.MLA_PROJ)
            else f"families.{Family.MLA_PROJ}.chunk_bytes")
    raise UnsupportedSchedule(
        f"the MLA up-projection mla.kv_b is {size / MIB:.2f} MiB per device here, but the schedule "
        f"streams the mla_proj family in chunks of {(chunk or 0) / MIB:.2f} MiB; the kernel must hold "
        f"mla.kv_b whole in VMEM (two ops read it), so set {knob} to at least {size} or split the model over "
        "more devices")


def window_template(dims: ModelDims, i: int) -> str:
    """Template of window ``i`` (the kind of layer ``i + 1``, or ``head`` after the last layer)."""
    return dims.kinds[i + 1] if i + 1 < dims.num_layers else "head"


def _window_layers(dims: ModelDims, geo: Geometry) -> dict[str, int]:
    """Template -> its first window. Every window of a template must see its pooled slabs in
    the same banks relative to each other (then its issue points are the first one's)."""
    first: dict[str, int] = {}
    for i in dims.moe_layers:
        template = window_template(dims, i)
        rep = first.setdefault(template, i)
        shifts: dict[str, set[int]] = {}
        for op in window_ops(template, 1):
            for ring_name, delta in op.reads:
                ring = geo.rings.get(ring_name)
                if ring is None or not ring.bank_rows:
                    continue
                banks = geo.pools[ring.pool]
                shift = banks.first_bank(ring_name, i + delta) - banks.first_bank(ring_name, rep + delta)
                shifts.setdefault(ring.pool, set()).add(shift % banks.banks)
        if any(len(values) > 1 for values in shifts.values()):
            raise UnsupportedSchedule(f"window {i}: its ring-pool slabs do not sit in the banks of window {rep}'s; "
                                      "the kernel's issue tables need one bank pattern per window template")
    return first


# ------------------------------------------------------------------------------ windows


# The ops of a window's lead-in: layer i from its routing decision to its experts. The copies
# of window i can be issued from the op after the routing op on (the routing horizon).
LEAD_IN = registry.LEAD_IN


@dataclass(frozen=True)
class Op:
    """One op of a window: name, layer offset (0 = layer i, 1 = layer i+1) and what it reads.

    ``reads`` holds (ring name, layer offset) pairs; an expert op reads ("expert", entry)."""

    name: str
    delta: int
    reads: tuple[tuple[str, int], ...] = ()


def _window_op(spec: registry.OpSpec, delta: int) -> Op:
    """The kernel's view of registry op ``spec`` at layer offset ``delta``: its tensors' rings,
    then the small-parameter row, then what it reads again."""
    reads = [(name, delta) for name in spec.tensors]
    if spec.reads_small:
        reads.append((SMALL_RING, delta))
    reads += [(name, delta) for name in spec.rereads]
    return Op(spec.name, delta, tuple(reads))


def _block_ops(block: registry.Block, delta: int, ops: tuple[registry.OpSpec, ...] | None = None) -> list[Op]:
    """``block``'s ops (or the part ``ops`` of them) as the kernel's K3 layers run them: every
    optional op present (the kernel's model has every tensor, :func:`megakernel.dims.model_dims`)."""
    return [_window_op(spec, delta) for spec in (block.ops if ops is None else ops)]


def attention_ops(kind: str, delta: int) -> list[Op]:
    return _block_ops(registry.attention_block(kind), delta)


def moe_head_ops(delta: int) -> list[Op]:
    """A MoE layer's ops before its experts."""
    block = registry.mlp_block(True)
    return _block_ops(block, delta, block.split_at_experts()[0])


def moe_tail_ops(delta: int) -> list[Op]:
    """A MoE layer's ops after its experts."""
    block = registry.mlp_block(True)
    return _block_ops(block, delta, block.split_at_experts()[2])


def head_ops(delta: int) -> list[Op]:
    return _block_ops(registry.head_block(), delta)


def expert_ops(n: int) -> list[Op]:
    """``expert[0] .. expert[n-1]``, each reading its entry's expert slot."""
    return [Op(registry.expert_op(j), 0, ((EXPERT_RING, j),)) for j in range(n)]


def prologue_ops(first_kind: str, next_kind: str) -> list[Op]:
    """Layer 0 (``first_kind`` attention + dense MLP) and layer 1 up to its experts; positions from 0."""
    return [*attention_ops(first_kind, 0), *_block_ops(registry.mlp_block(False), 0), *attention_ops(next_kind, 1),
            *moe_head_ops(1)]


def window_ops(template: str, n: int) -> list[Op]:
    """Lead-in (:data:`LEAD_IN`, positions -len..-1) + window ops (positions 0..)."""
    lead = moe_head_ops(0)[-len(LEAD_IN):]
    body = expert_ops(n) + moe_tail_ops(0)
    body += head_ops(1) if template == "head" else attention_ops(template, 1) + moe_head_ops(1)
    return lead + body


@dataclass(frozen=True)
class Unit:
    """A copy the plan schedules: slab ``slab`` of ring ``ring``'s instance at ``delta``
    (for experts: ``delta`` = 0 and ``slab`` = the entry j)."""

    ring: str
    delta: int
    slab: int


@dataclass
class WindowPlan:
    ops: list[Op]  # lead-in included
    first: int  # position of ops[0] (-len(LEAD_IN) for windows, 0 for the prologue)
    issue: dict[Unit, int]  # unit -> position of the op at whose start it is issued
    consumer: dict[Unit, int]

    def position(self, index: int) -> int:
        return self.first + index


def _first_slot(ring: RingSpec, key: int) -> int:
    """Ring slab of an instance's slab 0: the entry for an expert; ``delta * K`` otherwise
    (the two instances of a window are consecutive), 0 for a ring with one instance."""
    if ring.name == EXPERT_RING:
        return key
    return key * ring.num_slabs if ring.instances > 1 else 0


def _read(geo: Geometry, specs: dict[str, RingSpec], ring_name: str, key: int,
          layers: tuple[int, int] | None) -> Read:
    """The issue plan's view of an op reading ``ring_name`` at layer offset (or expert entry)
    ``key``: a ring-pool member is an instance of the pool's ring, in the bank the plan gave it."""
    ring = geo.rings[ring_name]
    if not ring.bank_rows:
        return Read(ring_name, key, _first_slot(specs[ring_name], key))
    assert layers is not None, "a window with ring-pool reads needs its layers"
    banks = geo.pools[ring.pool]
    return Read(banks.ring, (ring_name, key), banks.first_bank(ring_name, layers[key]), ring.num_slabs, ring.distance)


def plan_window(geo: Geometry, ops: list[Op], first: int, horizon: int, *, respect_buffers: bool = True,
                layers: tuple[int, int] | None = None) -> WindowPlan:
    """Issue positions of every copy first read at position >= 0, by
    :func:`tpusim.schedule.issue_plan.plan_issues` (slabs ``k >= buffers`` are refills the
    kernel issues inside their consumer, so they are left out).

    ``layers``: the model layers of offsets 0 and 1 (where ring-pool banks are read).
    ``respect_buffers=False`` ignores ``free`` for weight tensors: a deliberately broken plan
    that refills buffers still being read, for the race-detector test only."""
    topk = next((first + i for i, op in enumerate(ops) if op.name == registry.ROUTING_OP and op.delta == 0), None)
    specs = {name: ring.spec for name, ring in geo.rings.items() if not ring.bank_rows}
    specs.update(geo.pool_specs)
    reads = [[_read(geo, specs, ring, key, layers) for ring, key in op.reads] for op in ops]
    try:
        planned = plan_issues(specs, reads, first=first, horizon=lambda _c: horizon,
                              routing=lambda _read: topk if topk is not None else first,
                              respect_buffers=respect_buffers, min_consumer=0)
    except UnsupportedIssuePlan as error:
        raise UnsupportedSchedule(str(error)) from None
    issue: dict[Unit, int] = {}
    consumer: dict[Unit, int] = {}
    for unit, when in planned.issue.items():
        pooled = unit.ring.startswith("pool:")
        if unit in planned.refills:
            if pooled and unit.slab < specs[unit.ring].buffers:
                name = unit.key[0]  # type: ignore[index]
                raise UnsupportedSchedule(f"{name} slab {unit.slab} would refill a ring-pool bank that another tensor "
                                          "of its own op still reads; the kernel refills only within one tensor")
            continue
        if pooled:
            name, delta = unit.key  # type: ignore[misc]
            ours = Unit(name, delta, unit.slab)
        elif unit.ring == EXPERT_RING:
            ours = Unit(unit.ring, 0, int(unit.key))  # type: ignore[call-overload]
        else:
            ours = Unit(unit.ring, int(unit.key), unit.slab)  # type: ignore[call-overload]
        issue[ours] = when
        consumer[ours] = planned.consumer[unit]
    return WindowPlan(ops, first, issue, consumer)


def plan_prologue(geo: Geometry, first_kind: str, next_kind: str, *, respect_buffers: bool = True) -> WindowPlan:
    return plan_window(geo, prologue_ops(first_kind, next_kind), 0, 0, respect_buffers=respect_buffers,
                       layers=(0, 1))


def plan_iteration(geo: Geometry, template: str, n: int, *, respect_buffers: bool = True) -> WindowPlan:
    """The plan of a window of ``template`` with ``n`` experts (with ring pools: the banks of
    the model's first window of that template; :func:`geometry` checked the others agree)."""
    i = geo.window_layer.get(template)
    if geo.pools and i is None:
        raise UnsupportedSchedule(f"no window of template {template} in this model")
    layers = (i, i + 1) if i is not None else None
    topk = -len(LEAD_IN)
    plan = plan_window(geo, window_ops(template, n), topk, topk + 1, respect_buffers=respect_buffers,
                       layers=layers)
    slots = geo.rings[EXPERT_RING].buffers
    for j in range(n):
        want = topk if j < slots else j - slots + 1
        got = plan.issue[Unit(EXPERT_RING, 0, j)]
        if j >= slots and got != want:
            raise UnsupportedSchedule(f"routed expert {j} would be issued at {got}, not at expert[{want}]")
        if j < slots and got > 0:
            raise UnsupportedSchedule(f"routed expert {j}'s slot is not free before the expert region ({got})")
    return plan


def peak_in_flight(plan: WindowPlan) -> int:
    """Most copies issued and not yet waited at any op start (waits at the consumer)."""
    events = sorted([(p, 1) for p in plan.issue.values()] + [(c, -1) for c in plan.consumer.values()],
                    key=lambda e: (e[0], -e[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak
