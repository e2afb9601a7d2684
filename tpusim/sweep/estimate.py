"""A fast analytic estimate of a schedule's step time, for ranking candidates before the engine.

The engine (:mod:`tpusim.engine`) is a SimPy model of every copy and op (0.1-0.2 s for a K3
step); a sweep considers thousands of candidates. This module replays the same program under
the engine's rules with *one pass of arithmetic per slab*: no event queue, no processes,
about 22 ms per K3 step at batch 8 once the issue plan is known (2-core dev machine, shared).
The issue plan is computed pool by pool and each pool's part remembered
(:class:`~tpusim.schedule.program_issue.PoolPlanCache`), so across a sweep only the pools
whose knobs are new are planned again (``benchmarks/bench_sweep.py`` times a whole sweep).
It is an **estimate** (label every number it produces so); the engine decides.

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
  slots; a ring-mode pool is one ring of banks), as the issue plan lays them out.

Per slab ``s`` of op ``i``, in consumption order (which is program order):

1. **Release** — at the start of the op :mod:`tpusim.schedule.issue_plan` names (the rule
   the engine and the kernel read too); a routed expert issued at its routing decision: when
   ``moe.topk`` ends (``after_routing``), at ``(k + 1) / n`` of it (``during_selection``), or
   when op ``moe.router - expert_speculation_ops`` starts (``speculative``; the mispredicted
   share is copied again after routing); KV tiles and KDA state: when their op starts.
2. **Admit** at the latest of: the release and its ring's slot being free (the slab
   ``buffers`` earlier in the ring has been consumed); rings are queues in order. The issue
   plan's fixed arena addresses keep each arena within its size, so no byte count is
   needed for weights; KV tiles and state are admitted while their bytes fit.
   *Invariant:* a ring never holds more than ``buffers`` slabs.
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
admitted (none for a chip that counts streams, see :mod:`tpusim.sweep.estimate_resources`); a slab's value and scale copies move as one transfer. ``summary.md`` reports how
well the estimate ranks the simulated candidates.
"""

from __future__ import annotations

import copy
import json
import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from hwmodels.schema import Chip
from tpusim.engine.collective_messages import consumer_index
from tpusim.engine.collectives import collective_time_s
from tpusim.engine.costs import (
    collective_stage_s,
    matmul_time_s,
    op_matmul_dtype,
    resolve_link,
    vector_time_s,
)
from tpusim.engine.policy import execution_policy
from tpusim.schedule.issue_plan import Unit
from tpusim.schedule.program_issue import (
    PoolPlanCache,
    ProgramIssuePlan,
    program_facts,
    program_issue_plan,
)
from tpusim.schedule.release import is_mispredicted, selection_fraction
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import VmemPlan, family_chunk, slab_rows, vmem_plan
from tpusim.sweep.estimate_resources import AdmissionPool, FluidHbm
from tpusim.workload.collectives import Topology
from tpusim.workload.formats import scale_bytes, value_bytes
from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import Family, MoeOp, Role, StateFamily
from tpusim.workload.shapes import TensorSpec, kv_cache_bytes_per_token, recurrent_state_bytes

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
    matmul_dtype: str


class IssuePlanner:
    """The issue plans of one program's schedules, memoised on everything they depend on.

    A plan is a function of the ops' tensors and the schedule alone
    (:mod:`tpusim.schedule.program_issue` never reads a collective), so one planner serves a
    program and its variants with other collective algorithms
    (:func:`tpusim.workload.program.with_collectives`): whole plans by the schedule's
    families, pools and expert issue, and each pool's part (:class:`PoolPlanCache`)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.facts = program_facts(program)
        self._plans: dict[str, ProgramIssuePlan] = {}
        self._pool_plans = PoolPlanCache()

    def issue_plan(self, schedule: Schedule) -> ProgramIssuePlan:
        """The schedule's issue plan (memoised on everything it depends on)."""
        key = json.dumps([schedule.model_dump(mode="json", include={"families", "pools", "expert_issue",
                                                                   "expert_speculation_ops"})], sort_keys=True)
        known = self._plans.get(key)
        if known is None:
            if len(self._plans) > 256:
                self._plans.clear()
            known = self._plans[key] = program_issue_plan(self.program, schedule, self.facts, self._pool_plans)
        return known


class EstimateContext:
    """Per-op costs of one program on one chip, computed once and reused for every schedule."""

    def __init__(self, program: Program, chip: Chip, planner: IssuePlanner | None = None) -> None:
        self.program, self.chip = program, chip
        self.batch = program.batch
        self.bandwidth_bytes_per_s = execution_policy(chip).hbm_bandwidth_bytes_per_s  # the engine's HBM rate
        self.issue_latency_s = chip.dma.issue_latency_s.value
        self.dma = chip.dma
        self.per_layer_s = chip.execution.per_layer_overhead_s.value
        self.per_step_s = chip.execution.per_step_overhead_s.value
        self.matrix = chip.matrix_unit
        ops = program.ops
        self._timings: dict[Any, float] = {}  # collective seconds on this chip (shared by variants)
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
            blocking, overlapped, join = _collective_costs(chip, ops, index, plan.topology, self._timings)
            position = seen_experts.get(op.layer, 0)
            if kind == EXPERT:
                seen_experts[op.layer] = position + 1
            topk = roles.get((op.layer, MoeOp.TOPK), -1)
            self.ops.append(_OpCost(
                index=index, layer=op.layer, first_of_layer=op.layer != previous_layer, kind=kind,
                tensors=op.tensors, rows=tuple(m for m, _k, _n in op.matmuls),
                matmul_s=sum(mm), piece_s=tuple(mm), vector_s=vector_time_s(op.vector_flops, chip),
                blocking=blocking, overlapped=overlapped,
                join_index=join if overlapped else -1,
                weight_bytes=op.weight_bytes, kv_read_bytes=op.kv_read_bytes, kv_write_bytes=op.kv_write_bytes,
                kv_tile_unit_bytes=kv_cache_bytes_per_token(model, plan, op.layer) * program.kv_sequences,
                expert_position=position, experts_in_layer=experts.get(op.layer, 0),
                topk_index=topk, router_index=roles.get((op.layer, MoeOp.ROUTER), topk), matmul_dtype=dtype,
            ))
            previous_layer = op.layer
        self._slabs: dict[tuple[str, int | None, int, str], tuple[tuple[int, float], ...]] = {}
        self.planner = planner or IssuePlanner(program)  # (a caller's: shared with its simulations)

    def for_program(self, program: Program) -> EstimateContext:
        """The context of ``program``, which is this context's program with other collective
        algorithms (:func:`tpusim.workload.program.with_collectives`), without pricing it again.

        Algorithms change only the collectives issued after some ops, so only those ops' costs
        are priced again (:func:`_collective_costs`); everything else is shared with this
        context: the per-op costs, the slabs, the program facts and the issue plans (a function
        of the ops' tensors and the schedule alone: :mod:`tpusim.schedule.program_issue` never
        reads a collective). ``tests/test_program_variants.py`` checks it estimates every
        schedule as a context built from scratch does (measured: 51 contexts, 11.6 s of a
        budget-60 K3 sweep, before)."""
        if program is self.program:
            return self
        ops = program.ops
        if len(ops) != len(self.ops) or any(a.name != b.name for a, b in zip(ops, self.program.ops, strict=True)):
            raise ValueError("for_program: not the same ops (only the collective algorithms may differ)")
        variant = copy.copy(self)
        variant.program = program
        variant.ops = []
        for cost, op, old in zip(self.ops, ops, self.program.ops, strict=True):
            if op.collectives or old.collectives:
                blocking, overlapped, join = _collective_costs(self.chip, ops, cost.index, program.plan.topology,
                                                               self._timings)
                cost = replace(cost, blocking=blocking, overlapped=overlapped, join_index=join if overlapped else -1)
            variant.ops.append(cost)
        return variant

    def issue_plan(self, schedule: Schedule) -> ProgramIssuePlan:
        """The schedule's issue plan (:class:`IssuePlanner`, shared with every variant)."""
        return self.planner.issue_plan(schedule)

    def slabs(self, tensor: TensorSpec, chunk_bytes: int | None, rows: int,
              dtype: str) -> tuple[tuple[int, float], ...]:
        """``(bytes, piece seconds)`` of each row slab of ``tensor`` read by an op whose matmuls
        run at ``dtype`` (memoised; as the engine cuts it)."""
        key = (tensor.name, chunk_bytes, rows, dtype)
        known = self._slabs.get(key)
        if known is None:
            per_slab = slab_rows(tensor, chunk_bytes)
            count = math.ceil(tensor.rows / per_slab)
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


def _collective_costs(chip: Chip, ops: list[Op], index: int, topology: Topology, timings: dict[Any, float]) -> tuple[
        tuple[tuple[str, float], ...], tuple[tuple[tuple[str, float], ...], ...], int]:
    """The collectives issued after op ``index``: the stages the stream waits for right there
    (blocking), the chains it waits for at their consumer (overlapped), and the first such
    consumer (``len(ops)`` when none). The only part of an op's costs that the plan's
    collective algorithms change (:meth:`EstimateContext.for_program`). ``timings`` remembers
    :func:`~tpusim.engine.collectives.collective_time_s` (a pure function of its key on one
    chip) per (algorithm, group, payload, topology): every layer issues the same collectives."""
    blocking: list[tuple[str, float]] = []
    overlapped: list[tuple[tuple[str, float], ...]] = []
    join = len(ops)
    chains: dict[str, int] = {}  # collective name -> its chain's position in ``overlapped``
    for call in ops[index].collectives:
        if call.spec.algorithm and chip.kind != "gpu":
            # remote copies (the engine's MessageFabric), timed on idle links; a chain
            # (``after`` naming a collective) runs behind its parent; the stream waits
            # at the consumer
            key = (call.spec.algorithm, call.spec.group, call.payload_bytes_per_peer, topology)
            seconds = timings.get(key)
            if seconds is None:
                seconds = timings[key] = collective_time_s(chip, *key)
            stage = (f"copies {call.spec.name}", seconds)
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
    return tuple(blocking), tuple(overlapped), join


def _is_expert(op: Op) -> bool:
    return bool(op.tensors) and all(t.family == Family.ROUTED_EXPERT for t in op.tensors)


def _join_index(ops: list[Op], index: int) -> int:
    """The op that consumes an overlapped collective's result (the engine's rule)."""
    layer = ops[index].layer
    for later in range(index + 1, len(ops)):
        if ops[later].layer != layer or ops[later].role in (Role.MOE_EXPERT, MoeOp.COMBINE):
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


def estimate(ctx: EstimateContext, schedule: Schedule, vmem: VmemPlan | None = None) -> Estimate:
    """Estimate ``schedule`` on the context's program (see the module docstring).

    ``vmem`` is the schedule's :func:`tpusim.schedule.vmem.vmem_plan` (computed when not given): its
    KV and state sizes bound those pools; weight copies follow the issue plan, whose fixed
    arena addresses already keep every arena within its size.
    """
    program = ctx.program
    vmem = vmem or vmem_plan(schedule, program.model, program.plan, program.batch, program.kv_sequences)
    replay = _Replay(ctx, schedule, vmem)
    for op in ctx.ops:
        replay.op(op)
    return replay.result()


class _Replay:
    """One pass over the program under one schedule (steps 1-4 of the module docstring)."""

    def __init__(self, ctx: EstimateContext, schedule: Schedule, vmem: VmemPlan) -> None:
        unbounded = float("inf")
        self.ctx, self.schedule = ctx, schedule
        self.plan = ctx.issue_plan(schedule)
        self.queues: dict[str, tuple[AdmissionPool, deque[float]]] = {}  # ring -> (its queue, its free times)
        self.tensors: dict[str, tuple[tuple[AdmissionPool, deque[float]], int | None, str, bool]] = {}
        self.kv = (AdmissionPool(vmem.kv_bytes or unbounded), deque(maxlen=schedule.kv_buffers))
        self.state = (AdmissionPool(vmem.state_bytes or unbounded), deque(maxlen=1))
        self.hbm = FluidHbm(ctx.bandwidth_bytes_per_s, ctx.issue_latency_s, ctx.dma, schedule.max_dmas_in_flight)
        self.miss_rate = schedule.speculation_miss_rate if schedule.expert_issue == "speculative" else 0.0
        self.lead_ops = self.plan.max_lead_ops()
        self.link_free: dict[str, float] = {}
        self.joins: dict[int, float] = {}
        self.starts: list[float] = []
        self.topk_span: dict[int, tuple[float, float]] = {}  # layer -> (start, end) of moe.topk
        self.clock = ctx.per_step_s
        self.exposed = 0.0
        self.by_family: dict[str, float] = {}
        self.experts_seen = 0

    def queue(self, tensor: str, family: str) -> tuple[AdmissionPool, deque[float]]:
        """The ring queue a tensor's slabs go through (the engine's, with cross-op prefetch)."""
        key = tensor if family == Family.SMALL_PARAMS else self.plan.ring_of(tensor, family)
        known = self.queues.get(key)
        if known is None:
            depth = self.plan.rings[key].buffers if key in self.plan.rings else self.schedule.family(family).buffers
            known = self.queues[key] = (AdmissionPool(float("inf")), deque(maxlen=depth))
        return known

    def tensor_facts(self, tensor: str, family: str) -> tuple[tuple[AdmissionPool, deque[float]], int | None, str, bool]:
        """(queue, slab size, ring, is small) of a tensor kind, memoised for the replay."""
        known = self.tensors.get(tensor)
        if known is None:
            small = family == Family.SMALL_PARAMS
            known = self.tensors[tensor] = (self.queue(tensor, family), family_chunk(self.schedule, family)[0],
                                            self.plan.ring_of(tensor, family), small)
        return known

    def slab(self, queue: tuple[AdmissionPool, deque[float]], release: float, nbytes: int) -> float:
        """Admit one slab (step 2) and copy it (step 3): its landing time."""
        pool, ring = queue
        ready = release
        if len(ring) == ring.maxlen and ring[0] > ready:
            ready = ring[0]
        return self.hbm.copy(pool.admit(ready, nbytes), nbytes)

    @staticmethod
    def consume(queue: tuple[AdmissionPool, deque[float]], free_s: float, nbytes: int) -> None:
        queue[0].hold(free_s, nbytes)
        queue[1].append(free_s)

    def wait(self, t: float, land: float, family: str) -> float:
        """The stream waits for a landing: the exposed DMA time is charged to ``family``."""
        if land > t:
            self.exposed += land - t
            self.by_family[family] = self.by_family.get(family, 0.0) + land - t
            return land
        return t

    def op(self, op: _OpCost) -> None:
        ctx = self.ctx
        if op.first_of_layer:
            if op.layer >= 0:
                self.clock += ctx.per_layer_s
            if len(self.starts) > self.lead_ops:
                self.hbm.forget_before(self.starts[-self.lead_ops - 1])
        join = self.joins.pop(op.index, 0.0)
        if join > self.clock:
            self.clock = join
        start = self.clock
        self.starts.append(start)
        kind = op.kind
        if kind in (WEIGHTS_MM, WEIGHTS_OTHER):
            t = self.weights(op, start)
        elif kind == EXPERT:
            t = self.expert(op, start)
        elif kind == STATE:
            t = self.recurrent_state(op, start)
        elif kind == KV:
            t = self.kv_tiles(op, start)
        else:
            t = start + op.matmul_s + op.vector_s
            if op.index == op.topk_index:
                self.topk_span[op.layer] = (start, t)
        if op.kv_write_bytes and kind == KV:
            self.hbm.copy(t, op.kv_write_bytes)
        link_free, joins = self.link_free, self.joins
        for stages in op.overlapped:
            joins[op.join_index] = max(joins.get(op.join_index, 0.0), _run_link(link_free, stages, t))
        self.clock = _run_link(link_free, op.blocking, t) if op.blocking else t

    def weights(self, op: _OpCost, start: float) -> float:
        """Weight slabs, released at the issue plan's ops; slab-by-slab or wait-all."""
        t = start
        waits_all = op.kind == WEIGHTS_OTHER  # a vector op waits for all its slabs, then frees them
        last_land = t
        held: list[tuple[tuple[AdmissionPool, deque[float]], int]] = []
        issue = self.plan.plan.issue
        for position, tensor in enumerate(op.tensors):
            queue, chunk_bytes, ring, small = self.tensor_facts(tensor.name, tensor.family)
            key: object = (tensor.name, op.layer) if ring.startswith("pool:") else op.layer
            rows = op.rows[position] if position < len(op.rows) else 1
            for chunk, (nbytes, piece_s) in enumerate(self.ctx.slabs(tensor, chunk_bytes, rows, op.matmul_dtype)):
                release = self.starts[issue[Unit(ring, key, 0 if small else chunk)]]
                land = self.slab(queue, release, nbytes)
                if waits_all:
                    last_land = max(last_land, land)
                    held.append((queue, nbytes))
                    continue
                t = self.wait(t, land, tensor.family) + piece_s
                self.consume(queue, t, nbytes)
        t = self.wait(t, last_land, op.tensors[0].family)
        t += (op.matmul_s if waits_all else 0.0) + op.vector_s
        for queue, nbytes in held:
            self.consume(queue, t, nbytes)
        return t

    def expert(self, op: _OpCost, start: float) -> float:
        """A routed expert: released by its routing decision, or where its slot frees."""
        queue = self.queue("expert", Family.ROUTED_EXPERT)
        span = self.topk_span.get(op.layer, (start, start))
        nbytes = op.weight_bytes
        issue_op, by_routing = self.plan.expert_issue(op.layer, op.expert_position)
        mode = self.schedule.expert_issue
        if not by_routing:
            release = self.starts[issue_op]
        elif mode == "after_routing":
            release = span[1]
        elif mode == "during_selection":
            release = span[0] + (span[1] - span[0]) * selection_fraction(op.expert_position, op.experts_in_layer)
        else:
            release = self.starts[issue_op]
            if is_mispredicted(self.experts_seen, self.miss_rate):
                wasted = self.slab(queue, release, nbytes)  # holds a slot until it lands and routing is known
                self.consume(queue, max(wasted, span[1]), nbytes)
                release = span[1]
        self.experts_seen += 1
        t = self.wait(start, self.slab(queue, release, nbytes), Family.ROUTED_EXPERT) + op.matmul_s + op.vector_s
        self.consume(queue, t, nbytes)
        return t

    def recurrent_state(self, op: _OpCost, start: float) -> float:
        t = self.wait(start, self.slab(self.state, start, op.kv_read_bytes), StateFamily.KDA_STATE)
        t += op.matmul_s + op.vector_s
        written = self.hbm.copy(t, op.kv_write_bytes) if op.kv_write_bytes else t
        self.consume(self.state, written, op.kv_read_bytes)
        return t

    def kv_tiles(self, op: _OpCost, start: float) -> float:
        tile_bytes = self.schedule.kv_tile_tokens * op.kv_tile_unit_bytes or op.kv_read_bytes
        tiles = max(1, math.ceil(op.kv_read_bytes / tile_bytes))
        left, t = op.kv_read_bytes, start
        for _tile in range(tiles):
            size = min(tile_bytes, left)
            left -= size
            t = self.wait(t, self.slab(self.kv, start, size), "kv_cache")
            t += op.matmul_s * size / op.kv_read_bytes
            self.consume(self.kv, t, size)
        return t + op.vector_s

    def result(self) -> Estimate:
        step_s = max(self.clock, self.hbm.last_land, *self.joins.values())
        batch = self.ctx.batch
        return Estimate(step_s, self.exposed, self.hbm.busy_s, batch / step_s if step_s > 0 else 0.0, self.by_family)


def _run_link(link_free: dict[str, float], stages: tuple[tuple[str, float], ...], start: float) -> float:
    """Run collective stages on FIFO links from ``start``; return when the last ends."""
    t = start
    for link, duration in stages:
        begin = max(t, link_free.get(link, 0.0))
        t = begin + duration
        link_free[link] = t
    return t
