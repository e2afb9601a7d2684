"""Model error out of sample and the one interval rule (calibration.core.model_error,
tpusim.report.intervals): conformal ranks, coverage folds, extrapolated rows."""

from __future__ import annotations

import math

import pytest

from calibration.core.model_error import (
    EXTRAPOLATION_FACTOR,
    Fold,
    conformal_quantile,
    coverage,
    model_error,
)
from hwmodels.overlay import ModelErrorTerm
from tpusim.report.intervals import Z90, interval, no_interval, step_fields


def test_conformal_rank_and_the_too_few_flag() -> None:
    # 19 residuals: rank ceil(20 * 0.9) = 18 -> the 18th smallest
    values = [i / 100 for i in range(1, 20)]
    assert conformal_quantile(values) == (pytest.approx(0.18), True)
    # 4 residuals: rank 5 > 4 -> the largest, flagged
    assert conformal_quantile([0.01, -0.05, 0.02, 0.03]) == (pytest.approx(0.05), False)


def _fold(dimension: str, value: str, measured: list[float], predicted: list[float]) -> Fold:
    return Fold(dimension, value, [f"{value}{i}" for i in range(len(measured))], measured, predicted,
                [0.0] * len(measured))


def test_coverage_uses_only_the_other_folds_of_the_same_dimension() -> None:
    # residuals (m - p) / p: fold a: +10 %, fold b: +2 %, fold c: +2 %
    folds = [_fold("format", "a", [1.1], [1.0]), _fold("format", "b", [1.02], [1.0]),
             _fold("format", "c", [1.02], [1.0])]
    result = coverage(folds)
    assert result is not None and result.points == 3
    # a's interval comes from b and c (q = 2 %): it misses a's +10 %; b and c are covered
    assert result.inside == 2 and result.empirical == pytest.approx(2 / 3)
    assert result.per_fold[0]["model_error_rel"] == pytest.approx(0.02)
    error = model_error(folds)
    assert error is not None and error.in_range_rel == pytest.approx(0.10)
    assert error.extrapolated_rel == pytest.approx(EXTRAPOLATION_FACTOR * 0.10)


def test_interval_adds_model_error_in_quadrature_and_widens_outside_the_fit() -> None:
    term = ModelErrorTerm(in_range_rel=0.03, extrapolated_rel=0.06, method="test", points=12)
    samples = [0.99e-3, 1.0e-3, 1.01e-3]
    sd_rel = 0.01e-3 / 1e-3  # sample sd of the three (ddof=1) is 0.01 ms
    inside = step_fields(1e-3, samples, 1, term)
    t = math.hypot(Z90 * sd_rel, 0.03)
    assert inside["step_ms_low"] == pytest.approx(1 - t) and inside["step_ms_high"] == pytest.approx(1 + t)
    assert inside["interval_includes"] == {"parameters": True, "model_error": True, "extrapolated": False}
    outside = step_fields(1e-3, samples, 1, term, ["kimi-k3 was not among the fitted models (muse-spark)"])
    assert outside["step_ms_high"] - outside["step_ms_low"] > inside["step_ms_high"] - inside["step_ms_low"]
    assert "extrapolated model error ±6.0 %" in outside["interval"] and "kimi-k3" in outside["interval"]
    # model error alone (a fit that states no parameter uncertainty, e.g. the GPU stack)
    alone = step_fields(2e-3, [], 4, term)
    assert alone["step_ms_low"] == pytest.approx(2 * 0.97) and alone["tokens_per_s_high"] == pytest.approx(4 / 1.94e-3)
    assert "no parameter uncertainty" in alone["interval"]
    with pytest.raises(ValueError):
        interval(1.0, [1.0])
    assert no_interval()["tokens_per_s_low"] is None
