"""The kernel's expert decoders by pairs (``pairs``, ``pairs-fold``): two bf16 values out of each
32-bit operation, no per-weight multiply, the fold and block scales on the products.

The formats, host encoders, reference decoders and the ``words32``/``fold`` decoders are in
:mod:`megakernel.quant`; this module holds the decoders that move a code's bits straight into
bf16 fields and the kernel's panel products built on them (``tests/test_expert_decoders.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from megakernel.quant import (
    FP8_BLOCK_ROWS,
    MXFP4_BLOCK_ROWS,
    U32,
    decode_e4m3,
    dequant_mxfp4_fold,
    pack_bytes_to_words,
    packed_bitcast,
    shift_bits,
    words_to_bf16,
)

# ---------------------------------------------------------------- the "pairs" decoders
#
# Two bf16 values out of each 32-bit operation, no per-weight multiply, no select. A code's
# sign and magnitude bits are moved straight to where a bf16 keeps them, with its exponent
# field left as the code's own (no rebias): the bf16 then holds the code's value times a
# fixed power of two (e4m3: 2^-120, e2m1: 2^-126), and the format's subnormal codes land
# exactly on bf16's subnormals. Everything per weight that remains — that fold and the block
# scales — is applied to the f32 product of each scale block (B x 128 values, not 256 x 128
# weights). The activations are pre-scaled by 2^ACT_PRESCALE_LOG2 (exact: a power of two, far
# from bf16's range limits) so the products of these tiny weights stay normal f32 numbers.

PAIRS_DECODER = "pairs"
FP8_FOLD_LOG2 = 127 - 7  # a bf16 with e4m3's exponent field is the e4m3 value times 2^-120
E2M1_FOLD_LOG2 = 127 - 1  # a bf16 with e2m1's exponent field is the e2m1 value times 2^-126
ACT_PRESCALE_LOG2 = 64  # x * 2^64 stays below bf16's largest value for |x| < 2^63
MXFP4_GROUP_ROWS = 64  # logical rows one vreg of u32 words holds (two 32-row scale blocks)


def fp8_pair_group_rows(rows: int) -> int:
    """Logical rows of one FP8 decode group: 512 (two 256-row scale blocks, one per half)
    where the part's rows allow it, else 256 (both halves in one block)."""
    if rows % FP8_BLOCK_ROWS:
        raise ValueError(f"fp8 pair words need rows % 256 == 0, got {rows}")
    return 2 * FP8_BLOCK_ROWS if rows % (2 * FP8_BLOCK_ROWS) == 0 else FP8_BLOCK_ROWS


def pack_fp8_pairs(values: np.ndarray) -> np.ndarray:
    """uint8[..., R, C] e4m3 bytes -> uint16[..., R/2, C] in :func:`fp8_pairs_group`'s order:
    per group of ``G`` = :func:`fp8_pair_group_rows` rows, 16-bit word ``r`` = row ``r`` (low
    byte) and row ``G/2 + r`` (high byte) of the group, so a u32 word's bytes 0 and 2 are two
    adjacent rows of the group's first half and bytes 1 and 3 the same rows of its second."""
    rows, cols = values.shape[-2:]
    group = fp8_pair_group_rows(rows)
    grouped = values.reshape(*values.shape[:-2], rows // group, group, cols)
    return pack_bytes_to_words(grouped).reshape(*values.shape[:-2], rows // 2, cols)


def pack_mxfp4_pairs(packed: np.ndarray) -> np.ndarray:
    """uint8[..., R/2, C] (logical MXFP4 bytes, :func:`quantize_mxfp4`) -> uint16[..., R/4, C]
    in :func:`mxfp4_pairs_group`'s order: per group of 64 logical rows (8 u32 word rows),
    nibble ``k`` (from the lowest) of u32 row ``i`` holds logical row ``16 (k % 4) + 2 i + k // 4``,
    so pair ``p`` (nibbles ``p`` and ``p + 4``) decodes to 16 consecutive rows."""
    nibbles = np.concatenate([packed & 0xF, packed >> 4], axis=-2).astype(np.uint32)  # [..., R, C]
    rows, cols = nibbles.shape[-2:]
    if rows % MXFP4_GROUP_ROWS:
        raise ValueError(f"mxfp4 pair words need rows % {MXFP4_GROUP_ROWS} == 0, got {rows}")
    # [..., groups, p, i, h, C]: logical row 16p + 2i + h of each group
    n = nibbles.reshape(*nibbles.shape[:-2], rows // MXFP4_GROUP_ROWS, 4, 8, 2, cols)
    words = np.zeros((*n.shape[:-5], rows // MXFP4_GROUP_ROWS, 8, cols), np.uint32)
    for k in range(8):
        words |= n[..., k % 4, :, k // 4, :] << (4 * k)
    low, high = (words & 0xFFFF).astype(np.uint16), (words >> 16).astype(np.uint16)
    return np.stack([low, high], axis=-2).reshape(*packed.shape[:-2], rows // 4, cols)


def fp8_pairs_group(t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One group's u32 words [G/4, C] -> (first half, second half) as bf16 bit words [G/4, C]
    (two rows each): the e4m3 values times 2^-120, exact, subnormal codes as bf16 subnormals.
    9 VALU operations per 4 weights."""
    sign, magnitude = U32(0x8000_8000), U32(0x07F0_07F0)
    second = (t & sign) | ((t >> 4) & magnitude)
    first = ((t << 8) & sign) | ((t << 4) & magnitude)
    return first, second


def mxfp4_pairs_group(t: jax.Array) -> list[jax.Array]:
    """One group's u32 words [8, C] -> four bf16 bit words [8, C] (pairs 0..3, 16 logical rows
    each): the e2m1 values times 2^-126, exact (0.5 is a bf16 subnormal). 19 VALU operations
    per 8 weights."""
    sign, magnitude = U32(0x8000_8000), U32(0x01C0_01C0)
    return [(shift_bits(t, 6 - 4 * p) & magnitude) | (shift_bits(t, 12 - 4 * p) & sign) for p in range(4)]


def prescale_activations(x: jax.Array) -> jax.Array:
    """f32/bf16 [B, K] -> bf16 [B, K] times 2^64 (exact)."""
    return (x.astype(jnp.float32) * (2.0 ** ACT_PRESCALE_LOG2)).astype(jnp.bfloat16)


def fp8_pairs_product(x_scaled: jax.Array, words: jax.Array, scales: jax.Array) -> jax.Array:
    """``x_scaled`` bf16[B, R] (:func:`prescale_activations`) @ one FP8 panel: ``words``
    u16[R/2, 128] (:func:`pack_fp8_pairs`), ``scales`` f32[R/256, 128] (the bf16 block scales)
    -> f32[B, 128]. One product per half group, scaled by its block's scale after the dot."""
    rows = 2 * words.shape[0]
    group = fp8_pair_group_rows(rows)
    half, fold = group // 2, 2.0 ** (FP8_FOLD_LOG2 - ACT_PRESCALE_LOG2)
    acc = None
    for g in range(rows // group):
        t = packed_bitcast(words[g * half: (g + 1) * half], U32)
        for h, bits in enumerate(fp8_pairs_group(t)):
            start = g * group + h * half
            w = packed_bitcast(bits, jnp.bfloat16)
            y = jnp.dot(x_scaled[:, start: start + half], w, preferred_element_type=jnp.float32)
            block = start // FP8_BLOCK_ROWS
            y = y * scales[block: block + 1]
            acc = y if acc is None else acc + y
    assert acc is not None
    return acc * fold


def mxfp4_pairs_product(x_scaled: jax.Array, words: jax.Array, scales: jax.Array) -> jax.Array:
    """``x_scaled`` bf16[B, R] @ one MXFP4 panel: ``words`` u16[R/4, 128]
    (:func:`pack_mxfp4_pairs`), ``scales`` f32[R/32, 128] (``2^(e-127)``) -> f32[B, 128]. One
    product per 32-row block, scaled after the dot."""
    rows = 4 * words.shape[0]
    acc = None
    for g in range(rows // MXFP4_GROUP_ROWS):
        t = packed_bitcast(words[g * 16: (g + 1) * 16], U32)
        pairs = [packed_bitcast(bits, jnp.bfloat16) for bits in mxfp4_pairs_group(t)]
        for b in range(2):
            start = g * MXFP4_GROUP_ROWS + b * MXFP4_BLOCK_ROWS
            w = jnp.concatenate(pairs[2 * b: 2 * b + 2], axis=0)
            y = jnp.dot(x_scaled[:, start: start + MXFP4_BLOCK_ROWS], w, preferred_element_type=jnp.float32)
            y = y * scales[start // MXFP4_BLOCK_ROWS: start // MXFP4_BLOCK_ROWS + 1]
            acc = y if acc is None else acc + y
    assert acc is not None
    return acc * 2.0 ** (E2M1_FOLD_LOG2 - ACT_PRESCALE_LOG2)


# The kernel's decoders: FP8 gate/up by pairs and MXFP4 down by fold (``pairs-fold``, since
# 2026-12-06 10:00 UTC); ``fp8-pairs`` (sets v5e-s, v5e-u, v5e-v) had MXFP4 on words32. MXFP4 is
# not decoded by pairs because e2m1's 0.5 is a subnormal in any placement that needs no
# per-weight fix-up, and the v5e MXU reads bf16 subnormals as 0 (probe mxu_subnormal; XLA on a
# CPU too): docs/megakernel-on-tpu.md.
FP8_PAIRS_DECODER = "fp8-pairs"
KERNEL_DECODER = "pairs-fold"  # recorded with every chip run


def fp8_panel_product(x_scaled: jax.Array, words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """Kernel form of :func:`fp8_pairs_product`: ``scale_words`` are the bf16 scales' bits."""
    return fp8_pairs_product(x_scaled, words, words_to_bf16(scale_words).astype(jnp.float32))


def mxfp4_panel_product(x: jax.Array, words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """``x`` bf16[B, R] @ one MXFP4 panel (``words`` u16[R/4, 128] by :func:`pack_mxfp4_words`,
    ``scale_words`` u16[R/64, 128]) decoded by :func:`dequant_mxfp4_fold` -> f32[B, 128]."""
    w = dequant_mxfp4_fold(words[None], scale_words[None])[0]
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def dequant_fp8_pairs(value_words: jax.Array, scales: jax.Array | None = None) -> jax.Array:
    """Decode-only form for the probes: ``value_words`` u16[P, R/2, 128] (:func:`pack_fp8_pairs`)
    -> bf16[P, R, 128], the e4m3 values times 2^-120 (the block scales, ``scales``, are not
    applied: in the kernel they go on the products)."""
    del scales
    rows = 2 * value_words.shape[1]
    group = fp8_pair_group_rows(rows)
    half = group // 2
    out = []
    for g in range(rows // group):
        t = packed_bitcast(value_words[:, g * half: (g + 1) * half], U32)
        out += [packed_bitcast(bits, jnp.bfloat16) for bits in fp8_pairs_group(t)]
    return jnp.concatenate(out, axis=1)


def fp8_blocked_products(x: jax.Array, values: jax.Array, scales: jax.Array) -> jax.Array:
    """Logical form of the kernel's FP8 products, same operations in the same order (for
    :mod:`megakernel.reference`): ``x`` f32[B, R], ``values`` uint8[E, R, C] e4m3 bits,
    ``scales`` bf16[E, R/256, C] -> f32[B, E, C]. Per half group (:func:`fp8_pair_group_rows`)
    the 2^64-scaled bf16 activations times the bf16 weights ``e4m3 * 2^-120`` (f32 sums), times
    the block's scale; summed over the halves in order, then times 2^56."""
    rows = values.shape[1]
    group = fp8_pair_group_rows(rows)
    half = group // 2
    xs = prescale_activations(x).astype(jnp.float32)
    w = (decode_e4m3(values) * 2.0 ** -FP8_FOLD_LOG2).astype(jnp.bfloat16).astype(jnp.float32)
    s = scales.astype(jnp.float32)
    acc = None
    for start in range(0, rows, half):
        y = jnp.einsum("bk,ekc->bec", xs[:, start: start + half], w[:, start: start + half])
        block = start // FP8_BLOCK_ROWS
        y = y * s[None, :, block, :]
        acc = y if acc is None else acc + y
    assert acc is not None
    return acc * 2.0 ** (FP8_FOLD_LOG2 - ACT_PRESCALE_LOG2)
