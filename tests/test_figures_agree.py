"""Figures that agree (issue 23, item 5), through the CLI: one floor per device view in `floor`
and `simulate`, speculation slower than plain decode flagged, the demo's per-batch schedules,
chip-count advice from the capacity check itself, and signal exit codes of 128 + signal."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from hwmodels.catalog import make_system
from tpusim.app.cli import main
from tpusim.app.cli.run_guard import EXIT_INTERRUPTED, EXIT_TERMINATED
from tpusim.workload.capacity import capacity_report
from tpusim.workload.model_catalog import load_model, plan_for_system

WORKLOAD = ["--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "2", "--batch", "4"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_floor_and_simulate_print_the_same_critical_device_floor(capsys: pytest.CaptureFixture[str]) -> None:
    """They printed different 'analytic floors' for one workload (expected vs critical device)."""
    _, floor_out, _ = run(capsys, "floor", *WORKLOAD, "--json")
    _, sim_out, _ = run(capsys, "simulate", *WORKLOAD, "--json")
    floor, sim = json.loads(floor_out), json.loads(sim_out)
    assert sim["floors"]["device"] == "critical"
    assert sim["floor_ms"] == pytest.approx(floor["floor_ms_critical_device"], rel=1e-12)
    _, floor_table, _ = run(capsys, "floor", *WORKLOAD)
    _, sim_table, _ = run(capsys, "simulate", *WORKLOAD)
    critical = f"{sim['floor_ms']:.3f} ms"
    assert any("floor, critical device" in line and critical in line for line in floor_table.splitlines())
    assert any("floor, critical device" in line and critical in line for line in sim_table.splitlines())
    assert any("floor, expected device" in line for line in floor_table.splitlines())
    assert not any(line.strip().startswith("│ floor ") for line in floor_table.splitlines() + sim_table.splitlines())


@pytest.mark.slow
def test_speculation_slower_than_plain_decode_is_flagged(capsys: pytest.CaptureFixture[str]) -> None:
    """TPU batch 8 at acceptance 3 was slower than no speculation, shown as a normal row. (Its 64
    verify rows no longer fit on-chip memory once the collective buffers count: batch 4 with 3
    draft tokens, 16 verify rows, at acceptance 1.5 is the slower case now.)"""
    argv = ["compare", "--model", "kimi-k3", "--systems", "tpu-v7:16", "--batch", "4", "--spec-acceptance", "1.5",
            "--draft-tokens", "3", "--schedule", "published"]
    code, out, _ = run(capsys, *argv, "--json")
    plain, speculative = json.loads(out)
    assert code == 0 and plain["acceptance_length"] is None
    assert speculative["tokens_per_s"] < plain["tokens_per_s"]
    assert speculative["slower_than_plain"] is True and "slower than plain decode" in speculative["warning"]
    assert "slower_than_plain" not in plain
    code, table, _ = run(capsys, *argv, "--format", "csv")
    assert code == 0 and "warning: speculation slower than plain decode" in table


def test_demo_compares_each_batch_with_its_own_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It compared every batch with the batch-1 sweep's schedule although it swept batch 8 too."""
    from calibration.commands import demo_steps as demo
    from calibration.commands.demo_run import DemoConfig

    for batch in (1, 8):
        (tmp_path / f"sweep-b{batch}").mkdir()
        (tmp_path / f"sweep-b{batch}" / "best.json").write_text("{}")
    calls: list[list[str]] = []

    def fake_compare(argv: list[str]) -> list[dict[str, Any]]:
        calls.append(argv)
        batch = int(argv[argv.index("--batch") + 1])
        return [{"system": "tpu-v7:16", "batch": batch}]

    monkeypatch.setattr(demo, "run_cli_json", fake_compare)
    monkeypatch.setattr("tpusim.compare.plot.plot_comparison", lambda rows, path, title: path)
    rows = demo.compare_per_batch(DemoConfig(out_dir=tmp_path, compare_batches="1,2,8"), [1, 2, 8])
    schedules = {int(a[a.index("--batch") + 1]): a[a.index("--schedule") + 1] for a in calls}
    assert schedules == {1: str(tmp_path / "sweep-b1" / "best.json"), 2: "published",
                         8: str(tmp_path / "sweep-b8" / "best.json")}
    assert [row["batch"] for row in rows] == [1, 2, 8]


def test_chip_advice_is_a_count_the_capacity_check_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "floor", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "8")
    assert code == 2 and "16 x tpu-v7 fit" in err
    model, system = load_model("kimi-k3"), make_system("tpu-v7", 16)
    for chips, fits in ((8, False), (16, True)):
        plan = plan_for_system(model, system.chip, chips)
        assert capacity_report(model, plan, system.chip, batch=1, context_tokens=1024).fits is fits


def test_no_chip_advice_where_no_count_fits(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`sweep --batch 100000` advised 'at least ~774 chips': K3's latent cache is on every TP device."""
    code, _, err = run(capsys, "sweep", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16",
                       "--batch", "100000", "--out", str(tmp_path / "sweep"))
    assert code == 2 and "no count up to 4096 x tpu-v7 fits" in err and "at least" not in err
    model, system = load_model("kimi-k3"), make_system("tpu-v7", 16)
    plan = plan_for_system(model, system.chip, 4096)
    assert not capacity_report(model, plan, system.chip, batch=100000, context_tokens=1024).fits


def test_exit_codes_are_128_plus_the_signal() -> None:
    assert EXIT_TERMINATED == 128 + signal.SIGTERM and EXIT_INTERRUPTED == 128 + signal.SIGINT


def test_a_terminated_sweep_exits_143(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep stopped by SIGTERM exited 130 (Ctrl-C's code)."""
    import tpusim.sweep
    from tpusim.app.interrupts import Terminated
    from tpusim.sweep import SweepInterrupted

    def stopped(*_: object, **__: object) -> None:
        try:
            raise Terminated
        except KeyboardInterrupt:
            raise SweepInterrupted("interrupted: 0 finished rows kept") from None

    monkeypatch.setattr(tpusim.sweep, "run_sweep", stopped)
    code, _, err = run(capsys, "sweep", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "1",
                       "--out", str(tmp_path / "s"))
    assert code == EXIT_TERMINATED and "--resume" in err
