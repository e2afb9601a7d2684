"""Execution modes: how a chip dispatches a decode step, as one small replaceable policy.

The engine core (lowering, HBM server, compute stream) knows nothing of launch modes; it
asks an :class:`ExecutionPolicy` for the few numbers that differ:

=====================  =========================================  ==========================================
knob                   ``megakernel`` (TPU: one pallas_call)      ``per_op_launch`` (GPU stack, CPU host)
=====================  =========================================  ==========================================
schedule               the user's schedule, as written            :func:`conventional_schedule`: no cross-op
                                                                  prefetch, whole tensors, one buffer each
cross-op prefetch      yes (``prefetch_distance_ops``, experts    no: every copy is issued when its own op
                       at the expert-issue point)                 starts and waited on before it computes
HBM rate               ``hbm.sustained_bandwidth_bytes_per_s``    sustained × ``execution.per_op_efficiency``
compute rate           peak                                       peak × ``per_op_efficiency``
per op                 nothing                                    ``execution.launch_overhead_s``
per step / per layer   ``per_step_overhead_s`` / ``per_layer_``   the same
staging capacity       enforced (``vmem.check_fits``)             not enforced (hardware-managed caches)
=====================  =========================================  ==========================================

The per-op mode is deliberately rough (a conventional serving stack: one kernel per op, each
streaming its own weights, collectives as blocking calls); a full GPU execution model
replaces :func:`execution_policy` without touching the rest of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwmodels.schema import Chip
from tpusim.schedule import SCHEDULE_FAMILIES, FamilySchedule, Schedule

# In-flight copies a conventional stack keeps per op: effectively unbounded (every tensor
# of the op is requested at once, as a kernel's thread blocks do).
CONVENTIONAL_MAX_DMAS_IN_FLIGHT = 64


@dataclass(frozen=True)
class ExecutionPolicy:
    """What the engine needs to know about how a step is dispatched."""

    mode: str
    hbm_bandwidth_bytes_per_s: float
    compute_efficiency: float  # fraction of peak compute reached (1.0 for the megakernel)
    launch_overhead_s: float  # added before every op
    per_step_overhead_s: float
    per_layer_overhead_s: float
    cross_op_prefetch: bool
    enforce_staging_capacity: bool

    def effective_schedule(self, schedule: Schedule) -> Schedule:
        """The schedule the engine actually runs under this execution mode."""
        return schedule if self.cross_op_prefetch else conventional_schedule(schedule)


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


def execution_policy(chip: Chip) -> ExecutionPolicy:
    """The policy for ``chip.execution.mode``."""
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
            cross_op_prefetch=True,
            enforce_staging_capacity=True,
        )
    efficiency = execution.per_op_efficiency.value if execution.per_op_efficiency else 1.0
    efficiency = min(1.0, max(efficiency, 1e-3))
    return ExecutionPolicy(
        mode="per_op_launch",
        hbm_bandwidth_bytes_per_s=sustained * efficiency,
        compute_efficiency=efficiency,
        launch_overhead_s=execution.launch_overhead_s.value,
        per_step_overhead_s=execution.per_step_overhead_s.value,
        per_layer_overhead_s=execution.per_layer_overhead_s.value,
        cross_op_prefetch=False,
        enforce_staging_capacity=False,
    )
