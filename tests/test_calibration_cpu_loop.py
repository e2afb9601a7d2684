"""The CPU closed loop: probe the host, time jitted per-op decode steps, fit host-cpu.

One quick end-to-end run (about 20–40 s on two busy cores) shared by the checks below; the
full loop (4 layers, widths 256–1536, batch 1/4/16) runs in ``benchmarks/bench_calibration.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.sources.cpu_loop import CpuLoopConfig, run_cpu_loop
from calibration.sources.cpu_workload import build_cpu_step
from calibration.sources.measurements import Measurement
from calibration.sources.predict import Predictor, resolve_model
from calibration.sources.step_times import FitResult
from hwmodels.catalog import load_chip
from hwmodels.schema import Chip
from tpusim.app.cli import main
from tpusim.workload.model_catalog import plan_for
from tpusim.workload.program import build_program
from tpusim.workload.routing import parse_routing

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> tuple[FitResult, list[Measurement], Chip]:
    """The fit, its records, and the host entry the loop probed (published figures only)."""
    folder = tmp_path_factory.mktemp("local")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPUSIM_LOCAL_DIR", str(folder))
        result, records = run_cpu_loop(CpuLoopConfig.quick(), probe=True, quick_probe=True)
        return result, records, load_chip("host-cpu", calibrated=False)


def test_replay_reads_exactly_the_program_bytes() -> None:
    model = resolve_model("kimi-k3-mini[width=256,layers=2,formats=f32]")
    program = build_program(model, plan_for(model, 1), batch=4, context_tokens=64,
                            routing=parse_routing("uniform"))
    step = build_cpu_step(program)
    assert step.weight_bytes == program.weight_bytes
    assert len(step.time_steps(warmup=1, repeats=2)) == 2


def test_quick_loop_predicts_within_bounds(loop: tuple[FitResult, list[Measurement], Chip]) -> None:
    result, records, probed = loop
    assert len(records) == 9 and {r.backend for r in records} == {"cpu-xla"}
    assert all(r.ms_per_step_median > 0 and r.steps for r in records)
    assert {r.batch for r in result.split.holdout} == {4}
    summary = result.summary()
    # Loose bounds: the quick variant runs beside other jobs on two cores. The full loop's
    # numbers (MAPE target 15 %) are in the benchmark and the issue note.
    assert summary["mape_calibration"] < 0.30 and summary["mape_holdout"] < 0.35
    assert summary["mape_calibration"] < summary["mape_before_calibration"] + 1e-9
    # The fitted bandwidth is judged against the data and the probe, not against the fit's own
    # bounds (which it cannot leave). Physics: a step that reads B weight bytes in T seconds
    # streamed at least B / T, so no fit may claim less (30 % slack for the fit's own error).
    # The probe's numpy copy measures DRAM while small XLA steps run from cache: the fit may
    # exceed it, but not by the orders of magnitude its bounds would allow.
    fitted = {p.path: p for p in result.parameters}["hbm.sustained_bandwidth_bytes_per_s"].value
    achieved = max(r.extra["weight_bytes"] / (r.ms_per_step_median / 1e3) for r in records)
    copy = probed.hbm.sustained_bandwidth_bytes_per_s.value
    assert fitted >= 0.7 * achieved, (fitted, achieved)
    assert copy / 4 <= fitted <= copy * 30, (fitted, copy)
    assert "host-cpu" in result.fitted_on


def test_cli_cpu_loop_reuses_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str],
                                   loop: tuple[FitResult, list[Measurement], Chip]) -> None:
    """``--measurements FILE`` on cpu-xla records re-fits host-cpu without measuring again."""
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    from hwmodels.probe import probe_host, write_host_entry

    write_host_entry(probe_host(quick=True))
    _result, records, _probed = loop
    path = tmp_path / "cpu.jsonl"
    path.write_text("".join(r.to_json_line() + "\n" for r in records))
    out = tmp_path / "out"
    code = main(["calibrate", "--hardware", "host-cpu", "--measurements", str(path),
                 "--holdout", "width=512", "--out", str(out), "--json", "--max-evals", "15",
                 "--allow-unconverged", "--allow-at-bounds"])  # a 15-evaluation fit may stop early
    # (or on a bound, calibration.reports.trust); this tests the reuse
    captured = capsys.readouterr()
    # the fit ran on exactly the records given, nothing measured again (either outcome)
    reused = [json.loads(line) for line in (out / "measurements.jsonl").read_text().splitlines() if line.strip()]
    assert sorted(r["ms_per_step_median"] for r in reused) == sorted(r.ms_per_step_median for r in records)
    if code == 2:
        # the records are timings of this machine under whatever load it had: a misfit over the
        # trust check's 25 % is refused (no override, by design) and saves no overlay; any other
        # refusal is a failure
        assert "calibration refused" in captured.err and "miss the points they were fitted on" in captured.err, \
            captured.err
        assert load_chip("host-cpu").execution.launch_overhead_s.label != "calibrated"
        return
    assert code == 0, captured.err
    data = json.loads(captured.out)
    assert data["mape_holdout"] is not None and data["overlay"]
    assert load_chip("host-cpu").execution.launch_overhead_s.label == "calibrated"
    assert Predictor().predict(load_chip("host-cpu"), records[0]) > 0
