"""Prediction intervals on calibrated results (tpusim.report.intervals) and their absence on
uncalibrated ones, through `simulate` and `compare`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibration.core.covariance import nearest_psd
from hwmodels.overlay import CalibratedValue, CalibrationOverlay, save_overlay
from tpusim.app.cli import main
from tpusim.compare.rows import SystemSpec, compare_rows
from tpusim.report.intervals import INTERVAL_KEYS, format_interval, interval

MINI = ["simulate", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1", "--batch", "2",
        "--schedule", "published", "--json"]
SUSTAINED = "hbm.sustained_bandwidth_bytes_per_s"


@pytest.fixture(autouse=True)
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    return tmp_path / "local"


def _calibrate_with_samples() -> None:
    """An overlay whose sampled sets spread the HBM rate by ±10 % around 2.8 TB/s."""
    samples = [{SUSTAINED: value} for value in (2.52e12, 2.8e12, 3.08e12)]
    save_overlay(CalibrationOverlay(chip="tpu-v7", fitted_on="test", samples=samples, parameters={
        SUSTAINED: CalibratedValue(value=2.8e12, uncertainty=0.2e12, fitted_on="test")}))


def test_interval_is_center_plus_minus_z_sd() -> None:
    low, high = interval(10.0, [9.0, 11.0])
    sd = 2 ** 0.5  # sample sd of (9, 11)
    assert (low, high) == pytest.approx((10 - 1.6449 * sd, 10 + 1.6449 * sd), rel=1e-4)


def test_uncalibrated_simulate_says_it_has_no_interval(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(MINI) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(data[key] is None for key in INTERVAL_KEYS)
    assert data["interval"].startswith("none: uncalibrated")


def test_calibrated_simulate_carries_a_re_simulated_interval(capsys: pytest.CaptureFixture[str]) -> None:
    _calibrate_with_samples()
    assert main(MINI) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_ms_low"] < data["step_ms"] < data["step_ms_high"]
    assert data["tokens_per_s_low"] < data["tokens_per_s"] < data["tokens_per_s_high"]
    assert data["tokens_per_s_low"] == pytest.approx(2 * 1000 / data["step_ms_high"])
    assert "3 re-simulations" in data["interval"]
    assert format_interval(data) == f"90 % interval {data['step_ms_low']:.3f}–{data['step_ms_high']:.3f} ms"


def test_compare_rows_carry_interval_keys_only_when_calibrated() -> None:
    spec = [SystemSpec("tpu-v7", 1)]
    plain = compare_rows("kimi-k3-mini", spec, [1], schedule="published")
    assert plain[0]["step_ms_low"] is None and plain[0]["interval"].startswith("none")
    _calibrate_with_samples()
    row = compare_rows("kimi-k3-mini", spec, [1], schedule="published")[0]
    assert row["label"] == "calibrated"
    assert row["step_ms_low"] < row["step_ms"] < row["step_ms_high"]
    assert set(INTERVAL_KEYS) <= set(row)


def test_an_indefinite_covariance_is_drawn_from_its_nearest_psd_matrix() -> None:
    psd = np.array([[4.0, 1.0], [1.0, 2.0]])
    np.testing.assert_array_equal(nearest_psd(psd), psd)  # already PSD: untouched
    indefinite = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and -1
    fixed = nearest_psd(indefinite)
    np.testing.assert_allclose(fixed, [[1.5, 1.5], [1.5, 1.5]])  # the -1 direction dropped
    assert np.linalg.eigvalsh(fixed).min() > -1e-12
