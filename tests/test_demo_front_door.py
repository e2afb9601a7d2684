"""The demo's front door: the default run answers first and leaves the long steps to --full,
every long step shows progress, and the report says what --full would add."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from calibration.commands import demo_steps as demo
from calibration.commands.demo_report import NOT_BY_DEFAULT, render_report
from calibration.commands.demo_run import DemoConfig, DemoRun, StepRecord
from tpusim.progress_notes import listening, note
from tpusim.sweep.progress import SweepProgress

SWEEP = {"best": {"name": "sample-00398", "predicted_ms": 3.6096, "tokens_per_s": 277.04},
         "published": {"predicted_ms": 4.1288}, "speedup_vs_published": 1.1438,
         "counts": {"considered": 1720, "simulated": 32}, "figures": "tpu-v7: published figures"}


def test_the_first_answer_names_the_best_schedule_and_its_speed_up() -> None:
    lines = demo.first_answer(SWEEP, 41.2)
    assert lines[0] == "Kimi K3 on 16 TPU v7, batch 1 (simulated, tpu-v7: published figures):"
    assert lines[1] == ("  best schedule sample-00398: 3.610 ms/step, 277.0 tokens/s, "
                        "1.144x the published schedule's 4.129 ms")
    assert "after 41 s" in lines[2] and "32 of 1720" in lines[2]


def _steps_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **config: bool) -> list[str]:
    names: list[str] = []

    def fake_timed(run: DemoRun, name: str, action: object, progress: object) -> StepRecord:
        names.append(name)
        record = run.step(name)
        record.ok, record.error = False, "not run in this test"
        return record

    monkeypatch.setattr(demo, "_timed", fake_timed)
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    demo.run_demo(DemoConfig(out_dir=tmp_path / "report", **config))
    assert (tmp_path / "report" / "report.md").is_file()
    return names


def test_the_default_demo_leaves_the_long_steps_to_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _steps_run(tmp_path, monkeypatch) == ["sweep b1", "floor", "sweep b8", "simulate", "measured tpu-v5e",
                                                 "compare", "compiler-priced tpu-v7"]
    full = _steps_run(tmp_path, monkeypatch, full=True)
    assert full[0] == "sweep b1"  # the first answer comes first either way
    assert set(full) >= {"sweep b4", "sweep b8", "run-kernel", "calibrate tpu-v7", "calibrate host-cpu", "joint b1",
                         "compare"}


def test_the_report_says_what_full_adds(tmp_path: Path) -> None:
    text = render_report(DemoRun(DemoConfig(out_dir=tmp_path)))
    kernel = text.split("## 4. The Pallas megakernel")[1].split("##")[0]
    assert NOT_BY_DEFAULT in kernel and "tpusim demo --full" in NOT_BY_DEFAULT


def test_a_long_step_shows_its_latest_note_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "HEARTBEAT_S", 0.05)
    lines: list[str] = []

    def slow() -> int:
        for count in range(1, 6):
            note(f"simulate {count}/5")
            time.sleep(0.05)
        return 5

    record = demo._timed(DemoRun(DemoConfig(out_dir=Path("unused"))), "sweep b1", slow, lines.append)
    assert record.ok and record.data == 5
    beats = [line for line in lines if line.startswith("[demo] sweep b1: ") and " s, simulate " in line]
    assert beats, lines
    note("heard by nobody")  # after the step, nothing listens: no error, no line
    assert len(lines) == len([*beats, lines[0], lines[-1]])


def test_a_sweeps_progress_is_a_note_even_without_a_terminal() -> None:
    heard: list[str] = []
    with listening(heard.append):
        progress = SweepProgress(enabled=False)
        task = progress.phase("batch 1: simulate", 3)
        progress.offer_best(3.61, "sample-1")
        progress.advance(task)
    assert heard[-1] == "batch 1: simulate 1/3, best 3.610 ms (simulated) sample-1"
