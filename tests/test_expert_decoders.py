"""The kernel's expert decoders (fp8 pairs, mxfp4 fold): every code in every position, bit-exact; the blocked FP8 product."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from megakernel import quant, quant_pairs


def _bf16_rows(bits: np.ndarray) -> np.ndarray:
    """u32 words [n, C] -> f64 [2n, C]: row 2i the low half, 2i+1 the high (pltpu.bitcast's order)."""
    lo = (bits & 0xFFFF).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    hi = (bits >> 16).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    return np.stack([lo, hi], axis=1).reshape(-1, bits.shape[-1])


@pytest.mark.parametrize("rows", [256, 512, 1024])
def test_every_code_in_every_position_decodes_exactly(rows: int) -> None:
    cols = 128
    codes = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
    codes = ((codes * 131 + codes // cols * 7) % 256).astype(np.uint8)  # every code, in every row and lane slot
    codes[(codes & 0x7F) == 0x7F] = 0x00  # e4m3fn's NaN: never produced by the encoder
    words = quant_pairs.pack_fp8_pairs(codes)
    t = np.asarray(words).reshape(rows // 4, 2, cols)
    t32 = t[:, 0].astype(np.uint32) | (t[:, 1].astype(np.uint32) << 16)  # u16 rows 2i, 2i+1 -> u32 row i
    group = quant_pairs.fp8_pair_group_rows(rows)
    out = np.zeros((rows, cols))
    for g in range(rows // group):
        first, second = quant_pairs.fp8_pairs_group(jnp.asarray(t32[g * group // 4: (g + 1) * group // 4]))
        out[g * group: g * group + group // 2] = _bf16_rows(np.asarray(first))
        out[g * group + group // 2: (g + 1) * group] = _bf16_rows(np.asarray(second))
    want = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * 2.0 ** -quant_pairs.FP8_FOLD_LOG2
    assert np.array_equal(out, want)  # subnormal codes land on bf16 subnormals, exactly


def test_one_group_packs_like_the_byte_words() -> None:
    codes = np.random.default_rng(0).integers(0, 256, (256, 128)).astype(np.uint8)
    assert np.array_equal(quant_pairs.pack_fp8_pairs(codes), quant.pack_bytes_to_words(codes))
    with pytest.raises(ValueError, match="rows % 256"):
        quant_pairs.pack_fp8_pairs(codes[:128])


def test_blocked_product_equals_the_dense_product() -> None:
    rng = np.random.default_rng(1)
    rows, batch = 1536, 3
    w = rng.standard_normal((rows, 128)).astype(np.float32)
    codes, scales = quant.quantize_fp8_b256(w)
    codes[((codes & 0x78) == 0)] &= 0x80  # no subnormal codes: XLA on a CPU flushes them (as the v5e MXU does)
    dense = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    dense *= np.repeat(scales.astype(np.float64), quant.FP8_BLOCK_ROWS, axis=0)
    x = rng.standard_normal((batch, rows)).astype(ml_dtypes.bfloat16)
    scale_words = jnp.asarray(quant.bf16_to_words(scales.astype(np.float32)))
    got = jax.jit(quant_pairs.fp8_panel_product)(quant_pairs.prescale_activations(jnp.asarray(x)),
                                           jnp.asarray(quant_pairs.pack_fp8_pairs(codes)), scale_words)
    want = x.astype(np.float64) @ dense
    assert np.abs(np.asarray(got, np.float64) - want).max() <= 2e-6 * np.abs(want).max()
    logical = quant_pairs.fp8_blocked_products(jnp.asarray(x, jnp.float32), jnp.asarray(codes)[None], jnp.asarray(scales)[None])
    # the reference's logical form: the same sums (bit-identity in the kernel is test_megakernel_kernel's)
    assert np.abs(np.asarray(logical, np.float64)[:, 0] - want).max() <= 2e-6 * np.abs(want).max()


def test_mxfp4_fold_every_code_and_scale_exactly() -> None:
    """The kernel's MXFP4 decoder: every e2m1 code in every nibble position at every E8M0
    exponent it is exact for (2 .. 252), signed zeros included, against ml_dtypes."""
    rows, cols = 512, 128
    nib = (np.arange(rows * cols).reshape(rows, cols) * 7 + np.arange(rows)[:, None] // 3) % 16
    nib = nib.astype(np.uint8)
    packed = (nib[: rows // 2] | (nib[rows // 2:] << 4)).astype(np.uint8)
    e = (2 + (np.arange(rows // 32 * cols).reshape(rows // 32, cols) * 13) % 251).astype(np.uint8)  # 2 .. 252
    assert set(np.unique(e)) == set(range(2, 253))
    got = jax.jit(quant.dequant_mxfp4_fold)(jnp.asarray(quant.pack_mxfp4_words(packed))[None],
                                          jnp.asarray(quant.pack_bytes_to_words(e))[None])[0]
    got64 = np.asarray(got.astype(jnp.float32), np.float64)
    want = nib.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    want *= np.repeat(np.exp2(e.astype(np.float64) - quant.E8M0_BIAS), quant.MXFP4_BLOCK_ROWS, axis=0)
    assert np.array_equal(got64, want) and np.array_equal(np.signbit(got64), np.signbit(want))
