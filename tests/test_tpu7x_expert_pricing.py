"""The simulator prices the routed experts the way the kernel compiled for each chip multiplies
them (:mod:`megakernel.expert_products`): on a chip whose MXU takes FP8 (tpu-v7) the kernel
feeds the FP8 tiles to the MXU against bf16 activations (Mosaic: ``vmatpush3.f8e4m3`` then
``vmatmul.mubr.bf16``) with no VPU decode, so the engine prices no conversion of either expert
format there and runs the products at the bf16-activation rate; on tpu-v5e the kernel decodes
on the VPU and the engine prices the catalog's per-element decode."""

from __future__ import annotations

import pytest

from hwmodels.catalog import load_chip
from megakernel.expert_products import MXU_FP8, expert_products_for
from tpusim.engine.core import simulate
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.registry.names import Family


def _expert_ops(model_name: str = "kimi-k3-mini"):
    model = load_model(model_name)
    program = build_program(model, plan_for(model, 1), batch=1, context_tokens=256)
    ops = [op for layer in program.layers for op in layer.ops
           if op.tensors and op.tensors[0].family == Family.ROUTED_EXPERT]
    assert ops
    return program, ops


@pytest.mark.parametrize("chip_name", ["tpu-v5e", "tpu-v6e", "tpu-v7"])
def test_engine_prices_no_decode_where_the_kernel_feeds_fp8_to_the_mxu(chip_name: str) -> None:
    chip = load_chip(chip_name)
    _, ops = _expert_ops()
    formats = {t.fmt.name for op in ops for t in op.tensors}
    assert formats == {"fp8_e4m3_b256", "mxfp4"}
    decode = {fmt: chip.vector_unit.dequant_for(fmt) for fmt in formats}
    if expert_products_for(chip_name) is MXU_FP8:
        assert decode == dict.fromkeys(formats, 0.0)
        # bf16 activations against FP8 weights: the product runs at the bf16-activation rate
        assert {op.matmul_dtype for op in ops} == {"bf16"}
        assert chip.matrix_unit.takes_weights("fp8")
    elif chip_name == "tpu-v5e":  # decoded on the VPU, priced per element
        assert all(rate > 0 for rate in decode.values())


def test_tpu7x_step_carries_no_decode_time() -> None:
    """The same K3-mini step on tpu-v7 and on tpu-v7 given v5e's decode rates: the catalog's
    (the kernel's FP8 path) keeps the VPU free of decode, so it is faster and its VPU less busy."""
    program, _ = _expert_ops()
    schedule = load_schedule("published")
    v7 = load_chip("tpu-v7")
    v5e_vpu = load_chip("tpu-v5e").vector_unit
    vpu = v7.vector_unit.model_copy(update={"dequant_s_per_element": v5e_vpu.dequant_s_per_element})
    decoding = v7.model_copy(update={"compute": [vpu if unit.name == "vpu" else unit for unit in v7.compute]})
    assert decoding.vector_unit.dequant_for("mxfp4") > 0
    native, decoded = simulate(program, schedule, v7), simulate(program, schedule, decoding)
    assert native.step_s < decoded.step_s
    assert native.busy_fraction["vpu"] * native.step_s < decoded.busy_fraction["vpu"] * decoded.step_s
