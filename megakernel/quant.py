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
:mod:`megakernel.layout`); :func:`pack_bytes_to_words` pairs the upper and lower halves of a
byte matrix's rows into one uint16 (``word[r] = byte[r] | byte[r + R/2] << 8``), and the
``*_words`` decoders undo it inside the kernel. All decoders use only integer shifts/masks,
``where`` and bitcasts, so the same code runs in the reference, in TPU interpret mode and
lowers to Mosaic. Dequantised values are exact in bf16 (3 or 1 mantissa bits, power-of-two
scales), so a dequantised matmul equals the reference's bit for bit.
"""

from __future__ import annotations

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


def dequant_fp8_words(value_words: jax.Array, scales: jax.Array) -> jax.Array:
    """Kernel form. ``value_words`` u16[P, R/2, 128] (byte pairs), ``scales`` bf16[P, R/256,
    128] -> bf16[P, R, 128]: one 128-column panel per leading index."""
    bits = split_words(value_words, axis=1)
    scale = repeat_rows(scales.astype(jnp.float32), FP8_BLOCK_ROWS, axis=1)
    return (decode_e4m3(bits) * scale).astype(jnp.bfloat16)


def dequant_mxfp4_words(value_words: jax.Array, scale_words: jax.Array) -> jax.Array:
    """Kernel form. ``value_words`` u16[P, R/4, 128] (packed bytes paired by halves),
    ``scale_words`` u16[P, R/64, 128] -> bf16[P, R, 128].

    Nibble q of ``word[r]`` holds logical row: q=0 ``r``, q=1 ``r + R/2``, q=2 ``r + R/4``,
    q=3 ``r + 3R/4`` (byte halves, then nibble halves)."""
    w = value_words.astype(jnp.uint32)
    n0, n1, n2, n3 = (w & 0xF), (w >> 4) & 0xF, (w >> 8) & 0xF, (w >> 12) & 0xF
    nibbles = jnp.concatenate([n0, n2, n1, n3], axis=1)
    exponents = split_words(scale_words, axis=1)
    scale = repeat_rows(decode_e8m0(exponents), MXFP4_BLOCK_ROWS, axis=1)
    return (decode_e2m1(nibbles) * scale).astype(jnp.bfloat16)


def words_to_bf16(words: jax.Array) -> jax.Array:
    """u16[...] bit patterns -> bf16[...] (same width bitcast)."""
    return lax.bitcast_convert_type(words, jnp.bfloat16)
