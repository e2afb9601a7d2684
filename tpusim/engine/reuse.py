"""Lowered steps kept for the next run of the same step: lower once, reset, run again.

Lowering (:mod:`tpusim.engine.build`) is a pure function of the program, the schedule the
engine runs, the chip and its execution policy (the VMEM plan follows from the first two). A
K3 step lowers to ~3,800 copies, ~2,600 slabs and ~1,700 op plans, a third of a warm step's
CPU time; re-simulating the same step (a repeated ``tpusim simulate``, a benchmark, a
calibration residual evaluated twice at one point) need not build them again. The run only
flips the state of those objects (a copy lands, a slab is reserved and freed, a pool's
admission pointer moves), so after a run they are set back to their state as lowered and the
lowered step is run again.

The key is the inputs by value, as :func:`tpusim.schedule.program_issue.cached_issue_plan`
keys its plans: the program by identity (the cache holds it, so the identity cannot be
reused by another object while the entry lives), the schedule by its content hash (its name
and description lower to nothing), the chip and the policy by ``==`` (pydantic and dataclass
value equality; a policy holding a closure made per call never compares equal, so it is
lowered afresh: a miss, never a wrong hit). A few recent steps are kept (LRU);
:func:`forget_lowerings` empties the store (a cold benchmark; the tests of the reset).

Reset, exactly what the run mutates (``tests/test_engine_reuse.py`` checks a reused step
against a fresh lowering on every built-in schedule): per copy ``landed``, ``waiter``,
``stream``, ``lane``, ``issue_s``, ``land_s``; per slab ``pending`` (its copies), ``released``,
``reserved``, ``freed``, ``free_on_land``; per pool ``ptr`` and ``used_bytes``; per ring
``used``. Op plans, pieces and message collectives are read-only during a run.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwmodels.schema import Chip
from tpusim.engine.build import Lowered, lower
from tpusim.engine.execution import ExecutionPolicy
from tpusim.engine.items import Descriptor, Ring, Slab
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import VmemPlan
from tpusim.workload.program import Program

KEPT = 4  # recent lowered steps kept (a K3 batch-8 step is ~10,000 copies: a few MB each)


@dataclass
class _Kept:
    program: Program
    schedule_hash: str
    chip: Chip
    policy: ExecutionPolicy
    lowered: Lowered
    slabs: list[Slab]
    descs: list[Descriptor]
    rings: list[Ring]


_KEPT: list[_Kept] = []


def lowered_step(program: Program, schedule: Schedule, chip: Chip, policy: ExecutionPolicy,
                 vmem: VmemPlan) -> Lowered:
    """The lowered step for these inputs, in its state as lowered (kept for the next run)."""
    digest = schedule.content_hash()
    for position, kept in enumerate(_KEPT):
        if (kept.program is program and kept.schedule_hash == digest
                and (kept.chip is chip or kept.chip == chip) and kept.policy == policy):
            _KEPT.append(_KEPT.pop(position))
            _reset(kept)
            return kept.lowered
    lowered = lower(program, schedule, chip, policy, vmem)
    slabs = [slab for pool in lowered.pools for slab in pool.order]
    descs = [desc for slab in slabs for desc in slab.descs]
    descs.extend(desc for op in lowered.ops for piece in op.pieces for desc in piece.writes if desc.slab is None)
    rings = list({id(slab.ring): slab.ring for slab in slabs}.values())
    _KEPT.append(_Kept(program, digest, chip, policy, lowered, slabs, descs, rings))
    if len(_KEPT) > KEPT:
        _dismantle(_KEPT.pop(0).lowered)
    return lowered


def forget_lowerings() -> None:
    """Empty the store: the next :func:`lowered_step` of any step lowers it afresh."""
    while _KEPT:
        _dismantle(_KEPT.pop().lowered)


def _reset(kept: _Kept) -> None:
    """Set everything a run mutates back to its state as lowered (module docstring)."""
    for desc in kept.descs:
        desc.landed = False
        desc.waiter = None
        desc.stream = None
        desc.lane = -1
        desc.issue_s = 0.0
        desc.land_s = 0.0
    for slab in kept.slabs:
        slab.pending = len(slab.descs)
        slab.released = slab.reserved = slab.freed = slab.free_on_land = False
    for pool in kept.lowered.pools:
        pool.ptr = 0
        pool.used_bytes = 0
    for ring in kept.rings:
        ring.used = 0


def _dismantle(lowered: Lowered) -> None:
    """Break the lowered step's reference cycles (pool <-> slab <-> copy) once it will not run
    again, so reference counting frees it at once: left to the cyclic collector, the tens of
    thousands of objects are traversed again when the engine re-enables it (measured: a tenth
    of a cold K3 step at batch 8)."""
    for pool in lowered.pools:
        for slab in pool.order:
            slab.descs.clear()
        pool.order.clear()
