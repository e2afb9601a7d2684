"""Part-by-part calibration: component records, per-chip bounds, the identifiability rule,
and prediction intervals that cover the truth ~90 % of the time on a synthetic fit."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.core.parameters import (
    PARAMETERS,
    Bound,
    Parameter,
    chip_with,
    figure_value,
    parameter,
)
from calibration.core.samples import draw_samples
from calibration.sources.tpu_components import load_components, predict_isolated
from calibration.sources.tpu_stages import fit_stage, isolated_stage
from hwmodels.catalog import list_chips, load_chip
from hwmodels.schema import Chip
from tpusim.report.intervals import interval

V7 = load_chip("tpu-v7", calibrated=False)
LATENCY = "links.ici.latency_s"
STEP = "execution.per_step_overhead_s"


def test_components_load_with_ranges_as_sigma() -> None:
    records = load_components()
    parts = {r.part for r in records}
    assert parts == {"links", "hbm", "host", "slot_sweep", "breakdown"}
    phase = next(r for r in records if r.name.startswith("one latency-bound phase"))
    assert phase.value == pytest.approx(4.1e-6) and phase.sigma_rel == pytest.approx(0.6 / 4.1)
    ratio = next(r for r in records if r.part == "slot_sweep")
    assert ratio.value == pytest.approx(824 / 653)
    assert sum(not r.modelled for r in records) == 1  # the chip-hierarchical all-reduce


def test_links_part_pins_latencies_and_bandwidths_and_holds_issue_costs() -> None:
    chip, stage = isolated_stage("links", V7, V7, load_components())
    assert set(stage.held) == {"links.ici.message_issue_s", "links.sibling.message_issue_s"}
    for path in stage.fitted:
        assert stage.sigma[path] < 0.5 * stage.values[path]
    # the sibling copy times (2.6 µs at 256 KiB, 610 GB/s at 16 MiB) give ≈ 663 GB/s, ≈ 2.1 µs
    assert stage.values["links.sibling.bandwidth_bytes_per_s_per_direction"] == pytest.approx(663e9, rel=0.05)
    assert np.mean(np.abs(stage.errors("after"))) < np.mean(np.abs(stage.errors("before")))
    by_set = stage.to_json()["errors_by_measurement_set"]
    assert {name: row["points"] for name, row in by_set.items()} == {"collective_microbenchmarks": 5, "link_copies": 4}
    rate = next(r for r in load_components() if r.name.startswith("cross-chip copy to one peer"))
    assert stage.pins[rate.name] == ["links.ici.bandwidth_bytes_per_s_per_direction"]
    assert predict_isolated(chip, rate) == pytest.approx(45e9, rel=0.1)


@pytest.mark.parametrize("name", sorted(list_chips()))
def test_bounds_are_per_chip(name: str) -> None:
    """Every figure of the one table calibrated on this chip's kind has bounds that contain
    the chip's own published value."""
    chip = load_chip(name, calibrated=False)
    for spec in PARAMETERS:
        if chip.kind not in spec.bounds:
            continue
        try:
            value = figure_value(chip, spec.path)
        except KeyError:
            continue
        lower, upper = spec.bounds_for(chip)
        assert lower < upper, (name, spec.path)
        assert lower <= value <= upper, (name, spec.path, value, lower, upper)


def test_bounds_follow_the_chip_not_tpu_v7() -> None:
    sustained = parameter("hbm.sustained_bandwidth_bytes_per_s")
    v5e = load_chip("tpu-v5e", calibrated=False)
    gb200 = load_chip("gb200", calibrated=False)
    assert sustained.bounds_for(v5e)[1] <= v5e.hbm.peak_bandwidth_bytes_per_s.value
    gb200_start = gb200.hbm.sustained_bandwidth_bytes_per_s.value
    assert sustained.bounds_for(gb200)[1] >= gb200_start > sustained.bounds_for(V7)[1]  # not clipped to v7's


def _synthetic(xs: np.ndarray) -> callable:  # type: ignore[valid-type]
    def predict(chip: Chip) -> np.ndarray:
        return figure_value(chip, LATENCY) * xs + figure_value(chip, STEP)
    return predict


SPECS = tuple(Parameter(path, path, "s", {"tpu": Bound(0.01, 100.0, relative=True)}, "synthetic") for path in (LATENCY, STEP))


def test_a_parameter_the_data_cannot_see_is_held() -> None:
    """Only latency + step overhead is measured (x = 1 everywhere): one of them is held."""
    xs = np.ones(4)
    truth = chip_with(V7, {LATENCY: 3e-6, STEP: 60e-6})
    measured = _synthetic(xs)(truth)
    _chip, stage = fit_stage("synthetic", V7, V7, SPECS, ["a", "b", "c", "d"], measured, [0.02] * 4,
                             _synthetic(xs))
    assert len(stage.held) == 1 and len(stage.fitted) == 1
    assert "not seen by the data" in next(iter(stage.held.values()))


@pytest.mark.slow
def test_interval_covers_the_truth_about_90_percent() -> None:
    """Fit y = latency·x + overhead on noisy data (known σ), predict at a new x with the
    sampled parameter sets: the 90 % interval covers the noise-free truth ~90 % of the time."""
    xs = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    x_new = np.array([24.0])
    truth_values = {LATENCY: 3e-6, STEP: 60e-6}
    truth = chip_with(V7, truth_values)
    exact = _synthetic(xs)(truth)
    target = float(_synthetic(x_new)(truth)[0])
    sigma = 0.03
    covered, seeds = 0, 60
    for seed in range(seeds):
        noise = np.random.default_rng(seed).normal(0.0, sigma, size=xs.size)
        measured = exact * (1 + noise)
        chip, stage = fit_stage("synthetic", V7, V7, SPECS, [str(x) for x in xs], measured, [sigma] * xs.size,
                                _synthetic(xs))
        assert not stage.held
        sets = draw_samples([(stage.fitted, np.array([stage.values[p] for p in stage.fitted]), stage.covariance,
                              stage.bounds)], seed=seed)
        center = float(_synthetic(x_new)(chip)[0])
        samples = [float(_synthetic(x_new)(chip_with(V7, values))[0]) for values in sets]
        low, high = interval(center, samples)
        covered += low <= target <= high
    assert 0.78 <= covered / seeds <= 0.99
