"""The GPU batch-growth fit on public Blackwell sweeps (calibration.sources.gpu_batch_sweeps):
which rows it uses, that its engine cache is the engine's, and the held-out error guard."""

from __future__ import annotations

import pytest

from calibration.sources import gpu_batch_sweeps as sweeps
from tpusim.engine import simulate
from tpusim.engine.gpu_batch import batch_terms
from tpusim.schedule.schema import load_schedule


def test_only_fixed_deployment_plain_decode_tpot_rows_are_used():
    rows = sweeps.load_rows()
    used = [p for p in sweeps.points()]
    for point in used:
        row = rows[point.row_id]
        assert row["tpot_ms"] == point.tpot_ms and row["concurrency"] == point.concurrency
        assert not row["disaggregated"] and "on" not in str(row["spec_decoding"]).lower().split()
        assert row["source_id"] == point.sweep.source_id and row["gpu_type"].lower() == point.sweep.chip
    for sweep in sweeps.SWEEPS:
        deployments = {rows[i]["parallelism"] for i in sweep.rows}
        assert len(deployments) == 1, sweep.key  # one deployment along the sweep
    assert {"S1a", "S2", "S3", "S5", "S6", "S7"} <= set(sweeps.EXCLUDED)


def test_roles_anchor_lowest_fit_named_and_the_rest_held_out():
    by_sweep: dict[str, list] = {}
    for point in sweeps.points():
        by_sweep.setdefault(point.sweep.key, []).append(point)
    for key, these in by_sweep.items():
        lowest = min(these, key=lambda p: p.concurrency)
        assert lowest.role == "anchor", key
        assert all(p.role in ("fit", "held-out") for p in these if p is not lowest)
    fit = [p for p in sweeps.points() if p.role == "fit"]
    assert {p.sweep.stack for p in fit} == {"vllm", "sglang"} and len(fit) == 3


def test_the_cache_is_the_engine():
    """Two cached points re-simulated: the step without batch terms and the terms per unit figure."""
    for key in ("k25-b200-tp4ep4@4", "dsr1-b200-1k8k@16"):
        point = next(p for p in sweeps.points() if p.key == key)
        program = sweeps._program(point)
        cached = sweeps.baseline()[key]
        assert simulate(program, load_schedule("naive"), sweeps.sweep_chip(point.sweep)).step_s == pytest.approx(
            cached["step_s"], rel=1e-9)
        for figure in sweeps.PARAMETERS:
            chip = sweeps.sweep_chip(point.sweep, {figure.path: 1.0})
            assert sum(batch_terms(chip, program).values()) == pytest.approx(
                cached["terms_per_unit_s"][figure.name], rel=1e-9)


def test_held_out_error_stays_within_the_documented_figure():
    """The guard: the fit through the calibration core, judged on the points it did not see."""
    values = sweeps.fit()
    for figure in sweeps.PARAMETERS:
        assert figure.lower <= values[figure.name] <= figure.upper
    summary = sweeps.held_out_summary(sweeps.table(values))
    documented = sweeps.DOCUMENTED_HELD_OUT
    assert summary["points"] >= documented["points"] and summary["sweeps"] >= documented["sweeps"]
    assert summary["mape"] <= documented["mape"] + sweeps.GUARD_MARGIN, summary
    assert summary["max_abs_error"] <= documented["max_abs_error"] + 2 * sweeps.GUARD_MARGIN, summary


def test_the_batch_terms_improve_the_held_out_error():
    rows = sweeps.table(sweeps.fit())
    assert sweeps.held_out_summary(rows)["mape"] < sweeps.held_out_summary(rows, "before_error")["mape"]
