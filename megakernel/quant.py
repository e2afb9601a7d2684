"""Weight formats: host-side encoders (numpy) and device-side decoders (pure jnp).

Kimi K3 stores its routed experts in two narrow formats (``tpusim.workload.formats``):

- **FP8 e4m3 with a bf16 power-of-two scale per 256 contraction rows** (``fp8_e4m3_b256``,
  gate/up). Value ``W[r, c] = e4m3(bits[r, c]) * scale[r // 256, c]``.
- **MXFP4** (``mxfp4``, down): e2m1 nibbles, two per byte, plus an E8M0 scale (a biased
  exponent byte, ``2 ** (e - 127)``) per 32 contraction rows.

Logical (checkpoint) layouts, ``rows`` = contraction dimension as everywhere in tpusim:

| array | dtype | shape | meaning |
| --- | --- | --- | --- |
| fp8 values | uint8 | (R, C) | e4m3 bit patterns |
| fp8 scales | bf16 | (R/256, C) | powers of two |
| mxfp4 packed | uint8 | (R/2, C) | byte ``[r, c]`` = ``W[r, c]`` (low nibble), ``W[r + R/2, c]`` (high) |
| mxfp4 scales | uint8 | (R/32, C) | E8M0 exponents |

The kernel streams everything as 16-bit words (one VMEM arena per pool, see
:mod:`megakernel.layout`): the expert values packed by :func:`pack_fp8_words` and
:func:`pack_mxfp4_words` (two adjacent output rows of each half per u32 word) and the E8M0
scales by :func:`pack_bytes_to_words` (``word[r] = byte[r] | byte[r + R/2] << 8``); the
``*_words`` decoders undo them inside the kernel. All decoders use only integer shifts/masks,
``where`` and bitcasts, so the same code runs in the reference, in TPU interpret mode and
lowers to Mosaic. Dequantised values are exact in bf16 (3 or 1 mantissa bits, power-of-two
scales), so a dequantised matmul equals the reference's bit for bit.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

FP8_BLOCK_ROWS = 256
MXFP4_BLOCK_ROWS = 32
FP8_E4M3_MAX = 448.0
E2M1_MAX = 6.0
E8M0_BIAS = 127


# ---------------------------------------------------------------- host-side encoders (numpy)


def quantize_fp8_b256(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w`` f32[..., R, C] -> (uint8[..., R, C] e4m3 bits, bf16[..., R/256, C] power-of-two
    scales)."""
    *lead, rows, cols = w.shape
    assert rows % FP8_BLOCK_ROWS == 0, f"fp8_e4m3_b256 needs rows % 256 == 0, got {rows}"
    blocks = w.reshape(*lead, rows // FP8_BLOCK_ROWS, FP8_BLOCK_ROWS, cols).astype(np.float32, copy=True)
    amax = np.maximum(np.abs(blocks).max(axis=-2), 1e-30)  # [..., R/256, C]
    scale = np.exp2(np.ceil(np.log2(amax / FP8_E4M3_MAX))).astype(np.float32)
    blocks /= scale[..., None, :]
    values = blocks.astype(ml_dtypes.float8_e4m3fn)
    return values.reshape(*lead, rows, cols).view(np.uint8), scale.astype(ml_dtypes.bfloat16)


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w`` f32[..., R, C] -> (uint8[..., R/2, C] packed nibbles, uint8[..., R/32, C] E8M0).

    OCP MX rule: shared exponent ``floor(log2(amax)) - 2`` (e2m1's largest exponent), values
    rounded to nearest e2m1 (saturating at 6).
    """
    *lead, rows, cols = w.shape
    assert rows % (2 * MXFP4_BLOCK_ROWS) == 0, f"mxfp4 needs rows % 64 == 0, got {rows}"
    blocks = w.reshape(*lead, rows // MXFP4_BLOCK_ROWS, MXFP4_BLOCK_ROWS, cols).astype(np.float32, copy=True)
    amax = np.maximum(np.abs(blocks).max(axis=-2), 2.0**-100)
    exponent = np.clip(np.floor(np.log2(amax)) - 2, -E8M0_BIAS, E8M0_BIAS)
    blocks /= np.exp2(exponent)[..., None, :]
    np.clip(blocks, -E2M1_MAX, E2M1_MAX, out=blocks)
    nibbles = blocks.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(*lead, rows, cols) & 0xF
    half = rows // 2
    packed = (nibbles[..., :half, :] | (nibbles[..., half:, :] << 4)).astype(np.uint8)
    return packed, (exponent + E8M0_BIAS).astype(np.uint8)


def mxfp4_row_slice(packed: np.ndarray, scales: np.ndarray, start: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Logical rows ``start .. start + rows`` of an MXFP4 tensor (uint8[..., R/2, C] packed,
    uint8[..., R/32, C] E8M0), repacked as a ``rows``-row tensor of the same layout (rows
    ``r`` and ``r + rows/2`` share a byte). A slice inside one 32-row block (expert TP
    splitting a narrow expert) keeps that block's scale row: the values are unchanged."""
    if rows % 2 or (rows % MXFP4_BLOCK_ROWS and MXFP4_BLOCK_ROWS % rows):
        raise ValueError(f"{rows} rows are not whole 32-row blocks nor an even part of one")
    if start % min(rows, MXFP4_BLOCK_ROWS):
        raise ValueError(f"a slice at row {start} straddles a scale block")
    nibbles = np.concatenate([packed & 0xF, packed >> 4], axis=-2)[..., start: start + rows, :]
    half = rows // 2
    out = (nibbles[..., :half, :] | (nibbles[..., half:, :] << 4)).astype(np.uint8)
    first = start // MXFP4_BLOCK_ROWS
    return out, scales[..., first: first + -(-rows // MXFP4_BLOCK_ROWS), :]


def pack_bytes_to_words(b: np.ndarray) -> np.ndarray:
    """uint8[..., R, C] -> uint16[..., R/2, C]: ``word[r] = b[r] | b[r + R/2] << 8``."""
    half = b.shape[-2] // 2
    assert b.shape[-2] == 2 * half, "byte matrices pack to words by halves: rows must be even"
    return (b[..., :half, :].astype(np.uint16) | (b[..., half:, :].astype(np.uint16) << 8)).astype(np.uint16)


def bf16_to_words(w: np.ndarray) -> np.ndarray:
    """bf16 (or f32 rounded to bf16) array -> its uint16 bit patterns."""
    return np.asarray(w).astype(ml_dtypes.bfloat16).view(np.uint16)


# ---------------------------------------------------------------- device-side decoders (jnp)


def _f32_from_bits(bits: jax.Array) -> jax.Array:  # u32[...] -> f32[...]
    return lax.bitcast_convert_type(bits.astype(jnp.uint32), jnp.float32)


def decode_e4m3(bits: jax.Array) -> jax.Array:
    """e4m3fn bit patterns (any unsigned int dtype, values < 256) -> f32. NaN is not produced
    by the encoder and decodes as 480."""
    b = bits.astype(jnp.uint32)
    sign = (b >> 7) & 1
    exponent = (b >> 3) & 0xF
    mantissa = b & 0x7
    normal = _f32_from_bits((sign << 31) | ((exponent + (127 - 7)) << 23) | (mantissa << 20))
    subnormal = mantissa.astype(jnp.float32) * (2.0**-9)
    subnormal = jnp.where(sign == 1, -subnormal, subnormal)
    return jnp.where(exponent == 0, subnormal, normal)


def decode_e2m1(nibbles: jax.Array) -> jax.Array:
    """e2m1 nibbles (values < 16) -> f32 in {0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6}."""
    n = nibbles.astype(jnp.uint32)
    sign = (n >> 3) & 1
    exponent = (n >> 1) & 0x3
    mantissa = (n & 1).astype(jnp.float32)
    magnitude = jnp.where(
        exponent == 0,
        0.5 * mantissa,
        _f32_from_bits((exponent + 126) << 23) * (1.0 + 0.5 * mantissa),
    )
    return jnp.where(sign == 1, -magnitude, magnitude)


def decode_e8m0(exponents: jax.Array) -> jax.Array:
    """E8M0 biased exponents (1..254) -> f32 ``2 ** (e - 127)``."""
    return _f32_from_bits(exponents.astype(jnp.uint32) << 23)


def repeat_rows(x: jax.Array, times: int, axis: int) -> jax.Array:
    """Repeat every row ``times`` times along ``axis`` (block scale -> per-row scale)."""
    shape = list(x.shape)
    expanded = jnp.expand_dims(x, axis + 1)
    target = [*shape[: axis + 1], times, *shape[axis + 1 :]]
    out = jnp.broadcast_to(expanded, target)
    shape[axis] *= times
    return out.reshape(shape)


def dequant_fp8_b256(values: jax.Array, scales: jax.Array) -> jax.Array:
    """uint8[R, C] e4m3 bits, bf16[R/256, C] -> bf16[R, C] (exact)."""
    w = decode_e4m3(values) * repeat_rows(scales.astype(jnp.float32), FP8_BLOCK_ROWS, axis=0)
    return w.astype(jnp.bfloat16)


def dequant_mxfp4(packed: jax.Array, scales: jax.Array) -> jax.Array:
    """uint8[R/2, C] nibbles, uint8[R/32, C] E8M0 -> bf16[R, C] (exact). A slice of fewer
    than 32 rows (:func:`mxfp4_row_slice`) carries its block's one scale row."""
    p = packed.astype(jnp.uint32)
    nibbles = jnp.concatenate([p & 0xF, p >> 4], axis=0)
    rows = nibbles.shape[0]
    block = min(rows, MXFP4_BLOCK_ROWS)
    assert rows == block * scales.shape[0], f"{rows} mxfp4 rows with {scales.shape[0]} scale rows"
    w = decode_e2m1(nibbles) * repeat_rows(decode_e8m0(scales), block, axis=0)
    return w.astype(jnp.bfloat16)


def split_words(words: jax.Array, axis: int) -> jax.Array:
    """uint16 words -> their bytes, upper halves after lower halves along ``axis``
    (inverse of :func:`pack_bytes_to_words`); returns uint32 values < 256."""
    w = words.astype(jnp.uint32)
    return jnp.concatenate([w & 0xFF, w >> 8], axis=axis)


# The kernel forms. v5e's VPU has no bf16 arithmetic and no FP8 unit, so each decoder works on
# 32-bit words: ``pltpu.bitcast`` views two packed 16-bit word rows as one u32 row and a u32
# row as two bf16 rows (row 2i the low half, 2i+1 the high), both free reinterpretations of
# the vregs. The host packs the bytes so that every u32 word holds two *adjacent* output rows
# of each half of the tensor; a field is moved straight from its bit position into an f32's
# exponent/mantissa (no byte split, no u16<->u32 unpack, no f32->bf16 rounding: the values
# are exact in bf16, so the top 16 bits are the bf16). About 12 VPU operations an element
# where the logical decoders take about 25 (measured: ``calibration.tpu_bench`` probes
# ``dequant_*``, ``form``).

WORDS32_DECODER = "words32"  # the kernel's decoders from 2026-12-06 (both parts); records without a decoder ran "bytes"
_U32 = jnp.uint32


def _shift(x: jax.Array, bits: int) -> jax.Array:
    return x << bits if bits >= 0 else x >> -bits


def _as_u32(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(x, _U32)


def _field_value_bits(t: jax.Array, at: int, width: int, mantissa: int, bias: int, scale: jax.Array) -> jax.Array:
    """The minifloat (1 sign, ``width - 1 - mantissa`` exponent, ``mantissa`` bits, exponent
    ``bias``) at bit ``at`` of each u32 of ``t``, times ``scale`` (a power of two), as the u32
    bits of its f32. The magnitude bits go where an f32's top exponent/mantissa bits are and
    the exponent is rebiased by an add; a subnormal (exponent 0) comes out as ``2^-bias *
    (1 + m/2^M)`` and is mapped to its value ``2^(1-bias) * m/2^M`` = ``2 * (f - 2^-bias)``,
    exact (Sterbenz)."""
    low = 23 - mantissa  # where the magnitude's lowest bit lands
    magnitude = _shift(t, low - at) & _U32(((1 << (width - 1)) - 1) << low)
    sign = _shift(t, 31 - (at + width - 1)) & _U32(0x8000_0000)
    f = _f32_from_bits(magnitude + _U32((127 - bias) << 23))
    f = jnp.where(magnitude < _U32(1 << 23), (f - 2.0 ** -bias) * 2.0, f)
    return _as_u32(f * scale) | sign


def _bf16_pairs(low_bits: jax.Array, high_bits: jax.Array) -> jax.Array:
    """Two f32 bit arrays (bf16-exact values) -> u32 words of (low row, high row) bf16s."""
    return (low_bits >> 16) | (high_bits & _U32(0xFFFF_0000))


def _packed_bitcast(x: jax.Array, dtype: Any) -> jax.Array:
    """``pltpu.bitcast``: u16[..., 2n, 128] -> u32[..., n, 128] (word row i = rows 2i low, 2i+1
    high), u32[..., n, 128] -> bf16[..., 2n, 128] (the inverse); any backend, under jit."""
    from jax.experimental.pallas import tpu as pltpu  # Pallas' TPU primitives

    return pltpu.bitcast(x, dtype)


def pack_fp8_words(values: np.ndarray) -> np.ndarray:
    """uint8[..., R, C] e4m3 bytes -> uint16[..., R/2, C] in :func:`dequant_fp8_words`'s order:
    word ``2j`` = bytes of rows ``2j, 2j+1``, word ``2j+1`` = rows ``R/2+2j, R/2+2j+1`` (low
    byte first), so u32 word ``j`` holds output rows ``2j, 2j+1`` and ``R/2+2j, R/2+2j+1``."""
    rows = values.shape[-2]
    if rows % 4:
        raise ValueError(f"fp8 kernel words need rows % 4 == 0, got {rows}")
    v = values.astype(np.uint16)
    halves = [v[..., : rows // 2, :], v[..., rows // 2:, :]]
    pairs = [h[..., 0::2, :] | (h[..., 1::2, :] << 8) for h in halves]  # [..., R/4, C] each
    return np.stack(pairs, axis=-2).reshape(*values.shape[:-2], rows // 2, values.shape[-1])


def pack_mxfp4_words(packed: np.ndarray) -> np.ndarray:
    """uint8[..., R/2, C] (the logical MXFP4 bytes, :func:`quantize_mxfp4`) -> uint16[..., R/4,
    C] in :func:`dequant_mxfp4_words`'s order: u32 word ``j`` (16-bit words ``2j``, ``2j+1``)
    holds, nibble ``k`` = 0..7 from the lowest, logical row ``(k // 2) * R/4 + 2j + k % 2``."""
    nibbles = np.concatenate([packed & 0xF, packed >> 4], axis=-2).astype(np.uint16)  # [..., R, C]
    rows = nibbles.shape[-2]
    if rows % 8:
        raise ValueError(f"mxfp4 kernel words need rows % 8 == 0, got {rows}")
    quarter = rows // 4
    q = [nibbles[..., i * quarter: (i + 1) * quarter, :] for i in range(4)]
    pair = [x[..., 0::2, :] | (x[..., 1::2, :] << 4) for x in q]  # one byte per quarter, [..., R/8, C]
    words = [pair[0] | (pair[1] << 8), pair[2] | (pair[3] << 8)]
    return np.stack(words, axis=-2).reshape(*packed.shape[:-2], rows // 4, packed.shape[-1])


def dequant_fp8_words(value_words: jax.Array, scales: jax.Array) -> jax.Array:
    """Kernel form. ``value_words`` u16[P, R/2, 128] (:func:`pack_fp8_words`), ``scales``
    bf16[P, R/256, 128] -> bf16[P, R, 128]: one 128-column panel per leading index."""
    t = _packed_bitcast(value_words, _U32)  # [P, R/4, 128]
    quarter = t.shape[1]
    scale = repeat_rows(scales.astype(jnp.float32), FP8_BLOCK_ROWS // 2, axis=1)  # word row j: row 2j's scale
    halves = []
    for h, s in enumerate((scale[:, :quarter], scale[:, quarter:])):
        low, high = (_field_value_bits(t, 16 * h + 8 * k, 8, 3, 7, s) for k in (0, 1))
        halves.append(_bf16_pairs(low, high))
    return _packed_bitcast(jnp.concatenate(halves, axis=1), jnp.bfloat16)


def dequant_mxfp4_words(value_words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """Kernel form. ``value_words`` u16[P, R/4, 128] (:func:`pack_mxfp4_words`),
    ``scale_words`` u16[P, R/64, 128] (E8M0 bytes by :func:`pack_bytes_to_words`) ->
    bf16[P, R, 128]. A part of fewer than 32 rows has one scale row (its block's)."""
    t = _packed_bitcast(value_words, _U32)  # [P, R/8, 128]
    eighth = t.shape[1]
    exponents = split_words(scale_words, axis=1)  # [P, R/32, 128] (or 1 row for a short part)
    block = min(8 * eighth, MXFP4_BLOCK_ROWS)
    scale = repeat_rows(decode_e8m0(exponents), block // 2, axis=1)  # word row j: row 2j's scale
    quarters = []
    for q in range(4):
        s = scale[:, q * eighth: (q + 1) * eighth]
        low, high = (_field_value_bits(t, 8 * q + 4 * k, 4, 1, 1, s) for k in (0, 1))
        quarters.append(_bf16_pairs(low, high))
    return _packed_bitcast(jnp.concatenate(quarters, axis=1), jnp.bfloat16)


def dequant_mxfp4_fold(value_words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """Kernel form, same layout as :func:`dequant_mxfp4_words` (``value_words`` u16[P, R/4, 128],
    ``scale_words`` u16[P, R/64, 128]) -> bf16[P, R, 128], in fewer operations: the E8M0
    exponent ``e`` is added into the f32 exponent field with the rebias (one integer add, no
    multiply), so every code decodes as ``D = 2^(ee + e - 128) (1 + m/2)`` with an implicit one;
    e2m1's two codes of exponent 0 (0 and 0.5) are then ``min(D, 2 D - 2^(e - 127))`` — for
    every other code ``2 D - 2^(e-127) >= D`` — exact (Sterbenz), no compare, no select. The f32
    results are exact in bf16, so a pair packs as ``(low >> 16) | high``. Exact for E8M0
    exponents 2 .. 252 (scales 2^-125 .. 2^125; below, the f32 values would be subnormal)."""
    t = _packed_bitcast(value_words, _U32)  # [P, R/8, 128]
    eighth = t.shape[1]
    exponents = split_words(scale_words, axis=1)  # [P, R/32, 128]
    block = min(8 * eighth, MXFP4_BLOCK_ROWS)
    field = repeat_rows(exponents << 23, block // 2, axis=1)  # word row j: row 2j's block
    two = _f32_from_bits(field)  # 2^(e-127): the value of code 0b010 (1.0) at this scale
    rebias = field - _U32(1 << 23)  # exponent field e - 1: code 0b01x lands on 2^(e-127)
    quarters = []
    for q in range(4):
        rows = slice(q * eighth, (q + 1) * eighth)
        halves = []
        for k in (0, 1):
            at = 8 * q + 4 * k
            magnitude = _shift(t, 22 - at) & _U32(7 << 22)
            d = _f32_from_bits(magnitude + rebias[:, rows])
            value = jnp.minimum(d, (d + d) - two[:, rows])
            halves.append(_as_u32(value) | (_shift(t, 31 - (at + 3)) & _U32(0x8000_0000)))
        quarters.append((halves[0] >> 16) | halves[1])
    return _packed_bitcast(jnp.concatenate(quarters, axis=1), jnp.bfloat16)


def words_to_bf16(words: jax.Array) -> jax.Array:
    """u16[...] bit patterns -> bf16[...] (same width bitcast)."""
    return lax.bitcast_convert_type(words, jnp.bfloat16)


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
    sign, magnitude = _U32(0x8000_8000), _U32(0x07F0_07F0)
    second = (t & sign) | ((t >> 4) & magnitude)
    first = ((t << 8) & sign) | ((t << 4) & magnitude)
    return first, second


def mxfp4_pairs_group(t: jax.Array) -> list[jax.Array]:
    """One group's u32 words [8, C] -> four bf16 bit words [8, C] (pairs 0..3, 16 logical rows
    each): the e2m1 values times 2^-126, exact (0.5 is a bf16 subnormal). 19 VALU operations
    per 8 weights."""
    sign, magnitude = _U32(0x8000_8000), _U32(0x01C0_01C0)
    return [(_shift(t, 6 - 4 * p) & magnitude) | (_shift(t, 12 - 4 * p) & sign) for p in range(4)]


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
        t = _packed_bitcast(words[g * half: (g + 1) * half], _U32)
        for h, bits in enumerate(fp8_pairs_group(t)):
            start = g * group + h * half
            w = _packed_bitcast(bits, jnp.bfloat16)
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
        t = _packed_bitcast(words[g * 16: (g + 1) * 16], _U32)
        pairs = [_packed_bitcast(bits, jnp.bfloat16) for bits in mxfp4_pairs_group(t)]
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
        t = _packed_bitcast(value_words[:, g * half: (g + 1) * half], _U32)
        out += [_packed_bitcast(bits, jnp.bfloat16) for bits in fp8_pairs_group(t)]
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
