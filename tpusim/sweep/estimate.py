"""A fast analytic estimate of a schedule's step time, for ranking candidates before the engine.

The engine (:mod:`tpusim.engine`) is a SimPy model of every copy and op (0.1-0.2 s for a K3
step); a sweep considers thousands of candidates. This module replays the same program under
the engine's rules with *one pass of arithmetic per slab*: no event queue, no processes,
9 ms per K3 step at batch 1 and 21 ms at batch 8 (2-core dev machine). It is an **estimate** (label every number it produces so); the
engine decides.

The model
---------
The engine's resources and rules (:mod:`tpusim.engine.build`, ``staging``, ``hbm``,
``stream``), each replaced by a closed form:

- the **compute stream** runs ops in order; an op computes slab by slab, each slab's piece
  (the engine's cost formulas, :mod:`tpusim.engine.costs`) starting once the slab has landed;
  a blocking collective after an op stalls the stream; an overlapped one must finish
  before the op that consumes it;
- the **HBM** is a *fluid* bandwidth: whenever copies are pending it moves bytes at
  ``sustained bandwidth x DMA efficiency(copies in flight)``; a copy costs the DMA issue
  latency before its bytes move, and at most ``max_dmas_in_flight`` are out at once;
- **VMEM**: one ring per tensor kind (``buffers`` slots; the routed experts share the expert
  slots) and one pool per arena of :func:`tpusim.schedule.vmem.vmem_plan`, whose slabs are admitted
  strictly in consumption order while their bytes fit.

Per slab ``s`` of op ``i``, in consumption order (which is program order):

1. **Release** — a weight slab of family ``f``: when op ``max(0, i - d_f)`` starts; a routed
   expert ``k`` of ``n``: when ``moe.topk`` ends (``after_routing``), at ``(k + 1) / n`` of it
   (``during_selection``), or when op ``moe.router - expert_speculation_ops`` starts
   (``speculative``; the mispredicted share is copied again after routing); KV tiles and
   KDA state: when their op starts.
2. **Admit** at the latest of: the release; the admission of the previous slab of its pool
   (in order); its ring's slot being free (the slab ``buffers`` earlier in the ring has been
   consumed); the pool having room (the earliest time the bytes still held by earlier slabs
   plus this one fit the arena). *Invariant:* a pool never holds more than its arena and a
   ring never more than ``buffers`` slabs.
3. **Land** — the slab's bytes occupy the HBM from ``admission + issue latency``, filling
   earlier idle HBM time first (earlier slabs keep priority, as the engine's
   consumption-order queue gives them). *Invariant:* the HBM never moves more than
   ``bandwidth x time`` bytes.
4. **Consume** — the stream waits for the landing (that wait is *exposed DMA time*), computes
   the slab's piece, and frees the slab (its ring slot and pool bytes).

Step time = when the stream has finished and every copy has landed, plus the per-step and
per-layer overheads.

Where it differs from the engine: processor sharing among in-flight copies is replaced by
the fluid server with consumption-order priority (the same total throughput, a slightly
different landing order); the DMA efficiency uses the copies outstanding when a slab is
admitted; a slab's value and scale copies move as one transfer. ``summary.md`` reports how
well the estimate ranks the simulated candidates.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass

from hwmodels.schema import Chip
from tpusim.engine.collectives import collective_time_s, consumer_index
from tpusim.engine.costs import (
    collective_stage_s,
    matmul_time_s,
    op_matmul_dtype,
    resolve_link,
    vector_time_s,
)
from tpusim.workload.formats import scale_bytes, value_bytes
from tpusim.workload.program import Op, Program
from tpusim.schedule.schema import SCHEDULE_FAMILIES, Schedule
from tpusim.workload.shapes import TensorSpec, kv_cache_bytes_per_token, recurrent_state_bytes
from tpusim.schedule.vmem import VmemPlan, slab_rows, vmem_plan

WEIGHTS_MM, WEIGHTS_OTHER, EXPERT, STATE, KV, PLAIN = range(6)


@dataclass(frozen=True)
class _OpCost:
    """Schedule-independent facts of one op (built once per program)."""

    index: int
    layer: int
    first_of_layer: bool
    kind: int  # WEIGHTS_MM | WEIGHTS_OTHER | EXPERT | STATE | KV | PLAIN
    tensors: tuple[TensorSpec, ...]
    rows: tuple[int, ...]  # matmul rows per tensor (WEIGHTS_MM)
    matmul_s: float  # whole-op matmul time (all kinds but WEIGHTS_MM pieces)
    piece_s: tuple[float, ...]  # EXPERT: per-tensor matmul times
    vector_s: float
    blocking: tuple[tuple[str, float], ...]  # stages of blocking collectives, in order
    overlapped: tuple[tuple[tuple[str, float], ...], ...]  # stages of overlapped collectives
    join_index: int  # op that waits for this op's overlapped collectives
    weight_bytes: int  # EXPERT: the whole expert slot
    kv_read_bytes: int
    kv_write_bytes: int
    kv_tile_unit_bytes: int  # KV: bytes per token for the whole batch
    expert_position: int  # EXPERT: k among the layer's n local experts
    experts_in_layer: int
    topk_index: int
    router_index: int


class EstimateContext:
    """Per-op costs of one program on one chip, computed once and reused for every schedule."""

    def __init__(self, program: Program, chip: Chip) -> None:
        self.program, self.chip = program, chip
        self.batch = program.batch
        self.bandwidth_bytes_per_s = chip.hbm.sustained_bandwidth_bytes_per_s.value
        self.issue_latency_s = chip.dma.issue_latency_s.value
        self.dma = chip.dma
        self.per_layer_s = chip.execution.per_layer_overhead_s.value
        self.per_step_s = chip.execution.per_step_overhead_s.value
        self.matrix = chip.matrix_unit
        ops = program.ops
        roles: dict[tuple[int, str], int] = {}
        experts: dict[int, int] = {}
        for index, op in enumerate(ops):
            roles.setdefault((op.layer, op.role), index)
            if _is_expert(op):
                experts[op.layer] = experts.get(op.layer, 0) + 1
        model, plan = program.model, program.plan
        self.ops: list[_OpCost] = []
        seen_experts: dict[int, int] = {}
        previous_layer: int | None = None
        for index, op in enumerate(ops):
            dtype = op_matmul_dtype(op)
            peak = self.matrix.peak_for(dtype)
            mm = [matmul_time_s(m, k, n, self.matrix, peak, dtype) for m, k, n in op.matmuls]
            if _is_expert(op):
                kind = EXPERT
            elif op.tensors:
                kind = WEIGHTS_MM if op.unit == "mxu" and len(op.matmuls) == len(op.tensors) else WEIGHTS_OTHER
            elif op.kv_read_bytes:
                kind = STATE if recurrent_state_bytes(model, plan, op.layer) else KV
            else:
                kind = PLAIN
            blocking: list[tuple[str, float]] = []
            overlapped: list[tuple[tuple[str, float], ...]] = []
            join = len(ops)
            chains: dict[str, int] = {}  # collective name -> its chain's position in ``overlapped``
            for call in op.collectives:
                if call.spec.algorithm and chip.kind != "gpu":
                    # remote copies (the engine's MessageFabric), timed on idle links; a chain
                    # (``after`` naming a collective) runs behind its parent; the stream waits
                    # at the consumer
                    stage = (f"copies {call.spec.name}", collective_time_s(
                        chip, call.spec.algorithm, call.spec.group, call.payload_bytes_per_peer, plan.topology))
                    parent = chains.get(call.spec.after)
                    if parent is None:
                        chains[call.spec.name] = len(overlapped)
                        overlapped.append((stage,))
                    else:
                        chains[call.spec.name] = parent
                        overlapped[parent] = (*overlapped[parent], stage)
                    join = min(join, consumer_index(ops, index, call.spec.consumed_by))
                    continue
                stages = tuple((link.name, collective_stage_s(link, stage, call.payload_bytes_per_peer))
                               for stage in call.spec.stages
                               if (link := resolve_link(chip, stage.link)) is not None)
                if stages and call.spec.overlapped:
                    overlapped.append(stages)
                    join = min(join, _join_index(ops, index))
                else:
                    blocking.extend(stages)
            position = seen_experts.get(op.layer, 0)
            if kind == EXPERT:
                seen_experts[op.layer] = position + 1
            topk = roles.get((op.layer, "moe.topk"), -1)
            self.ops.append(_OpCost(
                index=index, layer=op.layer, first_of_layer=op.layer != previous_layer, kind=kind,
                tensors=op.tensors, rows=tuple(m for m, _k, _n in op.matmuls),
                matmul_s=sum(mm), piece_s=tuple(mm), vector_s=vector_time_s(op.vector_flops, chip),
                blocking=tuple(blocking), overlapped=tuple(overlapped),
                join_index=join if overlapped else -1,
                weight_bytes=op.weight_bytes, kv_read_bytes=op.kv_read_bytes, kv_write_bytes=op.kv_write_bytes,
                kv_tile_unit_bytes=kv_cache_bytes_per_token(model, plan, op.layer) * program.batch,
                expert_position=position, experts_in_layer=experts.get(op.layer, 0),
                topk_index=topk, router_index=roles.get((op.layer, "moe.router"), topk),
            ))
            previous_layer = op.layer
        self._slabs: dict[tuple[str, int | None, int], tuple[tuple[int, float], ...]] = {}

    def slabs(self, tensor: TensorSpec, chunk_bytes: int | None, rows: int) -> tuple[tuple[int, float], ...]:
        """``(bytes, piece seconds)`` of each row slab of ``tensor`` (memoised; as the engine cuts it)."""
        key = (tensor.name, chunk_bytes, rows)
        known = self._slabs.get(key)
        if known is None:
            per_slab = slab_rows(tensor, chunk_bytes)
            count = math.ceil(tensor.rows / per_slab)
            dtype = tensor.fmt.mxu_dtype
            peak = self.matrix.peak_for(dtype)
            whole_s = matmul_time_s(rows, tensor.rows, tensor.cols, self.matrix, peak, dtype)
            out = []
            values_left, scales_left = tensor.value_bytes, tensor.scale_bytes
            for chunk in range(count):
                slab_rows_ = min(per_slab, tensor.rows - chunk * per_slab)
                last = chunk == count - 1
                values = values_left if last else value_bytes(tensor.fmt, slab_rows_, tensor.cols)
                scales = scales_left if last else scale_bytes(tensor.fmt, slab_rows_, tensor.cols)
                values_left -= values
                scales_left -= scales
                out.append((values + scales, whole_s * slab_rows_ / tensor.rows))
            known = self._slabs[key] = tuple(out)
        return known


def _is_expert(op: Op) -> bool:
    return bool(op.tensors) and all(t.family == "routed_expert" for t in op.tensors)


def _join_index(ops: list[Op], index: int) -> int:
    """The op that consumes an overlapped collective's result (the engine's rule)."""
    layer = ops[index].layer
    for later in range(index + 1, len(ops)):
        if ops[later].layer != layer or ops[later].role in ("moe.expert", "moe.combine"):
            return later
    return len(ops)


@dataclass(frozen=True)
class Estimate:
    """The estimate of one schedule (seconds; label every printed number "estimate")."""

    step_s: float
    exposed_dma_s: float
    hbm_busy_s: float
    tokens_per_s: float
    exposed_by_family_s: dict[str, float]


class _Hbm:
    """A fluid bandwidth server with backfill and an in-flight limit (see the module docstring)."""

    __slots__ = ("bandwidth", "busy_s", "efficiency", "end", "full_rate", "gap_ends", "gap_starts", "lands",
                 "last_land", "latency", "max_in_flight", "may_contend")

    def __init__(self, ctx: EstimateContext, max_in_flight: int) -> None:
        self.end = 0.0
        self.gap_starts: list[float] = []
        self.gap_ends: list[float] = []
        self.busy_s = 0.0
        self.last_land = 0.0
        self.bandwidth = ctx.bandwidth_bytes_per_s
        self.latency = ctx.issue_latency_s
        self.max_in_flight = max_in_flight
        self.efficiency = [ctx.dma.efficiency(n) for n in range(max_in_flight + 1)]
        self.full_rate = self.bandwidth * self.efficiency[1]
        self.may_contend = max_in_flight > ctx.dma.efficient_in_flight
        self.lands: deque[float] = deque(maxlen=max_in_flight)

    def copy(self, ready: float, nbytes: float) -> float:
        """Issue a copy of ``nbytes`` admitted at ``ready``; return when it has landed."""
        lands = self.lands
        if len(lands) == self.max_in_flight:
            earliest = min(lands)
            if earliest > ready:  # all slots busy: wait for the first to land
                ready = earliest
        rate = self.full_rate
        if self.may_contend:  # more copies may be out than the DMA engine serves at full rate
            outstanding = 1
            for land in lands:
                if land > ready:
                    outstanding += 1
            rate = self.bandwidth * self.efficiency[min(outstanding, self.max_in_flight)]
        land = self._transfer(ready + self.latency, nbytes / rate)
        lands.append(land)
        if land > self.last_land:
            self.last_land = land
        return land

    def _transfer(self, ready: float, duration: float) -> float:
        self.busy_s += duration
        starts, ends = self.gap_starts, self.gap_ends
        if ends and ends[-1] > ready:
            i = bisect.bisect_right(ends, ready)
            while i < len(ends):
                a = starts[i] if starts[i] > ready else ready
                available = ends[i] - a
                if available >= duration:
                    land = a + duration
                    if starts[i] < a:  # keep [start, a) idle, and [land, end) if any is left
                        if ends[i] - land > 1e-12:
                            starts.insert(i + 1, land)
                            ends.insert(i + 1, ends[i])
                        ends[i] = a
                    elif ends[i] - land > 1e-12:
                        starts[i] = land
                    else:
                        del starts[i], ends[i]
                    return land
                duration -= available
                if starts[i] < a:
                    ends[i] = a
                    i += 1
                else:
                    del starts[i], ends[i]
        start = ready if ready > self.end else self.end
        if start - self.end > 1e-12:
            starts.append(self.end)
            ends.append(start)
        self.end = start + duration
        return self.end

    def forget_before(self, horizon: float) -> None:
        """Drop idle gaps ending before ``horizon`` (no copy can be admitted that early)."""
        cut = bisect.bisect_left(self.gap_ends, horizon)
        if cut:
            del self.gap_starts[:cut], self.gap_ends[:cut]


class _Pool:
    """An arena: in-order admission while the held bytes fit (free times are known in order)."""

    __slots__ = ("capacity", "held", "last_admit", "used")

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.last_admit = 0.0
        self.held: list[tuple[float, int]] = []  # heap of (free time, bytes) of admitted slabs
        self.used = 0

    def admit(self, ready: float, nbytes: int) -> float:
        t = ready if ready > self.last_admit else self.last_admit
        held = self.held
        while held and held[0][0] <= t:
            self.used -= heapq.heappop(held)[1]
        while held and self.used + nbytes > self.capacity:
            free_s, size = heapq.heappop(held)
            self.used -= size
            if free_s > t:
                t = free_s
        self.last_admit = t
        return t

    def hold(self, free_s: float, nbytes: int) -> None:
        heapq.heappush(self.held, (free_s, nbytes))
        self.used += nbytes


def estimate(ctx: EstimateContext, schedule: Schedule, vmem: VmemPlan | None = None) -> Estimate:
    """Estimate ``schedule`` on the context's program (see the module docstring).

    ``vmem`` is the schedule's :func:`tpusim.schedule.vmem.vmem_plan` (computed when not given): its
    arena sizes are the pools' capacities.
    """
    program = ctx.program
    vmem = vmem or vmem_plan(schedule, program.model, program.plan, program.batch)
    unbounded = float("inf")
    arenas = {name: _Pool(size) for name, size in vmem.arena_bytes.items()}
    fams = {name: schedule.family(name) for name in SCHEDULE_FAMILIES}
    pool_of = {name: arenas.setdefault(fam.pool or name, _Pool(unbounded)) for name, fam in fams.items()}
    kv_pool, state_pool = _Pool(vmem.kv_bytes or unbounded), _Pool(vmem.state_bytes or unbounded)
    rings: dict[str, deque[float]] = {}
    expert_pool = pool_of["routed_expert"]
    expert_ring = rings["routed_expert"] = deque(maxlen=fams["routed_expert"].buffers)
    kv_ring: deque[float] = deque(maxlen=schedule.kv_buffers)
    state_ring: deque[float] = deque(maxlen=1)
    hbm = _Hbm(ctx, schedule.max_dmas_in_flight)
    issue = schedule.expert_issue
    miss_rate = schedule.speculation_miss_rate if issue == "speculative" else 0.0
    spec_ops = schedule.expert_speculation_ops
    tile_tokens = schedule.kv_tile_tokens
    max_distance = max(fam.prefetch_distance_ops for fam in fams.values())
    link_free: dict[str, float] = {}
    joins: dict[int, float] = {}
    starts: list[float] = []
    topk_span: dict[int, tuple[float, float]] = {}  # layer -> (start, end) of moe.topk
    clock = ctx.per_step_s
    exposed = 0.0
    by_family: dict[str, float] = {}
    experts_seen = 0

    def slab(pool: _Pool, ring: deque[float], release: float, nbytes: int) -> float:
        """Admit one slab (step 2) and copy it (step 3): its landing time."""
        ready = release
        if len(ring) == ring.maxlen and ring[0] > ready:
            ready = ring[0]
        return hbm.copy(pool.admit(ready, nbytes), nbytes)

    def consume(pool: _Pool, ring: deque[float], free_s: float, nbytes: int) -> None:
        pool.hold(free_s, nbytes)
        ring.append(free_s)

    for op in ctx.ops:
        if op.first_of_layer:
            if op.layer >= 0:
                clock += ctx.per_layer_s
            if max_distance and len(starts) > max_distance:
                hbm.forget_before(starts[-max_distance - 1])
        join = joins.pop(op.index, 0.0)
        if join > clock:
            clock = join
        start = clock
        starts.append(start)
        t = start
        kind = op.kind
        if kind in (WEIGHTS_MM, WEIGHTS_OTHER):
            waits_all = kind == WEIGHTS_OTHER  # a vector op waits for all its slabs, then frees them
            last_land = t
            held: list[tuple[_Pool, deque[float], int]] = []
            for position, tensor in enumerate(op.tensors):
                fam = fams[tensor.family]
                distance = fam.prefetch_distance_ops
                release = starts[op.index - distance] if op.index >= distance else starts[0]
                pool = pool_of[tensor.family]
                ring = rings.get(tensor.name)
                if ring is None:
                    ring = rings[tensor.name] = deque(maxlen=fam.buffers)
                rows = op.rows[position] if position < len(op.rows) else 1
                for nbytes, piece_s in ctx.slabs(tensor, fam.chunk_bytes, rows):
                    land = slab(pool, ring, release, nbytes)
                    if waits_all:
                        last_land = max(last_land, land)
                        held.append((pool, ring, nbytes))
                        continue
                    if land > t:
                        exposed += land - t
                        by_family[tensor.family] = by_family.get(tensor.family, 0.0) + land - t
                        t = land
                    t += piece_s
                    consume(pool, ring, t, nbytes)
            if last_land > t:
                exposed += last_land - t
                family = op.tensors[0].family
                by_family[family] = by_family.get(family, 0.0) + last_land - t
                t = last_land
            t += (op.matmul_s if waits_all else 0.0) + op.vector_s
            for pool, ring, nbytes in held:
                consume(pool, ring, t, nbytes)
        elif kind == EXPERT:
            pool, ring = expert_pool, expert_ring
            span = topk_span.get(op.layer, (start, start))
            nbytes = op.weight_bytes
            if issue == "after_routing":
                release = span[1]
            elif issue == "during_selection":
                release = span[0] + (span[1] - span[0]) * (op.expert_position + 1) / max(1, op.experts_in_layer)
            else:
                early = op.router_index - spec_ops
                release = starts[max(0, early)] if op.router_index >= 0 else start
                misses = math.floor((experts_seen + 1) * miss_rate + 1e-9) - math.floor(experts_seen * miss_rate + 1e-9)
                if misses:  # the wasted copy holds a slot until it lands and routing is known
                    wasted = slab(pool, ring, release, nbytes)
                    consume(pool, ring, max(wasted, span[1]), nbytes)
                    release = span[1]
            experts_seen += 1
            land = slab(pool, ring, release, nbytes)
            if land > t:
                exposed += land - t
                by_family["routed_expert"] = by_family.get("routed_expert", 0.0) + land - t
                t = land
            t += op.matmul_s + op.vector_s
            consume(pool, ring, t, nbytes)
        elif kind == STATE:
            land = slab(state_pool, state_ring, start, op.kv_read_bytes)
            if land > t:
                exposed += land - t
                by_family["kda_state"] = by_family.get("kda_state", 0.0) + land - t
                t = land
            t += op.matmul_s + op.vector_s
            written = hbm.copy(t, op.kv_write_bytes) if op.kv_write_bytes else t
            consume(state_pool, state_ring, written, op.kv_read_bytes)
        elif kind == KV:
            tile_bytes = tile_tokens * op.kv_tile_unit_bytes or op.kv_read_bytes
            tiles = max(1, math.ceil(op.kv_read_bytes / tile_bytes))
            left = op.kv_read_bytes
            for _tile in range(tiles):
                size = min(tile_bytes, left)
                left -= size
                land = slab(kv_pool, kv_ring, start, size)
                if land > t:
                    exposed += land - t
                    by_family["kv_cache"] = by_family.get("kv_cache", 0.0) + land - t
                    t = land
                t += op.matmul_s * size / op.kv_read_bytes
                consume(kv_pool, kv_ring, t, size)
            t += op.vector_s
        else:
            t += op.matmul_s + op.vector_s
            if op.index == op.topk_index:
                topk_span[op.layer] = (start, t)
        if op.kv_write_bytes and kind == KV:
            hbm.copy(t, op.kv_write_bytes)
        for stages in op.overlapped:
            joins[op.join_index] = max(joins.get(op.join_index, 0.0), _run_link(link_free, stages, t))
        clock = _run_link(link_free, op.blocking, t) if op.blocking else t
    step_s = max(clock, hbm.last_land, *joins.values())
    return Estimate(step_s, exposed, hbm.busy_s, ctx.batch / step_s if step_s > 0 else 0.0, by_family)


def _run_link(link_free: dict[str, float], stages: tuple[tuple[str, float], ...], start: float) -> float:
    """Run collective stages on FIFO links from ``start``; return when the last ends."""
    t = start
    for link, duration in stages:
        begin = max(t, link_free.get(link, 0.0))
        t = begin + duration
        link_free[link] = t
    return t
