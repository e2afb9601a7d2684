"""``tpusim sweep --compile-check``: the sweep's pick is the fastest simulated schedule a check
accepts (run_sweep's ``accept``), and the Mosaic check learns what the compiler keeps beside
the VMEM accounting from a refusal (compiles stubbed here: the real compile is exercised by
tests/test_megakernel_collective_compile.py and documented in docs/multi-device.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from megakernel.commands import lower, sweep_compile
from megakernel.commands.sweep_compile import MosaicCheck
from tests.test_sweep_run import sweep
from tpusim.schedule.schema import load_schedule


@pytest.mark.slow  # a sweep with compile checks (~7 s)
def test_the_pick_is_the_fastest_row_the_check_accepts(tmp_path: Path) -> None:
    seen: list[str] = []

    def accept(schedule: Any, row: dict[str, Any]) -> tuple[bool, str]:
        seen.append(row["hash"])
        return len(seen) == 3, f"check {len(seen)}"

    result = sweep(tmp_path, accept=accept)
    ranked = sorted((r for r in result.rows if r["status"] == "simulated"), key=lambda r: (r["predicted_ms"], r["hash"]))
    assert [c["hash"] for c in result.checks] == [r["hash"] for r in ranked[:3]] == seen
    assert result.best_row["hash"] == ranked[2]["hash"] and not result.check_failed
    best = load_schedule(tmp_path / "best.json")
    assert best.name == f"best-{ranked[2]['hash']}" and best.description.endswith("; check 3")
    assert "Checked beyond the simulator" in (tmp_path / "summary.md").read_text()


@pytest.mark.slow  # a sweep with compile checks (~5 s)
def test_when_no_row_is_accepted_the_simulated_best_is_kept_and_flagged(tmp_path: Path) -> None:
    result = sweep(tmp_path, accept=lambda schedule, row: (False, "refused"))
    simulated = [r for r in result.rows if r["status"] == "simulated"]
    assert result.check_failed and len(result.checks) == len(simulated)
    assert result.best_row["predicted_ms"] == min(r["predicted_ms"] for r in simulated)
    assert "unchecked" in (tmp_path / "summary.md").read_text()


def _check(monkeypatch: pytest.MonkeyPatch, reports: list[dict[str, Any]], compiles: int = 5) -> MosaicCheck:
    calls = iter(reports)
    monkeypatch.setattr(lower, "mosaic_report", lambda **_: next(calls))
    args = argparse.Namespace(model="kimi-k3", batch=8, context=1024, shard_of=None)
    system = argparse.Namespace(chip=argparse.Namespace(name="tpu-v7"))
    return MosaicCheck(args, system, argparse.Namespace(devices=32), compiles)


def _report(ok: bool, error: str | None = None, kind: str | None = None, accounting_mib: float = 57.61) -> dict:
    return {"compile": {"ok": ok, "seconds": 22.5, "error": error, "kind": kind, "topology": "tpu7x:2x2x4"},
            "accounting_bytes": {"all": accounting_mib * sweep_compile.MIB}}


def _row(name: str, mib: float) -> dict[str, Any]:
    return {"name": name, "hash": name, "vmem_static_mib": mib}


def test_a_vmem_refusal_teaches_what_the_compiler_keeps_and_skips_what_cannot_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    refusal = "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem. Used 66.10M of 64.00M vmem. Exceeded"
    check = _check(monkeypatch, [_report(False, refusal, "vmem"), _report(True, accounting_mib=54.69)])
    schedule = load_schedule("published")
    ok, note = check(schedule, _row("first", 57.61))
    assert not ok and "66.10 MiB used of 64.00" in note and "8.49 MiB beside the 57.61" in note
    assert check.usable_bytes == pytest.approx((64.00 - 66.10 + 57.61) * sweep_compile.MIB)
    ok, note = check(schedule, _row("any", 40.0))  # the first sweep stops compiling: it is swept again
    assert not ok and sweep_compile.SECOND_PASS in note
    check.stop_after_learning = False  # the second sweep
    # 57.00 + 8.49 > 64: skipped without a compile (the stub has one report left, for the next)
    ok, note = check(schedule, _row("second", 57.00))
    assert not ok and note.startswith("not compiled") and "first" in note
    ok, note = check(schedule, _row("third", 54.69))
    assert ok and "compiled it for tpu-v7 (tpu7x:2x2x4) in 22.5 s" in note


def test_other_refusals_are_reported_and_the_budget_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    check = _check(monkeypatch, [_report(False, "Mosaic failed: offsets along tiled dimensions\nmore", "mosaic")],
                   compiles=1)
    schedule = load_schedule("published")
    ok, note = check(schedule, _row("a", 40.0))
    assert not ok and note.endswith("offsets along tiled dimensions")
    ok, note = check(schedule, _row("b", 40.0))
    assert not ok and "budget is spent" in note


def test_the_second_sweep_runs_within_what_the_compiler_leaves_and_its_pick_becomes_best_json(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hwmodels.catalog import make_system
    from tpusim.sweep.result import SweepResult

    refusal = "Ran out of memory in memory space vmem. Used 66.10M of 64.00M vmem."
    check = _check(monkeypatch, [_report(False, refusal, "vmem")])
    check(load_schedule("published"), _row("first", 57.61))
    system = make_system("tpu-v7", 16)
    seen: list[Any] = []

    def result(name: str, failed: bool = False) -> SweepResult:
        schedule = load_schedule("naive").model_copy(update={"name": name})
        checks = [{"name": name, "hash": name, "predicted_ms": 8.45, "accepted": not failed, "note": "n"}]
        return SweepResult(best=schedule, best_row={"predicted_ms": 8.45}, published_row=None, published_rank=None,
                           considered=1, pruned=0, screened=0, simulated=1, estimated=0, wall_s=0.0, rows=[],
                           knobs=[], checks=checks)

    def sweep_into(out: Path, chosen: Any) -> SweepResult:
        seen.append((out, chosen))
        return result("second")

    (tmp_path / "summary.md").write_text("# first sweep\n")
    second = sweep_compile.resweep(result("first", failed=True), check, sweep_into, system, tmp_path)
    out, chosen = seen[0]
    assert out == tmp_path / sweep_compile.SECOND_PASS
    usable = chosen.chip.staging_memory.usable_capacity_bytes
    assert usable.label == "measured" and usable.value == pytest.approx(check.usable_bytes)
    assert system.chip.staging_memory.usable_bytes == 58 * sweep_compile.MIB  # the catalog's chip untouched
    assert load_schedule(tmp_path / "best.json").name == "second" == second.best.name
    assert load_schedule(tmp_path / sweep_compile.REFUSED_BEST).name == "first"
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# first sweep") and "55.51 MiB" in summary


def test_what_cannot_be_compile_checked_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwmodels.catalog import make_system
    from hwmodels.errors import InputError
    from megakernel import mosaic_compile
    from tpusim.workload.model_catalog import load_model, plan_for, shard_plan

    monkeypatch.setattr(mosaic_compile, "libtpu_available", lambda: True)
    k3 = load_model("kimi-k3")

    def args(**extra: Any) -> argparse.Namespace:
        return argparse.Namespace(**{"space": None, "shard_of": None, "weight_banks": 0, **extra})

    sweep_compile.check_possible(args(shard_of="k3-tp32", weight_banks=2), make_system("tpu-v5e", 1),
                                 shard_plan(k3, "k3-tp32"))  # one device's program: compiles on v5e
    assert sweep_compile.program_devices(args(shard_of="k3-tp32"), shard_plan(k3, "k3-tp32")) == 1
    for bad, system, plan, words in [
            (args(), make_system("b200", 8), plan_for(k3, 8), "not a TPU"),
            (args(), make_system("tpu-v5e", 16), plan_for(k3, 16), "compiles only on tpu-v7"),
            (args(weight_banks=2), make_system("tpu-v7", 16), plan_for(k3, 32), "--weight-banks 2"),
            (args(space="joint"), make_system("tpu-v7", 16), plan_for(k3, 32), "schedule sweeps only")]:
        with pytest.raises(InputError, match=words):
            sweep_compile.check_possible(bad, system, plan)
