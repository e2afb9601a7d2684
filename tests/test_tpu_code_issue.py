"""The ``code_size`` probe's two figures (calibration.sources.tpu_code_issue): the seconds a
static-schedule bundle takes and what a loop iteration costs beyond its bundles, recovered
from records written here with known values; and the committed records' figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.sources.tpu_code_issue import code_issue, straight_rates

S_PER_BUNDLE, LOOP_S, LAUNCH_S = 1 / 1.4e9, 30e-9, 580e-6
FORMS = {("straight", 64): (1_600, 1), ("looped", 64): (1_800, 9), ("straight", 512): (12_400, 1),
         ("looped", 512): (14_300, 65)}


def _records(tmp_path: Path, forms: dict[tuple[str, int], tuple[int, int]]) -> tuple[Path, Path]:
    probes, static = [], []
    for (form, rounds), (bundles, iterations) in forms.items():
        per = bundles * S_PER_BUNDLE + iterations * LOOP_S
        for repeats in (1, 64, 128):  # R = 1 disturbed as on the chip (a compile beside it): never read
            seconds = LAUNCH_S + repeats * per + (5e-3 if repeats == 1 else 0.0)
            probes.append({"kind": "probe", "probe": "code_size", "check": "ok", "date": "2026-12-07T09:45:00+00:00",
                           "params": {"form": form, "rounds": rounds, "repeats_in_kernel": repeats},
                           "seconds_median": seconds})
        static.append({"kind": "static_schedule", "probe": "code_size", "chip": "tpu-v5e",
                       "params": {"form": form, "rounds": rounds}, "repetition_bundles": bundles,
                       "loop_iterations": iterations})
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in probes))
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in static))
    return tmp_path / "p.jsonl", tmp_path / "s.jsonl"


def test_the_two_figures_come_back_from_records_of_known_values(tmp_path: Path) -> None:
    issue = code_issue(*_records(tmp_path, FORMS))
    assert issue is not None
    assert issue.s_per_bundle == pytest.approx(S_PER_BUNDLE, rel=1e-9)
    assert issue.loop_iteration_s == pytest.approx(LOOP_S, rel=1e-6)
    assert {(f.form, f.rounds): f.iterations for f in issue.forms} == {k: v[1] for k, v in FORMS.items()}
    assert "1.400 G bundles/s" in issue.source and "30.0 ns" in issue.source and "measured on tpu-v5e" in issue.source
    # a straight form's rate holds its own loop edge: just under 1.4 G bundles/s
    assert all(1.35 < rate < 1.4 for rate in straight_rates(issue).values())


def test_one_form_alone_fixes_nothing(tmp_path: Path) -> None:
    only = {k: v for k, v in FORMS.items() if k[0] == "straight"}
    assert code_issue(*_records(tmp_path, only)) is None


def test_the_committed_records_issue_near_the_derived_clock_and_pay_for_loops() -> None:
    """On the chip (2026-12-07): straight-line code from 0.8k to 49k bundles issues at one rate
    within 5 % of the clock derived from the MXU's peak (no instruction-fetch stall), and a loop
    iteration costs tens of cycles beyond its bundles."""
    issue = code_issue()
    assert issue is not None and len(issue.forms) == 8
    assert 1.40e9 < issue.bundles_per_s < 1.55e9
    assert 10e-9 < issue.loop_iteration_s < 40e-9
    rates = straight_rates(issue)
    assert max(rates.values()) / min(rates.values()) < 1.1
