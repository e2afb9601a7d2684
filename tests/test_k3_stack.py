"""The SGLang K3 serving stack (tpusim/stacks/sglang-k3.yaml), B300/GB300 and the B300 K3 set."""

from __future__ import annotations

from collections import Counter

import pytest

from calibration.sources.k3_b300 import load_b300_k3
from hwmodels.catalog import load_chip, make_system
from tpusim.engine.gpu_fusion import (
    GENERIC,
    RADIX_ROUTER,
    SINGLE_CTA_ROUTER,
    kernel_lists,
    load_stack,
)
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program

COLLECTIVE = "collective"


def _layers(fmt: str) -> dict[str, dict]:
    model = load_model(f"kimi-k3@{fmt}")
    program = build_program(model, plan_for(model, 8, intra_link="nvlink"), batch=1, context_tokens=1024)
    return {entry["blocks"]: entry for entry in kernel_lists(program, load_stack("sglang-k3"))}


def _main_without_gather(entry: dict) -> int:
    """Main-stream kernels minus the plan's latent all-gather (SGLang replicates latent_down)."""
    return sum(not k["side"] and k["what"] != "all_gather kernel" for k in entry["kernels"])


def test_hand_count_kda_and_mla_layers() -> None:
    # hand count from shared/reference/k3-on-sglang.md 2.2 / 2.3 (T <= 12, TP8, MXFP4):
    # KDA + MoE: agg1, qkvg GEMM, fused KDA decode, o_proj, fused AR, agg2, merged front,
    #   route+quant, permute, FC1, FC2, finalize+AR+norm, gemm_ag GEMV, spin-add3 = 14 main;
    #   side: [f_a|b] GEMV, f_b GEMV, shared SiTU, shared down, shared AR = 5
    # MLA + MoE: agg1, fused_a GEMM, q_a norm, q_b GEMM, w_kc BMM, KV write, MLA decode, w_vc BMM,
    #   output gate, o_proj, fused AR = 11 + MoE 9 = 20 main; side: kv_a norm, g_proj + 3 = 5
    layers = _layers("mxfp4")
    kda = next(v for k, v in layers.items() if "kda" in k and "moe" in k)
    mla = next(v for k, v in layers.items() if "mla" in k and "moe" in k)
    assert (_main_without_gather(kda), kda["side"]) == (14, 5)
    assert (_main_without_gather(mla), mla["side"]) == (20, 5)
    assert sum(k["kind"] == COLLECTIVE for k in kda["kernels"]) == 3  # AR, latent gather, MoE AR


def test_nvfp4_takes_the_in_op_single_cta_router() -> None:
    mx = Counter(k["kind"] for k in _layers("mxfp4")["attn+kda+mlp+moe"]["kernels"])
    nv = Counter(k["kind"] for k in _layers("nvfp4")["attn+kda+mlp+moe"]["kernels"])
    assert mx[RADIX_ROUTER] == 1 and mx[SINGLE_CTA_ROUTER] == 0
    assert nv[SINGLE_CTA_ROUTER] == 1 and nv[RADIX_ROUTER] == 0
    assert sum(nv.values()) == sum(mx.values()) + 1  # + the separate fp4_quantize kernel


def test_stacks_load_and_chips_name_them() -> None:
    assert load_stack("generic") is GENERIC
    assert load_chip("b300", calibrated=False).execution.gpu.stack == "sglang-k3"
    assert load_chip("b200", calibrated=False).execution.gpu.stack == "generic"
    gb300 = make_system("gb300", 16, calibrated=False)
    assert gb300.chip.hbm.capacity_bytes.value == 288e9 and gb300.hosts == 4
    assert next(link for link in gb300.chip.links if link.name == "nvlink").domain_devices == 72


def test_unknown_stack_is_one_line() -> None:
    from hwmodels.errors import InputError

    with pytest.raises(InputError, match="unknown serving stack 'nope'"):
        load_stack("nope")


def test_b300_records() -> None:
    records = load_b300_k3()
    assert [(r.extra["format"], r.extra["speculative"], r.ms_per_step_median) for r in records] == [
        ("mxfp4", None, 8.51), ("mxfp4", "kimi-k3-dspark", 2.84), ("nvfp4", None, 10.12),
        ("nvfp4", "kimi-k3-dspark", 3.24)]
    assert all(r.system.chip == "b300" and r.system.chips == 8 and r.label == "published" for r in records)


@pytest.mark.slow
def test_fit_runs_and_holds_out_each_format() -> None:
    from calibration.sources.k3_b300 import fit_k3_stack

    fit = fit_k3_stack(load_chip("b300", calibrated=False), max_evals=6)
    assert set(fit["holdout"]) == {"mxfp4", "nvfp4"}
    assert fit["format_difference"]["predicted_before"] > 0.05  # the kernel path, not a constant
    assert all(fit["dspark_checks"][fmt]["plausible"] for fmt in ("mxfp4", "nvfp4"))


def test_gb200_takes_the_b300_fit_as_derived(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from hwmodels.overlay import CalibratedValue, CalibrationOverlay, save_overlay
    from tpusim.engine.gpu import derived_origin

    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path))
    assert derived_origin(load_chip("gb200")) == ""  # no b300 overlay: priors
    save_overlay(CalibrationOverlay(chip="b300", fitted_on="published:b300-sglang-k3", parameters={
        "execution.gpu.kernel_gap_s": CalibratedValue(value=0.9e-6, fitted_on="published:b300-sglang-k3"),
        "execution.per_op_efficiency": CalibratedValue(value=0.95, fitted_on="published:b300-sglang-k3")}))
    gb200 = load_chip("gb200")
    assert gb200.execution.gpu.kernel_gap_s.value == 0.9e-6 and gb200.execution.gpu.kernel_gap_s.label == "derived"
    assert gb200.execution.per_op_efficiency.value == 0.95
    assert derived_origin(gb200) == "derived from calibrated b300"
    assert not gb200.is_calibrated
    assert gb200.hbm.capacity_bytes.value == 186e9  # its own physics
    assert derived_origin(load_chip("b200")) == ""  # b200 names no source chip


def test_gpu_rows_serve_k3_in_mxfp4() -> None:
    k3 = load_model("kimi-k3")
    assert k3.for_chip_kind("gpu").formats["routed_gate_up"] == "mxfp4"
    assert k3.for_chip_kind("tpu").formats["routed_gate_up"] == "fp8_e4m3_b256"  # the TPU re-blocks gate/up
    assert load_model("kimi-k3@nvfp4").for_chip_kind("gpu").variant == "nvfp4"  # a chosen variant wins
