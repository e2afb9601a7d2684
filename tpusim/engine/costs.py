"""Cost formulas of the engine: how long one piece of work occupies one resource.

Pure functions of the chip description, no state. The engine calls them once per op or
slab while lowering a program (see :mod:`tpusim.engine.build`); nothing here runs
inside the event loop.

Matrix unit (MXU / tensor cores), for a matmul ``x[M, K] @ W[K, N]``::

    flop term  = 2 * pad(M) * K * N / peak(dtype)     pad(M) = M rounded up to row_pad
    push term  = ceil(K / tile_rows) * ceil(N / tile_cols) * weight_push_s_per_tile
    time       = max(flop term, push term)

The batch rows pad to the unit's ``row_pad`` (TPU MXU: the 8-row sublane tile, because LHS
rows stream through a loaded weight tile one per cycle; GPU tensor cores: the MMA M
dimension, 64), and every ``tile_rows x tile_cols`` weight tile has to be pushed into the
array once: at decode batch sizes the push term binds on TPUs. A chip without a published push cost (GPUs) has a zero push term. The dtype is the
op's: the MXU dtype of its first weight tensor, else bf16 — the same convention as
:func:`tpusim.workload.floors.floors`, so a simulated op is never cheaper than its floor.

Vector unit (VPU / CUDA cores): ``vector_flops / peak(f32)``.

Collective stage on a link::

    time = link.collective_stage_latency_s + payload_bytes_per_peer * peers / bandwidth

with ``bandwidth = link.bandwidth_bytes_per_s_per_direction`` (already the per-device
aggregate over ``links_per_device``; not multiplied again). A plan stage names a link
(``sibling``, ``ici``, ``nvlink``, ...); :func:`tpusim.workload.floors.link_for` maps it onto the
chip's links with fallbacks (``ici`` → NVLink on a GPU, ``sibling`` → ICI on a chip without
a sibling core). A stage whose link the chip lacks entirely costs nothing (a one-device
system has no peers to talk to).
"""

from __future__ import annotations

import math

from hwmodels.schema import Chip, ComputeUnit, LinkSpec
from tpusim.workload.floors import link_for
from tpusim.workload.program import Op
from tpusim.workload.sharding import CollectiveStage

VECTOR_DTYPE = "f32"


def op_matmul_dtype(op: Op) -> str:
    """The dtype the matrix unit runs ``op`` at (:attr:`tpusim.workload.program.Op.matmul_dtype`)."""
    return op.matmul_dtype


def padded_rows(rows: int, unit: ComputeUnit) -> int:
    """``rows`` rounded up to the unit's row padding (default: its tile height)."""
    pad = unit.row_pad or unit.tile_rows
    return max(1, math.ceil(rows / pad)) * pad


def weight_push_s(contraction: int, cols: int, unit: ComputeUnit, dtype: str | None = None) -> float:
    """Time to push a ``contraction x cols`` weight block of ``dtype`` into the array, tile by
    tile (the unit's per-dtype push cost where it has one, e.g. int8 on TPU7x)."""
    push = unit.push_for(dtype)
    if not push:
        return 0.0
    tiles = math.ceil(contraction / unit.tile_rows) * math.ceil(cols / unit.tile_cols)
    return tiles * push


def matmul_time_s(rows: int, contraction: int, cols: int, unit: ComputeUnit, peak_flops_per_s: float,
                  dtype: str | None = None) -> float:
    """MXU time of ``x[rows, contraction] @ W[contraction, cols]`` (see the module docstring)."""
    if rows <= 0 or contraction <= 0 or cols <= 0:
        return 0.0
    flop_s = 2.0 * padded_rows(rows, unit) * contraction * cols / peak_flops_per_s
    return max(flop_s, weight_push_s(contraction, cols, unit, dtype))


def vector_time_s(vector_flops: float, chip: Chip) -> float:
    """VPU time of ``vector_flops`` elementwise/reduction FLOPs."""
    if vector_flops <= 0.0:
        return 0.0
    return vector_flops / chip.vector_unit.peak_for(VECTOR_DTYPE)


def resolve_link(chip: Chip, stage_link: str) -> LinkSpec | None:
    """The chip link carrying a plan stage that names ``stage_link`` (None: no such link)."""
    return link_for(chip, stage_link)


def collective_stage_s(link: LinkSpec, stage: CollectiveStage, payload_bytes_per_peer: int) -> float:
    """One collective stage: latency floor plus the bytes to every peer over the link."""
    bandwidth = link.bandwidth_bytes_per_s_per_direction.value
    return link.collective_stage_latency_s.value + payload_bytes_per_peer * stage.peers / bandwidth
