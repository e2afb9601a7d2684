"""The TPU kernel's layout rules that its VMEM accounting shares (one owner of each).

Mosaic, the TPU compiler behind Pallas, slices a tiled VMEM dimension only at tile multiples
and unrolls every vector operation; these rules are how the megakernel meets that, and
:mod:`tpusim.schedule.vmem` sizes the same buffers from them, so the simulator's VMEM total
and the kernel's scratch stay equal (``tests/test_vmem_truth.py``):

- every DMA region (a ring slab, an expert slot's copy, a small-parameter row) is a whole
  number of (16, 128) tiles of 16-bit words (:func:`tile_rows`, :func:`tile_padded_bytes`);
- a new KV-cache row is written as the whole 16-token tile holding it (:data:`KV_WRITE_TOKENS`);
- large streamed matmuls run as runtime loops (:func:`matmul_loops`) with their input staged
  in VMEM; the routed expert is dequantized one 128-column panel at a time, its scale words
  re-laid one tile per panel (:func:`expert_scale_tile_rows`).
"""

from __future__ import annotations

import math

from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.shapes import expert_slice_tensors
from tpusim.workload.sharding import ShardingPlan

# The TPU's lane width (the minor dimension of a vector register and of a VMEM tile), defined here
# once: the kernel, its accounting and the probes import it (tests/test_single_source.py).
LANES = 128
BF16_BYTES = 2
ROW_GRANULE = 16  # bf16 packs 16 rows per (16, 128) VMEM tile

# Every DMA region a TPU kernel lays out in VMEM (a ring slab, an expert slot's copy, a small-
# parameter row) starts and ends on a whole (16, 128) tile of 16-bit words: Mosaic slices a
# tiled dimension only at tile multiples. The kernel's layout and this accounting both pad so.
TILE_ROWS = ROW_GRANULE
TILE_BYTES = TILE_ROWS * LANES * BF16_BYTES


def vmem_array_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """VMEM bytes a ``shape`` array of ``itemsize``-byte elements occupies once Mosaic has
    tiled it: the minor dimension padded to 128 lanes, the second-minor to the next power of
    two up to 8 rows (at least the rows one sublane packs: 2 for 16-bit values), beyond 8 to a
    multiple of 8; a 1-D array is one row. Measured on libtpu 0.0.42's Mosaic from the scoped
    allocation a scratch buffer gets (``tests/test_vmem_array_bytes.py`` compiles probe
    kernels: f32 rows 3 -> 4, 5 -> 8, 9 -> 16; bf16 rows 1 -> 2, 17 -> 24; 32 lanes -> 128).
    The accounting (:mod:`tpusim.schedule.vmem`) counts the kernel's scratch as laid out
    (``Megakernel.scratch_bytes``, logical bytes); ``tpusim lower``'s tiled scratch gives
    what this rule makes of it, the scratch's share of the compiler's scoped VMEM."""
    dims = (1, *shape) if len(shape) == 1 else tuple(shape)
    *lead, rows, cols = dims
    packed = max(1, 4 // itemsize)
    padded_rows = -(-rows // 8) * 8 if rows > 8 else max(1 << (rows - 1).bit_length(), packed)
    return math.prod(lead) * padded_rows * -(-cols // LANES) * LANES * itemsize


# A new KV-cache row is written back as the whole 16-token tile that holds it (read, merged in
# VMEM, written): the kernel's staging buffer and the KV write's bytes are this many tokens.
KV_WRITE_TOKENS = TILE_ROWS


# A streamed matmul whose tensor has more than MATMUL_STATIC_SLABS slabs, or slabs taller than
# MATMUL_STATIC_ROWS rows, runs as a runtime loop over slabs and over MATMUL_CHUNK_ROWS-row
# chunks of each slab (Mosaic unrolls every vector op: an unrolled 7168 x 1664 multiply is
# ~100k instructions, slow to compile and instruction-fetch bound on the chip). Its input rows
# are staged in VMEM as [chunks, rows, MATMUL_CHUNK_ROWS] f32 (matmul_stage_bytes).
MATMUL_STATIC_SLABS = 4
MATMUL_STATIC_ROWS = 1024
MATMUL_STATIC_ARENA_ROWS = 4096  # a slab of more 128-lane rows (1 MiB) than this loops too
MATMUL_CHUNK_ROWS = 256
# Panels of a looped matmul (and of a routed expert's part) the kernel's panel loop issues per
# iteration: 1 is one product, then its result popped before the next panel's weights are
# pushed. More lets the compiler overlap one panel's MXU round trip with the next's pushes.
PANEL_UNROLL = 8
EXPERT_PANEL_UNROLL = 2


def loop_rows(batch: int) -> int:
    """Activation rows the loops' scratch holds: the batch, at least one 8-row sublane tile (a
    product with more rows, the multi-device kernel's pair matmul, runs unlooped)."""
    return max(batch, 8)


def matmul_loops(slabs: int, slab_rows: int, panels: int) -> bool:
    """Whether a tensor of ``slabs`` slabs of ``slab_rows`` rows and ``panels`` 128-column
    panels is multiplied in runtime loops (slabs, row chunks, panels)."""
    return (slabs > MATMUL_STATIC_SLABS or slab_rows > MATMUL_STATIC_ROWS
            or slab_rows * panels > MATMUL_STATIC_ARENA_ROWS)


def matmul_stage_chunks(slabs: int, slab_rows: int) -> int:
    """Staged input chunks of a looped matmul (each slab's rows in whole or tail chunks)."""
    return slabs * -(-slab_rows // MATMUL_CHUNK_ROWS)


def matmul_dots(slabs: int, slab_rows: int, cols: int) -> int:
    """MXU products the megakernel issues to multiply by one streamed tensor of ``slabs``
    slabs of ``slab_rows`` rows and ``cols`` columns: per 128-column panel, one per staged input
    chunk when it loops (:func:`matmul_loops`), else one per slab (the static einsum). A routed
    expert's part is one slab (each panel's whole contraction in one product)."""
    panels = -(-cols // LANES)
    chunks = matmul_stage_chunks(slabs, slab_rows) if matmul_loops(slabs, slab_rows, panels) else slabs
    return chunks * panels


def tile_rows(rows: int) -> int:
    """``rows`` 128-lane rows of 16-bit words rounded up to whole tiles."""
    return -(-rows // TILE_ROWS) * TILE_ROWS


def tile_padded_bytes(size: int) -> int:
    """``size`` bytes rounded up to whole (16, 128) tiles of 16-bit words."""
    return -(-size // TILE_BYTES) * TILE_BYTES


def expert_slot_bytes(model: ModelConfig, plan: ShardingPlan) -> int:
    """VMEM bytes of one routed-expert slot: its two copies (gate/up, down; values and scales
    each) tile-padded, as the kernel lays them out (rule 2)."""
    return sum(tile_padded_bytes(t.bytes) for t in expert_slice_tensors(model, plan))


# The routed-expert list is built as vectors, one 128-lane int32 row per 128 entries, staged in
# VMEM and copied to SMEM by one local DMA per row: SMEM, like VMEM, is sliced only at whole
# 128-word rows, and a vector-to-scalar move per list entry is what the list avoids.
INT32_BYTES = 4


def expert_list_rows(list_entries: int) -> int:
    """128-entry rows of a routed-expert list of ``list_entries`` entries (at least one)."""
    return max(1, -(-list_entries // LANES))


def expert_list_stage_rows(list_entries: int) -> int:
    """VMEM rows of the list's staging: its 128-lane rows in whole 8-row int32 tiles."""
    return -(-expert_list_rows(list_entries) // 8) * 8


def expert_list_stage_bytes(list_entries: int) -> int:
    """VMEM bytes of the list's staging rows."""
    return expert_list_stage_rows(list_entries) * LANES * INT32_BYTES


def expert_scale_tile_rows(model: ModelConfig, plan: ShardingPlan) -> int:
    """Rows of one panel's scale words in ``panel_scales`` (tile-padded): the larger of the
    gate/up (FP8, one bf16 scale per 256 rows) and down (MXFP4, one byte per 32 rows) parts."""
    gate_up, down = expert_slice_tensors(model, plan)
    per_panel = [math.ceil(t.scale_bytes / math.ceil(t.cols / LANES) / (LANES * BF16_BYTES)) for t in (gate_up, down)]
    return tile_rows(max(per_panel))
