"""Predict, then measure: the planned runs' chip, and every prediction on record before its run."""

from __future__ import annotations

import datetime as dt
import functools
import json
from pathlib import Path

import pytest

from calibration.reports import tpu_v5e_plan as plan
from calibration.sources.tpu_fixed_cost import kernel_probe_chip
from calibration.sources.tpu_probes import dequant_path
from hwmodels.catalog import load_chip
from megakernel.quant import WORDS32_DECODER
from megakernel.quant_pairs import KERNEL_DECODER

DATA = Path(__file__).resolve().parents[1] / "calibration" / "data"
DOCUMENTED_MAPE, MARGIN = 0.027, 0.01  # 18 runs, MAPE 2.7 % (docs/megakernel-on-tpu.md, README)
DOCUMENTED_DERIVED_MAPE = 0.018  # sets v5e-y/z: 11 runs, MAPE 1.75 %, 10 within 5 % (docs/megakernel-on-tpu.md)
# sets v5e-ab/ac: the simulator refit on the unrolled kernel's own capped runs (v5e-aa), 8 runs
# not yet measured when predicted: MAPE 4.3 %, 6 within 5 % (naive b8 -10.9 %, best-0007 b1 +8.8 %)
DOCUMENTED_REFIT_MAPE = 0.043


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def _static(part: str, decoder: str) -> float:
    (row,) = [r for r in _rows("tpu-v5e-static-schedule.jsonl")
              if r["probe"] == "expert_product"
              and (r["params"]["part"], r["params"]["decoder"], r["params"]["rows"]) == (part, decoder, 1)]
    return row["panel_bundles"] / 1.5e9 / (row["params"]["k"] * 128)


@pytest.mark.slow  # engine runs of the K3 shard (~12-25 s)
def test_the_planned_chip_takes_the_static_figures() -> None:
    chip = plan.planned_chip(KERNEL_DECODER)
    base = kernel_probe_chip(load_chip("tpu-v5e", calibrated=False), decoder=WORDS32_DECODER)

    def figure(c: object, fmt: str) -> float:
        return plan._figure(c, dequant_path(fmt))  # type: ignore[arg-type]

    assert figure(chip, "fp8_e4m3_b256") == pytest.approx(_static("gate_up", "pairs"), rel=1e-12)
    ratio = figure(base, "mxfp4") / _static("down", WORDS32_DECODER)
    assert 1.0 < ratio < 2.0  # the stalls a static schedule leaves out
    assert figure(chip, "mxfp4") == pytest.approx(_static("down", "fold") * ratio, rel=1e-12)
    with pytest.raises(KeyError):
        plan.static_figure("down", "no-such-decoder")


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def _build(row: dict) -> tuple[int, int]:
    return tuple(row.get("panel_unroll") or (1, 1))  # type: ignore[return-value]


def _first_errors(derived: bool) -> dict[tuple[int, int], list[float]]:
    """Per kernel build, |first prediction recorded before the run / measured - 1| of each run,
    the simulator's (``derived`` False) or the derived figure's; every run has one of each kind
    its build was predicted with, recorded before it ran."""
    kernel = [r for r in _rows("tpu-v5e-kernel.jsonl") if r.get("decoder") in plan.PART_DECODERS]
    predictions = [p for p in _rows("tpu-v5e-predictions.jsonl") if not p.get("kernel_variant")
                   and p.get("expert_cap") is None and p["label"].startswith("derived") == derived]
    errors: dict[tuple[int, int], list[float]] = {}
    for run in kernel:
        ran = _when(run["provenance"].split("date=")[1].split()[0])
        match = [p for p in predictions if p["decoder"] == run["decoder"] and p["batch"] == run["batch"]
                 and _build(p) == _build(run) and Path(p["schedule"]).stem in {run["schedule"], _stem(run)}]
        if derived and not match:
            continue  # the one-panel builds and the unrolled kernel's runs from set v5e-ab on were
            # predicted by the simulator alone
        assert match, f"{run['schedule']} b{run['batch']} ({run['decoder']}, {_build(run)}) ran without a prediction"
        first = min(match, key=lambda p: _when(p["date"]))
        assert _when(first["date"]) < ran, f"{run['schedule']} b{run['batch']}: predicted after it ran"
        errors.setdefault(_build(run), []).append(abs(first["predicted_ms"] / run["ms_per_step_median"] - 1))
    return errors


def test_every_prediction_was_on_record_before_its_run_and_holds() -> None:
    simulated = _first_errors(derived=False)
    plain = simulated[(1, 1)]  # the kernel with one panel an iteration: the simulator predicted it
    assert len(plain) >= 20
    assert sum(plain) / len(plain) <= DOCUMENTED_MAPE + MARGIN, plain
    # the unrolled kernel (sets v5e-y, v5e-z): the simulator did not price the unroll then
    # (11-36 % slow, docs/megakernel-on-tpu.md); the figure derived from set v5e-x's variants did
    unrolled = _first_errors(derived=True)[(4, 2)]
    assert len(unrolled) >= 11 and len(simulated[(4, 2)]) >= len(unrolled)
    assert sum(unrolled) / len(unrolled) <= DOCUMENTED_DERIVED_MAPE + MARGIN, unrolled
    assert sum(e <= 0.05 for e in unrolled) >= 10


def test_the_refit_simulator_predicted_the_unrolled_kernel_before_it_ran() -> None:
    """Set v5e-ab on: the simulator's figure, refit on the build's own capped runs (label
    "refit"), recorded before each run of a point the unrolled kernel had not run."""
    kernel = [r for r in _rows("tpu-v5e-kernel.jsonl") if r.get("decoder") in plan.PART_DECODERS
              and _build(r) == (4, 2)]
    refit = [p for p in _rows("tpu-v5e-predictions.jsonl") if "refit" in p["label"] and not p.get("kernel_variant")
             and p.get("expert_cap") is None]
    errors = []
    for run in kernel:
        ran = _when(run["provenance"].split("date=")[1].split()[0])
        match = [p for p in refit if p["batch"] == run["batch"] and _build(p) == (4, 2)
                 and Path(p["schedule"]).stem in {run["schedule"], _stem(run)} and _when(p["date"]) < ran]
        if match:
            errors.append(abs(min(match, key=lambda p: _when(p["date"]))["predicted_ms"] / run["ms_per_step_median"] - 1))
    assert len(errors) >= 8
    assert sum(errors) / len(errors) <= DOCUMENTED_REFIT_MAPE + MARGIN, errors
    assert sum(e <= 0.05 for e in errors) >= 6


@functools.cache
def _schedule_files() -> dict:
    from calibration.sources.tpu_chip_records import schedules_by_hash

    return schedules_by_hash()


def _stem(run: dict) -> str:
    path = _schedule_files().get(run["schedule_hash"])
    return path.stem if path is not None else run["schedule"]


def test_the_decoders_are_priced_at_the_rows_of_the_batch() -> None:
    """The static figure a batch takes is the record compiled for at least its rows: batch 1 the
    one-row record, 2-8 the 8-row one, 16 the 16-row one (two sublane tiles: more VPU work)."""
    assert [plan.static_rows(b, "gate_up", "pairs") for b in (1, 2, 8, 16, 32)] == [1, 8, 8, 16, 16]
    at8, at16 = (plan.static_figure("gate_up", "pairs", rows=r)[0] for r in (8, 16))
    assert at16 > at8 * 1.05


# planned_chip pays way (b)'s fixed-cost fit through the engine: 23 s in the fast subset, where no
# test before it made that fit; under 1 s in the default run, after the slow test above made it
@pytest.mark.slow
def test_the_planned_chip_at_batch_16_takes_the_16_row_figure() -> None:
    at16 = plan.static_figure("gate_up", "pairs", rows=16)[0]
    chip16 = plan.planned_chip(KERNEL_DECODER, 2, batch=16)
    assert plan._figure(chip16, dequant_path("fp8_e4m3_b256")) == pytest.approx(at16)


def test_every_point_predicted_since_the_per_layer_rule_held_within_5_percent() -> None:
    """Issue 45's record (2026-12-07): since the per-layer cost is paid through the layer
    (``each_op``, committed with set v5e-ao's predictions), every point of the kernel as it is
    (panel loops 8/2, vector expert list) predicted before its run came within 5 % of the chip:
    sets v5e-ao, v5e-ap, v5e-aq and v5e-ar, 13 points, none among those the rule was chosen on
    (the decodes only: set v5e-as's capped runs are another question, the first principles')."""
    kernel = [r for r in _rows("tpu-v5e-kernel.jsonl") if r.get("expert_list") == "vector" and _build(r) == (8, 2)
              and r.get("expert_cap") is None]
    predictions = [p for p in _rows("tpu-v5e-predictions.jsonl") if p.get("set") in {"v5e-ao", "v5e-ap", "v5e-aq", "v5e-ar"}
                   and p.get("expert_cap") is None]
    errors = {}
    for p in predictions:
        after = [r for r in kernel if r["batch"] == p["batch"] and _when(p["date"]) < _when(r["provenance"].split("date=")[1].split()[0])
                 and Path(p["schedule"]).stem in {r["schedule"], _stem(r)}]
        if after:  # the run that followed the prediction; a point predicted twice (v5e-ao's unreached b2) once
            first = min(after, key=lambda r: r["provenance"].split("date=")[1])
            errors.setdefault((Path(p["schedule"]).stem, p["batch"], first["provenance"]),
                              p["predicted_ms"] / first["ms_per_step_median"] - 1)
    assert len(errors) == 13, sorted(errors)
    assert max(map(abs, errors.values())) < 0.05, errors


def test_a_capped_case_is_predicted_on_the_trace_the_capped_kernel_runs(tmp_path: Path) -> None:
    """The fixed-cost probe keeps the first ``cap`` distinct experts of each layer's list
    (first appearance, round-major) and runs every row on them: the borrowed trace says so."""
    source = tmp_path / "trace.json"
    source.write_text(json.dumps({"layers": [[[5, 1, 7], [1, 9, 2]], [[3, 4, 0], [8, 3, 6]]]}))
    routing = plan.capped_trace(f"trace:{source}", 2)
    capped = json.loads(Path(routing.removeprefix("trace:")).read_text())["layers"]
    # round-major first appearance: layer 0 picks 5, 1 (round 0), then 1 again, 7, 9, 2; layer 1: 3, 8, ...
    assert capped == [[[5, 1], [5, 1]], [[3, 8], [3, 8]]]
    assert routing.endswith("trace-cap2-borrowed.json")


def test_a_case_the_kernel_refuses_is_not_predicted(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Set v5e-av planned `published-slots8` at 4 experts a layer and predicted it; the kernel
    refused it on the chip (8 expert slots need a cap of at least 8). The plan asks the kernel's
    own rule (``dma_plan.check_expert_cap``) first now."""
    from calibration.tpu_bench import device_run

    cases = [c for c in device_run.load_cases("v5e-av") if "slots8" in c.schedule]
    assert cases and cases[0].expert_cap == 4
    monkeypatch.setattr(device_run, "load_cases", lambda name: cases)
    assert plan.predict_set("v5e-av", chip_for=lambda b, s: (load_chip("tpu-v5e", calibrated=False), "catalog")) == []
    assert "the kernel refuses it (expert cap 4: at least the 8 expert slots); not predicted" in capsys.readouterr().err
