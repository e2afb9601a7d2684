"""The two direct fitting rules of calibration: a least-squares straight line and a median.

Most figures are fitted by the one solver (:func:`calibration.core.fit`). A few are set by
a rule on a handful of measurements instead, where a solve would add nothing: the probes'
per-layer slope and the MXU push per tile (a line through the points,
:mod:`calibration.sources.tpu_probes`), the fixed-cost probe's time per routed expert
(:mod:`calibration.sources.tpu_fixed_cost`), a plateau or a per-session slope taken over
repeats (a median). Those rules live here, once; ``tests/test_fitting_rules.py`` checks that
no other module of the tree fits a line (``polyfit``) or takes a median.

- :func:`fit_line` — ``y = slope x + intercept`` by least squares (numpy's ``polyfit``, degree
  1), optionally with the slope's standard error from its covariance;
- :func:`fit_through_origin` — ``y = Σ_j c_j x_j`` by least squares, no intercept (numpy's
  ``lstsq``): several costs at once from points that each mix them (the ``code_size`` probe's
  seconds per bundle and per loop iteration);
- :func:`median` — the middle value (the mean of the two middle ones for an even count), as
  :func:`statistics.median` gives it: robust to one outlying repeat or device session.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Line:
    """A straight line fitted by least squares; ``slope_standard_error`` when asked for."""

    slope: float
    intercept: float
    slope_standard_error: float | None = None


def fit_line(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *,
             standard_error: bool = False) -> Line:
    """The least-squares line through ``(x, y)`` (at least two distinct ``x``; with
    ``standard_error``, at least four points: numpy's covariance needs two degrees of freedom)."""
    if standard_error:
        coefficients, covariance = np.polyfit(x, y, 1, cov=True)
        return Line(float(coefficients[0]), float(coefficients[1]), float(np.sqrt(covariance[0, 0])))
    slope, intercept = (float(v) for v in np.polyfit(x, y, 1))
    return Line(slope, intercept)


def fit_through_origin(columns: Sequence[Sequence[float]], y: Sequence[float]) -> tuple[float, ...]:
    """The coefficients ``c`` of ``y ≈ Σ_j c_j columns[j]`` by least squares, no intercept
    (at least as many points as columns, the columns independent)."""
    design = np.column_stack([np.asarray(c, dtype=float) for c in columns])
    if design.shape[0] < design.shape[1] or np.linalg.matrix_rank(design) < design.shape[1]:
        raise ValueError(f"{design.shape[0]} points cannot fix {design.shape[1]} independent coefficients")
    coefficients, *_ = np.linalg.lstsq(design, np.asarray(y, dtype=float), rcond=None)
    return tuple(float(c) for c in coefficients)


def median(values: Iterable[Any]) -> Any:
    """The median of ``values`` (:func:`statistics.median`: the values' own type, a float for
    an even count of floats)."""
    return statistics.median(values)


__all__ = ["Line", "fit_line", "fit_through_origin", "median"]


SIMULATED_RESOLUTION_MS = 1e-3  # 1 µs: far below any measured spread; above the engine's float noise


def rank_agreement(measured_ms: Sequence[float], simulated_ms: Sequence[float],
                   resolution_ms: float = SIMULATED_RESOLUTION_MS) -> float:
    """Kendall's τ-b between measured and simulated step times, the simulated ones rounded to
    ``resolution_ms`` first: two schedules the simulator prices the same up to float noise
    (``published`` and ``published-after-routing`` at batch 8: 1e-11 ms apart) are a tie, not an
    order that flips with the last bit of an input (issue 46, 2026-12-07)."""
    from scipy.stats import kendalltau

    rounded = [round(s / resolution_ms) * resolution_ms for s in simulated_ms]
    return float(kendalltau(list(measured_ms), rounded).statistic)
