"""Repack :class:`megakernel.layout.Weights` into the HBM arrays the kernel streams.

Every streamed array is uint16 words in 128-lane rows, so any family can land in any pool's
arena (one uint16 VMEM scratch per pool; Pallas' TPU interpreter cannot DMA through
``ref.bitcast`` views, so the arena cannot be bytes with typed views). Per ring
(:mod:`megakernel.dma_plan`):

| HBM array | shape | content |
| --- | --- | --- |
| ``small`` | [layers, 2S/128, 128] | f32 row: high halves (S/128 rows) then low halves |
| ``<dense tensor>`` | [instances, K, P*s, 128] | bf16 bits; slab k = rows [k*s, (k+1)*s), panel-major: panel p holds columns [128p, 128p+128) |
| ``expert.gate_up`` | [n_moe, E, P*L/2 + P*L/256, 128] | FP8 byte pairs per panel (v5e/v6e: rows r, r+L/2 by groups; TPU7x: rows 2r, 2r+1), then bf16 scales per panel |
| ``expert.down`` | [n_moe, E, Q*w/4 + Q*w/64, 128] | MXFP4 words (4 nibbles) per panel (in the order the chip's products unpack), then E8M0 byte pairs per panel |

(``K`` slabs of ``s`` rows per :func:`tpusim.schedule.vmem.slab_rows` under the schedule's
``chunk_bytes``; a last partial slab is zero-padded; ``P = ceil(cols / 128)``, a last partial
panel zero-padded: only K3 TP32's 2112-wide layer-0 gate/up has one, +3 % of that tensor.) The HBM layout
therefore depends on the schedule's chunk sizes, as the issue asks ("chunked per the
schedule").
"""

from __future__ import annotations

import numpy as np

from megakernel.dims import ModelDims
from megakernel.dma_plan import Geometry, Ring
from megakernel.expert_products import DECODE, ExpertProducts
from megakernel.layout import STACKED_DENSE, Weights
from megakernel.quant import bf16_to_words, pack_bytes_to_words
from tpusim.schedule.kernel_layout import LANES, tile_rows
from tpusim.workload.registry.names import ExpertTensor


def panels(words: np.ndarray) -> np.ndarray:
    """u16[..., R, C] -> u16[..., (C/128)*R, 128]: 128-column panels stacked along rows."""
    *lead, rows, cols = words.shape
    assert cols % LANES == 0, f"columns {cols} are not a multiple of {LANES}"
    x = words.reshape(*lead, rows, cols // LANES, LANES)
    x = np.moveaxis(x, -2, -3)  # [..., P, R, 128]
    return np.ascontiguousarray(x.reshape(*lead, cols // LANES * rows, LANES))


def slabs(words: np.ndarray, ring: Ring) -> np.ndarray:
    """u16[n, R, C] -> u16[n, K, P*s, 128] (zero rows pad the last slab, zero columns the
    last panel)."""
    n, rows, cols = words.shape
    padded = ring.num_slabs * ring.slab_rows
    words = np.pad(words, ((0, 0), (0, padded - rows), (0, ring.padded_cols - cols)))
    x = words.reshape(n, ring.num_slabs, ring.slab_rows, ring.padded_cols)
    return panels(x)


def small_words(small: np.ndarray) -> np.ndarray:
    """f32[layers, S] -> u16[layers, 2S/128 padded to tiles, 128] (high halves, then low halves)."""
    bits = np.ascontiguousarray(small, np.float32).view(np.uint32)
    hi, lo = (bits >> 16).astype(np.uint16), (bits & 0xFFFF).astype(np.uint16)
    layers, cols = small.shape
    words = np.concatenate([hi.reshape(layers, cols // LANES, LANES), lo.reshape(layers, cols // LANES, LANES)], axis=1)
    return tile_pad(words, axis=1)


def tile_pad(words: np.ndarray, axis: int) -> np.ndarray:
    """Zero rows after ``words`` along ``axis`` up to whole (16, 128) tiles (the VMEM region
    a DMA fills is tile-aligned: :func:`tpusim.schedule.vmem.tile_rows`)."""
    pad = [(0, 0)] * words.ndim
    pad[axis] = (0, tile_rows(words.shape[axis]) - words.shape[axis])
    return np.pad(words, pad)


def expert_words(weights: Weights, products: ExpertProducts = DECODE) -> tuple[np.ndarray, np.ndarray]:
    """(gate_up u16[n_moe, E, rows, 128], down u16[n_moe, E, rows, 128]) slot images, the values'
    words in the order ``products`` unpacks (:mod:`megakernel.expert_products`)."""
    gu_values = panels(products.pack_gate_up(weights["expert.gate_up.values"]))
    gu_scales = panels(bf16_to_words(weights["expert.gate_up.scales"]))
    dn_values = panels(products.pack_down(weights["expert.down.values"]))
    dn_scales = panels(pack_bytes_to_words(weights["expert.down.scales"]))
    return (tile_pad(np.concatenate([gu_values, gu_scales], axis=2), axis=2),
            tile_pad(np.concatenate([dn_values, dn_scales], axis=2), axis=2))


def pack_hbm(weights: Weights, geo: Geometry, products: ExpertProducts = DECODE) -> dict[str, np.ndarray]:
    """Ring name -> the HBM array the kernel streams it from (``expert`` gives two:
    ``expert.gate_up`` and ``expert.down``, packed for the kernel's ``expert_products``)."""
    out: dict[str, np.ndarray] = {"small": small_words(weights["small"])}
    for name, ring in geo.rings.items():
        if name in ("small", "expert"):
            continue
        value = weights[name]
        if name not in STACKED_DENSE:
            value = value[None]
        out[name] = slabs(bf16_to_words(value), ring)
    out[ExpertTensor.GATE_UP], out[ExpertTensor.DOWN] = expert_words(weights, products)
    return out


def hbm_shapes(geo: Geometry, dims: ModelDims, local_experts: int) -> dict[str, tuple[int, ...]]:
    """Shapes of :func:`pack_hbm`'s arrays without packing anything (for ShapeDtypeStructs);
    stacks hold ``dims.stack_size`` entries (fewer when weights are banked)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, ring in geo.rings.items():
        if name == "small":
            shapes[name] = (dims.stack_size(dims.num_layers), ring.slab_arena_rows, LANES)
        elif name != "expert":
            shapes[name] = (dims.stack_size(ring.instances), ring.num_slabs, ring.slab_arena_rows, LANES)
    slot = geo.expert_slot
    moe_layers = dims.stack_size(len(dims.moe_layers))
    shapes[ExpertTensor.GATE_UP] = (moe_layers, local_experts, slot.gate_up_total, LANES)
    shapes[ExpertTensor.DOWN] = (moe_layers, local_experts, slot.down_total, LANES)
    return shapes
