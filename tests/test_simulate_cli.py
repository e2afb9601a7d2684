"""`tpusim simulate`: JSON keys, human output labels, outputs and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpusim.app.cli import main

MINI = ["simulate", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1", "--batch", "2"]
K3 = ["simulate", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", "--batch", "1"]
JSON_KEYS = {"step_ms", "tokens_per_s", "exposed_dma_ms", "overlap_fraction", "vmem_peak_bytes",
             "busy_fraction", "breakdown", "schedule_hash", "source", "floor_ms"}


@pytest.fixture(autouse=True)
def _no_local_overlays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_for_k3_published(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, [*K3, "--schedule", "published"])
    assert set(data) >= JSON_KEYS
    assert data["step_ms"] > data["floor_ms"] > 0
    assert data["tokens_per_s"] == pytest.approx(1000 / data["step_ms"])
    assert sum(data["breakdown"].values()) == pytest.approx(data["step_ms"])
    assert data["source"] == ("simulated (tpusim engine, megakernel execution; hardware tpu-v7: "
                              "published figures)")
    assert data["schedule"] == "published" and len(data["schedule_hash"]) == 16
    assert data["plan"] == "k3-tp32" and data["devices"] == 32


def test_human_output_labels_every_number(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*MINI, "--schedule", "naive"]) == 0
    out = capsys.readouterr().out
    assert "simulated" in out and "analytic floor" in out and "source: simulated" in out


def test_trace_and_plot_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, plot = tmp_path / "step.json", tmp_path / "step.png"
    data = run_json(capsys, [*MINI, "--schedule", "layer-double-buffer", "--trace", str(trace),
                             "--plot", str(plot), "--plot-layers", "0:2"])
    assert json.loads(trace.read_text())["traceEvents"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert data["trace"] == str(trace) and data["plot"] == str(plot)


def test_schedule_file_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tpusim.schedule.schema import load_schedule, save_schedule

    path = tmp_path / "mine.json"
    save_schedule(load_schedule("published").with_changes(name="mine", max_dmas_in_flight=4), path)
    data = run_json(capsys, [*MINI, "--schedule", str(path)])
    assert data["schedule"] == "mine"


@pytest.mark.parametrize("argv", [
    ["simulate", "--model", "no-such-model", "--hardware", "tpu-v7", "--chips", "16"],
    ["simulate", "--model", "kimi-k3", "--hardware", "no-such-chip", "--chips", "16"],
    [*MINI, "--schedule", "no-such-schedule"],
    [*MINI, "--routing", "nonsense"],
    [*MINI, "--plot-layers", "x:y", "--plot", "out.png"],
])
def test_bad_input_exits_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tpusim simulate: error:") and "\n" not in err


def test_bad_numbers_are_rejected_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main([*MINI[:-2], "--batch", "0"])
    assert caught.value.code == 2


def test_infeasible_schedule_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tpusim.schedule.schema import FamilySchedule, load_schedule, save_schedule

    published = load_schedule("published")
    families = {name: published.family(name).model_dump() for name in published.families}
    families["routed_expert"] = FamilySchedule(buffers=8, pool="main").model_dump()
    path = tmp_path / "eight-slots.json"
    save_schedule(published.with_changes(name="eight-slots", families=families), path)
    assert main([*K3, "--schedule", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "infeasible schedule" in err and "routed_expert" in err and "\n" not in err


def test_source_says_when_the_chip_has_calibrated_figures(capsys: pytest.CaptureFixture[str]) -> None:
    from hwmodels.overlay import CalibratedValue, CalibrationOverlay, save_overlay

    save_overlay(CalibrationOverlay(chip="tpu-v7", fitted_on="test", parameters={
        "hbm.sustained_bandwidth_bytes_per_s": CalibratedValue(value=2.9e12)}))
    calibrated = run_json(capsys, MINI)
    assert "calibrated on test (1 figure: hbm.sustained_bandwidth_bytes_per_s" in calibrated["source"]
    assert calibrated["calibrated"] is True
    published = run_json(capsys, [*MINI, "--uncalibrated"])
    assert published["source"].endswith("tpu-v7: published figures)")
    assert calibrated["step_ms"] > published["step_ms"]  # a slower HBM


def test_gpu_rows_speak_gpu_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--model", "kimi-k3-mini", "--hardware", "gb200", "--chips", "1",
                 "--uncalibrated"]) == 0
    out = capsys.readouterr().out
    assert "busy: tensor cores" in out and "L2 peak" in out
    assert "VMEM" not in out and "busy: mxu" not in out
    assert main([*MINI, "--uncalibrated"]) == 0
    out = capsys.readouterr().out
    assert "busy: MXU" in out and "VMEM peak" in out
