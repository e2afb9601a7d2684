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
U32 = jnp.uint32


def shift_bits(x: jax.Array, bits: int) -> jax.Array:
    return x << bits if bits >= 0 else x >> -bits


def _as_u32(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(x, U32)


def _field_value_bits(t: jax.Array, at: int, width: int, mantissa: int, bias: int, scale: jax.Array) -> jax.Array:
    """The minifloat (1 sign, ``width - 1 - mantissa`` exponent, ``mantissa`` bits, exponent
    ``bias``) at bit ``at`` of each u32 of ``t``, times ``scale`` (a power of two), as the u32
    bits of its f32. The magnitude bits go where an f32's top exponent/mantissa bits are and
    the exponent is rebiased by an add; a subnormal (exponent 0) comes out as ``2^-bias *
    (1 + m/2^M)`` and is mapped to its value ``2^(1-bias) * m/2^M`` = ``2 * (f - 2^-bias)``,
    exact (Sterbenz)."""
    low = 23 - mantissa  # where the magnitude's lowest bit lands
    magnitude = shift_bits(t, low - at) & U32(((1 << (width - 1)) - 1) << low)
    sign = shift_bits(t, 31 - (at + width - 1)) & U32(0x8000_0000)
    f = _f32_from_bits(magnitude + U32((127 - bias) << 23))
    f = jnp.where(magnitude < U32(1 << 23), (f - 2.0 ** -bias) * 2.0, f)
    return _as_u32(f * scale) | sign


def _bf16_pairs(low_bits: jax.Array, high_bits: jax.Array) -> jax.Array:
    """Two f32 bit arrays (bf16-exact values) -> u32 words of (low row, high row) bf16s."""
    return (low_bits >> 16) | (high_bits & U32(0xFFFF_0000))


def packed_bitcast(x: jax.Array, dtype: Any) -> jax.Array:
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
    t = packed_bitcast(value_words, U32)  # [P, R/4, 128]
    quarter = t.shape[1]
    scale = repeat_rows(scales.astype(jnp.float32), FP8_BLOCK_ROWS // 2, axis=1)  # word row j: row 2j's scale
    halves = []
    for h, s in enumerate((scale[:, :quarter], scale[:, quarter:])):
        low, high = (_field_value_bits(t, 16 * h + 8 * k, 8, 3, 7, s) for k in (0, 1))
        halves.append(_bf16_pairs(low, high))
    return packed_bitcast(jnp.concatenate(halves, axis=1), jnp.bfloat16)


def dequant_mxfp4_words(value_words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """Kernel form. ``value_words`` u16[P, R/4, 128] (:func:`pack_mxfp4_words`),
    ``scale_words`` u16[P, R/64, 128] (E8M0 bytes by :func:`pack_bytes_to_words`) ->
    bf16[P, R, 128]. A part of fewer than 32 rows has one scale row (its block's)."""
    t = packed_bitcast(value_words, U32)  # [P, R/8, 128]
    eighth = t.shape[1]
    exponents = split_words(scale_words, axis=1)  # [P, R/32, 128] (or 1 row for a short part)
    block = min(8 * eighth, MXFP4_BLOCK_ROWS)
    scale = repeat_rows(decode_e8m0(exponents), block // 2, axis=1)  # word row j: row 2j's scale
    quarters = []
    for q in range(4):
        s = scale[:, q * eighth: (q + 1) * eighth]
        low, high = (_field_value_bits(t, 8 * q + 4 * k, 4, 1, 1, s) for k in (0, 1))
        quarters.append(_bf16_pairs(low, high))
    return packed_bitcast(jnp.concatenate(quarters, axis=1), jnp.bfloat16)


def dequant_mxfp4_fold(value_words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """Kernel form, same layout as :func:`dequant_mxfp4_words` (``value_words`` u16[P, R/4, 128],
    ``scale_words`` u16[P, R/64, 128]) -> bf16[P, R, 128], in fewer operations: the E8M0
    exponent ``e`` is added into the f32 exponent field with the rebias (one integer add, no
    multiply), so every code decodes as ``D = 2^(ee + e - 128) (1 + m/2)`` with an implicit one;
    e2m1's two codes of exponent 0 (0 and 0.5) are then ``min(D, 2 D - 2^(e - 127))`` — for
    every other code ``2 D - 2^(e-127) >= D`` — exact (Sterbenz), no compare, no select. The f32
    results are exact in bf16, so a pair packs as ``(low >> 16) | high``. Exact for E8M0
    exponents 2 .. 252 (scales 2^-125 .. 2^125; below, the f32 values would be subnormal)."""
    t = packed_bitcast(value_words, U32)  # [P, R/8, 128]
    eighth = t.shape[1]
    exponents = split_words(scale_words, axis=1)  # [P, R/32, 128]
    block = min(8 * eighth, MXFP4_BLOCK_ROWS)
    field = repeat_rows(exponents << 23, block // 2, axis=1)  # word row j: row 2j's block
    two = _f32_from_bits(field)  # 2^(e-127): the value of code 0b010 (1.0) at this scale
    rebias = field - U32(1 << 23)  # exponent field e - 1: code 0b01x lands on 2^(e-127)
    quarters = []
    for q in range(4):
        rows = slice(q * eighth, (q + 1) * eighth)
        halves = []
        for k in (0, 1):
            at = 8 * q + 4 * k
            magnitude = shift_bits(t, 22 - at) & U32(7 << 22)
            d = _f32_from_bits(magnitude + rebias[:, rows])
            value = jnp.minimum(d, (d + d) - two[:, rows])
            halves.append(_as_u32(value) | (shift_bits(t, 31 - (at + 3)) & U32(0x8000_0000)))
        quarters.append((halves[0] >> 16) | halves[1])
    return packed_bitcast(jnp.concatenate(quarters, axis=1), jnp.bfloat16)


def words_to_bf16(words: jax.Array) -> jax.Array:
    """u16[...] bit patterns -> bf16[...] (same width bitcast)."""
    return lax.bitcast_convert_type(words, jnp.bfloat16)
