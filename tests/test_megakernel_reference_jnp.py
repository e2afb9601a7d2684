"""The kernel against the independent plain-jnp reference (:mod:`megakernel.reference_jnp`,
written without the kernel's math modules): greedy tokens equal over 4 steps and logits and
state within :mod:`tests.tolerances`, on a 13-layer kimi-k3-mini (KDA, MLA, the dense and MoE
MLPs, a completed 12-layer residual block; shallow so rounding has not grown chaotic), for the
published schedule and the ring-pool example (every dense tensor through one ring of banks).
Also: the reference imports nothing from ``megakernel``, and its format decoders agree with
ml_dtypes' on what the host encoders wrote."""

from __future__ import annotations

import ast
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from tolerances import assert_within_rounding

from megakernel import reference_jnp
from megakernel.dims import model_dims
from megakernel.examples import ring_schedule
from megakernel.hbm import pack_hbm
from megakernel.kernel import Megakernel
from megakernel.layout import random_weights
from megakernel.quant import quantize_fp8_b256, quantize_mxfp4
from megakernel.reference import device_params, init_state
from megakernel.tolerance import REORDERED
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for


def test_reference_imports_no_kernel_math():
    tree = ast.parse(Path(reference_jnp.__file__).read_text())
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if m and m.startswith("megakernel")], modules


def test_weight_formats_decode_to_what_was_encoded():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((512, 128)).astype(np.float32)
    bits, scales = quantize_fp8_b256(w)
    got = np.asarray(reference_jnp.fp8_weight(jnp.asarray(bits), jnp.asarray(scales)))
    want = bits.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.repeat(scales.astype(np.float32), 256, 0)
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - w).max() <= np.abs(w).max() / 8  # e4m3: 3 mantissa bits
    packed, exps = quantize_mxfp4(w[:256])
    got4 = np.asarray(reference_jnp.mxfp4_weight(jnp.asarray(packed), jnp.asarray(exps)))
    assert got4.shape == (256, 128)
    assert np.abs(got4 - w[:256]).max() <= np.abs(w[:256]).max() / 2  # e2m1: 1 mantissa bit


@pytest.mark.slow
@pytest.mark.parametrize("schedule", [load_schedule("published"), ring_schedule()], ids=lambda s: s.name)
def test_kernel_matches_independent_reference_13_layers_4_greedy_steps(schedule):
    model = load_model("kimi-k3-mini").with_layers(13)
    plan = plan_for(model, 1)
    dims = model_dims(model, plan)
    weights = random_weights(dims, seed=0)
    params = device_params(weights)
    kernel = Megakernel(dims, schedule, 1, 256, interpret=pltpu.InterpretParams())
    hbm = {name: jnp.asarray(value) for name, value in pack_hbm(weights, kernel.geo).items()}
    ref = reference_jnp.ReferenceStep(model, plan, weights.arrays, dims.small_offsets)
    state = init_state(dims, 1, kernel.max_context, context=130, seed=1)
    ref_state = reference_jnp.RefState(state.kda_state, state.conv_state, state.kv_cache, state.position)
    tokens = ref_tokens = jnp.asarray([37], jnp.int32)
    for _ in range(4):
        logits, state = kernel.jitted_step(hbm, params["embedding"], state, tokens)
        ref_logits, ref_state, _ = ref(ref_state, ref_tokens)
        # The kernel's FP8 products go block by block (scales on the products, fp8-pairs) where
        # the independent reference multiplies whole dequantised matrices: a reordered sum, and
        # its rounding grows over steps (measured: logits 0, 3.0e-3, 5.4e-3, 3.2e-3 at steps 0-3).
        assert_within_rounding(logits, ref_logits, "logits", comparison=REORDERED)
        assert_within_rounding(state.kda_state, ref_state.kda, "KDA state")
        assert_within_rounding(state.conv_state, ref_state.conv, "conv window")
        assert_within_rounding(state.kv_cache, ref_state.kv, "KV cache")
        tokens, ref_tokens = (jnp.argmax(x, -1).astype(jnp.int32) for x in (logits, ref_logits))
        np.testing.assert_array_equal(tokens, ref_tokens)
