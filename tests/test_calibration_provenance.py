"""Calibrated or not is one property of the loaded chip, and it knows what it was fitted on."""

from __future__ import annotations

import json

import pytest

from hwmodels.catalog import chip_to_yaml, load_chip, local_dir
from hwmodels.overlay import CalibratedValue, CalibrationOverlay, save_overlay
from hwmodels.provenance import FitCoverage, model_family_and_format
from tpusim.app.cli import main


@pytest.fixture
def overlay_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    save_overlay(CalibrationOverlay(
        chip="tpu-v7", fitted_on="4 points: muse-spark@{nvfp4+int8} b1..8 on tpu-v7x4",
        coverage=FitCoverage(models=["muse-spark"], formats=["nvfp4+int8"], chip_counts=[4],
                             batches=[1, 2, 4, 8], backends=["tpu7x (published)"]),
        parameters={"execution.per_layer_overhead_s": CalibratedValue(value=2e-6, uncertainty=1e-7)},
    ))
    return tmp_path / "local"


def test_model_family_and_format() -> None:
    assert model_family_and_format("muse-spark@int4+bf16[layers=4]") == ("muse-spark", "int4+bf16")
    assert model_family_and_format("kimi-k3") == ("kimi-k3", "default")
    assert model_family_and_format("some/dir/my-model.yaml") == ("my-model.yaml", "default")


def test_published_chip_is_not_calibrated(overlay_dir) -> None:
    assert not load_chip("tpu-v7", calibrated=False).is_calibrated
    assert not load_chip("gb200").is_calibrated  # no overlay for it


def test_overlay_makes_the_chip_calibrated_and_says_on_what(overlay_dir) -> None:
    chip = load_chip("tpu-v7")
    assert chip.is_calibrated
    assert chip.calibration.figures == ["execution.per_layer_overhead_s"]
    assert chip.calibration.note().startswith("calibrated on 4 points: muse-spark")
    assert chip.calibration.warnings("muse-spark@nvfp4+int8", 4) == []
    gaps = chip.calibration.warnings("kimi-k3", 16)
    assert len(gaps) == 3  # model, format and chip count all lie outside the fit
    assert any("kimi-k3" in gap for gap in gaps) and any("16 chips" in gap for gap in gaps)
    assert chip.calibration.warnings("muse-spark@int4+bf16", 4) == [
        "format int4+bf16 was not among the fitted formats (nvfp4+int8)"]
    assert "calibration" not in chip_to_yaml(chip)  # never written into a catalog file


def test_local_dir_defaults_outside_the_package(monkeypatch) -> None:
    import hwmodels

    monkeypatch.delenv("TPUSIM_LOCAL_DIR", raising=False)
    package = hwmodels.__file__.rsplit("/", 1)[0]
    assert not str(local_dir()).startswith(package)


def test_hardware_list_and_simulate_read_the_property(overlay_dir, capsys) -> None:
    assert main(["hardware", "show", "tpu-v7"]) == 0
    assert "calibrated on 4 points" in capsys.readouterr().out
    assert main(["simulate", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["calibrated"] is True
    assert "calibrated on 4 points" in data["source"]
    assert any("kimi-k3-mini was not among the fitted models" in w for w in data["calibration_warnings"])
    assert main(["simulate", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1",
                 "--json", "--uncalibrated"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["calibrated"] is False and data["calibration_warnings"] == []
