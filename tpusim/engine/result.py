"""What a simulation returns: :class:`SimResult`.

Every time is in seconds and every size in bytes (convert at the edges: the CLI prints
milliseconds). The numbers are *simulated*: label them so wherever they are shown.

Definitions:

- ``step_s`` — from the start of the step (per-step overhead included) until the compute
  stream has finished the last op and every copy and collective it started has completed.
- ``tokens_per_s`` — ``batch / step_s`` (aggregate over the batch).
- ``exposed_dma_s`` — time the compute stream spent waiting for copies to land.
- ``dma_busy_s`` — time with at least one copy in flight (issue latency included).
- ``overlap_fraction`` — ``1 - exposed_dma_s / dma_busy_s``: the share of copy time hidden
  behind compute (1.0 when nothing was exposed or nothing was copied).
- ``busy_fraction`` — per resource, busy time / ``step_s``: ``hbm`` (any copy in flight),
  ``mxu``, ``vpu``, and ``link.<name>`` for every link a collective used.
- ``breakdown_s`` — the step split by what the compute stream was doing; the values sum to
  ``step_s``: compute per phase (``attention``, ``moe``, ``mlp``, ``head``), ``collectives``
  (blocking collectives and waits for overlapped ones), ``fixed_overheads`` (per step, per
  layer, kernel launches), ``exposed_dma`` and ``drain`` (copies/collectives still finishing
  after the last op).
- ``launch_s`` / ``launch_count`` — the kernel-launch part of ``fixed_overheads`` and how many
  launches it paid for (per-op kernels, NCCL kernels, a GPU megakernel's one launch; 0 on a
  TPU megakernel, whose dispatch is in the per-step cost).
- ``kernel_fixed_s`` — the part of ``fixed_overheads`` a GPU serving stack's kernels cost
  beyond their launches (fixed time and bandwidth ramp per kernel, :mod:`tpusim.engine.gpu_stack`).
- ``op_time_s`` — per op of the program (in order), stream time from its start (its
  launches and kernel fixed time included) to its end (its collectives included); with the
  per-step and per-layer costs and the drain they sum to ``step_s``.
- ``layer_s`` — stream time per layer (``-1`` is the head), from the layer's first op
  (its per-layer overhead included) to the next layer's; with the per-step overhead and the
  drain they sum to ``step_s``.
- ``vmem_peak_bytes`` / ``vmem_peak_time_s`` / ``vmem_peak_layer`` — the highest dynamic
  VMEM occupancy (activations + resident buffers), when it was first reached and which layer
  the compute stream was in.
- ``words`` — the chip's names for the generic resources: ``staging`` (what the ``vmem_*``
  fields measure: VMEM on a TPU, L2 or shared memory on a GPU), ``mxu`` and ``vpu`` (the
  ``busy_fraction`` keys: MXU/VPU on a TPU, tensor cores / CUDA cores on a GPU).
- ``event_count`` — entries the engine queued on its event loop (:mod:`tpusim.engine.loop`):
  a diagnostic of the engine's own cost, not a simulated result. It drops when the engine
  stops queueing events that change no time (since issue 26 the compute stream is no SimPy
  process, so its end is not an event; since issue 49 a turn taken running ahead, with nothing
  else due before it, makes no entry: :mod:`tpusim.engine.loop`); compare results without it.
- ``events`` — with ``record_events``: the ordered kernel-vocabulary event list
  ``("dma_start", family, tensor, layer, chunk)``, ``("dma_wait", family, tensor, layer,
  chunk)``, ``("compute", op_name, layer)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpusim.engine.timeline import Timeline

PHASES = ("attention", "moe", "mlp", "head")
BREAKDOWN_KEYS = (*PHASES, "collectives", "fixed_overheads", "exposed_dma", "drain")


@dataclass(frozen=True)
class SimResult:
    """One simulated decode step (see the module docstring for every definition)."""

    step_s: float
    batch: int
    tokens_per_s: float
    exposed_dma_s: float
    dma_busy_s: float
    overlap_fraction: float
    vmem_peak_bytes: int
    vmem_peak_time_s: float
    vmem_peak_layer: int | None
    vmem_static_bytes: int
    vmem_capacity_bytes: float
    busy_fraction: dict[str, float]
    breakdown_s: dict[str, float]
    layer_s: dict[int, float]
    exposed_dma_by_family_s: dict[str, float]
    dma_count: int
    dma_bytes: int
    event_count: int
    schedule_name: str
    schedule_hash: str
    execution_mode: str
    timeline: Timeline | None = field(default=None, compare=False, repr=False)
    events: list[tuple[Any, ...]] | None = field(default=None, compare=False, repr=False)
    launch_s: float = 0.0
    launch_count: int = 0
    kernel_fixed_s: float = 0.0
    op_time_s: tuple[float, ...] = ()
    # The chip's words for the generic resources (hwmodels.schema.Chip.words): "staging" is
    # what the vmem_* fields measure (VMEM on a TPU, L2 / shared memory on a GPU), "mxu" and
    # "vpu" the busy_fraction keys (MXU/VPU on a TPU, tensor/CUDA cores on a GPU).
    words: dict[str, str] = field(default_factory=lambda: {"staging": "VMEM", "mxu": "MXU", "vpu": "VPU"})
    # the part of fixed_overheads that grows with the batch on a GPU serving stack, by
    # mechanism (tpusim.engine.gpu_batch.batch_terms; empty elsewhere)
    batch_terms_s: dict[str, float] = field(default_factory=dict)

    @property
    def step_ms(self) -> float:
        return self.step_s * 1e3

    @property
    def breakdown(self) -> dict[str, float]:
        """Alias of ``breakdown_s`` (seconds), for callers that predate the unit suffix."""
        return self.breakdown_s

    def summary(self) -> dict[str, Any]:
        """The scalar results as a plain dict (seconds and bytes; no timeline, no events)."""
        return {
            "step_s": self.step_s,
            "batch": self.batch,
            "tokens_per_s": self.tokens_per_s,
            "exposed_dma_s": self.exposed_dma_s,
            "dma_busy_s": self.dma_busy_s,
            "overlap_fraction": self.overlap_fraction,
            "vmem_peak_bytes": self.vmem_peak_bytes,
            "vmem_peak_time_s": self.vmem_peak_time_s,
            "vmem_peak_layer": self.vmem_peak_layer,
            "vmem_static_bytes": self.vmem_static_bytes,
            "vmem_capacity_bytes": self.vmem_capacity_bytes,
            "busy_fraction": dict(self.busy_fraction),
            "breakdown_s": dict(self.breakdown_s),
            "layer_s": {str(layer): value for layer, value in self.layer_s.items()},
            "exposed_dma_by_family_s": dict(self.exposed_dma_by_family_s),
            "dma_count": self.dma_count,
            "dma_bytes": self.dma_bytes,
            "event_count": self.event_count,
            "schedule_name": self.schedule_name,
            "schedule_hash": self.schedule_hash,
            "execution_mode": self.execution_mode,
            "launch_s": self.launch_s,
            "launch_count": self.launch_count,
            "kernel_fixed_s": self.kernel_fixed_s,
            "batch_terms_s": dict(self.batch_terms_s),
            "words": dict(self.words),
        }
