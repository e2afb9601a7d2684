"""The routed experts on a chip whose MXU takes FP8 (TPU7x, :mod:`megakernel.quant_mxu`): chosen
from the catalog, exact against dequantise-then-multiply, the kernel in interpret mode against
the independent reference, and Mosaic compiling it for tpu7x (mini here; K3's per-device
program under ``heavy``) with FP8 weight pushes in its bundles. v5e/v6e keep the decoders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from tolerances import assert_within_rounding

from megakernel import quant_mxu, reference_jnp
from megakernel.dims import model_dims
from megakernel.expert_products import DECODE, MXU_FP8, expert_products_for
from megakernel.hbm import pack_hbm
from megakernel.kernel import Megakernel
from megakernel.layout import random_weights
from megakernel.mosaic_compile import libtpu_available
from megakernel.quant import (
    bf16_to_words,
    dequant_fp8_b256,
    dequant_mxfp4,
    pack_bytes_to_words,
    quantize_fp8_b256,
    quantize_mxfp4,
)
from megakernel.reference import device_params, init_state
from megakernel.tolerance import REORDERED
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, LANES
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for, shard_plan
from tpusim.workload.registry.names import ExpertTensor

needs_libtpu = pytest.mark.skipif(not libtpu_available(), reason="libtpu is not installed: Mosaic cannot compile here")
ROOT = Path(__file__).resolve().parents[1]


def test_catalog_chooses_the_products() -> None:
    assert expert_products_for("tpu-v7") is MXU_FP8
    assert expert_products_for("tpu-v5e") is DECODE
    assert expert_products_for("tpu-v6e") is DECODE  # lists an fp8 rate, but pushes through a conversion


def test_only_the_fp8_kernel_carries_fp8() -> None:
    """The traced step: FP8 and FP4 values appear only in the kernel built for a chip that takes
    FP8 (the v5e/v6e kernel keeps its u32 decoders, no narrow float anywhere)."""
    from megakernel.mosaic_compile import step_inputs

    model = load_model("kimi-k3-nano")
    dims = model_dims(model, plan_for(model, 1))
    text = {}
    for products in (DECODE, MXU_FP8):
        kernel = Megakernel(dims, load_schedule("published"), 1, 256, expert_products=products)
        text[products.name] = str(jax.make_jaxpr(kernel.step)(*step_inputs(kernel)))
    assert "f8_e4m3fn" not in text[DECODE.name] and "f4_e2m1fn" not in text[DECODE.name]
    assert "f8_e4m3fn" in text[MXU_FP8.name] and "f4_e2m1fn" in text[MXU_FP8.name]


@pytest.mark.parametrize("batch", [1, 3])  # MXFP4 at batch 1: one product per row (ROW_EXPANSION_MAX_ROWS)
@pytest.mark.parametrize("rows", [64, 256, 768, 1024])
def test_products_equal_dequantised_matmuls(rows: int, batch: int) -> None:
    """Each product against the f32 matmul of the dequantised weights: the same values, only
    the f32 sums in block order (so equal to ~1e-7 of the largest output, 0 when one block)."""
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((rows, 128)).astype(np.float32) * np.exp2(rng.integers(-30, 30, (1, 128)))
    x = jnp.asarray(rng.standard_normal((batch, rows)), jnp.bfloat16)
    x32 = x.astype(jnp.float32)
    cases = [(quantize_mxfp4(w), quant_mxu.mxfp4_mxu_product, quant_mxu.pack_mxfp4_rows, pack_bytes_to_words,
              dequant_mxfp4)]
    if rows % 256 == 0:
        cases.append((quantize_fp8_b256(w), quant_mxu.fp8_mxu_product, quant_mxu.pack_fp8_rows, bf16_to_words,
                      dequant_fp8_b256))
    for (values, scales), product, pack, pack_scales, dequant in cases:
        want = jnp.dot(x32, dequant(jnp.asarray(values), jnp.asarray(scales)).astype(jnp.float32), precision="highest")
        got = jax.jit(product)(x, jnp.asarray(pack(values)), jnp.asarray(pack_scales(scales)))
        scale = float(jnp.abs(want).max())
        assert float(jnp.abs(got - want).max()) <= 2e-7 * scale, product.__name__


@pytest.mark.parametrize("part", ["gate_up", "down"])
def test_the_expert_product_probe_runs_the_mxu_products(part: str) -> None:
    """calibration.tpu_bench's expert_product probe with ``fp8-mxu`` (its tpu7x static counts in
    calibration/data/tpu7x-static-schedule.jsonl): its first panel against the float64 product."""
    from calibration.tpu_bench.probes_products import (
        PRODUCT_TOLERANCE,
        panel_product,
        product_inputs,
    )

    inputs, x, dense = product_inputs(part, 1, seed=5)
    x0, words, scales = inputs[0][0], inputs[1][quant_mxu.MXU_FP8_PRODUCTS], inputs[2]  # type: ignore[index]
    got = np.asarray(jax.jit(panel_product(part, quant_mxu.MXU_FP8_PRODUCTS))(x0, words[0], scales[0]), np.float64)
    want = x[0] @ dense[:, :128]
    assert np.abs(got - want).max() <= PRODUCT_TOLERANCE * np.abs(want).max()


def _run_steps(model_name: str, layers: int, steps: int) -> None:
    model = load_model(model_name).with_layers(layers)
    plan = plan_for(model, 1)
    dims = model_dims(model, plan)
    weights = random_weights(dims, seed=0)
    params = device_params(weights)
    kernel = Megakernel(dims, load_schedule("published"), 1, 256, interpret=pltpu.InterpretParams(),
                        expert_products=MXU_FP8)
    hbm = {name: jnp.asarray(value) for name, value in pack_hbm(weights, kernel.geo, MXU_FP8).items()}
    ref = reference_jnp.ReferenceStep(model, plan, weights.arrays, dims.small_offsets)
    state = init_state(dims, 1, kernel.max_context, context=130, seed=1)
    ref_state = reference_jnp.RefState(state.kda_state, state.conv_state, state.kv_cache, state.position)
    tokens = ref_tokens = jnp.asarray([37], jnp.int32)
    for _ in range(steps):
        logits, state = kernel.jitted_step(hbm, params["embedding"], state, tokens)
        ref_logits, ref_state, _ = ref(ref_state, ref_tokens)
        # block-by-block f32 sums (both parts) where the reference multiplies whole dequantised
        # matrices: a reordered sum, as the v5e decoders' test says
        assert_within_rounding(logits, ref_logits, "logits", comparison=REORDERED)
        assert_within_rounding(state.kda_state, ref_state.kda, "KDA state")
        assert_within_rounding(state.kv_cache, ref_state.kv, "KV cache")
        tokens, ref_tokens = (jnp.argmax(x, -1).astype(jnp.int32) for x in (logits, ref_logits))
        np.testing.assert_array_equal(tokens, ref_tokens)


@pytest.mark.slow  # ~30 s of interpret mode
def test_fp8_mxu_kernel_matches_independent_reference_nano() -> None:
    _run_steps("kimi-k3-nano", 5, 2)


@pytest.mark.heavy  # ~40 s more of interpret mode; nano above runs by default
def test_fp8_mxu_kernel_matches_independent_reference_mini_13_layers() -> None:
    _run_steps("kimi-k3-mini", 13, 2)


@pytest.mark.slow  # 8 virtual devices x 4 layers of kimi-k3-nano in interpret mode (~45 s)
def test_fp8_mxu_multi_device_kernel_gives_the_reference_tokens() -> None:
    """The collective kernel as lower_check compiles it for TPU7x (FP8 to the MXU), with its
    experts cut across the devices, against the one-device independent reference."""
    done = subprocess.run([sys.executable, "-m", "megakernel.commands.collective_check", "--devices", "8", "--layers", "4",
                           "--steps", "1", "--expert-products", "fp8-mxu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data["expert_products"] == "fp8-mxu" and data["matches_reference"], data["steps"]


def _compile(argv: list[str], dump: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TPU_SKIP_MDS_QUERY": "1", "JAX_PLATFORMS": "cpu",
           "LIBTPU_INIT_ARGS": f"--xla_jf_dump_to={dump}"}
    out = subprocess.run([sys.executable, "-m", "megakernel.commands.mosaic_compile", *argv], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=False)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pushes(dump: Path) -> dict[str, int]:
    """Weight pushes in the kernel's final bundles by dtype (``vmatpush*.f8e4m3``, ``.bf16``)."""
    (bundles,) = [p for p in dump.glob("*-step.1-*final_bundles.txt") if "analysis" not in p.name]
    text = bundles.read_text()
    return {"fp8": text.count("vmatpush3.f8e4m3."), "bf16": text.count("vmatpush3.bf16.")}


# One weight push loads a vreg: 8 sublanes of 128 32-bit words, four e4m3 values a word, so
# 32 rows of a 128-column panel
FP8_ROWS_PER_PUSH = 8 * 4


def expected_fp8_pushes(model: str, shard_of: str | None = None,
                        expert_panel_unroll: int = EXPERT_PANEL_UNROLL) -> int:
    """The FP8 pushes in the step's bundles, from the kernel's shapes alone: only the routed
    experts' panels are FP8 (gate/up as stored, down widened from e2m1), each panel [rows, 128]
    pushed whole (rows / 32 pushes: every block product of :mod:`megakernel.quant_mxu` unrolled),
    and the experts' panel loop holds ``expert_panel_unroll`` panels of each part an iteration
    (all of a part's panels where it has fewer). Seen on kimi-k3-mini (libtpu 0.0.42):
    16, 32, 48 pushes at unrolls 1, 2, 4 (4 gate/up and 2 down panels of 256 rows)."""
    loaded = load_model(model)
    dims = model_dims(loaded, shard_plan(loaded, shard_of) if shard_of else plan_for(loaded, 1))
    return sum(min(expert_panel_unroll, cols // LANES) * (rows // FP8_ROWS_PER_PUSH)
               for rows, cols in (dims.shapes[ExpertTensor.GATE_UP], dims.shapes[ExpertTensor.DOWN]))


@needs_libtpu
@pytest.mark.slow  # one Mosaic compile of kimi-k3-mini in a fresh process (~30-60 s)
def test_mini_compiles_for_tpu7x_with_fp8_pushes(tmp_path: Path) -> None:
    report = _compile(["--model", "kimi-k3-mini", "--hardware", "tpu-v7"], tmp_path)
    assert report["compile"]["ok"], report["compile"]
    assert _pushes(tmp_path)["fp8"] == expected_fp8_pushes("kimi-k3-mini") == 32


@needs_libtpu
@pytest.mark.heavy  # K3's per-device program (k3-tp32): minutes, and a ~GB dump
def test_k3_shard_compiles_for_tpu7x_with_fp8_pushes(tmp_path: Path) -> None:
    report = _compile(["--model", "kimi-k3", "--shard-of", "k3-tp32", "--weight-banks", "2",
                       "--hardware", "tpu-v7"], tmp_path)
    assert report["compile"]["ok"], report["compile"]
    assert _pushes(tmp_path)["fp8"] == expected_fp8_pushes("kimi-k3", "k3-tp32")
