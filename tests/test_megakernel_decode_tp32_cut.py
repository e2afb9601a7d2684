"""The nano TP32 shard cut (plan-k3-nano-tp32.yaml: 32 devices, expert groups of 4 ranks,
``expert_tp`` 4, each of the 8 heads on 4 devices) against independent numpy references.

- The 4 expert-TP parts of an expert, dequantised by the kernel's decoders and run through
  the gated MLP, sum to the whole expert's output, the whole expert dequantised by a numpy
  decoder written here from the format definitions (ml_dtypes' e4m3 / e2m1, E8M0 = 2^(e-127)).
- Each part's bytes are the plan's expert slice bytes (:func:`tpusim.workload.shapes.expert_slice_tensors`).
- An MXFP4 row slice unpacks to the same values as the rows of the whole tensor.
- Over the ranks of one parity, the attention output-projection parts cover every row of
  every head exactly once (the same-parity reduce sums each head once).
- A routed reduce that does not span every part of an expert group is refused.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megakernel.collective_plan import UnsupportedPlan
from megakernel.decode_shards import cut_of, weight_shard
from megakernel.layout import random_weights
from megakernel.math_moe import gated_mlp
from megakernel.multi_device_decode import DecodeKernel
from megakernel.quant import dequant_fp8_b256, dequant_mxfp4, mxfp4_row_slice
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.shapes import expert_slice_tensors


@pytest.fixture(scope="module")
def tp32():
    model = load_model("kimi-k3-nano").with_layers(4)
    plan = plan_for(model, 32)
    kernel = DecodeKernel(model, plan, 1, 8, interpret=True)
    return model, plan, kernel, random_weights(kernel.one, seed=3).arrays


def _fp8_numpy(values: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return values.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(scales.astype(np.float32), 256, 0)


def _mxfp4_numpy(packed: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    nibbles = np.concatenate([packed & 15, packed >> 4], axis=-2)
    values = nibbles.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    block = min(values.shape[-2], 32)
    return values * np.repeat(np.exp2(exponents.astype(np.float32) - 127), block, axis=-2)


@pytest.mark.slow  # 32 ranks' expert shards cut and run through the MLP (~9 s, loaded machine)
def test_expert_parts_sum_to_the_whole_expert(tp32):
    model, plan, kernel, full = tp32
    rng = np.random.default_rng(1)
    latent = jnp.asarray(rng.standard_normal((3, kernel.one.moe.latent)), jnp.float32)
    specs = expert_slice_tensors(model, plan)
    tp, local = plan.expert_tp, plan.experts_per_group(model)
    group = plan.expert_groups - 1  # ranks 28-31: the cut is not at the origin
    parts = [weight_shard(full, kernel.one, kernel.dims, cut_of(model, plan, group * tp + t)) for t in range(tp)]
    for j in range(local):
        e = group * local + j
        whole_gu = _fp8_numpy(full["expert.gate_up.values"][0, e], full["expert.gate_up.scales"][0, e])
        whole_dn = _mxfp4_numpy(full["expert.down.values"][0, e], full["expert.down.scales"][0, e])
        want = np.asarray(gated_mlp(latent, jnp.asarray(whole_gu, jnp.bfloat16), jnp.asarray(whole_dn, jnp.bfloat16)))
        got = np.zeros_like(want)
        for shard in parts:
            gu = dequant_fp8_b256(shard["expert.gate_up.values"][0, j], shard["expert.gate_up.scales"][0, j])
            dn = dequant_mxfp4(shard["expert.down.values"][0, j], shard["expert.down.scales"][0, j])
            got += np.asarray(gated_mlp(latent, gu, dn))
            stored = sum(shard[f"expert.{n}.{k}"][0, j].nbytes for n in ("gate_up", "down")
                         for k in ("values", "scales"))
            assert stored == sum(s.bytes for s in specs)  # the plan's slice bytes
        assert np.abs(want).max() > 0.1
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(64, 16), (64, 32), (128, 64), (64, 8), (96, 32)]), st.data())
def test_mxfp4_row_slice_keeps_the_values(shape, data):
    rows, part = shape
    seed = data.draw(st.integers(0, 2**16))
    start = part * data.draw(st.integers(0, rows // part - 1))
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, (rows // 2, 8)).astype(np.uint8)
    exponents = rng.integers(120, 135, (rows // 32, 8)).astype(np.uint8)
    whole = _mxfp4_numpy(packed, exponents)
    sliced = _mxfp4_numpy(*mxfp4_row_slice(packed, exponents, start, part))
    np.testing.assert_array_equal(sliced, whole[start: start + part])


def test_mxfp4_row_slice_refuses_a_slice_across_blocks():
    with pytest.raises(ValueError):
        mxfp4_row_slice(np.zeros((32, 4), np.uint8), np.zeros((2, 4), np.uint8), 16, 32)


def test_head_replicas_cover_each_output_projection_row_once_per_parity(tp32):
    model, plan, _, _ = tp32
    hd, heads = model.kda.head_dim, model.kda.num_heads
    for parity in (0, 1):
        rows: list[int] = []
        for rank in range(parity, plan.devices, 2):
            cut = cut_of(model, plan, rank)
            assert cut.first_head == rank % heads  # one head per device, each on 4 devices
            rows += list(range(heads * hd))[cut.pair_rows(hd)]
        assert sorted(rows) == list(range(heads * hd))


def test_a_routed_reduce_within_a_host_is_refused(tp32):
    model, plan, _, _ = tp32
    moe = [s.model_copy(update={"group": "host"}) if s.name == "moe.routed_reduce" else s for s in plan.moe_collectives]
    with pytest.raises(UnsupportedPlan, match=r"moe\.routed_reduce"):
        DecodeKernel(model, plan.model_copy(update={"moe_collectives": moe}), 1, 8, interpret=True)
