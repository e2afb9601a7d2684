"""run_sweep end to end on kimi-k3-mini (8 of its 93 layers, for speed): outputs, determinism,
interrupt and resume, and the CLI (all 93 layers)."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from hwmodels.catalog import make_system
from hwmodels.errors import InputError
from tpusim.app.cli import main
from tpusim.schedule.schema import load_schedule
from tpusim.sweep import SweepInterrupted, SweepResult, SweepSpace, default_space, run_sweep
from tpusim.sweep.outputs import STATUSES
from tpusim.workload.model_catalog import load_model, plan_for

BATCH = 2


@cache
def mini() -> tuple:
    model = load_model("kimi-k3-mini").with_layers(8)  # dense layer 0, KDA and MLA layers
    system = make_system("tpu-v7", 2)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    return model, plan, system


@pytest.fixture(scope="module")
def mini_yaml(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The 8-layer mini model as a YAML file, for the CLI (``--model PATH``)."""
    path = tmp_path_factory.mktemp("model") / "kimi-k3-mini-8.yaml"
    path.write_text(yaml.safe_dump(mini()[0].model_dump(mode="json")))
    return str(path)


def cli_args(model: str, out: Path, *extra: str) -> list[str]:
    return ["sweep", "--model", model, "--hardware", "tpu-v7", "--chips", "2", "--batch", "2",
            "--screen-layers", "4", "--no-plots", "--out", str(out), *extra]


def small_space(samples: int = 30) -> SweepSpace:
    return default_space().model_copy(update={"samples": samples})


def sweep(out: Path, **overrides: Any) -> SweepResult:
    model, plan, system = mini()
    options: dict[str, Any] = {"out_dir": out, "budget": 5, "jobs": 1, "seed": 3, "quiet": True,
                               "space": small_space(), "screen_factor": 2, "screen_layers": 4,
                               "plots": False}
    options.update(overrides)
    return run_sweep(model, plan, system, BATCH, **options)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_outputs_are_complete_and_labelled(tmp_path: Path) -> None:
    result = sweep(tmp_path, plots=True, budget=8)  # budget >= 8: a refine round too
    rows = read_csv(tmp_path / "sweep.csv")
    assert len(rows) == result.considered == len({r["hash"] for r in rows})
    assert Counter(r["status"] for r in rows) == {
        status: n for status, n in (("simulated", result.simulated), ("estimated", result.estimated),
                                    ("pruned", result.pruned)) if n}
    assert set(r["status"] for r in rows) <= set(STATUSES)
    simulated = [r for r in rows if r["status"] == "simulated"]
    assert len(simulated) == 8 and all(r["predicted_by"] == "simulated" and r["sim_ms"] for r in simulated)
    assert {r["name"] for r in rows if r["source"] == "builtin"} <= {r["name"] for r in simulated}
    assert all(r["predicted_by"] == "estimate" for r in rows if r["status"] == "estimated")
    assert all(r["reason"] for r in rows if r["status"] == "pruned")
    # the chosen schedule is the fastest simulated row (the choice, not a bound it cannot leave)
    assert result.best_row["status"] == "simulated"
    assert result.best_row["predicted_ms"] == pytest.approx(min(float(r["sim_ms"]) for r in simulated), rel=1e-6)
    best = load_schedule(str(tmp_path / "best.json"))
    assert best.name == f"best-{best.content_hash()}" and best.content_hash() == result.best_row["hash"]
    assert result.sensitivity and any(e["is_seed"] for e in result.sensitivity)
    summary = (tmp_path / "summary.md").read_text()
    assert "published" in summary and "rank" in summary and "Sensitivity" in summary and "simulated" in summary
    config = json.loads((tmp_path / "space.json").read_text())
    assert SweepSpace.model_validate(config["space"]).constraints.vmem_capacity_bytes == 60817408
    assert config["workload"]["model"] == "kimi-k3-mini" and config["workload"]["screen_layers"] == 4
    for name in ("pareto.png", "sensitivity.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files behind


@pytest.mark.slow  # a sweep and its resume (~5-7 s)
def test_schema_rejections_are_pruned_rows_that_resume_keeps(tmp_path: Path) -> None:
    """Settings the schedule schema rejects are rows (``pruned``, ``schema: ...``), never evaluated."""
    ring = {"mode": "ring", "banks": 4, "bank_bytes": 1 << 20}
    space = SweepSpace.model_validate({**small_space(20).model_dump(mode="json"),
                                       "pool_modes": {"attention+experts": {"main": ring}}})
    result = sweep(tmp_path, space=space, budget=3, screen_factor=0)
    rows = read_csv(tmp_path / "sweep.csv")
    schema = [r for r in rows if r["reason"].startswith("schema: ")]
    assert {"sample", "neighbour"} <= {r["source"] for r in schema}
    assert all(r["status"] == "pruned" and not (r["est_ms"] or r["screen_ms"] or r["sim_ms"] or r["predicted_ms"])
               for r in schema)
    assert len(rows) == result.considered and result.pruned == sum(r["status"] == "pruned" for r in rows)
    assert "schema " in (tmp_path / "summary.md").read_text()  # "Pruned by: ..., schema N"
    resumed: list[dict[str, Any]] = []
    sweep(tmp_path, space=space, budget=3, screen_factor=0, resume=True, on_row=resumed.append)
    assert resumed == [] and read_csv(tmp_path / "sweep.csv") == rows


@pytest.mark.slow  # two whole sweeps (~10 s, loaded machine)
def test_same_seed_gives_an_identical_best_json(tmp_path: Path) -> None:
    small = {"space": small_space(12), "budget": 8}  # budget 8: the refine round runs too
    sweep(tmp_path / "a", **small)
    sweep(tmp_path / "b", **small)
    sweep(tmp_path / "c", jobs=2, **small)  # worker processes must not change the choice
    first = (tmp_path / "a" / "best.json").read_bytes()
    assert (tmp_path / "b" / "best.json").read_bytes() == first
    assert (tmp_path / "c" / "best.json").read_bytes() == first


@pytest.mark.slow
def test_interrupted_sweep_keeps_rows_and_resume_does_not_repeat_them(tmp_path: Path) -> None:
    reference = sweep(tmp_path / "reference", space=small_space(15))
    out = tmp_path / "interrupted"
    seen: list[dict[str, Any]] = []

    def interrupt_after_a_few_simulations(row: dict[str, Any]) -> None:
        seen.append(row)
        if sum(r["status"] == "simulated" for r in seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(SweepInterrupted, match="--resume"):
        sweep(out, on_row=interrupt_after_a_few_simulations, space=small_space(15))
    kept = read_csv(out / "sweep.csv")
    assert [r["hash"] for r in kept] == [r["hash"] for r in seen]  # every finished row, intact
    assert sum(r["status"] == "simulated" for r in kept) == 3
    for row, written in zip(kept, seen, strict=True):
        assert float(row["predicted_ms"] or 0) == (written.get("predicted_ms") or 0)

    # a torn last line (killed mid-write) is dropped, not parsed
    with (out / "sweep.csv").open("a") as handle:
        handle.write("deadbeef,partial")
    resumed: list[dict[str, Any]] = []
    result = sweep(out, resume=True, on_row=resumed.append, space=small_space(15))
    assert not {r["hash"] for r in resumed} & {r["hash"] for r in kept}  # nothing repeated
    rows = read_csv(out / "sweep.csv")
    assert len(rows) == len({r["hash"] for r in rows}) == reference.considered
    assert result.simulated == reference.simulated
    assert (out / "best.json").read_bytes() == (tmp_path / "reference" / "best.json").read_bytes()


@pytest.mark.slow  # CLI sweeps in subprocesses, one interrupted (~16 s, loaded machine)
def test_ctrl_c_on_the_cli_keeps_rows_and_resume_finishes(tmp_path: Path, mini_yaml: str) -> None:
    """A real SIGINT to `tpusim sweep --jobs 2`: exit 130, a resume hint, rows intact, no repeats."""
    command = [sys.executable, "-m", "tpusim",
               *cli_args(mini_yaml, tmp_path, "--budget", "60", "--samples", "100", "--jobs", "2", "--quiet")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    table = tmp_path / "sweep.csv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if table.exists() and any(r["status"] == "simulated" for r in read_csv(table)):
            break
        time.sleep(0.05)
    if process.poll() is not None:
        pytest.skip("the sweep finished before it could be interrupted")
    process.send_signal(signal.SIGINT)
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "finished rows kept" in err and "--resume" in err
    kept = read_csv(table)
    assert kept and all(r["hash"] and r["status"] in STATUSES for r in kept)
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    rows = read_csv(table)
    assert len(rows) == len({r["hash"] for r in rows})  # nothing repeated
    assert rows[: len(kept)] == kept  # the interrupted run's rows are untouched


@pytest.mark.slow  # a sweep, then a refused resume (~5-7 s)
def test_resume_refuses_a_different_workload(tmp_path: Path) -> None:
    sweep(tmp_path, budget=3, screen_factor=0, space=small_space(5))
    with pytest.raises(InputError, match="different"):
        sweep(tmp_path, budget=3, screen_factor=0, space=small_space(5), seed=4, resume=True)


def test_per_op_launch_chips_are_refused(tmp_path: Path) -> None:
    model = load_model("kimi-k3-mini")
    system = make_system("h100", 2)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip, intra_link="nvlink")
    with pytest.raises(InputError, match="per op"):
        run_sweep(model, plan, system, 1, out_dir=tmp_path, quiet=True)


@pytest.mark.slow
def test_cli_prints_labelled_top_five(tmp_path: Path, mini_yaml: str, capsys: pytest.CaptureFixture[str]) -> None:
    small = ("--budget", "4", "--samples", "10", "--screen-factor", "1")
    assert main(cli_args(mini_yaml, tmp_path, *small, "--quiet")) == 0
    out = capsys.readouterr().out
    assert "top 5" in out and "simulated" in out and "published" in out and "rank" in out
    assert main(cli_args(mini_yaml, tmp_path, *small, "--json", "--resume")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["best"]["predicted_by"] == "simulated"
    fastest = min(float(r["sim_ms"]) for r in read_csv(tmp_path / "sweep.csv") if r["status"] == "simulated")
    assert data["best"]["predicted_ms"] == pytest.approx(fastest, rel=1e-6)


def test_cli_interrupt_says_how_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    import tpusim.sweep

    def interrupted(*_args: Any, **_kwargs: Any) -> None:
        raise SweepInterrupted("interrupted: 7 finished rows kept in x/sweep.csv")

    monkeypatch.setattr(tpusim.sweep, "run_sweep", interrupted)
    code = main(["sweep", "--model", "kimi-k3-mini", "--hardware", "tpu-v7", "--chips", "2",
                 "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 130 and "7 finished rows" in err and "--resume" in err


@pytest.mark.slow  # a verify-step sweep (~5 s)
def test_a_verify_step_sweep_runs_its_rows_over_its_sequences(tmp_path: Path) -> None:
    """``sequences`` (a speculative verify step: rows of fewer sequences) reaches the program
    every candidate is simulated on, and the workload saved beside the rows."""
    from tpusim.engine import simulate
    from tpusim.workload.program import build_program

    result = sweep(tmp_path, sequences=1)
    assert json.loads((tmp_path / "space.json").read_text())["workload"]["sequences"] == 1
    model, plan, system = mini()
    program = build_program(model, plan, batch=BATCH, context_tokens=1024, seed=3, sequences=1)
    assert program.kv_sequences == 1
    best = result.schedules[result.best_row["hash"]]
    assert result.best_row["predicted_ms"] == pytest.approx(simulate(program, best, system.chip).step_s * 1e3, rel=1e-9)
