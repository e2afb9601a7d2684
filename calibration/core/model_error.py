"""Model error measured out of sample, and how often the intervals cover.

The parameter uncertainty of a fit (:mod:`calibration.core.covariance`) says how well the
data pins the fitted figures; it says nothing about what no figure can absorb (the model's
own structural error: the format contrasts of the TPU7x set miss by ≥ 0.19 ms whatever the
parameters). That error is measured from the leave-one-group-out folds of
:mod:`calibration.core.holdout`:

1. **Model error** (:func:`model_error`): the split-conformal quantile of the ``n`` pooled
   out-of-sample ``|e|`` at level 90 %: the ``⌈(n + 1) · 0.9⌉``-th smallest (the largest when
   that rank exceeds ``n``: too few folds to promise 90 %; flagged ``exact: False``). This
   is ``q``, the relative model error of an in-range prediction.
2. **Interval**: the rule lives in :mod:`tpusim.report.intervals` (``half_width_rel``): a
   calibrated prediction ``c`` with re-simulated parameter spread ``sd`` gets
   ``c · (1 ± t)``, ``t = √((1.645 · sd / c)² + q²)``. A prediction outside the fit (another
   model, format, chip count or batch) uses ``q_extrapolated = EXTRAPOLATION_FACTOR · q``
   and says why: the data holds no such point, so how much worse extrapolation is cannot be
   measured from it; the factor 2 is a stated assumption, not a fit.
3. **Coverage** (:func:`coverage`): for each fold, the interval of its held points is built
   from the fold's own refit alone: the centre is the refit's prediction, the parameter part
   its covariance, and ``q`` the conformal quantile of the *other* folds of the same
   dimension (never the fold's own residuals). The empirical coverage is the fraction of
   held points inside, reported beside the nominal 90 % with the mean interval width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.core.holdout import Fold
from tpusim.report.intervals import LEVEL, half_width_rel

EXTRAPOLATION_FACTOR = 2.0
METHOD = ("leave-one-group-out refits of the shipped fit over {dims}; model error = split-conformal 90 % quantile "
          "of the out-of-sample relative residuals (|measured - predicted| / predicted); interval half-width = "
          "sqrt((1.645 sd_params / centre)^2 + q^2) x centre; outside the fit: q x "
          f"{EXTRAPOLATION_FACTOR:g} (assumed)")


def conformal_quantile(magnitudes: Sequence[float], level: float = LEVEL) -> tuple[float, bool]:
    """The split-conformal quantile of ``|e|`` and whether it is exact (False: rank > n, the
    largest is used)."""
    values = np.sort(np.abs(np.asarray(magnitudes, dtype=float)))
    if not values.size:
        return float("nan"), False
    rank = math.ceil((values.size + 1) * level)
    return float(values[min(rank, values.size) - 1]), rank <= values.size


@dataclass(frozen=True)
class ModelError:
    """The out-of-sample model error of a fit (step 1), as the overlay stores it."""

    in_range_rel: float
    extrapolated_rel: float
    exact: bool  # False: too few out-of-sample points for a 90 % conformal quantile (the largest used)
    points: int
    folds: list[str]
    logo_mape: float
    method: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def model_error(folds: Sequence[Fold], method: str = METHOD) -> ModelError | None:
    """Step 1 over every fold's residuals (None without folds); ``method`` is formatted with
    the fold dimensions (``{dims}``)."""
    if not folds:
        return None
    residuals = np.concatenate([f.residuals for f in folds])
    q, exact = conformal_quantile(residuals)
    dims = sorted({f.dimension for f in folds})
    return ModelError(in_range_rel=q, extrapolated_rel=EXTRAPOLATION_FACTOR * q, exact=exact,
                      points=int(residuals.size), folds=[f.name for f in folds],
                      logo_mape=float(np.mean(np.abs(residuals))), method=method.format(dims=", ".join(dims)))


@dataclass(frozen=True)
class Coverage:
    """Step 3: how often the interval built without a group holds its measured points."""

    nominal: float
    empirical: float
    points: int
    inside: int
    mean_width_rel: float  # mean (high − low) / centre
    mean_width_ms: float
    per_fold: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def coverage(folds: Sequence[Fold], *, ms_per_unit: float = 1e3) -> Coverage | None:
    """Step 3 (None without at least two folds in some dimension); ``ms_per_unit`` turns the
    measured unit (seconds for step times) into milliseconds for the mean width."""
    per_fold, inside, total, widths, widths_ms = [], 0, 0, [], []
    for fold in folds:
        others = [f for f in folds if f.dimension == fold.dimension and f is not fold]
        if not others:
            continue
        q, _exact = conformal_quantile(np.concatenate([f.residuals for f in others]))
        sd = fold.param_sd or [0.0] * len(fold.measured)
        hits = 0
        for measured, predicted, sd_s in zip(fold.measured, fold.predicted, sd, strict=True):
            t = half_width_rel(sd_s / predicted, q)
            hits += abs(measured - predicted) <= t * predicted
            widths.append(2 * t)
            widths_ms.append(2 * t * predicted * ms_per_unit)
        inside += hits
        total += len(fold.measured)
        per_fold.append({"fold": fold.name, "points": len(fold.measured), "inside": hits,
                         "model_error_rel": q, "errors": [float(e) for e in fold.residuals]})
    if not total:
        return None
    return Coverage(nominal=LEVEL, empirical=inside / total, points=total, inside=inside,
                    mean_width_rel=float(np.mean(widths)), mean_width_ms=float(np.mean(widths_ms)),
                    per_fold=per_fold)
