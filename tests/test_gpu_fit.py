"""The GPU micro-benchmark fit (calibration.sources.gpu_micro) on synthetic data with known figures,
whole-step prediction of held-out steps, the CLI path, and the h200 -> b200 transfer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibration.core.parameters import chip_with
from calibration.sources.gpu_micro import StepPredictor, fit_micro, micro_time_s
from calibration.sources.gpu_transfer import derive_from_h200, derived_figures
from calibration.sources.measurements import Measurement, write_measurements
from hwmodels.catalog import load_chip
from hwmodels.errors import InputError
from tpusim.app.cli import main as cli_main

TRUE = {"dispatch": 9.0e-6, "gap": 2.2e-6, "sustained": 3.9e12, "eff": 0.82}
TRUE_PATHS = {"execution.per_step_overhead_s": 9.0e-6, "execution.gpu.kernel_gap_s": 2.2e-6,
              "hbm.sustained_bandwidth_bytes_per_s": 3.9e12, "execution.per_op_efficiency": 0.82}


def _record(model: str, batch: int, seconds: float, kind: str, **extra: object) -> Measurement:
    return Measurement(model=model, system={"chip": "h200", "chips": 1}, batch=batch, context=1,
                       backend="gpu-xla", ms_per_step_median=seconds * 1e3, ms_per_step_spread=0.0,
                       label="synthetic", extra={"kind": kind, **extra})


def synthetic_micro(noise: float = 0.01, seed: int = 0) -> list[Measurement]:
    """Micro records from the micro models at TRUE figures, with deterministic relative noise."""
    h200 = load_chip("h200", calibrated=False)
    rng = np.random.default_rng(seed)
    skeletons = [_record(f"bench:copy[bytes={b}]", 1, 1.0, "copy", bytes=b) for b in (2 ** e for e in range(16, 33))]
    skeletons += [_record(f"bench:gap-compiled[ops={k}]", 1, 1.0, "gap_compiled", kernels=k) for k in (1, 4, 16, 64, 256)]
    shapes = [(2048, 2048), (2048, 16384), (8192, 2048), (4096, 28672), (2048, 128256), (768, 2048)]
    skeletons += [_record(f"bench:matmul@{d}[k={k},n={n}]", rows, 1.0, "matmul", rows=rows, k=k, n=n, dtype=d)
                  for k, n in shapes for rows in (1, 8, 64, 256) for d in ("bf16", "fp8")]
    return [r.model_copy(update={"ms_per_step_median": micro_time_s(TRUE, h200, r) * 1e3 * (1 + noise * rng.standard_normal())})
            for r in skeletons]


def synthetic_steps() -> list[Measurement]:
    """Whole steps 'measured' as the engine predicts them on the chip with TRUE figures."""
    truth = chip_with(load_chip("h200", calibrated=False), TRUE_PATHS)
    predictor = StepPredictor()
    steps = [_record("llama-3.2-1b", 8, 1.0, "decode_step"),
             _record("kimi-k3-mini[layers=2,formats=bf16]", 1, 1.0, "decode_step", plan_devices=8)]
    steps = [s.model_copy(update={"context": 256}) for s in steps]
    return [s.model_copy(update={"ms_per_step_median": predictor.predict(truth, s) * 1e3}) for s in steps]


def test_micro_fit_recovers_known_gap_and_bandwidth() -> None:
    result = fit_micro(load_chip("h200", calibrated=False), synthetic_micro(), holdout=None)
    fitted = {p.path: p for p in result.parameters}
    assert fitted["execution.gpu.kernel_gap_s"].value == pytest.approx(2.2e-6, rel=0.05)
    assert fitted["hbm.sustained_bandwidth_bytes_per_s"].value == pytest.approx(3.9e12, rel=0.02)
    assert fitted["execution.per_step_overhead_s"].value == pytest.approx(9.0e-6, rel=0.10)
    assert fitted["execution.per_op_efficiency"].value == pytest.approx(0.82, rel=0.03)
    sigma = fitted["hbm.sustained_bandwidth_bytes_per_s"].uncertainty
    assert sigma is not None and 0 < sigma < 0.02 * 3.9e12
    assert result.summary()["mape_calibration"] < 0.02  # the residual is the 1 % noise
    assert result.extra["mape_by_kind"]["matmul_fp8"] < 0.03  # predicted, not fitted
    assert "24 matmul" in result.fitted_on  # 6 shapes x 4 rows in bf16; the fp8 ones are not fitted


def test_held_out_steps_are_predicted_not_fitted() -> None:
    records = synthetic_micro(noise=0.0) + synthetic_steps()
    result = fit_micro(load_chip("h200", calibrated=False), records)
    assert result.split.spec == "kind=decode_step" and len(result.split.holdout) == 2
    rows = result.extra["holdout_steps"]
    assert {row["model"] for row in rows} == {"llama-3.2-1b", "kimi-k3-mini[layers=2,formats=bf16]"}
    # Exact micro data -> the fitted figures are the true ones -> the engine's step matches.
    assert all(abs(row["error"]) < 0.01 for row in rows)
    assert all(abs(row["predicted_uncalibrated_ms"] / row["measured_ms"] - 1) > 0.02 for row in rows)
    assert "stack" in result.extra["step_execution"]


def test_slice_of_a_larger_plan_runs_without_collectives() -> None:
    chip = load_chip("h200", calibrated=False)
    record = _record("kimi-k3-mini[layers=2,formats=bf16]", 4, 1.0, "decode_step", plan_devices=8)
    predictor = StepPredictor()
    program = predictor.program(chip, record)
    assert predictor.plan(chip, record).devices == 8
    assert all(not op.collectives for op in program.ops)
    whole = _record("kimi-k3-mini[layers=2,formats=bf16]", 4, 1.0, "decode_step")
    assert predictor.plan(chip, whole).devices == 1


def test_missing_micro_kinds_are_named() -> None:
    records = [r for r in synthetic_micro() if r.extra["kind"] != "matmul"]
    with pytest.raises(InputError, match="matmul"):
        fit_micro(load_chip("h200", calibrated=False), records)


def test_cli_calibrate_reports_holdout_steps(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = write_measurements(tmp_path / "h200.jsonl", synthetic_micro() + synthetic_steps())
    code = cli_main(["calibrate", "--hardware", "h200", "--measurements", str(data), "--holdout",
                     "kind=decode_step", "--json", "--no-save", "--out", str(tmp_path / "out")])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["holdout"] == "kind=decode_step" and summary["mape_holdout"] < 0.05
    assert summary["parameters"]["execution.gpu.kernel_gap_s"]["value"] == pytest.approx(2.2e-6, rel=0.05)


def test_transfer_scales_by_published_ratio_and_labels_derived() -> None:
    h200 = load_chip("h200", calibrated=False)
    calibrated = chip_with(h200, {"hbm.sustained_bandwidth_bytes_per_s": 4.0e12, "execution.per_op_efficiency": 0.8})
    b200 = load_chip("b200", calibrated=False)
    figure = derive_from_h200(b200, calibrated, "hbm.sustained_bandwidth_bytes_per_s")
    ratio = b200.hbm.peak_bandwidth_bytes_per_s.value / h200.hbm.peak_bandwidth_bytes_per_s.value
    assert figure.value == pytest.approx(4.0e12 * ratio)
    assert figure.label == "derived" and figure.source.startswith("derived from calibrated h200")
    assert set(derived_figures(load_chip("gb200", calibrated=False), calibrated)) == {"hbm.sustained_bandwidth_bytes_per_s"}
    with pytest.raises(InputError, match="no published spec"):
        derive_from_h200(b200, calibrated, "execution.per_op_efficiency")
    with pytest.raises(InputError, match="not calibrated"):
        derive_from_h200(b200, h200, "hbm.sustained_bandwidth_bytes_per_s")


def test_cli_text_lists_held_out_steps_and_refuses_parameters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_measurements(tmp_path / "h200.jsonl", synthetic_micro() + synthetic_steps())
    args = ["calibrate", "--hardware", "h200", "--measurements", str(data), "--no-save", "--out", str(tmp_path / "out")]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "held out kimi-k3-mini[layers=2,formats=bf16] b1: measured" in out
    assert cli_main([*args, "--parameters", "hbm.sustained_bandwidth_bytes_per_s"]) == 2
    assert "drop --parameters" in capsys.readouterr().err
