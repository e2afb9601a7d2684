"""The joint sweep's robust choice (tpusim.sweep.joint_robust) and its multi-batch report
(tpusim.sweep.joint_batches), on kimi-k3-nano over 4 tpu-v7 chips."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hwmodels.catalog import make_system
from hwmodels.overlay import CalibratedValue, CalibrationOverlay, ModelErrorTerm, save_overlay
from tpusim.engine import simulate
from tpusim.report.intervals import sample_chips
from tpusim.sweep.joint import run_joint_sweep
from tpusim.workload.model_catalog import deployment_plan, load_model
from tpusim.workload.program import build_program

SUSTAINED = "hbm.sustained_bandwidth_bytes_per_s"


@pytest.fixture(autouse=True)
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    return tmp_path / "local"


def _overlay(samples: list[float], model_error: bool = True) -> None:
    error = ModelErrorTerm(in_range_rel=0.10, extrapolated_rel=0.20, points=12, method="test") if model_error else None
    save_overlay(CalibrationOverlay(
        chip="tpu-v7", fitted_on="test", samples=[{SUSTAINED: v} for v in samples], model_error=error,
        parameters={SUSTAINED: CalibratedValue(value=2.5e12, uncertainty=0.5e12, fitted_on="test")}))


def _sweep(out: Path, calibrated: bool, budget: int = 8) -> Any:
    return run_joint_sweep(load_model("kimi-k3-nano"), make_system("tpu-v7", 4, calibrated=calibrated), 1,
                           out_dir=out, quiet=True, plots=False, budget=budget, seed=1)


@pytest.mark.slow
def test_prior_figures_print_no_interval_and_say_so(tmp_path: Path) -> None:
    result = _sweep(tmp_path / "j", calibrated=False)
    robust = result.robust
    assert robust is not None and not robust["calibrated"] and robust["samples"] == 0
    assert robust["source"].startswith("prior:")
    assert robust["winner"]["step_ms_low"] is None and robust["p_beats_published"] is None
    assert all(e["p_best"] is None for e in robust["leaders"])
    summary = (tmp_path / "j" / "summary.md").read_text()
    assert "## Robust choice" in summary and "prior:" in summary and "no interval" in summary


@pytest.mark.slow
def test_calibrated_winner_gets_paired_p_best_against_published(tmp_path: Path) -> None:
    _overlay([1.6e12, 2.5e12, 3.4e12])
    result = _sweep(tmp_path / "j", calibrated=True)
    robust = result.robust
    assert robust["calibrated"] and robust["samples"] == 3 and robust["source"].startswith("calibrated on test")
    # the reference: winner and published re-simulated by hand on each sampled chip, each on its own plan
    model, system = load_model("kimi-k3-nano"), make_system("tpu-v7", 4)
    def steps(entry: dict[str, Any]) -> list[float]:
        from tpusim.schedule.schema import Deployment, load_schedule

        if entry["hash"] == result.best_row["hash"]:
            schedule = result.best
        else:
            schedule = load_schedule("published").model_copy(update={"deployment": Deployment(plan="auto")})
        plan = deployment_plan(model, system.chip, system.chips, schedule.deployment.plan,
                               schedule.deployment.collectives)
        program = build_program(model, plan, batch=1, context_tokens=1024, seed=1)
        return [simulate(program, schedule, chip).step_s for chip in sample_chips(system.chip)]

    win, pub = steps(robust["winner"]), steps(robust["published"])
    if result.best_row["hash"] != result.published_row["hash"]:
        assert robust["p_beats_published"] == pytest.approx(np.mean(np.array(win) < np.array(pub)))
    else:
        assert robust["p_beats_published"] is None
    spread_ms = 1.6448536 * float(np.std(win, ddof=1)) * 1e3
    t = np.hypot(spread_ms / robust["winner"]["predicted_ms"], 0.20)  # nano lies outside the 'test' fit
    assert robust["winner"]["step_ms_high"] == pytest.approx(robust["winner"]["predicted_ms"] * (1 + t), rel=1e-6)
    assert sum(e["p_best"] for e in robust["leaders"]) == pytest.approx(1.0)
    assert "P(best among these)" in (tmp_path / "j" / "summary.md").read_text()


@pytest.mark.slow
def test_model_error_only_gives_intervals_but_no_p_best(tmp_path: Path) -> None:
    _overlay([])
    robust = _sweep(tmp_path / "j", calibrated=True, budget=4).robust
    assert robust["samples"] == 0 and robust["winner"]["step_ms_low"] is not None
    assert robust["p_beats_published"] is None and all(e["p_best"] is None for e in robust["leaders"])
    assert any("no parameter samples" in n for n in robust["notes"])
    json.dumps(robust)  # JSON-ready


@pytest.mark.slow
def test_batches_report_and_plot_over_every_batch(tmp_path: Path) -> None:
    from tpusim.app.cli import main

    out = tmp_path / "b"
    code = main(["sweep", "--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4", "--space", "joint",
                 "--batches", "1,2", "--budget", "3", "--out", str(out), "--quiet", "--uncalibrated"])
    assert code == 0
    report = (out / "report.md").read_text()
    assert (out / "pareto.png").stat().st_size > 0
    for batch in (1, 2):
        assert (out / f"batch-{batch}" / "best.json").is_file() and f"## Batch {batch}" in report
    assert "| ms per step (simulated) | published | best |" in report and "What limits the best:" in report
    assert "no interval and no P(best)" in report
    assert "| at batch | published | winner of batch 1 | winner of batch 2 |" in report


def test_batches_flag_is_checked(tmp_path: Path) -> None:
    from tpusim.app.cli import main
    from tpusim.sweep.joint_batches import parse_batches

    assert parse_batches("1,2,4,8") == [1, 2, 4, 8]
    for bad in ("1,x", "0,2", "2,2", ""):
        with pytest.raises(Exception, match="--batches"):
            parse_batches(bad)
    assert main(["sweep", "--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4", "--batches", "1,2",
                 "--out", str(tmp_path / "x")]) == 2


@pytest.mark.slow  # two small nano sweeps, then both resumed, ~15 s
def test_each_batch_asks_the_winners_found_before_it_first(tmp_path: Path) -> None:
    import csv

    from tpusim.sweep.joint_batches import run_joint_batches

    def rows(batch: int) -> list[dict[str, str]]:
        with (tmp_path / f"batch-{batch}" / "sweep.csv").open() as handle:
            return list(csv.DictReader(handle))

    system = make_system("tpu-v7", 4, calibrated=False)
    first = run_joint_batches(load_model("kimi-k3-nano"), system, [1, 2], out_dir=tmp_path, budget=20, quiet=True,
                              plots=False)
    assert first[0].best_row["source"] != "builtin"  # a trial won at batch 1: its parameters seed batch 2
    seeded = [r for r in rows(2) if r["source"] == "seeded"]
    assert [r["hash"] for r in seeded] == [first[0].best_row["hash"]]  # the same deployment and schedule
    before = rows(2)
    again = run_joint_batches(load_model("kimi-k3-nano"), system, [1, 2], out_dir=tmp_path, budget=20, quiet=True,
                              plots=False, resume=True)
    assert rows(2) == before and again[1].best_row["hash"] == first[1].best_row["hash"]  # asked once, not again
    assert again[0].best_row["hash"] == first[0].best_row["hash"]


def test_a_batch_that_missed_a_later_winner_gets_one_more_round_asking_it(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The second pass of run_joint_batches (nano's batches all find the same winner, so the
    sweeps are stood in for: each call's winner is given, the calls are recorded)."""
    from types import SimpleNamespace

    from tpusim.sweep import joint_batches
    from tpusim.sweep.joint import ASK_BATCH

    winners = {1: "w1", 2: "w2", 4: "w2", 8: "w1"}  # batch 2 finds its own winner; 4 and 8 earlier ones
    calls: list[tuple[int, list[dict[str, Any]], bool, int]] = []

    def sweep(model: Any, system: Any, batch: int, *, seed_trials: list[dict[str, Any]], resume: bool = False,
              budget: int, **kwargs: Any) -> Any:
        calls.append((batch, seed_trials, resume, budget))
        seen = [winners[batch], *(params["id"] for params in seed_trials)]
        return SimpleNamespace(best_row={"hash": winners[batch], "trial": 3, "source": "tpe"},
                               rows=[{"hash": h} for h in seen], study_params={"id": winners[batch]})

    monkeypatch.setattr(joint_batches, "run_joint_sweep", sweep)
    monkeypatch.setattr(joint_batches, "cross_batch", lambda *args: {})
    monkeypatch.setattr(joint_batches, "batches_report", lambda *args: "report")
    joint_batches.run_joint_batches(SimpleNamespace(name="m"), SimpleNamespace(chip=SimpleNamespace(name="x"), chips=1, devices=1),
                                    [1, 2, 4, 8], out_dir=tmp_path, plots=False, budget=30)
    assert calls == [
        (1, [], False, 30), (2, [{"id": "w1"}], False, 30), (4, [{"id": "w1"}, {"id": "w2"}], False, 30),
        (8, [{"id": "w1"}, {"id": "w2"}], False, 30),  # each winner once
        (1, [{"id": "w2"}], True, 30 + ASK_BATCH),  # batch 1 never saw w2 (asked once though two batches won with it)
    ]
