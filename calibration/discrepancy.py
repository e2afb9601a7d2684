"""Model error measured out of sample, and how often the intervals cover.

The parameter uncertainty of a fit (:mod:`calibration.covariance`) says how well the data
pins the fitted figures; it says nothing about what no figure can absorb (the model's own
structural error: the format contrasts of the TPU7x set miss by ≥ 0.19 ms whatever the
parameters). That error is measured here, by refitting without each measurement group.

Method (leave-one-group-out refits + split-conformal quantile)
--------------------------------------------------------------
1. **Groups** (:func:`groups_by`): the measurements are split along each *dimension* the data
   varies in (format, batch; on another set model or chip count): one fold per value.
2. **Refit** (:func:`leave_one_group_out`): for each fold, the fit is run again without the
   fold's points (the same problem, the same solver, started at the full fit), and the held
   points are predicted with that chip. The out-of-sample residual of a point is
   ``e = (measured − predicted) / predicted`` (relative to the *prediction*, so that an
   interval ``predicted · (1 ± t)`` covers the measurement exactly when ``|e| ≤ t``).
3. **Model error** (:func:`conformal_quantile`): the split-conformal quantile of the ``n``
   pooled ``|e|`` at level 90 %: the ``⌈(n + 1) · 0.9⌉``-th smallest (the largest when that
   rank exceeds ``n``: too few folds to promise 90 %; flagged). This is ``q``, the relative
   model error of an in-range prediction.
4. **Interval** (:mod:`tpusim.report.intervals` owns the arithmetic): a calibrated prediction
   ``c`` with re-simulated parameter spread ``sd`` gets ``c · (1 ± t)``, ``t = √((1.645 · sd /
   c)² + q²)`` (parameter and model error taken independent). A prediction outside the fit
   (another model, format, chip count or batch: :meth:`hwmodels.provenance.Calibration.warnings`)
   uses ``q_extrapolated = EXTRAPOLATION_FACTOR · q`` instead, and says why: the data holds
   no such point, so how much worse extrapolation is cannot be measured from it; the factor
   2 is a stated assumption, not a fit.
5. **Coverage** (:func:`coverage`): for each fold, the interval of its held points is built
   from the fold's own fit alone: the centre is the fold's prediction, the parameter part its
   covariance propagated by a central-difference Jacobian of the held points, and ``q`` the
   conformal quantile of the *other* folds of the same dimension (never the fold's own
   residuals). The empirical coverage is the fraction of held points inside, reported beside
   the nominal 90 % with the mean interval width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.measurements import Measurement

LEVEL = 0.9
Z90 = 1.6448536269514722
EXTRAPOLATION_FACTOR = 2.0
DIMENSIONS = ("format", "batch", "model", "chips")
METHOD = ("leave-one-group-out refits over {dims}; model error = split-conformal 90 % quantile of the "
          "out-of-sample relative residuals (|measured - predicted| / predicted); interval half-width = "
          "sqrt((1.645 sd_params / centre)^2 + q^2) x centre; outside the fit: q x "
          f"{EXTRAPOLATION_FACTOR:g} (assumed)")


def group_key(record: Measurement, dimension: str) -> str:
    return {"format": record.format or "", "batch": str(record.batch), "model": record.model.partition("@")[0],
            "chips": str(record.system.chips)}[dimension]


def groups_by(records: Sequence[Measurement], dimensions: Sequence[str] = DIMENSIONS) -> list[tuple[str, str]]:
    """``(dimension, value)`` per fold: every dimension along which the records take ≥ 2 values."""
    folds = []
    for dimension in dimensions:
        values = list(dict.fromkeys(group_key(r, dimension) for r in records))
        if len(values) >= 2:
            folds += [(dimension, value) for value in values]
    return folds


@dataclass(frozen=True)
class Fold:
    """One held-out group: its points, their out-of-sample predictions and parameter spread."""

    dimension: str
    value: str
    keys: list[str]
    measured_s: list[float]
    predicted_s: list[float]
    param_sd_s: list[float] | None = None  # 1σ of the prediction from the fold fit's covariance

    @property
    def residuals(self) -> np.ndarray:
        """``(measured − predicted) / predicted`` per held point."""
        predicted = np.asarray(self.predicted_s)
        return (np.asarray(self.measured_s) - predicted) / predicted


def conformal_quantile(magnitudes: Sequence[float], level: float = LEVEL) -> tuple[float, bool]:
    """The split-conformal quantile of ``|e|`` and whether it is exact (False: rank > n, the
    largest is used)."""
    values = np.sort(np.abs(np.asarray(magnitudes, dtype=float)))
    if not values.size:
        return float("nan"), False
    rank = math.ceil((values.size + 1) * level)
    return float(values[min(rank, values.size) - 1]), rank <= values.size


# A refit without some points: (kept records) -> a prediction function for any record, and
# optionally the 1σ of that prediction from the refit's covariance.
Refit = Callable[[list[Measurement]], tuple[Callable[[Measurement], float], Callable[[Measurement], float] | None]]


def leave_one_group_out(records: Sequence[Measurement], refit: Refit,
                        folds: Sequence[tuple[str, str]] | None = None) -> list[Fold]:
    """Step 2: refit without each fold's points and predict them."""
    out = []
    for dimension, value in folds if folds is not None else groups_by(records):
        held = [r for r in records if group_key(r, dimension) == value]
        kept = [r for r in records if group_key(r, dimension) != value]
        predict, spread = refit(kept)
        out.append(Fold(dimension, value, [r.key() for r in held], [r.step_s for r in held],
                        [predict(r) for r in held], None if spread is None else [spread(r) for r in held]))
    return out


@dataclass(frozen=True)
class ModelError:
    """The out-of-sample model error of a fit (steps 1–3), as the overlay stores it."""

    in_range_rel: float
    extrapolated_rel: float
    exact: bool  # False: too few out-of-sample points for a 90 % conformal quantile (the largest used)
    points: int
    folds: list[str]
    logo_mape: float
    method: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def model_error(folds: Sequence[Fold]) -> ModelError | None:
    """Step 3 over every fold's residuals (None without folds)."""
    if not folds:
        return None
    residuals = np.concatenate([f.residuals for f in folds])
    q, exact = conformal_quantile(residuals)
    dims = sorted({f.dimension for f in folds})
    return ModelError(in_range_rel=q, extrapolated_rel=EXTRAPOLATION_FACTOR * q, exact=exact,
                      points=int(residuals.size), folds=[f"{f.dimension}={f.value}" for f in folds],
                      logo_mape=float(np.mean(np.abs(residuals))), method=METHOD.format(dims=", ".join(dims)))


def half_width_rel(param_sd_rel: float, model_rel: float) -> float:
    """Step 4: ``√((1.645 · sd / c)² + q²)``."""
    return math.hypot(Z90 * param_sd_rel, model_rel)


@dataclass(frozen=True)
class Coverage:
    """Step 5: how often the interval built without a group holds its measured points."""

    nominal: float
    empirical: float
    points: int
    inside: int
    mean_width_rel: float  # mean (high − low) / centre
    mean_width_ms: float
    per_fold: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def coverage(folds: Sequence[Fold]) -> Coverage | None:
    """Step 5 (None without at least two folds in some dimension)."""
    per_fold, inside, total, widths, widths_ms = [], 0, 0, [], []
    for fold in folds:
        others = [f for f in folds if f.dimension == fold.dimension and f is not fold]
        if not others:
            continue
        q, _exact = conformal_quantile(np.concatenate([f.residuals for f in others]))
        sd = fold.param_sd_s or [0.0] * len(fold.keys)
        hits = 0
        for measured, predicted, sd_s in zip(fold.measured_s, fold.predicted_s, sd, strict=True):
            t = half_width_rel(sd_s / predicted, q)
            hits += abs(measured - predicted) <= t * predicted
            widths.append(2 * t)
            widths_ms.append(2 * t * predicted * 1e3)
        inside += hits
        total += len(fold.keys)
        per_fold.append({"fold": f"{fold.dimension}={fold.value}", "points": len(fold.keys), "inside": hits,
                         "model_error_rel": q,
                         "errors": [float(e) for e in fold.residuals]})
    if not total:
        return None
    return Coverage(nominal=LEVEL, empirical=inside / total, points=total, inside=inside,
                    mean_width_rel=float(np.mean(widths)), mean_width_ms=float(np.mean(widths_ms)),
                    per_fold=per_fold)
