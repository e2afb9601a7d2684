"""The frozen fit / held-out split of the GPU batch sweeps (calibration/data/gpu-batch-split.json,
issue 50): its rule reproduces its sweep lists, it partitions the sweeps, it is the one owner of
every point's role, fit and held-out never overlap, and the mechanisms found on held-out rows
are listed and can be switched off."""

from __future__ import annotations

import datetime

from calibration.sources import gpu_batch_data as data
from calibration.sources import gpu_batch_mechanisms as mechanisms
from calibration.sources import gpu_batch_sweeps as sweeps

FROZEN_ON = "2026-12-06"  # changing the split means changing this date and the file together


def test_the_split_is_dated_and_its_rule_reproduces_its_sweep_lists():
    split = sweeps.load_split()
    assert split["frozen_on"] == FROZEN_ON
    datetime.date.fromisoformat(split["frozen_on"])
    held = [s.key for s in sweeps.SWEEPS if data.held_out_by_rule(s, split["held_out_when"])]
    fit = [s.key for s in sweeps.SWEEPS if not data.held_out_by_rule(s, split["held_out_when"])]
    assert held == split["held_out_sweeps"] and fit == split["fit_sweeps"]


def test_the_sides_partition_the_sweeps_and_each_sees_both_stacks_or_types_it_claims():
    split = sweeps.load_split()
    fit, held = set(split["fit_sweeps"]), set(split["held_out_sweeps"])
    assert not fit & held and fit | held == {s.key for s in sweeps.SWEEPS}
    by_key = {s.key: s for s in sweeps.SWEEPS}
    assert {by_key[k].stack for k in fit} == {"vllm", "sglang"}  # the fit sees both stacks' figures
    assert {by_key[k].chip for k in fit} == {"b200"} and "gb200" in {by_key[k].chip for k in held}
    assert {data.family(by_key[k]) for k in held} - {data.family(by_key[k]) for k in fit}  # an unseen family


def test_roles_come_from_the_split_and_fit_and_held_out_never_share_a_sweep():
    split = sweeps.load_split()
    fit_sweeps = {p.sweep.key for p in sweeps.points() if p.role == "fit"}
    held_sweeps = {p.sweep.key for p in sweeps.points() if p.role == "held-out"}
    assert fit_sweeps == set(split["fit_sweeps"]) and held_sweeps == set(split["held_out_sweeps"])
    assert not fit_sweeps & held_sweeps
    result = sweeps.calibrate()
    judged = sweeps.judged_points()
    assert {judged[i].sweep.key for i in result.held_out.points} == held_sweeps


def test_the_mechanisms_found_on_held_out_rows_are_listed_and_each_moves_the_prediction():
    names = [m["name"] for m in sweeps.load_split()["mechanisms_found_on_held_out_rows"]]
    assert names == ["prefill host floor", "prefill combine by pairs"]
    labels = [m.label for m in mechanisms.MECHANISM_VARIANTS]
    assert len(set(labels)) == 4 and labels[0] == "both (shipped)"
    values = sweeps.fit()
    shipped = sweeps.predict_ms(values)
    for variant in mechanisms.MECHANISM_VARIANTS[1:]:
        other = sweeps.predict_ms(values, mechanisms=variant)
        assert any(abs(other[k] - shipped[k]) > 1e-3 for k in shipped), variant.label
    cached = mechanisms.without_pairs_prefill_s()
    assert set(cached) == {p.key for p in sweeps.points() if not p.sweep.disaggregated}


def test_the_level_is_predicted_without_the_anchor():
    """Each sweep's lowest point from priors: the published anchor does not enter its prediction."""
    rows = sweeps.level_rows()
    assert len(rows) == len(sweeps.SWEEPS)
    anchors = {p.sweep.key: p for p in sweeps.points() if p.role == "anchor"}
    for row in rows:
        point = anchors[row["sweep"]]
        assert row["predicted_ms"] == sweeps.model_s(point, sweeps.prior_values()) * sweeps.MS
        assert row["measured_ms"] == point.tpot_ms
