"""Intervals and P(best) for the rows a sweep shows (tpusim.sweep.intervals), on the 8-layer
kimi-k3-mini with a calibrated overlay whose three sampled sets spread the HBM rate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hwmodels.catalog import make_system
from hwmodels.overlay import CalibratedValue, CalibrationOverlay, save_overlay
from tpusim.engine import simulate
from tpusim.report.intervals import sample_chips
from tpusim.sweep import default_space, run_sweep
from tpusim.sweep.intervals import leading_rows, row_intervals
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program

SUSTAINED = "hbm.sustained_bandwidth_bytes_per_s"
BATCH = 2


@pytest.fixture(autouse=True)
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    return tmp_path / "local"


def _sweep(out: Path) -> tuple:
    model = load_model("kimi-k3-mini").with_layers(8)
    system = make_system("tpu-v7", 2)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    result = run_sweep(model, plan, system, BATCH, out_dir=out, budget=5, jobs=1, seed=3, quiet=True,
                       space=default_space().model_copy(update={"samples": 20}), screen_factor=2,
                       screen_layers=4, plots=False)
    return result, (lambda: build_program(model, plan, batch=BATCH, context_tokens=1024, seed=3)), system


@pytest.mark.slow
def test_every_shown_row_gets_its_own_re_simulated_interval_and_p_best(tmp_path: Path) -> None:
    samples = [{SUSTAINED: value} for value in (2.0e12, 2.5e12, 3.1e12)]
    save_overlay(CalibrationOverlay(chip="tpu-v7", fitted_on="test", samples=samples, parameters={
        SUSTAINED: CalibratedValue(value=2.5e12, uncertainty=0.5e12, fitted_on="test")}))
    result, program, system = _sweep(tmp_path / "sweep")
    assert system.chip.is_calibrated
    entries = row_intervals(result, program, system.chip)
    shown = leading_rows(result)
    assert [e["hash"] for e in entries] == [r["hash"] for r in shown] and len(entries) >= 2
    # the reference: each shown schedule simulated by hand on each sampled chip
    chips = sample_chips(system.chip)
    steps = [[simulate(program(), result.schedules[r["hash"]], c).step_s for c in chips] for r in shown]
    winners = [min(range(len(shown)), key=lambda k, i=i: (steps[k][i], k)) for i in range(len(chips))]
    for k, entry in enumerate(entries):
        spread_ms = 1.6448536 * float(np.std(steps[k], ddof=1)) * 1e3  # each row's own samples
        assert entry["step_ms_high"] - entry["predicted_ms"] == pytest.approx(spread_ms, rel=1e-6)
        assert entry["p_best"] == pytest.approx(winners.count(k) / len(chips))
    assert sum(e["p_best"] for e in entries) == pytest.approx(1.0)
    # rows differ: the intervals are per row, not the best row's copied
    assert len({round(e["step_ms_low"], 9) for e in entries}) > 1


@pytest.mark.slow  # a K3 sweep (~5 s)
def test_uncalibrated_rows_say_they_have_no_interval(tmp_path: Path) -> None:
    result, program, system = _sweep(tmp_path / "sweep")
    built = []
    entries = row_intervals(result, lambda: built.append(1) or program(), system.chip)
    assert entries and all(e["step_ms_low"] is None and e["p_best"] is None for e in entries)
    assert all(e["interval"] == "none: uncalibrated figures" for e in entries)
    assert not built  # nothing to re-simulate: the program is never built


def test_a_model_error_interval_without_samples_prints_no_p_best() -> None:
    from tpusim.app.cli.sweep import _interval_cells

    entry = {"step_ms_low": 9.0, "step_ms_high": 11.0, "p_best": None}
    assert _interval_cells(entry, True) == ["9.000–11.000", "–"]
