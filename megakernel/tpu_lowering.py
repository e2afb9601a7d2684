"""Lower the megakernel for TPU from any machine, and compare its VMEM scratch with the
simulator's accounting.

Lowering traces the kernel with ``jax.ShapeDtypeStruct`` inputs (nothing is allocated, so
the full Kimi K3 per-device sizes of the TP32 plan lower on a laptop) and asks JAX for the
TPU lowering: Pallas → Mosaic, ending in one ``tpu_custom_call``. It proves that every op
of the kernel has a Mosaic lowering rule for this schedule and these shapes; it does not run
libtpu's Mosaic compiler. :mod:`megakernel.mosaic_compile` does (with libtpu installed, on
compile-only devices, no TPU needed), so tiling, alignment and VMEM limits surface there.

On a multi-device plan the kernel is :class:`megakernel.kernel_collectives.CollectiveMegakernel`
under ``jax.shard_map`` over the plan's mesh, with the plan's collectives as remote copies
inside it; the process needs ``plan.devices`` JAX devices (on a CPU:
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX starts, as
``python -m megakernel.commands.lower_check`` does). On one device there are no collectives.

The kernel's VMEM scratch (:meth:`megakernel.kernel.Megakernel.scratch_bytes`: arenas, KV
tiles, states, activations, working scratch, collective send/receive buffers) is set beside
:func:`tpusim.schedule.vmem.vmem_plan`'s ``total_bytes``, the one VMEM figure the simulator,
the sweep and compare check; the two are computed independently and agree byte for byte on
the K3 kernel (``tests/test_vmem_truth.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from megakernel.dims import model_dims
from megakernel.kernel import Megakernel
from megakernel.kernel_collectives import CollectiveMegakernel
from megakernel.reference import DecodeState
from tpusim.schedule.kernel_layout import vmem_array_bytes
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


def communicates(text: str) -> bool:
    """The lowered Mosaic call says it talks to other devices: Pallas sets ``has_communication``
    in the ``tpu_custom_call``'s config when the kernel has remote copies or remote semaphore
    signals (the kernel body itself is serialized MLIR bytecode, not searchable text)."""
    return re.search(r'has_communication(\\22|")\s*:\s*true', text) is not None


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
    collectives: bool = False  # the plan's collectives are inside the kernel (remote copies)
    remote_copies_per_layer: int = 0  # remote copies one MoE layer of the kernel issues
    scratch_tiled_bytes: int = 0  # the scratch as Mosaic tiles it (kernel_layout.vmem_array_bytes)

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
                   max_context: int, kernel: Megakernel | None = None) -> LoweringReport:
    """Build the kernel at ``plan``'s per-device sizes and lower it for TPU (on a multi-device
    plan: with its collectives, over a mesh of ``plan.devices`` JAX devices).

    Raises :class:`megakernel.dims.UnsupportedModel` for a model the K3 kernel does not
    implement, :class:`megakernel.dma_plan.UnsupportedSchedule` for a schedule it cannot
    follow and :class:`megakernel.collective_plan.UnsupportedPlan` for collectives it does not
    run (all say why). ``kernel``: the kernel to lower, when the caller built it (to read its
    trace-time log afterwards); else built here.
    """
    copies = 0
    if plan.devices > 1:
        kernel = kernel or CollectiveMegakernel(model, plan, schedule, batch, max_context)
        assert isinstance(kernel, CollectiveMegakernel)
        text = kernel.lower_for_tpu()
        copies = kernel.remote_copies_per_layer()
        present = communicates(text) and copies > 0
    else:
        kernel = kernel or Megakernel(model_dims(model, plan), schedule, batch, max_context)
        text = lower_for_tpu(kernel)
        present = False
    return lowering_report(model, plan, schedule, batch, kernel, lowered="tpu_custom_call" in text,
                           collectives=present, remote_copies_per_layer=copies)


def lowering_report(model: ModelConfig, plan: ShardingPlan, schedule: Schedule, batch: int, kernel: Megakernel,
                    *, lowered: bool, collectives: bool = False, remote_copies_per_layer: int = 0) -> LoweringReport:
    """The report for ``kernel``: its VMEM scratch by group beside the simulator's accounting
    (also for :mod:`megakernel.mosaic_compile`, which lowers and compiles in one go)."""
    accounting = vmem_plan(schedule, model, plan, batch).parts()
    scratch: dict[str, int] = {}
    for name, size in kernel.scratch_bytes().items():
        key = "collectives" if name.startswith("coll.") else name
        scratch[key] = scratch.get(key, 0) + size
    return LoweringReport(model=model.name, plan=plan.name, devices=plan.devices, schedule=schedule.name,
                          batch=batch, lowered=lowered, scratch_bytes=scratch, accounting_bytes=accounting,
                          collectives=collectives, remote_copies_per_layer=remote_copies_per_layer,
                          scratch_tiled_bytes=sum(vmem_array_bytes(shape, size) for _, shape, size in kernel.vmem_scratch()))
