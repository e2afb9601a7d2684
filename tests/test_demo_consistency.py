"""One answer per question in the demo report (:mod:`calibration.commands.demo_consistency`).

The renderer refuses a best-of figure that another figure of the same question beats; the
same-question check itself is tested on hand-made runs here, and on a real run of the demo's
K3 steps (``real_run``: the demo's own sweep, simulate, deployment search and compare
commands at ``--quick`` budgets on published figures; the calibration steps are left out, so
every figure answers the same question and the search is checked against all of them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.commands.demo_consistency import conflicts, figures
from calibration.commands.demo_report import render_report
from calibration.commands.demo_run import DemoConfig, DemoRun

PUBLISHED = "tpu-v7: published figures"


def _run(tmp_path: Path, *, joint_ms: float, compare_ms: float, joint_plan: str = "auto") -> DemoRun:
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    run.step("sweep b1").data = {"best": {"predicted_ms": 5.0}, "published": {"predicted_ms": 5.5},
                                 "counts": {"considered": 9, "pruned": 1, "simulated": 8}, "figures": PUBLISHED}
    run.step("sweep b4").data = {"best": {"predicted_ms": 6.0}, "published": {"predicted_ms": 6.5},
                                 "counts": {"considered": 9, "pruned": 1, "simulated": 8}, "figures": PUBLISHED}
    run.step("joint b1").data = {"best": {"plan": joint_plan, "predicted_ms": joint_ms, "tokens_per_s": 1e3 / joint_ms},
                                 "published": {"plan": "auto", "predicted_ms": 5.5, "tokens_per_s": 181.8},
                                 "speedup": 5.5 / joint_ms, "simulated": 8, "trials": 8, "robust": {},
                                 "figures": PUBLISHED}
    run.step("compare").data = [{"system": "tpu-v7:16", "chips": 16, "batch": 1, "acceptance_length": None,
                                 "execution": "megakernel", "label": "simulated", "fits": True, "step_ms": compare_ms,
                                 "tokens_per_s": 1e3 / compare_ms, "breakdown": {}}]
    return run


def test_a_search_beaten_elsewhere_is_refused(tmp_path: Path) -> None:
    """The issue's case: the search's best (5.051 ms) slower than the comparison's row (4.852)."""
    run = _run(tmp_path, joint_ms=5.051, compare_ms=4.852)
    problems = conflicts(run)
    assert any(p.startswith("deployment search: best found (5.051 ms) is slower than comparison") for p in problems)
    assert any(p.startswith("schedule sweep at batch 1: best (5.000 ms)") for p in problems)
    text = render_report(run)
    assert "**refused**" in text and "| best found |" not in text
    assert not run.ok  # the demo fails on a refused figure


def test_a_consistent_run_prints_every_swept_batch(tmp_path: Path) -> None:
    run = _run(tmp_path, joint_ms=4.9, compare_ms=5.0, joint_plan="base=published,expert_groups=4")
    assert conflicts(run) == []  # the search's winner is on another plan: not the schedule sweep's question
    text = render_report(run)
    assert "| 1 | 9 | 1 | 8 | 5.000 |" in text and "| 4 | 9 | 1 | 8 | 6.000 |" in text  # batch 4 too
    assert "simulated, published figures" in text and "**refused**" not in text
    assert run.ok


def test_other_chip_figures_are_another_question(tmp_path: Path) -> None:
    run = _run(tmp_path, joint_ms=4.8, compare_ms=4.852, joint_plan="base=published,expert_groups=4")
    note = "calibrated on 8 points (6 figures: a; overlay x.yaml)"
    run.steps[-1].data[0]["calibrated_on"] = note
    run.steps[-2].data["figures"] = f"tpu-v7: {note}"
    assert conflicts(run) == []  # the sweep's 5.0 ms (published) and the compare row's 4.852 (calibrated) differ
    run.steps[-2].data["best"]["predicted_ms"] = 5.1
    assert [p.split(" (")[0] for p in conflicts(run)] == ["deployment search: best found"]


@pytest.fixture(scope="session")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The demo's K3 steps at quick budgets, once per session (see the module docstring)."""
    from calibration.commands.demo_steps import (
        K3_TPU,
        batch_schedule,
        compare_per_batch,
        joint_step,
        run_cli_json,
        simulate_all,
    )

    out = tmp_path_factory.mktemp("demo")
    config = DemoConfig(out_dir=out, quick=True, jobs=1, compare_systems="tpu-v7:16", compare_acceptance="")
    run = DemoRun(config)
    run.step("sweep b1").data = run_cli_json(["sweep", *K3_TPU, "--batch", "1", "--budget", "8", "--samples", "20",
                                              "--out", str(out / "sweep-b1"), "--quiet", "--no-plots"])
    schedule = batch_schedule(out, 1)
    run.step("simulate").data = simulate_all(out, schedule, plots=False)
    run.step("joint b1").data = run_cli_json([*joint_step(config, schedule, budget=8), "--no-plots"])
    run.step("compare").data = compare_per_batch(config, [1], plot=False)
    return run


@pytest.mark.slow
def test_the_demos_own_figures_agree(real_run: DemoRun) -> None:
    shown = figures(real_run)
    assert {f.what for f in shown} >= {"schedule sweep at batch 1: best", "deployment search: best found",
                                       "comparison: tpu-v7:16 batch 1", "simulate: published"}
    assert len({f.question for f in shown}) == 1  # all on published figures: one question
    assert conflicts(real_run) == [], conflicts(real_run)
    assert "**refused**" not in render_report(real_run)
