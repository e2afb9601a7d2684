"""Megakernel building blocks (fast, no kernel run): weight formats, residual mixing, routing,
dims against tpusim.workload.shapes, the weight layout and safetensors loading."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from hwmodels.errors import InputError
from megakernel import math_moe, residual
from megakernel.dims import UnsupportedModel, model_dims, weight_shapes
from megakernel.hbm import pack_hbm, panels
from megakernel.layout import array_specs, load_safetensors, random_weights, save_safetensors
from megakernel.quant import (
    dequant_fp8_b256,
    dequant_fp8_words,
    dequant_mxfp4,
    dequant_mxfp4_words,
    pack_bytes_to_words,
    pack_fp8_words,
    pack_mxfp4_words,
    quantize_fp8_b256,
    quantize_mxfp4,
)
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.shapes import expert_slice_bytes, layer_tensors, lm_head_tensors


@pytest.fixture(scope="module")
def small_model_dims():
    model = load_model("kimi-k3-mini").with_layers(5)
    return model_dims(model, plan_for(model, 1))


def test_fp8_block_scales_are_powers_of_two_and_decode_exactly():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 256)).astype(np.float32) * 0.05
    values, scales = quantize_fp8_b256(w)
    assert values.dtype == np.uint8 and scales.shape == (2, 256)
    exponents = np.log2(scales.astype(np.float32))
    assert np.all(exponents == np.round(exponents))
    want = values.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(scales.astype(np.float32), 256, 0)
    got = np.asarray(dequant_fp8_b256(jnp.asarray(values), jnp.asarray(scales)), np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - w).max() <= 0.07 * np.abs(w).max()  # e4m3 keeps 3 mantissa bits


def test_mxfp4_decodes_exactly_and_kernel_word_form_matches():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((256, 384)).astype(np.float32)
    packed, exps = quantize_mxfp4(w)
    assert packed.shape == (128, 384) and exps.shape == (8, 384)
    nibbles = np.concatenate([packed & 15, packed >> 4]).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    want = nibbles * np.repeat(np.exp2(exps.astype(np.float32) - 127), 32, 0)
    got = np.asarray(dequant_mxfp4(jnp.asarray(packed), jnp.asarray(exps)), np.float32)
    np.testing.assert_array_equal(got, want)
    words = jax.jit(dequant_mxfp4_words)(jnp.asarray(panels(pack_mxfp4_words(packed)).reshape(3, 64, 128)),
                                         jnp.asarray(panels(pack_bytes_to_words(exps)).reshape(3, 4, 128)))
    np.testing.assert_array_equal(np.asarray(words, np.float32).transpose(1, 0, 2).reshape(256, 384), want)


def test_fp8_kernel_word_form_matches_logical_form():
    w = np.random.default_rng(2).standard_normal((256, 256)).astype(np.float32)
    values, scales = quantize_fp8_b256(w)
    logical = np.asarray(dequant_fp8_b256(jnp.asarray(values), jnp.asarray(scales)), np.float32)
    words = panels(pack_fp8_words(values)).reshape(2, 128, 128)
    kernel = jax.jit(dequant_fp8_words)(jnp.asarray(words), jnp.asarray(scales).reshape(1, 2, 128).transpose(1, 0, 2))
    np.testing.assert_array_equal(np.asarray(kernel, np.float32).transpose(1, 0, 2).reshape(256, 256), logical)


def test_kernel_word_decoders_are_exact_for_every_code_at_every_position():
    """Every e4m3 byte (zeros, subnormals, 0x7F) and e2m1 nibble, in every row of a word, at
    several scales, against ml_dtypes' own conversion (independent of our decoders)."""
    rng = np.random.default_rng(4)
    codes = np.arange(256, dtype=np.uint8)
    values = np.concatenate([np.repeat(codes[:, None], 128, 1), np.repeat(codes[::-1, None], 128, 1)])
    values = np.stack([np.roll(values, shift, axis=0) for shift in range(4)])  # each code in each byte of a word
    scales = np.exp2(rng.integers(-20, 8, (4, 2, 128))).astype(ml_dtypes.bfloat16)
    e4m3 = values.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    e4m3[np.isnan(e4m3)] = np.where(values[np.isnan(e4m3)] & 0x80, -480.0, 480.0)  # NaN codes (never encoded)
    want = e4m3 * np.repeat(scales.astype(np.float32), 256, 1)
    words = panels(pack_fp8_words(values)).reshape(4, 256, 128)
    got = jax.jit(dequant_fp8_words)(jnp.asarray(words), jnp.asarray(scales))
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)
    nibbles = np.stack([np.roll(np.repeat(np.arange(16, dtype=np.uint8)[:, None], 128, 1), s, 0) for s in range(8)])
    nibbles = np.tile(nibbles, (1, 4, 1))  # [8, 64, 128]: every code in every nibble of a u32
    packed = (nibbles[:, :32] | (nibbles[:, 32:] << 4)).astype(np.uint8)
    exps = rng.integers(100, 150, (8, 2, 128)).astype(np.uint8)
    e2m1 = (nibbles & 7).view(ml_dtypes.float4_e2m1fn).astype(np.float32) * np.where(nibbles & 8, -1.0, 1.0)
    want = e2m1 * np.repeat(np.exp2(exps.astype(np.float32) - 127), 32, 1)
    got = jax.jit(dequant_mxfp4_words)(jnp.asarray(pack_mxfp4_words(packed)), jnp.asarray(pack_bytes_to_words(exps)))
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)


def test_residual_mix_is_a_convex_combination_of_valid_sources():
    rng = np.random.default_rng(3)
    blocks = jnp.asarray(rng.standard_normal((4, 2, 128)), jnp.float32)
    partial = jnp.asarray(rng.standard_normal((2, 128)), jnp.float32)
    query = jnp.asarray(rng.standard_normal((1, 128)), jnp.float32)
    only_first = residual.mix(blocks, partial, 1, False, query, 1e-5)
    np.testing.assert_allclose(only_first, blocks[0], rtol=1e-6)  # one valid source: itself
    mixed = np.asarray(residual.mix(blocks, partial, 2, True, query, 1e-5))
    sources = np.stack([blocks[0], blocks[1], partial])
    lo, hi = sources.min(axis=0), sources.max(axis=0)
    assert np.all(mixed >= lo - 1e-5) and np.all(mixed <= hi + 1e-5)


def test_topk_matches_lax_top_k_and_weights_renormalise():
    rng = np.random.default_rng(4)
    scores = jax.nn.sigmoid(jnp.asarray(rng.standard_normal((5, 16)), jnp.float32))
    bias = jnp.asarray(rng.standard_normal((1, 16)) * 0.1, jnp.float32)
    ids, weights = math_moe.select_topk(scores, bias, 4, 2.5)
    _, want = jax.lax.top_k(scores + bias, 4)
    np.testing.assert_array_equal(np.concatenate([np.asarray(i) for i in ids], axis=1), np.asarray(want))
    np.testing.assert_allclose(sum(np.asarray(w) for w in weights), 2.5, rtol=1e-6)


def test_distinct_experts_are_listed_round_major():
    choices = np.array([[3, 1, 7], [1, 5, 3]])  # rows x rounds
    assert math_moe.distinct_experts(choices) == [3, 1, 5, 7]


@pytest.mark.parametrize(("name", "devices"), [("kimi-k3-mini", 1), ("kimi-k3", 32)])
def test_kernel_shapes_and_bytes_equal_tpusim_shapes(name, devices):
    model = load_model(name)
    plan = plan_for(model, devices)
    dims = model_dims(model, plan)
    ours = dict(weight_shapes(dims))
    for t in layer_tensors(model, plan, 3) + layer_tensors(model, plan, 1) + lm_head_tensors(model, plan):
        if not t.name.startswith("small."):
            assert ours[t.name] == (t.rows, t.cols), t.name
    # the kernel's math slices these matrices by its own widths: they must agree with the shapes
    k, m, e = dims.kda, dims.mla, dims.moe
    assert ours["kda.qkvgb"] == (dims.hidden, k.qkvgb_cols) and ours["kda.o"] == (k.width, dims.hidden)
    assert ours["mla.q_b"] == (m.q_lora, m.heads * m.q_head_cols) and ours["mla.kv_a"] == (dims.hidden, m.kv_cols)
    assert ours["mla.kv_b"] == (m.kv_lora, m.heads * m.kv_b_head_cols)
    assert ours["expert.gate_up"] == (e.latent, 2 * e.slice_width) and ours["head.lm_head"] == (dims.hidden, dims.vocab_rows)
    slot = sum(int(np.prod(shape[2:])) * np.dtype(dtype).itemsize for key, (shape, dtype) in array_specs(dims).items()
               if key.startswith("expert."))
    assert slot == expert_slice_bytes(model, plan)  # 7,010,304 B at K3 TP32


def test_unsupported_models_are_rejected_with_the_reason():
    with pytest.raises(UnsupportedModel, match="KDA and MLA"):
        model = load_model("muse-spark")
        model_dims(model, plan_for(model, 8))


def test_random_weights_have_the_table_shapes_and_pack_to_word_slabs(small_model_dims):
    weights = random_weights(small_model_dims, seed=1)
    for name, (shape, dtype) in array_specs(small_model_dims).items():
        assert weights[name].shape == shape and weights[name].dtype == dtype, name
    from megakernel.dma_plan import geometry

    hbm = pack_hbm(weights, geometry(small_model_dims, load_schedule("published")))
    assert all(a.dtype == np.uint16 and a.shape[-1] == 128 for a in hbm.values())
    # kda.qkvgb bf16[256, 1152]: 9 panels of 128 columns, one slab
    assert hbm["kda.qkvgb"].shape == (len(small_model_dims.kda_layers), 1, 9 * 256, 128)


def test_safetensors_round_trip_and_validation(tmp_path, small_model_dims):
    weights = random_weights(small_model_dims, seed=2)
    files = save_safetensors(weights, tmp_path / "ckpt", max_file_bytes=8 << 20)
    assert len(files) > 1  # sharded
    loaded = load_safetensors(small_model_dims, tmp_path / "ckpt")
    for name, value in weights.arrays.items():
        np.testing.assert_array_equal(loaded[name].view(np.uint8), value.view(np.uint8), err_msg=name)
    from safetensors.numpy import load_file, save_file

    first = load_file(str(files[0]))
    name = next(iter(first))
    first[name] = first[name][:1]
    save_file(first, str(files[0]))
    with pytest.raises(InputError, match=name.replace(".", r"\.")):
        load_safetensors(small_model_dims, tmp_path / "ckpt")
    with pytest.raises(InputError, match=r"no \*\.safetensors"):
        load_safetensors(small_model_dims, tmp_path)
