"""Cheap pruning: reject candidates that cannot run before any estimate or simulation.

A candidate is pruned, with the reason recorded in ``sweep.csv``, when

1. ``max_dmas_in_flight`` exceeds the space's outstanding-DMA limit (``dmas: ...``), or
2. its static VMEM scratch (:func:`tpusim.schedule.vmem.vmem_plan`, the accounting the kernel and the
   engine share) exceeds the usable capacity (``vmem: ...`` with
   :func:`tpusim.schedule.vmem.check_fits`'s message naming the arenas).

Speed. ``vmem_plan`` walks every layer's tensors (≈ 5 ms for K3); a sweep prunes thousands
of candidates. :class:`VmemAccountant` therefore memoises it: a plan's per-family bytes depend
only on that family's ``(buffers, chunk_bytes)`` and its KV bytes only on
``kv_buffers * kv_tile_tokens``, so it calls ``vmem_plan`` once per *new* family setting
(a few hundred calls for the whole space) and assembles the rest with rule 3 of
:mod:`tpusim.schedule.vmem` (a pool's arena is its largest member; arenas add up). The result is a
real :class:`~tpusim.schedule.vmem.VmemPlan`; ``tests/test_sweep_space.py`` checks it equals
``vmem_plan`` byte for byte.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from tpusim.schedule.schema import SCHEDULE_FAMILIES, SMALL_FAMILY, FamilySchedule, Schedule
from tpusim.schedule.vmem import (
    InfeasibleSchedule,
    VmemPlan,
    arenas,
    check_fits,
    family_chunk,
    family_stage_bytes,
    kernel_bytes,
    panel_loop_bytes,
    row_cache_bytes,
    small_padding_bytes,
    tensor_kinds,
    vmem_plan,
    working_bytes,
)
from tpusim.sweep.space import SweepSpace
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.sharding import ShardingPlan


class VmemAccountant:
    """Memoised :func:`tpusim.schedule.vmem.vmem_plan` for many schedules of one workload."""

    def __init__(self, model: ModelConfig, plan: ShardingPlan, batch: int, sequences: int | None = None) -> None:
        self.model, self.plan, self.batch, self.sequences = model, plan, batch, sequences
        self._family: dict[tuple[str, int, int | None], tuple[int, dict[str, int]] | None] = {}
        # family_bytes' answers: a guided sweep asks the same few thousand (family, buffers,
        # chunk) questions about a million times (1,200 K3 draws: 47 -> 5 s of CPU, profiled)
        self._family_total: dict[tuple[str, int, int | None], int] = {}
        self._kv: dict[int, int] = {}
        self._fixed: tuple[int, int] | None = None  # (state, activations)
        self._collectives: dict[str, int] = {}  # receive_slots -> collective buffers (rule 6)
        self._family_of = {t.name: family for family, ts in tensor_kinds(model, plan).items() for t in ts}
        self._memo: dict[object, int] = {}  # vmem_plan's and kernel_bytes' memo for this plan
        self.calls = 0

    def for_plan(self, plan: ShardingPlan) -> VmemAccountant:
        """The accountant of ``plan``, which is this one's plan with other collective
        algorithms: everything learnt is shared (weights, KV, state, activations and kernel
        scratch do not depend on the algorithms) except the collective buffers (rule 6 of
        :mod:`tpusim.schedule.vmem`), learnt again per ``receive_slots``. A joint sweep's
        workers size many algorithm variants of few plans."""
        twin = copy.copy(self)
        twin.plan, twin._collectives, twin._family_total, twin.calls = plan, {}, {}, 0
        twin._memo = {}
        return twin

    def _learn(self, schedule: Schedule) -> None:
        self.calls += 1
        full = vmem_plan(schedule, self.model, self.plan, self.batch, self.sequences, self._memo)
        for family in SCHEDULE_FAMILIES:
            chunk_bytes, buffers = family_chunk(schedule, family)
            key = (family, buffers, chunk_bytes)
            if family in full.family_bytes:
                detail = {name: size for name, size in full.detail.items() if self._family_of.get(name) == family}
                self._family[key] = (full.family_bytes[family], detail)
            else:
                self._family[key] = None
        self._kv[schedule.kv_buffers * schedule.kv_tile_tokens] = full.kv_bytes
        self._fixed = (full.state_bytes, full.activation_bytes)
        self._collectives[schedule.receive_slots] = full.collective_bytes

    def family_bytes(self, family: str, buffers: int, chunk_bytes: int | None) -> int:
        """Footprint of ``family`` with ``buffers`` slabs of ``chunk_bytes`` (0 if absent)."""
        key = (family, buffers, chunk_bytes)
        total = self._family_total.get(key)
        if total is None:
            total = self._family_total[key] = self._family_footprint(family, buffers, chunk_bytes)
        return total

    def _family_footprint(self, family: str, buffers: int, chunk_bytes: int | None) -> int:
        key = (family, buffers, chunk_bytes)
        if key not in self._family:
            self._learn(Schedule(name="probe", families={family: FamilySchedule(buffers=buffers, chunk_bytes=chunk_bytes)}))
        known = self._family[key]
        padding = small_padding_bytes(self.model, self.plan, buffers) if family == SMALL_FAMILY and known else 0
        # the family's looped-matmul staging, as if it were the largest (the kernel keeps one
        # buffer for the largest): an upper bound, so a guided sample never overflows
        stage = family_stage_bytes(self.model, self.plan, self.batch, family, chunk_bytes) if known else 0
        return known[0] + padding + stage if known else 0

    def fixed_bytes(self, kv_buffers: int, kv_tile_tokens: int) -> int:
        """KV tiles + recurrent state + activations + collective buffers (default layout) for
        these KV knobs."""
        key = kv_buffers * kv_tile_tokens
        probe = Schedule(name="probe", kv_buffers=kv_buffers, kv_tile_tokens=kv_tile_tokens)
        if key not in self._kv or self._fixed is None or probe.receive_slots not in self._collectives:
            self._learn(probe)
        assert self._fixed is not None
        return (self._kv[key] + sum(self._fixed) + self._collectives[probe.receive_slots]
                + working_bytes(self.model, self.plan, self.batch) + panel_loop_bytes(self.model, self.plan, self.batch)
                + row_cache_bytes(probe, self.model, self.plan, self.batch, self.sequences))

    def plan_for(self, schedule: Schedule) -> VmemPlan:
        """The schedule's :class:`VmemPlan` (equal to ``vmem_plan(schedule, ...)``)."""
        keys = {f: (f, *reversed(family_chunk(schedule, f))) for f in SCHEDULE_FAMILIES}
        kv_key = schedule.kv_buffers * schedule.kv_tile_tokens
        if (self._fixed is None or kv_key not in self._kv or schedule.receive_slots not in self._collectives
                or any(k not in self._family for k in keys.values())):
            self._learn(schedule)
        assert self._fixed is not None
        family_bytes: dict[str, int] = {}
        detail: dict[str, int] = {}
        for family, key in keys.items():
            known = self._family[key]
            if known is not None:
                family_bytes[family], part = known
                detail.update(part)
        arena_bytes, arena_members = arenas(schedule, family_bytes)
        state, activations = self._fixed
        return VmemPlan(family_bytes, arena_bytes, arena_members, self._kv[kv_key], state, activations, detail,
                        self._collectives[schedule.receive_slots],
                        kernel_bytes(schedule, self.model, self.plan, self.batch, self.sequences, self._memo))


@dataclass(frozen=True)
class PruneVerdict:
    """Whether a candidate survives pruning, its static VMEM bytes, and why not if it fails."""

    feasible: bool
    vmem_static_bytes: int
    reason: str = ""


def check_candidate(schedule: Schedule, space: SweepSpace, accountant: VmemAccountant) -> PruneVerdict:
    """Apply the space's constraints to one schedule (see the module docstring)."""
    try:
        vmem = accountant.plan_for(schedule)
    except InfeasibleSchedule as error:  # a layout VMEM cannot hold at all (a slab past its bank)
        return PruneVerdict(False, 0, f"vmem: {error}")
    limit = space.constraints.max_dmas_in_flight_limit
    if schedule.max_dmas_in_flight > limit:
        return PruneVerdict(False, vmem.total_bytes,
                            f"dmas: max_dmas_in_flight {schedule.max_dmas_in_flight} exceeds the limit {limit}")
    capacity = space.constraints.vmem_capacity_bytes
    if capacity is not None:
        try:
            check_fits(vmem, capacity)
        except InfeasibleSchedule as error:
            return PruneVerdict(False, vmem.total_bytes, f"vmem: {error}")
    return PruneVerdict(True, vmem.total_bytes)
