"""``simulate``: wire the resources together, run SimPy, collect a :class:`SimResult`.

Steps of :func:`simulate`:

1. Pick the execution policy for the chip (:mod:`tpusim.engine.execution`) and the schedule
   it runs (the user's, or a conventional one for per-op launch).
2. Size the static VMEM scratch with :func:`tpusim.schedule.vmem.vmem_plan`; when the policy enforces
   it, :func:`tpusim.schedule.vmem.check_fits` against the chip's usable staging memory. An overflow
   is diagnosed by a second simulation with the check off that watches the dynamic
   occupancy, and re-raised as :class:`VmemOverflow` (an
   :class:`~tpusim.schedule.vmem.InfeasibleSchedule`) naming the moment, the layer and the buffers.
3. Lower program + schedule into copies, buffers and compute pieces
   (:mod:`tpusim.engine.build`), or reset the same step kept from an earlier run
   (:mod:`tpusim.engine.reuse`).
4. Build the event loop (:mod:`tpusim.engine.loop`: SimPy's environment and queue, with
   lean callbacks), the HBM server (:mod:`tpusim.engine.hbm`), the staging memory
   (:mod:`tpusim.engine.staging`), the links and the compute stream
   (:mod:`tpusim.engine.stream`, a generator the loop drives as SimPy would a process), and
   run until no event is left.
5. Turn the accounts into a :class:`~tpusim.engine.result.SimResult`.

Determinism: the loop orders simultaneous events by (time, priority, insertion), as SimPy
does, and queues each at the moment SimPy would (:mod:`tpusim.engine.loop`); every other
order in the engine is explicit (copies by consumption sequence, pools by admission order,
dicts by insertion), so equal inputs give identical results and event lists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hwmodels.schema import Chip
from hwmodels.units import MIB
from tpusim.collector import collector_paused
from tpusim.engine.execution import ExecutionPolicy
from tpusim.engine.hbm import HbmServer
from tpusim.engine.items import MXU, VPU, Slab
from tpusim.engine.loop import Driver, EventLoop
from tpusim.engine.policy import execution_policy
from tpusim.engine.result import PHASES, SimResult
from tpusim.engine.reuse import lowered_step, step_vmem_plan
from tpusim.engine.staging import StagingMemory
from tpusim.engine.stream import Links, StreamAccount, compute_stream
from tpusim.engine.timeline import Recorder
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import InfeasibleSchedule, VmemPlan, check_fits
from tpusim.workload.program import Program

HOLDINGS_SHOWN = 4


class VmemOverflow(InfeasibleSchedule):
    """A schedule whose buffers do not fit on-chip memory, with when and where it overflows.

    ``time_s`` / ``layer`` / ``op`` say when the dynamic occupancy first crosses the usable
    capacity (``None`` when only the static arenas overflow); ``buffers`` lists the pools
    and what they hold at that moment (or the static arenas).
    """

    def __init__(self, message: str, *, time_s: float | None, layer: int | None, op: str | None,
                 buffers: dict[str, list[str]]) -> None:
        super().__init__(message)
        self.time_s = time_s
        self.layer = layer
        self.op = op
        self.buffers = buffers


def simulate(program: Program, schedule: Schedule, chip: Chip, *, record_timeline: bool = False,
             record_events: bool = False, check_capacity: bool = True, event_by_event: bool = False,
             panel_unroll: tuple[int, int] | None = None) -> SimResult:
    """Simulate one decode step of ``program`` under ``schedule`` on ``chip``.

    ``record_timeline`` attaches per-resource intervals and the VMEM curve
    (``result.timeline``) and the kernel-vocabulary event list (``result.events``);
    ``record_events`` records only the event list. Both are off on the fast path.
    Raises :class:`VmemOverflow` (an :class:`~tpusim.schedule.vmem.InfeasibleSchedule`) when the
    schedule's buffers do not fit the chip's usable on-chip memory, unless ``check_capacity`` is
    False: a step that was *measured* ran on its hardware whatever our accounting says (another
    kernel's layout, e.g. the published Muse kernel's unpublished receive slots), so
    calibration predicts it without the static check and reports the disagreement
    (``result.vmem_static_bytes`` against ``result.vmem_capacity_bytes``).
    ``event_by_event`` runs the reference loop: one queue entry per piece and per copy event,
    no running ahead (:mod:`tpusim.engine.loop`); every result but ``event_count`` is the same.
    ``panel_unroll``: the TPU kernel build's panels an iteration (dense, experts; see
    :class:`~tpusim.engine.execution.ExecutionPolicy`), e.g. a measured record's; None: (1, 1).
    """
    policy = execution_policy(chip)
    if panel_unroll is not None and tuple(panel_unroll) != policy.panel_unroll:
        if min(panel_unroll) < 1:
            raise ValueError(f"panel_unroll {panel_unroll}: panels an iteration must be >= 1")
        policy = dataclasses.replace(policy, panel_unroll=(int(panel_unroll[0]), int(panel_unroll[1])))
    terms = policy.step_terms(program) if policy.step_terms is not None else {}
    if terms:  # serial per-step time: the stream pays it with the per-step cost
        policy = dataclasses.replace(policy, per_step_overhead_s=policy.per_step_overhead_s + sum(terms.values()))
    effective = policy.effective_schedule(schedule)
    vmem = step_vmem_plan(program, effective)  # vmem_plan, remembered for the same step
    capacity = chip.staging_memory.usable_bytes
    if policy.enforce_staging_capacity and check_capacity:
        try:
            check_fits(vmem, capacity)
        except InfeasibleSchedule as error:
            raise _diagnose(str(error), program, schedule, effective, chip, policy, vmem, capacity) from None
    with collector_paused():
        run = _execute(program, effective, chip, policy, vmem, record_timeline=record_timeline,
                       record_events=record_events or record_timeline, event_by_event=event_by_event)
        result = _collect(run, program, schedule, policy, vmem, capacity)
        del run  # its loop, queues and accounts (and a step not kept) go by reference counting, not the collector
    return dataclasses.replace(result, words=chip.words, batch_terms_s=terms)


@dataclass
class _Run:
    """The resources of one finished simulation, before they are summarised."""

    env: EventLoop
    hbm: HbmServer
    staging: StagingMemory
    account: StreamAccount
    recorder: Recorder | None
    events: list[tuple[Any, ...]] | None


def _execute(program: Program, effective: Schedule, chip: Chip, policy: ExecutionPolicy, vmem: VmemPlan, *,
             record_timeline: bool, record_events: bool, watch_bytes: float | None = None,
             event_by_event: bool = False) -> _Run:
    """Steps 3-4 of :func:`simulate`: lower, wire the resources, run SimPy to the end."""
    with lowered_step(program, effective, chip, policy, vmem) as lowered:  # kept: reset, not rebuilt, next time
        env = EventLoop(run_ahead=not event_by_event)
        recorder = Recorder() if record_timeline else None
        events: list[tuple[Any, ...]] | None = [] if record_events else None
        hbm = HbmServer(env, policy.hbm_bandwidth_bytes_per_s, chip.dma, effective.max_dmas_in_flight,
                        _no_staging_yet, recorder, events, lowered.runs)
        staging = StagingMemory(env, lowered.base_bytes, hbm, recorder, watch_bytes, lowered.runs)
        hbm.on_free = staging.free
        account = StreamAccount()
        stream = Driver(env)
        stream.start(compute_stream(
            env, stream, lowered, hbm, staging, Links(recorder, solo=not event_by_event), account,
            per_step_s=policy.per_step_overhead_s, per_layer_s=policy.per_layer_overhead_s,
            per_layer_each_op=policy.per_layer_overhead_at == "each_op", recorder=recorder, events=events,
        ))
        env.run()
        env.ran_ahead += hbm.turns_ahead  # (the server counts its own: one attribute write per step)
        if stream.alive:  # cannot happen with in-order pools; kept as a loud guard
            raise RuntimeError(
                f"engine stalled at t={env.now:.9f} s in op {staging.current_op} (layer "
                f"{staging.current_layer}): {staging.used_bytes} B resident, {hbm.in_flight} copies in flight"
            )
    return _Run(env, hbm, staging, account, recorder, events)


def _no_staging_yet(slab: Slab) -> None:
    raise RuntimeError(f"a landing freed {slab.label} before the staging memory was wired")


def _collect(run: _Run, program: Program, schedule: Schedule, policy: ExecutionPolicy, vmem: VmemPlan,
             capacity: float) -> SimResult:
    """Step 5 of :func:`simulate`: the accounts as a :class:`SimResult`."""
    account, hbm, staging = run.account, run.hbm, run.staging
    step_s = max(account.stream_end_s, hbm.last_land_s, account.overlapped_end_s)
    breakdown = {phase: account.compute_by_phase.get(phase, 0.0) for phase in PHASES}
    for phase, value in account.compute_by_phase.items():
        breakdown.setdefault(phase, value)
    breakdown.update(
        collectives=account.collective_s,
        fixed_overheads=account.fixed_s,
        exposed_dma=account.exposed_dma_s,
        drain=step_s - account.stream_end_s,
    )
    layer_s: dict[int, float] = {}
    starts = account.layer_start_s
    for position, (layer, start) in enumerate(starts):
        end = starts[position + 1][1] if position + 1 < len(starts) else account.stream_end_s
        layer_s[layer] = layer_s.get(layer, 0.0) + (end - start)
    busy = {"hbm": hbm.busy_s, "mxu": account.unit_busy[MXU], "vpu": account.unit_busy[VPU]}
    busy.update({f"link.{name}": value for name, value in sorted(account.link_busy.items())})
    busy_fraction = {key: (value / step_s if step_s > 0 else 0.0) for key, value in busy.items()}
    overlap = 1.0 - account.exposed_dma_s / hbm.busy_s if hbm.busy_s > 0 else 1.0
    timeline = None
    if run.recorder is not None:
        timeline = run.recorder.timeline
        timeline.step_s = step_s
        timeline.vmem_capacity_bytes = capacity
    return SimResult(
        step_s=step_s,
        batch=program.batch,
        tokens_per_s=program.batch / step_s if step_s > 0 else float("inf"),
        exposed_dma_s=account.exposed_dma_s,
        dma_busy_s=hbm.busy_s,
        overlap_fraction=min(1.0, max(0.0, overlap)),
        vmem_peak_bytes=staging.peak_bytes,
        vmem_peak_time_s=staging.peak_s,
        vmem_peak_layer=staging.peak_layer,
        vmem_static_bytes=vmem.total_bytes,
        vmem_capacity_bytes=capacity,
        busy_fraction=busy_fraction,
        breakdown_s=breakdown,
        layer_s=layer_s,
        exposed_dma_by_family_s=dict(sorted(account.exposed_by_family.items())),
        dma_count=hbm.issued,
        dma_bytes=hbm.bytes_moved,
        event_count=run.env.scheduled,
        schedule_name=schedule.name,
        schedule_hash=schedule.content_hash(),
        execution_mode=policy.mode,
        launch_s=account.launch_s,
        launch_count=account.launch_count,
        kernel_fixed_s=account.kernel_fixed_s,
        op_time_s=tuple(account.op_time_s),
        timeline=timeline,
        events=run.events,
    )


def _summarise_holdings(holdings: dict[str, list[str]]) -> str:
    """``pool MiB [labels]`` per pool, largest first (at most HOLDINGS_SHOWN labels each)."""
    parts = []
    sized = [(pool, items, sum(int(item.rsplit(":", 1)[1]) for item in items)) for pool, items in holdings.items()]
    for pool, items, total in sorted(sized, key=lambda entry: (-entry[2], entry[0])):
        labels = list(dict.fromkeys(item.rsplit(":", 1)[0] for item in items))
        shown = ", ".join(labels[:HOLDINGS_SHOWN])
        more = f" +{len(labels) - HOLDINGS_SHOWN} more" if len(labels) > HOLDINGS_SHOWN else ""
        parts.append(f"{pool} {total / MIB:.2f} MiB [{shown}{more}]")
    return "; ".join(parts)


def _where(layer: int | None) -> str:
    return "the head" if layer == -1 else f"layer {layer}"


def _diagnose(static_message: str, program: Program, schedule: Schedule, effective: Schedule, chip: Chip,
              policy: ExecutionPolicy, vmem: VmemPlan, capacity: float) -> VmemOverflow:
    """Re-run without the capacity limit to find when and where occupancy overflows.

    If the buffers in use at once ever exceed ``capacity``, the error names the first such
    moment and what was resident; otherwise only the static arenas overflow, and it names
    the moment of peak use and what was resident then.
    """
    arenas = {name: [f"{'+'.join(vmem.arena_members.get(name, [name]))}:{size}"]
              for name, size in vmem.arena_bytes.items()}
    prefix = f"schedule {schedule.name!r}"
    try:
        staging = _execute(program, effective, chip, policy, vmem, record_timeline=False, record_events=False,
                           watch_bytes=capacity).staging
    except Exception as error:  # the diagnosis must never hide the original problem
        return VmemOverflow(f"{prefix}: {static_message} (dynamic diagnosis failed: {error})",
                            time_s=None, layer=None, op=None, buffers=arenas)
    if staging.crossing is not None:
        time_s, layer, op, holdings = staging.crossing
        dynamic = (f"occupancy first exceeds {capacity / MIB:.2f} MiB at t={time_s * 1e3:.4f} ms in "
                   f"{_where(layer)} (op {op}), holding {_summarise_holdings(holdings)}")
        return VmemOverflow(f"{prefix}: {dynamic}; {static_message}",
                            time_s=time_s, layer=layer, op=op, buffers=holdings)
    dynamic = (f"the static arenas overflow; the buffers in use at once peak at "
               f"{staging.peak_bytes / MIB:.2f} MiB at t={staging.peak_s * 1e3:.4f} ms in "
               f"{_where(staging.peak_layer)} (op {staging.peak_op}), holding "
               f"{_summarise_holdings(staging.peak_holdings)}")
    return VmemOverflow(f"{prefix}: {static_message}; {dynamic}", time_s=staging.peak_s,
                        layer=staging.peak_layer, op=staging.peak_op, buffers=staging.peak_holdings)
