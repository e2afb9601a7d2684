"""Lower the megakernel for TPU from any machine, and compare its VMEM scratch with the
simulator's accounting.

Lowering traces the kernel with ``jax.ShapeDtypeStruct`` inputs (nothing is allocated, so
the full Kimi K3 per-device sizes of the TP32 plan lower on a laptop) and asks JAX for the
TPU lowering: Pallas → Mosaic, ending in one ``tpu_custom_call``. It proves that every op
of the kernel has a Mosaic lowering rule for this schedule and these shapes; it does not run
libtpu's Mosaic compiler, so tiling or layout limits surface only on a real TPU. Collectives
are omitted (see :mod:`megakernel.dims`).

The kernel's VMEM scratch (:meth:`megakernel.kernel.Megakernel.scratch_bytes`: arenas, KV
tiles, states, activations) is set beside :func:`tpusim.schedule.vmem.vmem_plan`, the static
accounting the simulator and the sweep use; the two are computed independently.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from megakernel.dims import model_dims
from megakernel.kernel import Megakernel
from megakernel.reference import DecodeState
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.sharding import ShardingPlan


def lower_for_tpu(kernel: Megakernel) -> str:
    """The StableHLO text of one decode step lowered for TPU (inputs are shapes only)."""
    sds = jax.ShapeDtypeStruct
    dims = kernel.dims
    hbm = {name: sds(shape, jnp.uint16) for name, shape in kernel.hbm_shapes().items()}
    states = kernel.state_shapes()
    state = DecodeState(states["state.kda"], states["state.conv"], states["state.kv"], sds((), jnp.int32))
    embedding = sds((dims.vocab_rows, dims.hidden), jnp.bfloat16)
    tokens = sds((kernel.batch,), jnp.int32)
    lowered = jax.jit(kernel.step).trace(hbm, embedding, state, tokens).lower(lowering_platforms=("tpu",))
    return lowered.as_text()


@dataclass(frozen=True)
class LoweringReport:
    """What lowering one (model, plan, schedule, batch) for TPU showed, sizes in bytes."""

    model: str
    plan: str
    devices: int
    schedule: str
    batch: int
    lowered: bool  # the lowering ends in a Mosaic tpu_custom_call
    scratch_bytes: dict[str, int]  # the kernel's VMEM scratch by group
    accounting_bytes: dict[str, int]  # tpusim.schedule.vmem's static accounting by part

    @property
    def scratch_total_bytes(self) -> int:
        return sum(self.scratch_bytes.values())

    @property
    def accounting_total_bytes(self) -> int:
        return sum(self.accounting_bytes.values())

    @property
    def relative_difference(self) -> float:
        """(kernel − accounting) / accounting."""
        return (self.scratch_total_bytes - self.accounting_total_bytes) / self.accounting_total_bytes


def lower_schedule(model: ModelConfig, plan: ShardingPlan, schedule: Schedule, *, batch: int,
                   max_context: int) -> LoweringReport:
    """Build the kernel at ``plan``'s per-device sizes and lower it for TPU.

    Raises :class:`megakernel.dims.UnsupportedModel` for a model the K3 kernel does not
    implement and :class:`megakernel.dma_plan.UnsupportedSchedule` for a schedule it cannot
    follow (both say why).
    """
    kernel = Megakernel(model_dims(model, plan), schedule, batch, max_context)
    text = lower_for_tpu(kernel)
    vmem = vmem_plan(schedule, model, plan, batch)
    accounting = {f"arena.{pool}": size for pool, size in vmem.arena_bytes.items()}
    accounting.update(kv_tiles=vmem.kv_bytes, states=vmem.state_bytes, activations=vmem.activation_bytes)
    return LoweringReport(model=model.name, plan=plan.name, devices=plan.devices, schedule=schedule.name,
                          batch=batch, lowered="tpu_custom_call" in text,
                          scratch_bytes=kernel.scratch_bytes(), accounting_bytes=accounting)
