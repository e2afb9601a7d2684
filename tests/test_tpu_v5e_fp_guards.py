"""Guards of the first-principles chain that can fail (issue 46, item 3).

Every input the first-principles sensitivity table (``docs/tpu-v5e-measured.md``,
:mod:`calibration.reports.tpu_v5e_fp_sensitivity`) marks over 2 % is planted +10 % — in a
temporary copy of the probe records where the input is a record, in memory otherwise — and
``drift_check`` must fail; the committed chain passes both guards. The module's fixture builds
the build's programs once (~5 s); each plant is one engine sweep of its nine decodes.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from calibration.reports.tpu_v5e_first_principles import issue_figures
from calibration.reports.tpu_v5e_fp_sensitivity import (
    BEGIN,
    CLOCK,
    END,
    BuildPredictor,
    chips,
    committed_residuals,
    held,
)
from calibration.reports.tpu_v5e_guards import (
    GOAL_MAPE,
    GOAL_MAX,
    Guard,
    drift_check,
    goal_check,
    planted_stream_probes,
)
from calibration.reports.tpu_v5e_sensitivity import kept_block
from calibration.sources.tpu_chip_records import ChipRecord
from calibration.sources.tpu_probes import SUSTAINED, dequant_path, probe_chip
from hwmodels.catalog import load_chip
from megakernel.quant import WORDS32_DECODER

DOC = Path(__file__).resolve().parents[1] / "docs" / "tpu-v5e-measured.md"
MXFP4 = dequant_path("mxfp4")
PLANTED = {SUSTAINED, CLOCK, MXFP4}  # every input the docs' table must mark over 2 %


@pytest.fixture(scope="module")
def predictor() -> BuildPredictor:
    return BuildPredictor()


@pytest.fixture(scope="module")
def committed():  # type: ignore[no-untyped-def]
    """The committed chain's first-principles chips (built once a batch, shared by the tests)."""
    return chips()


def _failed(predictor: BuildPredictor, chip) -> list[Guard]:  # type: ignore[no-untyped-def]
    predicted = predictor.predict(chip)
    return [g for g in drift_check(predictor.records, predicted, committed_residuals()) if not g.ok]


@pytest.mark.slow  # builds the decodes' programs and simulates them (~10 s)
def test_the_committed_chain_passes_the_drift_guard_and_reports_its_goals(predictor: BuildPredictor,
                                                                         committed) -> None:  # type: ignore[no-untyped-def]
    predicted = predictor.predict(committed)
    drift = drift_check(predictor.records, predicted, committed_residuals())
    assert len(drift) == len(predictor.records) >= 16 and all(g.ok for g in drift), [g.line() for g in drift]
    goals = goal_check(predictor.records, predicted)
    whats = [g.what for g in goals]
    assert whats[:2] == ["MAPE", "largest error"] and {"Kendall tau b1", "Kendall tau b8"} <= set(whats[2:])
    # the goals' verdicts are the committed residuals' (not asserted met: since the per-layer cost
    # is paid through the layer, 2026-12-07, the 16 decodes miss MAPE 5 % / max 10 %; the docs say so)
    errors = np.abs(np.array(list(committed_residuals().values())))
    assert goals[0].ok == (errors.mean() <= GOAL_MAPE) and goals[1].ok == (errors.max() <= GOAL_MAX)
    assert goals[0].error == pytest.approx(max(errors.mean() - GOAL_MAPE, 0.0), abs=0.02)


@pytest.mark.slow
def test_dma_stream_records_planted_10_percent_fast_fail_the_drift_guard(
        tmp_path: Path, predictor: BuildPredictor) -> None:
    probes = probe_chip(load_chip("tpu-v5e", calibrated=False), planted_stream_probes(tmp_path, 1.1),
                        decoder=WORDS32_DECODER)
    failed = _failed(predictor, chips(probes))
    # the copy-bound decodes move by about -8 to -9 %; the one with the most exposed compute less
    assert len(failed) >= 8 and all(g.error < -0.02 for g in failed), [g.line() for g in failed]


@pytest.mark.heavy  # the same input planted where it is read from, the probe records, runs by default (above)
def test_the_bandwidth_held_10_percent_high_fails_the_drift_guard(predictor: BuildPredictor) -> None:
    failed = _failed(predictor, held(chips(), SUSTAINED, 1.1))
    assert len(failed) >= 8, [g.line() for g in failed]


@pytest.mark.slow
def test_every_bundle_10_percent_longer_fails_the_drift_guard(predictor: BuildPredictor) -> None:
    failed = _failed(predictor, chips(clock_hz=issue_figures()[0] / 1.1))
    # the schedules whose compute the copies hide least (the docs' table: up to +5.7 %) among them
    names = {g.what.split(" (")[0] for g in failed}
    assert {"layer-double-buffer b1", "published-no-lookahead b1"} <= names, [g.line() for g in failed]
    assert all(g.error > 0.02 for g in failed)


@pytest.mark.slow
def test_the_mxfp4_decoder_10_percent_slower_fails_the_drift_guard(predictor: BuildPredictor,
                                                                   committed) -> None:  # type: ignore[no-untyped-def]
    """Over 2 % since the per-layer cost is paid through the layer (2026-12-07): the down
    projections' decode shows where the copies do not hide it (the docs' table: +3.1 / +3.1 % at
    batch 1, +2.8 % on `published-no-lookahead` b4; since each schedule's own kernel is read, the
    ring kernels' longer layer code leaves less to hide it under: +2.4 % at b1, +2.3 % at b16)."""
    failed = _failed(predictor, held(committed, MXFP4, 1.1))
    assert [g.what.split(" (")[0] for g in failed] == [
        "k3-ring b1", "k3-ring-banks6 b1", "k3-ring-during-selection b1", "k3-ring-kv128 b1", "layer-double-buffer b1",
        "published-no-lookahead b1", "published-no-lookahead b4", "k3-ring b16"], [g.line() for g in failed]
    assert all(g.error > 0.02 for g in failed)


def _record(schedule: str, batch: int, ms: float) -> ChipRecord:
    return ChipRecord(model="kimi-k3", shard_of="k3-tp32", schedule=schedule, schedule_path="x.json", batch=batch,
                      context=1024, routing="trace:x", ms_median=ms, ms_spread=0.0, runs=1)


def test_drift_check_on_hand_worked_numbers() -> None:
    records = [_record("a", 1, 100.0), _record("b", 1, 50.0), _record("c", 8, 10.0)]
    committed = {("a", 1): -0.05, ("b", 1): 0.0}
    # a: -6.5 % against -5 % committed (drift -1.5 points, ok); b: +3 % against 0 (fails); c: no residual (fails)
    guards = drift_check(records, [93.5, 51.5, 10.0], committed)
    assert [g.ok for g in guards] == [True, False, False]
    assert guards[0].error == pytest.approx(-0.015) and guards[1].error == pytest.approx(0.03)


def test_goal_check_on_hand_worked_numbers() -> None:
    records = [_record(s, 1, ms) for s, ms in (("a", 10.0), ("b", 20.0), ("c", 30.0))]
    # errors +12 %, -1 %, 0: MAPE 4.33 % (met), largest 12 % (2 points over), order kept (tau 1)
    guards = goal_check(records, [11.2, 19.8, 30.0])
    assert [g.ok for g in guards] == [True, False, True]
    assert guards[1].error == pytest.approx(0.02)
    # a and b swapped in order: one discordant pair of three, tau 1/3, 0.47 under 0.8
    swapped = goal_check(records, [25.0, 19.8, 30.0])
    assert swapped[2].error == pytest.approx(0.8 - 1 / 3) and not swapped[2].ok


def test_the_committed_residuals_are_of_the_committed_decodes(predictor: BuildPredictor) -> None:
    """A decode re-measured or added must be met by residuals written again (``--write``). The
    records are the module fixture's (the build's programs made once for the file's tests)."""
    records = predictor.records
    committed = committed_residuals()
    assert set(committed) == {(r.schedule, r.batch) for r in records}


def test_the_docs_table_marks_over_2_percent_exactly_the_planted_inputs() -> None:
    block = kept_block(DOC.read_text(), BEGIN, END)
    assert block is not None, f"{DOC.name} has no first-principles sensitivity table"
    over = {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|.*\| yes \|[^|]*\|$", block, re.M)}
    assert over == PLANTED
