"""The lowering's working state: counters, memos, and the factories of slabs and copies.

:func:`tpusim.engine.build.lower` walks the program op by op; a :class:`Builder` holds what
those steps share: the pools and rings (step 1 of :mod:`tpusim.engine.build`), the running
sequence numbers of slabs and copies (consumption order), the issue plan it reads release
points from (step 3), the program's own facts (:mod:`tpusim.engine.lowering_facts`: op kinds,
tensor shape numbers, an expert's copies, kept across lowerings of one program), and memos
of facts that repeat in every layer under this schedule and chip (a tensor shape's row slabs
and their piece times, an expert part's times, matmul and vector times in seconds), so the
lowering's cost is per op, not per fact. Bytes are bytes; times are seconds.
"""

from __future__ import annotations

import math

from hwmodels.schema import Chip
from tpusim.engine.costs import matmul_time_s, vector_time_s
from tpusim.engine.execution import ExecutionPolicy
from tpusim.engine.items import Descriptor, OpPlan, Pool, Ring, Slab
from tpusim.engine.lowering_facts import ExpertLayout, kernel_plan, lowering_facts
from tpusim.schedule.kernel_layout import LANES, matmul_dots
from tpusim.schedule.program_issue import cached_issue_plan
from tpusim.schedule.schema import SCHEDULE_FAMILIES, SMALL_FAMILY, FamilySchedule, Schedule
from tpusim.schedule.vmem import VmemPlan, arena_of, family_chunk, slab_rows
from tpusim.workload.formats import scale_bytes, value_bytes
from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import Family, StateFamily
from tpusim.workload.shapes import TensorSpec

ROUTED = Family.ROUTED_EXPERT
KV_FAMILY = "kv_cache"
STATE_FAMILY = StateFamily.KDA_STATE
KV_POOL = "<kv tiles>"
STATE_POOL = "<kda state>"


class Builder:
    """Counters and lookups shared by the lowering steps."""

    def __init__(self, program: Program, schedule: Schedule, chip: Chip, policy: ExecutionPolicy,
                 vmem: VmemPlan) -> None:
        self.program = program
        self.schedule = schedule
        self.chip = chip
        self.policy = policy
        self.matrix = chip.matrix_unit
        self.compute_scale = 1.0 / policy.compute_efficiency
        dot = self.matrix.dot_overhead_s
        dot_s = (dot.value if dot is not None else 0.0) * self.compute_scale  # per MXU product
        dense_unroll, expert_unroll = policy.panel_unroll
        self.dot_s = dot_s / dense_unroll  # the panels in flight share one round trip
        self.expert_dot_s = dot_s / expert_unroll
        self.dots_cache: dict[tuple[int, int, int], float] = {}
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
        self.slab_parts_cache: dict[tuple[int, tuple[int, int, int], str], tuple[tuple[float | None, float], ...]] = {}
        self.expert_parts_cache: dict[tuple[object, ...], tuple[tuple[tuple[int, ...], float, float], ...]] = {}
        self.op_matmul_cache: dict[tuple[tuple[tuple[int, int, int], ...], str], float] = {}
        self.facts = lowering_facts(program)  # what lowering needs of the program alone
        self.dequant_rates: dict[str, float] = {}  # seconds per element by weight format
        self.families: dict[str, FamilySchedule] = {name: schedule.family(name) for name in SCHEDULE_FAMILIES}
        speculative = schedule.expert_issue == "speculative" and policy.cross_op_prefetch
        self.miss_rate = schedule.speculation_miss_rate if speculative else 0.0
        self.expert_count = 0  # routed experts lowered so far over the whole step (misses)
        self.kernels = kernel_plan(program, policy.kernel_plan)
        self.issue = cached_issue_plan(program, schedule) if policy.cross_op_prefetch else None
        self.plans: list[OpPlan] = []
        self.topology = program.plan.topology  # one Topology per lowering (a key of the message cache)
        # memos of facts that repeat in every layer (the lowering's cost is per op, not per fact)
        self.tensor_queues: dict[tuple[str, str], tuple[Ring, Pool, int | None]] = {}
        # per tensor shape number (facts.tensor_shapes): its queue, slab cut and scales' label
        self.tensor_recipes: dict[int, tuple[Ring, Pool, tuple[tuple[int, int, int], ...], str,
                                             tuple[str, bool, bool] | None]] = {}
        self.slab_cuts: dict[tuple[str, str, int, int, int | None], tuple[tuple[int, int, int], ...]] = {}
        self.peaks: dict[str, tuple[float, str]] = {}
        self.expert_queue: tuple[Ring, Pool] | None = None  # the expert slots' (ring, pool)

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
        return desc

    def matmul_s(self, rows: int, contraction: int, cols: int, peak: tuple[float, str]) -> float:
        key = (rows, contraction, cols, peak)
        cached = self.matmul_cache.get(key)
        if cached is None:
            cached = self.matmul_cache[key] = (
                matmul_time_s(rows, contraction, cols, self.matrix, peak[0], peak[1]) * self.compute_scale
            )
        return cached

    def dots_s(self, slabs: int, slab_rows: int, cols: int) -> float:
        """The fixed cost of the products the kernel issues for one streamed tensor
        (:func:`tpusim.schedule.kernel_layout.matmul_dots` x the unit's ``dot_overhead_s``)."""
        if not self.dot_s:
            return 0.0
        key = (slabs, slab_rows, cols)  # the same tensor shapes repeat in every layer
        cached = self.dots_cache.get(key)
        if cached is None:
            cached = self.dots_cache[key] = matmul_dots(slabs, slab_rows, cols) * self.dot_s
        return cached

    def panel_dots_s(self, cols: int) -> float:
        """The fixed cost of a routed expert part's products: one per 128-column panel, each over
        the whole contraction (``megakernel.kernel_dma.Ctx.panel_products``)."""
        return -(-cols // LANES) * self.expert_dot_s

    def vector_s(self, vector_flops: float) -> float:
        """VPU time of ``vector_flops`` (ops of a kind repeat in every layer: memoised)."""
        cached = self.vector_cache.get(vector_flops)
        if cached is None:
            cached = self.vector_cache[vector_flops] = vector_time_s(vector_flops, self.chip) * self.compute_scale
        return cached

    def dequant_s(self, tensor: TensorSpec, rows: int | None = None) -> float:
        """Vector-unit time to convert ``rows`` (default: all) of ``tensor`` from its stored
        format to the matrix unit's dtype: the chip's ``dequant_s_per_element`` for the format
        (0 where the chip lists none: native, or not modelled)."""
        per_element = self.dequant_rates.get(tensor.format_name)
        if per_element is None:
            per_element = self.dequant_rates[tensor.format_name] = (
                self.chip.vector_unit.dequant_for(tensor.format_name) * self.compute_scale)
        if not per_element:
            return 0.0
        return per_element * (tensor.rows if rows is None else rows) * tensor.cols

    def peak(self, dtype: str) -> tuple[float, str]:
        """(peak FLOP/s, dtype) the matrix unit runs matmuls of ``dtype`` at (an op's dtype:
        ``facts.dtypes``)."""
        peak = self.peaks.get(dtype)
        if peak is None:
            peak = self.peaks[dtype] = (self.matrix.peak_for(dtype), dtype)
        return peak

    def recurrent_state_bytes(self, layer: int) -> int:
        """One sequence's KDA recurrent-state bytes in ``layer`` (0: not a KDA layer)."""
        return self.facts.state_bytes(self.program, layer)

    def op_matmul_s(self, op: Op, dtype: str) -> float:
        """MXU time of all of ``op``'s matmuls at ``dtype`` (its ``facts.dtypes`` entry), unsplit
        (an op kind's matmuls repeat in every layer: memoised)."""
        key = (op.matmuls, dtype)
        cached = self.op_matmul_cache.get(key)
        if cached is None:
            peak = self.peak(dtype)
            cached = self.op_matmul_cache[key] = sum(
                self.matmul_s(rows, contraction, cols, peak) for rows, contraction, cols in op.matmuls)
        return cached

    def slab_parts(self, tensor: TensorSpec, shape: int, matmul: tuple[int, int, int], dtype: str,
                   slabs: list[tuple[Slab, int]]) -> tuple[tuple[float | None, float], ...]:
        """Per row slab of a tensor an aligned op reads (``slabs``: :meth:`tensor_slabs`), its
        conversion time (None: none) and its MXU time: a slab's share of the whole matmul, in
        proportion to its rows (cutting the contraction into slabs does not add weight-tile
        pushes: a 32-row slab is not a full 256-row tile, it fills an eighth of one). The same
        tensor shape and matmul repeat in every layer: memoised."""
        key = (shape, matmul, dtype)
        parts = self.slab_parts_cache.get(key)
        if parts is None:
            rows, contraction, cols = matmul
            whole_s = self.matmul_s(rows, contraction, cols, self.peak(dtype)) + self.dots_s(len(slabs), slabs[0][1], cols)
            converts = self.dequant_s(tensor) > 0.0
            parts = self.slab_parts_cache[key] = tuple(
                (self.dequant_s(tensor, slab_rows_) if converts else None, whole_s * slab_rows_ / tensor.rows)
                for _slab, slab_rows_ in slabs)
        return parts

    def expert_parts(self, op: Op, op_index: int, layout: ExpertLayout) -> tuple[tuple[tuple[int, ...], float, float],
                                                                                   ...]:
        """Per tensor of a routed expert op that a matmul reads: the positions of the copies its
        piece waits for (``layout``'s), its conversion time (0: none) and its MXU time (after the
        conversion: :func:`behind_conversion_s`). Every expert of every layer has the same few
        shapes: memoised."""
        dtype = self.facts.dtypes[op_index]
        key = (self.facts.tensor_shapes[op_index], op.matmuls, dtype)
        parts = self.expert_parts_cache.get(key)
        if parts is None:
            peak = self.peak(dtype)
            found = []
            for position in range(min(len(op.tensors), len(op.matmuls))):
                rows, contraction, cols = op.matmuls[position]
                dequant_s = self.dequant_s(op.tensors[position])
                mxu_s = self.matmul_s(rows, contraction, cols, peak) + self.panel_dots_s(cols)
                if dequant_s:
                    mxu_s = behind_conversion_s(mxu_s, dequant_s, -(-cols // LANES))
                found.append((layout[1][position], dequant_s, mxu_s))
            parts = self.expert_parts_cache[key] = tuple(found)
        return parts

    # ----------------------------------------------------------------- tensors → slabs

    def tensor_slabs(self, tensor: TensorSpec, shape: int, layer: int, op_index: int) -> list[tuple[Slab, int]]:
        """Row slabs of a (non-expert) weight tensor (``shape``: its number in the program's
        facts): [(slab, rows in it)], each slab added to the start releases of the op that
        issues it (step 3, as :meth:`release_plan` says per slab); new_slab and add_desc inlined: a step lowers
        thousands."""
        recipe = self.tensor_recipes.get(shape)
        if recipe is None:  # once per tensor shape: its queue, its cut, its scales' label, its issue ring
            ring, pool, chunk_bytes = self.tensor_queue(tensor)
            recipe = self.tensor_recipes[shape] = (
                ring, pool, self.slab_cut(tensor, chunk_bytes), f"{tensor.name}.scales",
                None if self.issue is None else self.issue.weight_ring(tensor.name, tensor.family))
        ring, pool, cut, scales_name, where = recipe
        plans = self.plans
        if where is None:
            releasers = [plans[self.kernels.issue_op(op_index)]] * len(cut)
        else:
            releasers = [plans[op] for op in self.issue.weight_issues_in(where, tensor.name, layer, len(cut))]
        out: list[tuple[Slab, int]] = []
        family, name = tensor.family, tensor.name
        order, slab_seq, seq = pool.order, self.slab_seq, self.desc_seq
        for chunk, (rows, values, scales) in enumerate(cut):
            slab = Slab(slab_seq, family, name, layer, op_index, pool, ring)
            slab_seq += 1
            order.append(slab)
            descs = slab.descs
            if values:
                descs.append(Descriptor(seq, family, name, layer, chunk, values, slab))
                seq += 1
            if scales:
                descs.append(Descriptor(seq, family, scales_name, layer, chunk, scales, slab))
                seq += 1
            slab.nbytes = values + scales
            releasers[chunk].start_releases.append(slab)
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

    def expert_slab(self, op: Op, op_index: int, label_suffix: str, layout: ExpertLayout) -> Slab:
        """One expert slot: every tensor of the expert op, values then scales (``layout``: the
        op's :func:`~tpusim.engine.lowering_facts.expert_layout` with ``label_suffix``)."""
        if self.expert_queue is None:
            ring = self.ring_of(ROUTED, self.families[ROUTED].buffers)
            self.expert_queue = (ring, self.pool_of(ROUTED, ring))
        ring, pool = self.expert_queue
        layer = op.layer
        slab = Slab(self.slab_seq, ROUTED, f"{op.name}{label_suffix}", layer, op_index, pool, ring)  # new_slab, inlined
        self.slab_seq += 1
        pool.order.append(slab)
        # chunk = the expert's entry in the layer's expert list (the kernel's vocabulary)
        entry, seq, total = op.expert_index or 0, self.desc_seq, 0
        descs = slab.descs
        for name, nbytes in layout[0]:  # add_desc, inlined (a batch-8 step lowers ~1,900 experts)
            descs.append(Descriptor(seq, ROUTED, name, layer, entry, nbytes, slab))
            seq += 1
            total += nbytes
        self.desc_seq, slab.nbytes = seq, total
        return slab


def behind_conversion_s(mxu_s: float, dequant_s: float, panels: int) -> float:
    """MXU time left after a part's conversion: the kernel converts and multiplies it panel by
    panel (``megakernel.kernel_dma.Ctx.panel_products``), and the MXU takes panel ``p``'s
    weights while the VPU converts panel ``p + 1``, so the pair lasts the longer of the two plus
    one panel of the shorter (the pipeline's fill): the closed form of the n-panel pipeline."""
    return max(mxu_s - dequant_s, 0.0) + min(mxu_s, dequant_s) / panels
