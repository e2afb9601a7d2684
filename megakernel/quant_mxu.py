"""The routed experts' products on a chip whose MXU takes FP8 (TPU7x): no decode on the VPU.

What Mosaic does with FP8 on ``tpu7x`` (libtpu 0.0.42, compiled here, 2026-12-06; the bundles
of a one-product kernel): ``jnp.dot(x bf16[B, K], w float8_e4m3fn[K, N],
preferred_element_type=f32)`` pushes ``w`` as FP8 (``vmatpush3.f8e4m3``) and streams the bf16
rows against it (``vmatmul.mubr.bf16``): mixed bf16 x FP8, no unpack on the vector unit, so
the activations need no FP8 cast (and no per-row scale). A ``float4_e2m1fn`` operand is
unpacked and converted to FP8 on the vector unit (``vunpack.c.{l,h}.s4`` + ``vcvt``: 32
operations per 512 x 128 weights, 1/2048 of an operation a weight) and then pushed as FP8.
A product over 32 rows is a masked push and product (``vmatmul.mubr.msk``).

The formats (:mod:`megakernel.quant`) and what each product does:

| part | stored | in VMEM -> MXU | scale |
| --- | --- | --- | --- |
| gate/up | e4m3 bytes, two adjacent rows per 16-bit word (:func:`pack_fp8_rows`) | ``pltpu.bitcast`` u16[R/2, 128] -> float8_e4m3fn[R, 128] (free) | bf16 power of two per 256 rows, on each 256-row chunk's f32 product |
| down | e2m1 nibbles, four adjacent rows per 16-bit word (:func:`pack_mxfp4_rows`) | ``pltpu.bitcast`` -> float4_e2m1fn[R, 128], ``astype`` float8_e4m3fn (exact: every e2m1 value is an e4m3 value) | E8M0 per 32 rows, on each 32-row block's f32 product (at batch <= 2 the blocks' partials come from one product per row: :func:`_row_expanded`) |

Why exact: every weight reaches the MXU as its own code's value (e4m3 as stored; e2m1 widened
to e4m3 without rounding), each bf16 x e4m3 product is exact in f32 (8 + 4 significant bits),
and a block's scale is a power of two multiplying that block's f32 partial product (exact
unless it leaves f32's range). What differs from a dequantise-then-multiply reference is only
the order of the f32 sums (block by block), as on v5e's ``pairs`` path; a row spread over
the blocks adds only exact zeros (lanes of other blocks) to each block's partial. The E8M0 scale is not
folded into the FP8 weights: ``6 * 2^s`` leaves e4m3's range for ``s > 6`` and ``0.5 * 2^s``
falls below its smallest subnormal for ``s < -8``, so folding is exact only for a window of
scales, and decided by the data; applied after the product it is exact for all of them.
FP8 subnormal codes go to the MXU as they are: whether TPU7x's array honours them (v5e's reads
bf16 subnormals as 0) is not checked here (no TPU7x is lent).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from megakernel.quant import (
    FP8_BLOCK_ROWS,
    MXFP4_BLOCK_ROWS,
    decode_e8m0,
    split_words,
    words_to_bf16,
)

MXU_FP8_PRODUCTS = "fp8-mxu"  # recorded as the kernel's decoder on a chip that takes FP8
F8, F4 = jnp.float8_e4m3fn, jnp.float4_e2m1fn


def pack_fp8_rows(values: np.ndarray) -> np.ndarray:
    """uint8[..., R, C] e4m3 bytes -> uint16[..., R/2, C]: word ``r`` = row ``2r`` (low byte),
    row ``2r + 1`` (high byte), the order ``pltpu.bitcast`` to an 8-bit dtype unpacks."""
    if values.shape[-2] % 2:
        raise ValueError(f"fp8 rows pack two a word: {values.shape[-2]} rows")
    v = values.astype(np.uint16)
    return (v[..., 0::2, :] | (v[..., 1::2, :] << 8)).astype(np.uint16)


def pack_mxfp4_rows(packed: np.ndarray) -> np.ndarray:
    """uint8[..., R/2, C] (logical MXFP4 bytes, :func:`megakernel.quant.quantize_mxfp4`) ->
    uint16[..., R/4, C]: nibble ``k`` (from the lowest) of word ``i`` is row ``4i + k``, the
    order ``pltpu.bitcast`` to a 4-bit dtype unpacks."""
    nibbles = np.concatenate([packed & 0xF, packed >> 4], axis=-2).astype(np.uint16)  # [..., R, C]
    if nibbles.shape[-2] % 4:
        raise ValueError(f"mxfp4 rows pack four a word: {nibbles.shape[-2]} rows")
    return (nibbles[..., 0::4, :] | nibbles[..., 1::4, :] << 4 | nibbles[..., 2::4, :] << 8
            | nibbles[..., 3::4, :] << 12).astype(np.uint16)


def _bitcast(x: jax.Array, dtype: object) -> jax.Array:
    from jax.experimental.pallas import tpu as pltpu  # Pallas' TPU primitives

    return pltpu.bitcast(x, dtype)


def _block_products(x: jax.Array, w: jax.Array, scales: jax.Array, block: int) -> jax.Array:
    """``x`` bf16[B, R] @ ``w`` (FP8)[R, 128], block by ``block`` rows, each block's f32
    product times its scale row ``scales[i]`` f32[1, 128], summed in order -> f32[B, 128]."""
    acc = None
    for i in range(w.shape[0] // block):
        y = jnp.dot(x[:, i * block: (i + 1) * block], w[i * block: (i + 1) * block],
                    preferred_element_type=jnp.float32) * scales[i: i + 1]
        acc = y if acc is None else acc + y
    assert acc is not None
    return acc


# Batches of at most this many rows multiply an MXFP4 panel in one product per row rather than
# one per 32-row scale block (:func:`_row_expanded`). Static bundles per K3 TP32 down panel (768
# x 128, 24 blocks), tpu7x, compiled here (one panel a loop iteration): one product per block 194
# at rows 1 to 8; one per row 71 (rows 1), 108 (2), 378 (8). FP8 gate/up keeps one product per
# 256-row block, as deep as the MXU: per row it took 175 bundles a panel at rows 1 (161-174 by
# block) and 352 at rows 2.
ROW_EXPANSION_MAX_ROWS = 2


def _row_expanded(x: jax.Array, w: jax.Array, scales: jax.Array, block: int) -> jax.Array:
    """:func:`_block_products` with one product per activation row: row ``r`` of ``x`` bf16[B, R]
    is laid out as ``blocks`` rows, row ``i`` keeping only block ``i``'s lanes (the others exact
    zeros), so one product gives every block's f32 partial [blocks, 128]; times the scale rows
    ``scales`` f32[blocks, 128], summed over the blocks -> that row's f32[1, 128]."""
    rows, blocks = w.shape[0], w.shape[0] // block
    lane_block = jax.lax.broadcasted_iota(jnp.int32, (blocks, rows), 1) >> (block.bit_length() - 1)
    mine = lane_block == jax.lax.broadcasted_iota(jnp.int32, (blocks, rows), 0)
    out = []
    for r in range(x.shape[0]):
        spread = jnp.broadcast_to(x[r: r + 1].astype(jnp.float32), (blocks, rows))  # exact: x is bf16
        xe = jnp.where(mine, spread, 0.0).astype(jnp.bfloat16)
        z = jnp.dot(xe, w, preferred_element_type=jnp.float32) * scales[:blocks]
        out.append(jnp.sum(z, axis=0, keepdims=True))
    return out[0] if len(out) == 1 else jnp.concatenate(out, axis=0)


def fp8_mxu_product(x: jax.Array, words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """``x`` bf16[B, R] @ one FP8 panel: ``words`` u16[R/2, 128] (:func:`pack_fp8_rows`),
    ``scale_words`` u16[R/256, 128] (the bf16 block scales' bits) -> f32[B, 128]."""
    w = _bitcast(words, F8)  # [R, 128], free: the same vregs
    scales = words_to_bf16(scale_words).astype(jnp.float32)
    return _block_products(x, w, scales, FP8_BLOCK_ROWS)


def mxfp4_mxu_product(x: jax.Array, words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """``x`` bf16[B, R] @ one MXFP4 panel: ``words`` u16[R/4, 128] (:func:`pack_mxfp4_rows`),
    ``scale_words`` u16[R/64, 128] (E8M0 bytes by :func:`megakernel.quant.pack_bytes_to_words`)
    -> f32[B, 128]. A part of fewer than 32 rows has its block's one scale row. One product per
    32-row block, or per activation row for small batches (:data:`ROW_EXPANSION_MAX_ROWS`)."""
    w = _bitcast(words, F4).astype(F8)  # [R, 128], exact
    scales = decode_e8m0(split_words(scale_words, axis=0))  # [R/32, 128] f32
    block = min(w.shape[0], MXFP4_BLOCK_ROWS)
    if w.shape[0] > block and x.shape[0] <= ROW_EXPANSION_MAX_ROWS:
        return _row_expanded(x, w, scales, block)
    return _block_products(x, w, scales, block)


def bf16_activations(x: jax.Array) -> jax.Array:
    """The activations the FP8 products take: bf16 as they are (no pre-scale: FP8 weights are
    normal-sized numbers, unlike the ``pairs`` decoders' folded ones)."""
    return x.astype(jnp.bfloat16)
