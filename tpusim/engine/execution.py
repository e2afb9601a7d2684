"""Execution modes: how a chip dispatches a decode step, as one small replaceable policy.

The engine core (lowering, HBM server, compute stream) knows nothing of launch modes; it
asks an :class:`ExecutionPolicy` for the few things that differ:

=====================  ==========================  ==========================  ===============================
knob                   ``megakernel`` on a TPU     ``per_op_launch`` on a      GPU chips (three stacks):
                       (one ``pallas_call``)       CPU host (the probe chip)   :mod:`tpusim.engine.gpu`
=====================  ==========================  ==========================  ===============================
schedule               the user's, as written      :func:`conventional_        per kernel: a fused serving
                                                   schedule` (no cross-op      stack's copies; megakernel: the
                                                   prefetch)                   user's, into L2
kernel launches        none                        one per op                  per kernel: the fusion table of
(:class:`KernelPlan`)                                                          :mod:`~tpusim.engine.gpu_fusion`
                                                                               (+ fixed time and ramp:
                                                                               gpu_stack); megakernel: one
HBM rate               sustained                   sustained ×                 per kernel: sustained ×
                                                   ``per_op_efficiency``       ``per_op_efficiency``;
                                                                               megakernel: sustained
compute rate           peak                        peak × efficiency           as the HBM rate
per step / per layer   ``per_step_overhead_s`` / ``per_layer_overhead_s`` (a GPU megakernel's grid barrier)
collectives            per plan stage:             as the TPU                  NCCL per call (+ a launch,
                       latency + bytes/bandwidth                               blocking) or in-kernel per stage;
                                                                               NVLink domain checked
staging capacity       enforced                    not enforced                megakernel: enforced (L2)
=====================  ==========================  ==========================  ===============================

The HBM-rate convention, applied once everywhere: ``hbm.sustained_bandwidth_bytes_per_s`` is
what a long stream of large copies reaches (a DMA ring, a persistent kernel's TMA stream);
``execution.per_op_efficiency`` is the fraction of that rate — and of the matrix unit's peak
— one standalone kernel of a conventional stack reaches. Neither figure may fold in the
other.

:func:`base_policy` builds the two generic modes here; GPU chips refine them in
:func:`tpusim.engine.gpu.gpu_policy`, and :func:`tpusim.engine.policy.execution_policy` picks
one for a chip. This module imports neither (imports point down: ``policy`` → ``gpu`` →
``gpu_fusion`` → ``execution``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hwmodels.schema import Chip
from tpusim.schedule.schema import SCHEDULE_FAMILIES, FamilySchedule, Schedule
from tpusim.workload.program import CollectiveCall, Program

# In-flight copies a conventional stack keeps per op: effectively unbounded (every tensor
# of the op is requested at once, as a kernel's thread blocks do).
CONVENTIONAL_MAX_DMAS_IN_FLIGHT = 64

# (chip, collective call, devices in the system) -> its stages as (link name, seconds)
CollectivePricer = Callable[[Chip, CollectiveCall, int], tuple[tuple[str, float], ...]]


@dataclass(frozen=True)
class KernelPlan:
    """Which kernel every op of a program runs in.

    ``launches[i]`` kernel launches are paid just before op ``i`` starts (0 when op ``i`` is
    fused into a kernel that is already running; more than 1 when the op is several kernels
    in a real stack, e.g. a GEMM and its activation). ``kernel_start[i]`` is the op whose
    start opens the kernel op ``i`` runs in: without cross-op prefetch, that is when op
    ``i``'s weight copies are issued (a fused kernel requests every weight it reads at once).

    Invariants: both tuples have one entry per op; ``kernel_start[i] <= i``.
    """

    launches: tuple[int, ...]
    kernel_start: tuple[int, ...]
    kernel_names: tuple[str, ...] = ()  # per op: what the launches before it are (for traces, docs)
    # per op (or empty: none): seconds the opened kernels cost beyond their launches and the
    # engine's copies and compute — a serving stack's fixed time and ramp per kernel
    fixed_s: tuple[float, ...] = ()
    # per op (or empty: kernel_start): the op whose start issues op i's weight copies. A stack
    # with programmatic dependent launch (PDL) issues a kernel's weight loads in its prologue,
    # which runs under the previous kernel (issue_start[i] <= kernel_start[i])
    issue_start: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.launches) != len(self.kernel_start):
            raise ValueError("KernelPlan: launches and kernel_start differ in length")
        if self.fixed_s and len(self.fixed_s) != len(self.launches):
            raise ValueError("KernelPlan: fixed_s and launches differ in length")
        for index, start in enumerate(self.kernel_start):
            if not 0 <= start <= index:
                raise ValueError(f"KernelPlan: op {index} opens at op {start}, which is not at or before it")
        if self.issue_start and (len(self.issue_start) != len(self.kernel_start) or any(
                not 0 <= issue <= start for issue, start in zip(self.issue_start, self.kernel_start, strict=True))):
            raise ValueError("KernelPlan: issue_start must be one op per op, at or before its kernel_start")

    def issue_op(self, index: int) -> int:
        """The op whose start issues op ``index``'s weight copies (no cross-op prefetch)."""
        return self.issue_start[index] if self.issue_start else self.kernel_start[index]

    @property
    def count(self) -> int:
        """Kernel launches for the ops (collective kernels are counted by the stream)."""
        return sum(self.launches)


def one_kernel_per_op(program: Program) -> KernelPlan:
    """Every op is its own kernel (the CPU host's dispatch loop)."""
    count = len(program.ops)
    return KernelPlan(launches=(1,) * count, kernel_start=tuple(range(count)))


def no_kernel_launches(program: Program) -> KernelPlan:
    """Nothing is launched inside the step (a TPU megakernel: dispatch is in the per-step cost)."""
    count = len(program.ops)
    return KernelPlan(launches=(0,) * count, kernel_start=tuple(range(count)))


@dataclass(frozen=True)
class ExecutionPolicy:
    """What the engine needs to know about how a step is dispatched.

    ``kernel_plan`` maps the program to its kernels; each launch costs ``launch_overhead_s``.
    ``collective_launches`` adds one launch before every collective call (an NCCL kernel);
    ``collectives_block`` runs even the plan's overlapped collectives on the compute stream
    (a conventional stack issues NCCL in order); ``collective_pricer`` replaces the per-stage
    pricing of :func:`tpusim.engine.costs.collective_stage_s` (``None`` keeps it);
    ``conventional`` is the schedule a mode without cross-op prefetch runs instead of the
    user's.
    """

    mode: str
    hbm_bandwidth_bytes_per_s: float
    compute_efficiency: float  # fraction of peak compute reached (1.0 for the megakernel)
    launch_overhead_s: float  # seconds per kernel launch
    per_step_overhead_s: float
    per_layer_overhead_s: float
    cross_op_prefetch: bool
    enforce_staging_capacity: bool
    kernel_plan: Callable[[Program], KernelPlan] = no_kernel_launches
    collective_launches: bool = False
    collectives_block: bool = False
    collective_pricer: CollectivePricer | None = None
    conventional: Callable[[Schedule], Schedule] | None = None
    description: str = ""
    # program -> named per-step seconds that grow with the batch (a GPU serving stack's
    # tpusim.engine.gpu_batch terms), paid on the stream with the per-step cost
    step_terms: Callable[[Program], dict[str, float]] | None = None
    # panels a TPU kernel's panel loop issues per iteration (streamed dense tensors, routed
    # experts' parts; tpusim.schedule.kernel_layout.PANEL_UNROLL): the panels in flight share one
    # MXU round trip, so each product's fixed cost (``dot_overhead_s``, measured one panel an
    # iteration) is divided by them. (1, 1): one panel an iteration, what the probe measured.
    panel_unroll: tuple[int, int] = (1, 1)
    # where the stream pays per_layer_overhead_s (hwmodels.schema.Execution.per_layer_overhead_at)
    per_layer_overhead_at: str = "layer_start"

    def effective_schedule(self, schedule: Schedule) -> Schedule:
        """The schedule the engine actually runs under this execution mode."""
        if self.cross_op_prefetch:
            return schedule
        return (self.conventional or conventional_schedule)(schedule)


def conventional_schedule(schedule: Schedule) -> Schedule:
    """A per-op-launch stack's copies: each op fetches its own whole tensors when it starts.

    KV tiling is kept from ``schedule`` (an attention kernel streams its cache in tiles).
    """
    families = {name: FamilySchedule(prefetch_distance_ops=0, buffers=1) for name in SCHEDULE_FAMILIES}
    return Schedule(
        name=f"{schedule.name} (per-op launch)",
        description="conventional stack: no cross-op prefetch",
        families=families,
        max_dmas_in_flight=CONVENTIONAL_MAX_DMAS_IN_FLIGHT,
        expert_issue="after_routing",
        kv_tile_tokens=schedule.kv_tile_tokens,
        kv_buffers=schedule.kv_buffers,
    )


def per_op_efficiency(chip: Chip) -> float:
    """``execution.per_op_efficiency`` clamped to (0, 1] (1.0 when the chip gives none)."""
    figure = chip.execution.per_op_efficiency
    return min(1.0, max(figure.value if figure else 1.0, 1e-3))


def base_policy(chip: Chip) -> ExecutionPolicy:
    """The TPU / host-CPU policy for ``chip.execution.mode``; GPU policies refine it."""
    execution = chip.execution
    sustained = chip.hbm.sustained_bandwidth_bytes_per_s.value
    if execution.mode == "megakernel":
        return ExecutionPolicy(
            mode="megakernel",
            hbm_bandwidth_bytes_per_s=sustained,
            compute_efficiency=1.0,
            launch_overhead_s=0.0,
            per_step_overhead_s=execution.per_step_overhead_s.value,
            per_layer_overhead_s=execution.per_layer_overhead_s.value,
            per_layer_overhead_at=execution.per_layer_overhead_at,
            cross_op_prefetch=True,
            enforce_staging_capacity=True,
            kernel_plan=no_kernel_launches,
            description="one persistent kernel per step; dispatch is in the per-step cost",
        )
    efficiency = per_op_efficiency(chip)
    return ExecutionPolicy(
        mode="per_op_launch",
        hbm_bandwidth_bytes_per_s=sustained * efficiency,
        compute_efficiency=efficiency,
        launch_overhead_s=execution.launch_overhead_s.value,
        per_step_overhead_s=execution.per_step_overhead_s.value,
        per_layer_overhead_s=execution.per_layer_overhead_s.value,
        cross_op_prefetch=False,
        enforce_staging_capacity=False,
        kernel_plan=one_kernel_per_op,
        description="one dispatch per op, no cross-op prefetch",
    )
