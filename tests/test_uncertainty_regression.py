"""The calibration regression guard: held-out error and coverage on the committed data.

A change that makes the model worse on real measurements by more than :data:`MARGIN`
(absolute, in MAPE) fails; so does coverage below :data:`MIN_COVERAGE` for the nominal
90 %. Values as measured when pinned (docs/calibration-refactor.md gives the commands).

- **CI** (``slow``, part of the default run): the TPU7x published set calibrated part by part
  once (``published:tpu7x-musespark`` with ``published:tpu7x-components``), its in-sample
  errors, and leave-one-group-out *linearised* around the shipped fit
  (:func:`calibration.core.linearised_folds`: one Gauss–Newton step per fold, no refits) with
  its coverage; the K3 rows on B300, each format held out by a real refit of the shipped
  problem (two engine fits of one row).
- **heavy** (``pytest -m heavy``): the TPU7x held-out errors and coverage from real refits of
  the shipped end-to-end stage (7 folds, minutes of engine time each).

The host-CPU loop is not guarded here: its measurements are taken on the machine that runs
the test, so no committed figure can be its bar (``tests/test_calibration_cpu_loop.py``
checks that its fit improves on the priors).
"""

from __future__ import annotations

from typing import Any

import pytest

MARGIN = 0.01  # one percentage point of MAPE
MIN_COVERAGE = 0.8  # of held-out points inside their 90 % interval
TPU7X = "published:tpu7x-musespark"
PINNED = {  # MAPE (fractions) as measured when pinned (docs/calibration-refactor.md)
    "priors_only": 0.1544,  # catalog priors, nothing fitted
    "parts_only": 0.0921,  # the parts' fit, not fitted on the step times
    "fitted": 0.0563,  # in sample (6.3 % before issue 33: the hold rule's second round started where a
    # truncated first round stopped)
    "held_out_linearised": 0.0736,  # leave-one-group-out, one Gauss–Newton step per fold (CI)
    "held_out": 0.0768,  # real refits (heavy): as pinned before issue 33, when the refits started at the
    # full fit; not re-measured with the refits of the shipped procedure (hours on the shared machine)
}
PINNED_K3_HELD_OUT = 0.010  # mean |error| of the two formats, each held out (MXFP4 +2.0 %, NVFP4 +0.0 %)


def _calibrate(*, logo: bool) -> Any:
    from calibration.sources.loaders import load_measurements, usable_for
    from calibration.sources.predict import Predictor
    from calibration.sources.tpu_calibration import calibrate_by_parts
    from calibration.sources.tpu_components import load_components
    from hwmodels.catalog import load_chip

    published = load_chip("tpu-v7", calibrated=False)
    records = usable_for(load_measurements(TPU7X), published.name, published.kind)
    return calibrate_by_parts(published, records, load_components(), predictor=Predictor(), logo=logo,
                              with_coverage=logo, measurements=TPU7X)


@pytest.mark.slow
def test_published_tpu7x_errors_and_linearised_held_out_do_not_regress() -> None:
    from calibration.core import coverage, linearised_folds, model_error

    result = _calibrate(logo=False)
    errors = result.result().errors[TPU7X]
    folds = linearised_folds(result.e2e.solution)
    error, cover = model_error(folds), coverage(folds)
    assert error is not None and error.points == 24  # 3 format folds of 4 + 4 batch folds of 3
    assert cover is not None
    measured = {name: getattr(errors, name) for name in ("priors_only", "parts_only", "fitted")}
    measured["held_out_linearised"] = error.logo_mape
    worse = {name: f"{value:.4f} > {PINNED[name]:.4f} + {MARGIN}" for name, value in measured.items()
             if value > PINNED[name] + MARGIN}
    if cover.empirical < MIN_COVERAGE:
        worse["coverage"] = f"{cover.empirical:.3f} < {MIN_COVERAGE}"
    assert not worse, worse


@pytest.mark.slow
def test_b300_k3_held_out_error_does_not_regress() -> None:
    from calibration.core import leave_one_group_out
    from calibration.sources.k3_b300 import OPTIONS, k3_problem, load_b300_k3
    from hwmodels.catalog import load_chip

    plain = {r.extra["format"]: r.ms_per_step_median for r in load_b300_k3() if r.extra["speculative"] is None}
    folds = leave_one_group_out(k3_problem(load_chip("b300", calibrated=False), plain), OPTIONS)
    held_out = sum(abs(f.predicted[0] / f.measured[0] - 1.0) for f in folds) / len(folds)
    assert {f.value for f in folds} == {"mxfp4", "nvfp4"}
    assert held_out <= PINNED_K3_HELD_OUT + MARGIN, held_out


@pytest.mark.heavy
def test_published_tpu7x_held_out_errors_and_coverage_do_not_regress() -> None:
    result = _calibrate(logo=True).result()
    errors = result.errors[TPU7X]
    for name in ("priors_only", "parts_only", "fitted", "held_out"):
        assert getattr(errors, name) <= PINNED[name] + MARGIN, (name, getattr(errors, name), PINNED[name])
    assert result.coverage is not None
    assert result.coverage["empirical"] >= MIN_COVERAGE, result.coverage
    assert result.model_error is not None and result.model_error["points"] == 24
