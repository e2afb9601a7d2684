"""Guard of the TPU v5e calibration on its own kernel records (issue 34).

- Way (c), held out by schedule half, re-simulated now
  (:func:`calibration.reports.tpu_v5e_replay.replay`): every record the committed reference
  held out is predicted with the figures its fold fitted on the *other* half; the held-out
  MAPE must stay within ``MARGIN`` of the documented one, and the 90 % intervals must keep
  covering at least ``COVERAGE_FLOOR``. An engine change that moves these predictions (the
  VPU dequantisation dropped, the expert overlap broken, a probe rule changed) fails it.
  11 engine runs, ~5 s.
- Way (b) reads the probe records and the kernel's fixed-cost probe runs only: building its
  chip with the decode records' file unreadable works, every figure it sets names its probe,
  and the three the fixed-cost probe sets say they are derived through the engine.
- ``tpusim calibrate --hardware tpu-v5e`` on a missing or malformed records file: one line, exit 2.
- The report's ``--decoder`` reaches the records' loader and way (b) (the fit stubbed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calibration.reports.tpu_v5e_replay import HELDOUT_PATH, replay
from calibration.sources.tpu_chip_records import KERNEL_PATH, ChipRecord
from calibration.sources.tpu_fixed_cost import kernel_probe_chip
from calibration.sources.tpu_kernel_fit import ranking, resolved_tau, splits
from calibration.sources.tpu_probes import (
    CALIBRATION_DECODER,
    dequant_path,
    load_probes,
    main,
    probe_chip,
    probe_figures,
)
from hwmodels.catalog import load_chip
from hwmodels.overlay import iter_figures
from tpusim.app.cli import main as cli

MARGIN = 0.01  # one point of MAPE above the documented held-out error
COVERAGE_FLOOR = 0.8  # the target for held-out 90 % intervals


@pytest.mark.slow  # a held-out fit over the committed records (~10-25 s)
def test_way_c_held_out_error_stays_at_the_documented_figure() -> None:
    data = replay("schedule", with_probes=False)
    held = [row for row in data["rows"] if not row["new"]]
    assert held, "the reference holds no record of the committed file"
    assert data["mape"]["c"] <= data["documented_mape"] + MARGIN, (
        f"held-out MAPE {data['mape']['c']:.4f} > documented {data['documented_mape']:.4f} + {MARGIN}")
    assert data["coverage"]["inside"] / data["coverage"]["points"] >= COVERAGE_FLOOR, data["coverage"]


@pytest.mark.slow  # builds way (b)'s chip: one fixed-cost fit through the engine (~17-25 s)
def test_way_b_reads_no_decode_step_time(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Path.read_text

    def guarded(self: Path, *args: object, **kwargs: object) -> str:
        if self.resolve() == KERNEL_PATH.resolve():
            raise AssertionError("way (b) read the kernel step times")
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", guarded)
    chip = kernel_probe_chip(load_chip("tpu-v5e", calibrated=False))
    figures = dict(iter_figures(chip))
    set_paths = probe_figures(load_probes())
    for path in (dequant_path("fp8_e4m3_b256"), "hbm.sustained_bandwidth_bytes_per_s",
                 "compute.mxu.weight_push_s_per_tile", "dma.concurrency_penalty_per_dma",
                 "execution.per_layer_overhead_s"):
        assert path in set_paths, path
    # the kernel's fixed-cost probe (capped experts, their own file) sets these, read through the engine
    derived = {dequant_path("fp8_e4m3_b256"), dequant_path("mxfp4"), "execution.per_layer_overhead_s"}
    for path in set_paths:
        if path in derived:
            assert figures[path].label == "derived", path
            assert "fixed-cost probe" in figures[path].source, figures[path].source
        else:
            assert figures[path].label == "measured", path
            assert figures[path].source.startswith("measured on tpu-v5e (probe "), figures[path].source
    assert chip.dma.service == "in_order" and chip.dma.service_source.startswith("measured on tpu-v5e (probe dma_order")
    assert chip.calibration is None  # nothing fitted


def test_probe_figures_save_as_the_v5e_overlay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path))
    main(["--save"])
    chip = load_chip("tpu-v5e")  # calibrated: the overlay applies
    measured = probe_chip(load_chip("tpu-v5e", calibrated=False))
    assert chip.is_calibrated
    for path in probe_figures(load_probes()):
        assert dict(iter_figures(chip))[path].value == pytest.approx(dict(iter_figures(measured))[path].value)


def _record(schedule: str, batch: int, ms: float, spread: float = 0.0) -> ChipRecord:
    return ChipRecord(model="kimi-k3", shard_of="k3-tp32", schedule=schedule, schedule_path="x.json", batch=batch,
                      context=1024, routing="trace:x", ms_median=ms, ms_spread=spread, runs=1)


def test_splits_and_ranking_follow_whatever_records_exist() -> None:
    records = [_record(s, b, ms) for s, b, ms in (("naive", 1, 97.0), ("published", 1, 78.0), ("k3-ring", 1, 78.3),
                                                 ("published", 4, 150.0), ("naive", 16, 600.0), ("published", 16, 500.0))]
    groups = splits(records)
    assert groups["schedule"] == ("B", "A", "A", "A", "B", "A")  # k3-ring A, naive B, published A (name order)
    assert groups["batch"] == ("b1+4", "b1+4", "b1+4", "b1+4", "b16", "b16")
    found = ranking(records, {0: 90.0, 1: 70.0, 2: 75.0}, 1)
    assert found is not None and found["tau"] == pytest.approx(1.0) and found["regret"] == pytest.approx(0.0)
    worst = ranking(records, {0: 60.0, 1: 70.0, 2: 75.0}, 1)
    assert worst is not None and worst["pick"] == "naive" and worst["regret"] == pytest.approx(97.0 / 78.0 - 1)
    assert ranking(records, {3: 1.0}, 4) is None  # one schedule: no order to judge


def test_resolved_tau_counts_only_pairs_the_spreads_separate() -> None:
    records = [_record("a", 1, 100.0, spread=0.5), _record("b", 1, 100.6, spread=0.5),
               _record("c", 1, 110.0, spread=0.5), _record("d", 1, 90.0, spread=0.5)]
    # a-b lie within their spreads: the swapped guess between them is not held against it
    tau, pairs = resolved_tau(records, [101.0, 100.0, 120.0, 80.0])
    assert pairs == 5 and tau == pytest.approx(1.0)
    tau, pairs = resolved_tau(records, [101.0, 100.0, 80.0, 120.0])  # c and d swapped: every resolved pair wrong
    assert pairs == 5 and tau == pytest.approx(-1.0)
    found = ranking(records, {0: 101.0, 1: 100.0, 2: 120.0, 3: 80.0}, 1)
    assert found is not None and found["tau_resolved"] == pytest.approx(1.0) and found["tau"] < 1.0


@pytest.mark.parametrize("content, words", [
    (None, "no such kernel records file"),
    ("{not json\n", "not a JSON record"),
    (json.dumps({"shard_of": "k3-tp8", "ms_per_step_median": 1.0}) + "\n", "no kernel records with shard_of"),
    (json.dumps({"shard_of": "k3-tp32", "ms_per_step_median": 1.0}) + "\n", "kernel record lacks"),
])
def test_calibrate_on_bad_kernel_records_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch, content: str | None,
                                                           words: str) -> None:
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(tmp_path / "local"))
    path = tmp_path / "records.jsonl"
    if content is not None:
        path.write_text(content)
    assert cli(["calibrate", "--hardware", "tpu-v5e", "--measurements", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err, err


def test_the_reference_names_the_command_that_wrote_it() -> None:
    reference = json.loads(HELDOUT_PATH.read_text())
    assert "calibration.reports.tpu_v5e" in reference["command"]
    assert reference["fitted"] and set(reference["splits"]) >= {"schedule"}


def test_whole_model_runs_are_not_kernel_records(tmp_path: Path) -> None:
    from calibration.sources.tpu_chip_records import is_kernel_records

    whole = tmp_path / "mini.jsonl"
    whole.write_text(json.dumps({"model": "kimi-k3-mini", "ms_per_step_median": 1.0}) + "\n")
    assert not is_kernel_records(whole)  # the end-to-end procedure's measurement file, as before
    assert is_kernel_records(KERNEL_PATH)


def test_kernel_records_refuse_a_foreign_chip_or_split(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(KERNEL_PATH)
    assert cli(["calibrate", "--hardware", "tpu-v7", "--measurements", path, "--out", "/nonexistent/x"]) == 2
    assert "kernel records calibrate tpu-v5e" in capsys.readouterr().err
    assert cli(["calibrate", "--hardware", "tpu-v5e", "--measurements", path, "--holdout-dimensions", "format"]) == 2
    assert "kernel records split by schedule or batch" in capsys.readouterr().err


@pytest.mark.slow  # engine runs in worker processes (~6 s)
def test_engine_runs_in_worker_processes_give_the_serial_predictions() -> None:
    from calibration.sources.tpu_chip_records import ChipRecordPredictor, load_chip_records

    records = [r for r in load_chip_records(KERNEL_PATH) if r.batch == 1][:3]
    chip = load_chip("tpu-v5e", calibrated=False)
    serial = ChipRecordPredictor(records).predict_many(chip, range(3))
    pooled = ChipRecordPredictor(records, jobs=2)
    try:
        assert pooled.predict_many(chip, [2, 0, 1, 0]) == [serial[2], serial[0], serial[1], serial[0]]
        assert pooled.runs == 3
    finally:
        pooled.close()


@pytest.mark.parametrize("argv, decoder", [([], CALIBRATION_DECODER), (["--decoder", "bytes"], "bytes")])
def test_the_report_reads_the_records_of_the_decoder_it_is_given(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                                  decoder: str) -> None:
    """``--decoder`` reaches the records' loader and way (b)'s chip (no engine run: the fit is stubbed)."""
    from calibration.reports import tpu_v5e
    from calibration.sources import tpu_kernel_fit
    from calibration.sources.tpu_chip_records import load_chip_records

    class Reached(Exception):
        pass

    seen: dict[str, Any] = {}

    def stop(path: Path, records: list[ChipRecord], *args: object) -> None:
        seen.update(records=records, decoder=args[-1])
        raise Reached

    monkeypatch.setattr(tpu_kernel_fit, "_calibrate", stop)
    with pytest.raises(Reached):
        tpu_v5e.main(argv)
    assert seen["decoder"] == decoder
    assert seen["records"] == load_chip_records(KERNEL_PATH, decoder=decoder)
    other = "bytes" if decoder != "bytes" else CALIBRATION_DECODER
    assert len(seen["records"]) != len(load_chip_records(KERNEL_PATH, decoder=other))  # 22 words32, 34 bytes points
