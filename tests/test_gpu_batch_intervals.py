"""90 % intervals on GPU rows from the batch fit's model error: a chip's own overlay, a chip
whose figures derive from another's, and a served workload's TPOT."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hwmodels.catalog import load_chip
from hwmodels.overlay import (
    CalibratedValue,
    CalibrationOverlay,
    ModelErrorTerm,
    overlay_path,
    save_overlay,
)
from tpusim.engine.gpu import gpu_variant
from tpusim.report.intervals import derived_overlay_chip, interval_terms
from tpusim.serving.config import Traffic
from tpusim.serving.serve import _gpu_fields

ERROR = ModelErrorTerm(in_range_rel=0.2, extrapolated_rel=0.2, method="held-out sweeps", points=21)


def _write_b300() -> None:
    save_overlay(CalibrationOverlay(
        chip="b300", fitted_on="published:gpu-batch-sweeps", model_error=ERROR,
        parameters={"execution.gpu.grouped_gemm_expert_s": CalibratedValue(value=1e-7)}), overlay_path("b300"))


def test_no_overlay_no_interval():
    assert interval_terms(load_chip("gb200")).model_error is None
    assert derived_overlay_chip(load_chip("gb200")) is None


def test_a_derived_chip_takes_the_source_fit_model_error():
    _write_b300()
    gb200 = load_chip("gb200")
    assert not gb200.is_calibrated and derived_overlay_chip(gb200) == "b300"
    assert gb200.execution.gpu.grouped_gemm_expert_s.label == "derived"
    assert interval_terms(gb200).model_error == ERROR
    assert interval_terms(load_chip("b300")).model_error == ERROR


def test_a_served_gpu_row_carries_a_tpot_interval_and_its_breakdown():
    _write_b300()
    chip = gpu_variant(load_chip("b300"), "stack")
    pricer = SimpleNamespace(chip=chip, decode_breakdown_ms=lambda batch, context: {"compute": 1.0, "expert_groups": 0.5})
    record = {"tpot_ms": {"mean": 10.0}}
    fields = _gpu_fields(pricer, Traffic(mode="concurrency", concurrency=16), record, cap=256)
    assert fields["tpot_ms_low"] == pytest.approx(8.0) and fields["tpot_ms_high"] == pytest.approx(12.0)
    assert fields["decode_breakdown_ms"] == {"batch": 16, "compute": 1.0, "expert_groups": 0.5}
    assert fields["interval"].startswith("90 %")
    tpu = SimpleNamespace(chip=load_chip("tpu-v7"), decode_breakdown_ms=None)
    assert _gpu_fields(tpu, Traffic(mode="concurrency", concurrency=16), record, cap=256)["interval"].startswith("none")
