"""Lowered steps kept for the next run of the same step: lower once, reset, run again.

Lowering (:mod:`tpusim.engine.build`) is a pure function of the program, the schedule the
engine runs, the chip and its execution policy (the VMEM plan follows from the first two). A
K3 step lowers to ~3,800 copies, ~2,600 slabs and ~1,700 op plans, a third of a warm step's
CPU time; re-simulating the same step (the same program, schedule and chip figures: a
benchmark's warm runs, a caller that simulates a step it simulated before) need not build
them again, nor size its VMEM again (:func:`step_vmem_plan`). The run only flips the state of
those objects (a copy lands, a slab is reserved and freed, a pool's admission pointer moves),
so after a run they are set back to their state as lowered and the lowered step is run again.
A step with another schedule (a sweep's next candidate) is lowered afresh; a step whose chip
differs only in figures that price the pieces (a calibration's next point: the compute units,
the links, the launch and per-step and per-layer costs; :func:`structure_inputs`) takes the kept
step of the same structure and prices it again in place (:mod:`tpusim.engine.reprice`: the
same pieces, exactly the fresh lowering's times), or is lowered afresh where the new figures
would change the pieces themselves.

The key is the inputs by value, as :func:`tpusim.schedule.program_issue.cached_issue_plan`
keys its plans: the program by identity (the cache holds it, so the identity cannot be
reused by another object while the entry lives), the schedule by its content hash (its name
and description lower to nothing), the chip and the policy by ``==`` (pydantic and dataclass
value equality; a policy holding a closure made per call never compares equal, so it is
lowered afresh: a miss, never a wrong hit) — all of them but the copy engine's figures
(:func:`lowering_inputs`: the HBM bandwidth and the DMA spec, which only the HBM server reads),
so a calibration fitting those (the tpu-v5e kernel fit moves only the HBM bandwidth) runs each
of its points' steps lowered once (and one moving compute figures, repriced). Recent steps are kept (LRU: ``KEPT`` steps holding at
most ``KEPT_COPIES`` copies; a caller re-simulating more steps in turn raises both with
:func:`keep_lowerings`, as the calibration's record predictor does);
:func:`forget_lowerings` empties the store (a cold benchmark; the tests of the reset). A run
holds its step until it ends; a second run of a held step (another thread) lowers its own.

Reset, what the run mutates (``tests/test_engine_reuse.py`` checks a reused step against a
fresh lowering on every built-in schedule): per pool ``ptr`` and ``used_bytes``; per ring
``used``. The thousands of copies and slabs are not touched: their flags (a copy's
``landed``; a slab's ``released``, ``freed``, ``free_on_land``) hold the number of the run that
set them (:mod:`tpusim.engine.items`), and each run has a new number (``Lowered.runs``), so a
new run finds them all clear. A copy's ``waiter`` is cleared when the copy lands, so a run that
ended leaves none; after a run that raised, the next reset clears them all. The rest of a
copy's state is written in a run before it is read (``issue_s`` at its issue, ``land_s`` at its
landing, ``lane`` at its issue when recorded, ``stream`` when it starts streaming by stream).
Op plans, pieces and message collectives are read-only during a run.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from hwmodels.schema import Chip
from tpusim.engine.build import Lowered, lower
from tpusim.engine.execution import ExecutionPolicy
from tpusim.engine.items import Descriptor, Ring
from tpusim.engine.reprice import StepPrices, reprice, repriceable, step_prices
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import VmemPlan, vmem_plan
from tpusim.workload.program import Program

KEPT = 4  # recent lowered steps kept by default (K3 on 16 tpu-v7: 4,000-10,000 copies a step) ...
KEPT_COPIES = 100_000  # ... holding at most this many copies (~0.7 kB each lowered: ~70 MB)
_LIMITS = {"steps": KEPT, "copies": KEPT_COPIES}  # as set by keep_lowerings


@dataclass(eq=False)  # compared by identity (its program holds arrays)
class _Kept:
    program: Program
    schedule_hash: str
    chip: Chip
    policy: ExecutionPolicy
    lowered: Lowered
    inputs: tuple[Chip, ExecutionPolicy]  # lowering_inputs(chip, policy)
    structure: tuple[Chip, ExecutionPolicy] | None  # structure_inputs(chip, policy) (None: not repriceable)
    prices: StepPrices | None = None  # what repricing reads, made at the first (reprice.step_prices)
    # what a reset sets back, gathered at the first reuse (a step run once never pays for it)
    rings: list[Ring] | None = None
    busy: bool = False  # a run holds it (its state is that run's)
    raised: bool = False  # its last run raised: copies may still name a waiter


_KEPT: list[_Kept] = []
_VMEM: list[tuple[Program, str, VmemPlan]] = []  # the VMEM plans of recent steps
_LOCK = threading.Lock()  # the store's lists (a run itself holds its step, not the lock)
_KEEP_NEW: contextvars.ContextVar[bool] = contextvars.ContextVar("keep_new_lowerings", default=True)


def step_vmem_plan(program: Program, schedule: Schedule) -> VmemPlan:
    """:func:`tpusim.schedule.vmem.vmem_plan` of ``program`` under ``schedule``, remembered for
    the last few steps (a pure function of the two, keyed as the lowered steps are)."""
    digest = schedule.content_hash()
    with _LOCK:
        for position, (known, known_digest, vmem) in enumerate(_VMEM):
            if known is program and known_digest == digest:
                _VMEM.append(_VMEM.pop(position))
                return vmem
    vmem = vmem_plan(schedule, program.model, program.plan, program.resident_rows, program.kv_sequences)
    with _LOCK:
        _VMEM.append((program, digest, vmem))
        del _VMEM[:-_LIMITS["steps"]]
    return vmem


@contextlib.contextmanager
def lowered_step(program: Program, schedule: Schedule, chip: Chip, policy: ExecutionPolicy,
                 vmem: VmemPlan) -> Iterator[Lowered]:
    """The lowered step for these inputs, in its state as lowered, held for the caller's run
    (``with lowered_step(...) as lowered``) and kept for the next one. A kept step that another
    run holds (another thread) is not shared: this run lowers its own copy, not kept."""
    digest = schedule.content_hash()
    inputs = lowering_inputs(chip, policy)
    structure = structure_inputs(chip, policy) if repriceable(schedule, policy) else None
    similar = None  # a kept step of the same structure, to be priced for these figures
    with _LOCK:
        position, kept = next(((position, kept) for position, kept in enumerate(_KEPT)
                               if kept.program is program and kept.schedule_hash == digest
                               and ((kept.chip is chip and kept.policy == policy) or kept.inputs == inputs)),
                              (-1, None))
        busy = kept is not None and kept.busy
        if kept is None and structure is not None:
            position, similar = next(((position, known) for position, known in enumerate(_KEPT)
                                      if known.program is program and known.schedule_hash == digest
                                      and not known.busy and known.structure == structure), (-1, None))
        if similar is not None:
            similar.busy = True
            _KEPT.append(_KEPT.pop(position))
        elif kept is not None and not busy:
            kept.busy = True
            _KEPT.append(_KEPT.pop(position))  # most recently used last
    if similar is not None:
        if similar.prices is None:
            similar.prices = step_prices(similar.lowered, program, schedule, similar.chip, similar.policy, vmem)
        if reprice(similar.lowered, similar.prices, program, schedule, chip, policy, vmem):
            similar.chip, similar.policy, similar.inputs = chip, policy, inputs
            kept = similar
        else:  # the figures change the pieces themselves: lowered afresh (the kept step is unchanged)
            similar.busy = False
    disposable = False
    if kept is not None and not busy:
        _reset(kept)
    else:
        lowered = lower(program, schedule, chip, policy, vmem)
        disposable = not busy and not _KEEP_NEW.get()
        if busy or disposable:
            kept = None
        else:
            kept = _Kept(program, digest, chip, policy, lowered, inputs, structure, busy=True)
            with _LOCK:
                _KEPT.append(kept)
                _evict()
    held = lowered if kept is None else kept.lowered
    held.runs += 1  # this run's number: every copy's and slab's flag reads clear (module docstring)
    try:
        yield held
    except BaseException:
        if kept is not None:
            kept.raised = True
        raise
    finally:
        if kept is not None:
            kept.busy = False
        elif disposable:
            _dismantle(lowered)


@contextlib.contextmanager
def lowerings_not_kept() -> Iterator[None]:
    """Within (this thread or task): a step not already kept is lowered for its one run and
    dismantled after it, neither kept nor evicting a kept one. For a caller that never runs a
    step twice (a sweep's worker: every candidate is new): a kept step outlives its run, so the
    cyclic collector traverses its tens of thousands of objects when the engine resumes it, and
    again in older generations until the LRU drops it (measured on a budget-300 K3 joint
    sweep's tasks: a sixth of a worker's CPU); dismantled at once, reference counting frees it.
    The results are the same."""
    token = _KEEP_NEW.set(False)
    try:
        yield
    finally:
        _KEEP_NEW.reset(token)


def keep_lowerings(steps: int, copies: int) -> None:
    """Keep up to ``steps`` lowered steps holding at most ``copies`` copies (the defaults:
    ``KEPT``, ``KEPT_COPIES``). A caller that re-simulates more steps in turn than that (a
    calibration's residual walks all its points: the tpu-v5e kernel set is 22 steps, 443,000
    copies) raises both, else the LRU drops each step before its turn comes round again."""
    with _LOCK:
        _LIMITS["steps"], _LIMITS["copies"] = steps, copies


@contextlib.contextmanager
def lowerings_kept(steps: int) -> Iterator[None]:
    """Within: at least ``steps`` lowered steps kept (the copies' limit unchanged), the limits as
    they were after. For a caller that walks ``steps`` steps in turn, again and again (a fit's
    residual over its points): each finds its step kept, reset or repriced, not lowered again."""
    with _LOCK:
        before = _LIMITS["steps"]
        _LIMITS["steps"] = max(before, steps)
    try:
        yield
    finally:
        with _LOCK:  # and the store back within them: the steps kept for the walk go now, not at
            _LIMITS["steps"] = before  # the next lowerings (every full collection would traverse them)
            _evict()


def _evict() -> None:
    """Drop the least recently used steps beyond the limits (the caller holds the lock)."""
    copies = sum(known.lowered.descriptors for known in _KEPT)
    while len(_KEPT) > _LIMITS["steps"] or (copies > _LIMITS["copies"] and len(_KEPT) > 1):
        copies -= _KEPT[0].lowered.descriptors
        _drop(_KEPT.pop(0))


def lowering_inputs(chip: Chip, policy: ExecutionPolicy) -> tuple[Chip, ExecutionPolicy]:
    """What of ``chip`` and ``policy`` lowering reads, for the store's key: everything but the
    copy engine's figures — the HBM (``policy.hbm_bandwidth_bytes_per_s`` is derived from it)
    and the DMA spec, read only by the HBM server (:mod:`tpusim.engine.hbm`) — and the
    calibration's provenance. A policy with a collective pricer hands the pricer the whole
    chip, so there the whole chip is the key."""
    if policy.collective_pricer is not None:
        return chip, policy
    return (chip.model_copy(update={"hbm": None, "dma": None, "calibration": None}),
            dataclasses.replace(policy, hbm_bandwidth_bytes_per_s=0.0))


def structure_inputs(chip: Chip, policy: ExecutionPolicy) -> tuple[Chip, ExecutionPolicy]:
    """What of ``chip`` and ``policy`` the lowered step's structure (its copies, slabs and pieces)
    depends on: :func:`lowering_inputs` less the figures that only price the pieces (the compute
    units, the links), each op's launches (the launch cost) or the run (the per-step and per-layer
    costs). Two steps of equal structure inputs differ only in times, which
    :func:`tpusim.engine.reprice.reprice` writes (or declines, where a time becoming zero or
    nonzero would add or drop a piece)."""
    reduced, reduced_policy = lowering_inputs(chip, policy)
    execution = chip.execution.model_copy(update={
        "launch_overhead_s": None, "per_step_overhead_s": None, "per_layer_overhead_s": None})
    return (reduced.model_copy(update={"compute": [], "links": [], "execution": execution}),
            dataclasses.replace(reduced_policy, launch_overhead_s=0.0, per_step_overhead_s=0.0,
                                per_layer_overhead_s=0.0))


def forget_lowerings() -> None:
    """Empty the store: the next :func:`lowered_step` of any step lowers it afresh (and its
    VMEM plan is computed afresh)."""
    with _LOCK:
        while _KEPT:
            _drop(_KEPT.pop())
        _VMEM.clear()


def _drop(kept: _Kept) -> None:
    """A step leaves the store: dismantled at once unless a run still holds it (the collector
    frees that one later)."""
    if not kept.busy:
        _dismantle(kept.lowered)


def _reset(kept: _Kept) -> None:
    """Set back what a run mutates and the next run's number does not clear (module docstring)."""
    lowered = kept.lowered
    if kept.rings is None:
        kept.rings = list({id(slab.ring): slab.ring for pool in lowered.pools for slab in pool.order}.values())
    if kept.raised:  # a run that raised may have left a waiter on a copy that never landed
        kept.raised = False
        for desc in _copies(lowered):
            desc.waiter = None
    for pool in lowered.pools:
        pool.ptr = 0
        pool.used_bytes = 0
    for ring in kept.rings:
        ring.used = 0


def _copies(lowered: Lowered) -> list[Descriptor]:
    """Every copy of a lowered step: the slabs' and the write-backs."""
    descs = [desc for pool in lowered.pools for slab in pool.order for desc in slab.descs]
    descs.extend(desc for op in lowered.ops for piece in op.pieces for desc in piece.writes if desc.slab is None)
    return descs


def _dismantle(lowered: Lowered) -> None:
    """Break the lowered step's reference cycles (pool <-> slab <-> copy) once it will not run
    again, so reference counting frees it at once: left to the cyclic collector, the tens of
    thousands of objects are traversed again when the engine re-enables it (measured: a tenth
    of a cold K3 step at batch 8)."""
    for pool in lowered.pools:
        for slab in pool.order:
            slab.descs.clear()
        pool.order.clear()
