"""Calibration that can be trusted or is refused (issue 23, item 3), through the CLI.

Each test drives one way an untrustworthy overlay used to be saved and applied silently: a
fit at its bounds, step times in the wrong unit, an implausibly fast host CPU; and the
tools around overlays: ``tpusim overlays``, ``--local-dir``, the extrapolation warning on
stderr, ``host-cpu`` before a probe, and the demo's reuse command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from calibration.core.parameters import chip_with
from calibration.reports.trust import MEASURED_CEILING_HEADROOM, unit_problem
from calibration.sources.measurements import Measurement, write_measurements
from calibration.sources.predict import Predictor
from hwmodels.catalog import load_chip
from hwmodels.overlay import CalibratedValue, CalibrationOverlay, overlay_path, save_overlay
from hwmodels.provenance import FitCoverage
from tpusim.app.cli import build_parser, main
from tpusim.app.schemas import example_text

PER_LAYER = "execution.per_layer_overhead_s"
SUSTAINED = "hbm.sustained_bandwidth_bytes_per_s"


def _example(tmp_path: Path, scale: float = 1.0) -> Path:
    """The printed measurement example (4 Muse Spark points on tpu-v7 x4), times ``scale``."""
    lines = [json.loads(line) for line in example_text("measurement").splitlines() if line.strip()]
    for line in lines:
        line["ms_per_step_median"] *= scale
    path = tmp_path / f"example-x{scale:g}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_an_h100_fit_at_its_bounds_is_refused_unless_allowed(tmp_path, local_dir, capsys) -> None:
    """Four h100 points 0.85x the published prediction, faster than in-bounds figures allow:
    both parameters run to a bound (the sustained HBM rate up to the published peak, the
    per-layer cost down to zero) while the error on the points stays within its limit.
    Refused, exit 2, both named with their bounds, report written, no overlay;
    ``--allow-at-bounds`` keeps it (and says so)."""
    predictor, h100 = Predictor(), load_chip("h100", calibrated=False)
    records = []
    for batch in (1, 2, 4, 8):
        skeleton = Measurement(model="kimi-k3-mini[width=2048,layers=2]", system={"chip": "h100", "chips": 1}, batch=batch,
                               context=256, routing="uniform", schedule="naive", backend="test (synthetic)",
                               ms_per_step_median=1.0, label="synthetic")
        fast_ms = 0.85 * predictor.predict(h100, skeleton) * 1e3
        records.append(skeleton.model_copy(update={"ms_per_step_median": fast_ms}))
    path = write_measurements(tmp_path / "h100.jsonl", records)
    argv = ["calibrate", "--hardware", "h100", "--measurements", str(path), "--parameters",
            f"{SUSTAINED},{PER_LAYER}", "--max-evals", "8", "--allow-unconverged"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    captured = capsys.readouterr()
    error = captured.err.strip().splitlines()[-1]
    assert error.startswith("tpusim calibrate: error: calibration refused, overlay not saved")
    assert f"{SUSTAINED} stopped at its upper bound" in error and f"{PER_LAYER} stopped at its lower bound" in error
    assert "bounds [" in error and "--allow-at-bounds" in error
    assert "REFUSED:" in captured.out
    assert "## Refused: overlay not saved" in (tmp_path / "a" / "report.md").read_text()
    assert json.loads((tmp_path / "a" / "fit.json").read_text())["refused"] is True
    assert not overlay_path("h100").exists()

    assert main([*argv, "--out", str(tmp_path / "b"), "--allow-at-bounds"]) == 0
    assert "warning (kept: --allow-at-bounds)" in capsys.readouterr().out
    assert overlay_path("h100").exists()


@pytest.mark.slow
def test_step_times_in_microseconds_given_as_ms_are_a_unit_error(tmp_path, local_dir, capsys) -> None:
    """The example's step times x1000 (µs written into the ms field): refused as a likely
    unit error whatever the override flags, report written, no overlay."""
    path = _example(tmp_path, 1000.0)
    code = main(["calibrate", "--hardware", "tpu-v7", "--measurements", str(path), "--parameters", PER_LAYER,
                 "--max-evals", "2", "--allow-unconverged", "--allow-at-bounds", "--out", str(tmp_path / "out")])
    assert code == 2
    error = _error_line(capsys)
    assert "likely unit error (×1000)" in error and "µs given as ms" in error
    assert (tmp_path / "out" / "report.md").is_file()
    assert not overlay_path("tpu-v7").exists()


def test_unit_check_thresholds() -> None:
    assert unit_problem([1.0, 2.0], [1.1, 1.8]) is None
    assert unit_problem([1.0, 2.0], [0.004, 0.008]) is None  # 250x: 2.4 decades, not yet a unit slip
    problem = unit_problem([1e-3, 2e-3], [1.0, 2.0])
    assert problem is not None and "(×1/1000)" in problem.reason and "seconds given as ms" in problem.reason


def test_a_host_cpu_faster_than_its_probe_allows_is_implausible(tmp_path, local_dir, capsys) -> None:
    """A host-cpu whose fitted memory rate is 100x the probed copy rate (the headroom for
    cache is 30x): refused as physically implausible, no overlay."""
    from hwmodels.probe import probe_host, write_host_entry

    write_host_entry(probe_host(quick=True))
    probed = load_chip("host-cpu", calibrated=False)
    peak = probed.hbm.peak_bandwidth_bytes_per_s.value
    fast = chip_with(probed, {SUSTAINED: 100 * peak})
    predictor, records = Predictor(), []
    for width in (1024, 2048):
        for batch in (1, 4):
            skeleton = Measurement(model=f"kimi-k3-mini[width={width},layers=2,formats=f32]",
                                   system={"chip": "host-cpu", "chips": 1}, batch=batch, context=256,
                                   routing="uniform", schedule="naive", backend="cpu-xla (synthetic)",
                                   ms_per_step_median=1.0, label="synthetic")
            step_ms = predictor.predict(fast, skeleton) * 1e3
            records.append(skeleton.model_copy(update={"ms_per_step_median": step_ms}))
    path = write_measurements(tmp_path / "cpu.jsonl", records)
    code = main(["calibrate", "--hardware", "host-cpu", "--measurements", str(path), "--parameters", SUSTAINED,
                 "--max-evals", "10", "--allow-unconverged", "--allow-at-bounds", "--out", str(tmp_path / "out")])
    assert code == 2
    error = _error_line(capsys)
    assert f"{SUSTAINED} = " in error and "physically implausible" in error
    assert f"{MEASURED_CEILING_HEADROOM:.0f}× the probed hbm.peak_bandwidth_bytes_per_s" in error
    assert not overlay_path("host-cpu").exists()


@pytest.mark.slow
def test_overlays_list_show_remove_and_local_dir(tmp_path, local_dir, capsys, monkeypatch) -> None:
    """A fit saved with ``--local-dir A`` lands in A (not the environment's folder); every
    overlay command and ``hardware show`` read A when given it, or TPUSIM_LOCAL_DIR=A."""
    elsewhere = tmp_path / "elsewhere"
    path = _example(tmp_path)
    assert main(["calibrate", "--hardware", "tpu-v7", "--measurements", str(path), "--parameters", PER_LAYER,
                 "--max-evals", "4", "--allow-unconverged", "--out", str(tmp_path / "out"), "--json",
                 "--local-dir", str(elsewhere)]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert Path(fit["overlay"]) == elsewhere / "calibrated" / "tpu-v7.yaml"
    assert not overlay_path("tpu-v7").exists()  # the environment's folder is untouched

    assert main(["overlays", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["overlays", "list", "--json", "--local-dir", str(elsewhere)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["chip"] == "tpu-v7" and row["measurements"] == str(path)
    assert row["fitted_on"].startswith("4 points: muse-spark")
    assert row["errors"]["mape_calibration"] == pytest.approx(fit["mape_calibration"])
    assert row["created"] and row["parameters"] == [PER_LAYER]
    assert main(["overlays", "list", "--local-dir", str(elsewhere)]) == 0
    table = capsys.readouterr().out
    assert "tpu-v7" in table and f"{100 * fit['mape_calibration']:.1f} %" in table

    assert main(["overlays", "show", "tpu-v7", "--local-dir", str(elsewhere)]) == 0
    shown = capsys.readouterr().out
    assert PER_LAYER in shown and f"measurements: {path}" in shown and "errors: mape_before" in shown

    assert main(["hardware", "show", "tpu-v7", "--json", "--local-dir", str(elsewhere)]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["figures"] == [PER_LAYER]
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(elsewhere))
    assert main(["hardware", "show", "tpu-v7", "--json"]) == 0
    assert "calibration" in json.loads(capsys.readouterr().out)
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(local_dir))

    assert main(["overlays", "remove", "tpu-v7", "--local-dir", str(elsewhere)]) == 0
    assert "removed" in capsys.readouterr().out
    assert not (elsewhere / "calibrated" / "tpu-v7.yaml").exists()
    assert main(["overlays", "remove", "tpu-v7", "--local-dir", str(elsewhere)]) == 2
    assert "no calibrated overlay for 'tpu-v7'" in _error_line(capsys)


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _leaf_parsers(child, (*path, name))


def test_every_command_takes_local_dir() -> None:
    parsers = list(_leaf_parsers(build_parser()))
    assert len(parsers) > 15
    for path, parser in parsers:
        assert any("--local-dir" in action.option_strings for action in parser._actions), path


def test_an_overlay_applied_outside_its_fit_warns_on_stderr(local_dir, capsys) -> None:
    save_overlay(CalibrationOverlay(
        chip="tpu-v7", fitted_on="4 points: muse-spark on tpu-v7x4 (test)",
        coverage=FitCoverage(models=["muse-spark"], formats=["default"], chip_counts=[4], batches=[1]),
        parameters={PER_LAYER: CalibratedValue(value=2e-6)}))
    assert main(["floor", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays pure JSON
    warnings = [line for line in captured.err.splitlines() if line.startswith("tpusim: warning: tpu-v7 calibration:")]
    assert any("kimi-k3 was not among the fitted models (muse-spark)" in line for line in warnings)
    assert any("16 chips was not among the fitted chip counts (4)" in line for line in warnings)


@pytest.mark.parametrize("argv", [
    ["floor", "--model", "kimi-k3-mini", "--hardware", "host-cpu", "--chips", "1"],
    ["hardware", "show", "host-cpu"],
])
def test_host_cpu_before_a_probe_says_to_run_the_probe(argv, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run `tpusim hardware probe`" in err[0] and "unknown chip" not in err[0]


def test_the_demo_prints_the_command_that_reuses_its_calibration(tmp_path, monkeypatch, capsys) -> None:
    from calibration.commands import demo_steps as demo

    class Done:
        ok, steps = True, []

    monkeypatch.setattr(demo, "run_demo", lambda config, progress, answer: Done())
    assert main(["demo", "--out", str(tmp_path / "default")]) == 0
    assert "to reuse this calibration" not in capsys.readouterr().out  # the default run calibrates nothing
    chosen = tmp_path / "my local"
    assert main(["demo", "--full", "--out", str(tmp_path / "report"), "--local-dir", str(chosen)]) == 0
    out = capsys.readouterr().out
    assert f"to reuse this calibration: tpusim simulate --model kimi-k3 --hardware tpu-v7 --chips 16 " \
           f"--local-dir '{chosen}'" in out
    monkeypatch.delenv("TPUSIM_LOCAL_DIR")
    assert main(["demo", "--full", "--out", str(tmp_path / "report")]) == 0
    assert f"--local-dir {(tmp_path / 'report' / 'local').resolve()}" in capsys.readouterr().out


def test_the_demo_report_says_what_it_kept_despite_the_checks_and_how_to_reuse_it(tmp_path) -> None:
    from calibration.commands.demo_report import render_report
    from calibration.commands.demo_run import DemoConfig, DemoRun

    run = DemoRun(DemoConfig(out_dir=tmp_path))
    run.step("calibrate host-cpu").data = {"refusals": [
        {"reason": "execution.launch_overhead_s stopped at its lower bound", "override": "--allow-at-bounds",
         "overridden": True}]}
    text = render_report(run, reuse="to reuse this calibration: tpusim simulate --local-dir /x")
    assert ("Kept despite failed checks (the demo passes --allow-at-bounds): execution.launch_overhead_s "
            "stopped at its lower bound.") in text
    assert "To reuse this calibration: tpusim simulate --local-dir /x." in text


def test_the_cpu_loop_needs_no_probe_beforehand(tmp_path, monkeypatch) -> None:
    """The CPU loop probes the host itself: choosing its procedure reads no host entry (the
    demo's first run on a new machine calibrates host-cpu with an empty local folder)."""
    import argparse

    from calibration.commands.calibrate import _source

    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "empty"))
    args = argparse.Namespace(procedure="auto", measurements="cpu-loop", hardware="host-cpu", components=None,
                              parameters=None)
    assert _source(args).name == "cpu loop"
