"""Prediction intervals: parameter sets drawn from a fit's uncertainty, kept in the overlay.

Method (covariance sampling, chosen over a bootstrap because a bootstrap refits the whole
calibration per resample — minutes of engine time each — while sampling costs nothing at
fit time):

1. Every stage of a calibration (:mod:`calibration.sources.tpu_stages`; the end-to-end fit) leaves its
   fitted values ``θ_s`` and their covariance ``C_s``. Stages are fitted on disjoint data,
   so the joint distribution is taken block-diagonal (the end-to-end stage's dependence on
   the parts' values is not propagated: its values are conditional on them).
2. :func:`draw_samples` draws :data:`SAMPLES` parameter sets from ``N(θ_s, C_s)`` per stage
   (:func:`calibration.core.covariance.correlated_draws`, the one sampler; ``C_s`` comes from
   :func:`calibration.core.covariance.fit_covariance`, the one covariance rule) with a fixed
   seed, clipped to each parameter's bounds, and the overlay stores them
   (``CalibrationOverlay.samples``).
3. A calibrated prediction re-simulates once per set (:mod:`tpusim.report.intervals`, which
   owns the interval arithmetic): the
   90 % interval is ``center ± 1.645 · sd`` of the re-simulated values around the calibrated
   prediction — the spread comes from re-simulating (correlations between parameters and
   the engine's non-linearity included), not from a formula assuming independence; the
   normal quantile is used because 24 draws pin a standard deviation far better than a
   5th/95th percentile.

The samples carry the parameter uncertainty only; the model's own error, measured out of
sample by leave-one-group-out refits (:mod:`calibration.core.model_error`), is stored beside them
(``CalibrationOverlay.model_error``) and :mod:`tpusim.report.intervals` adds it to the
samples' spread (in quadrature; the extrapolated term outside the fit).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calibration.core.covariance import correlated_draws

SAMPLES = 24
SEED = 20260930
METHOD = (f"{SAMPLES} parameter sets drawn from N(fitted values, fit covariance) per calibration stage "
          "(block-diagonal across stages, clipped to bounds, seed {seed}); interval = calibrated "
          "prediction ± 1.645 sd of the re-simulated predictions")


def draw_samples(stages: Sequence[tuple[list[str], np.ndarray, np.ndarray, dict[str, tuple[float, float]]]],
                 n: int = SAMPLES, seed: int = SEED) -> list[dict[str, float]]:
    """``n`` parameter sets; ``stages`` lists per stage ``(paths, values, covariance, bounds)``."""
    rng = np.random.default_rng(seed)
    sets: list[dict[str, float]] = [{} for _ in range(n)]
    for paths, values, cov, bounds in stages:
        if not paths:
            continue
        draws = correlated_draws(rng, values, cov, n)
        for k in range(n):
            for j, path in enumerate(paths):
                low, high = bounds.get(path, (-np.inf, np.inf))
                sets[k][path] = float(np.clip(draws[k, j], max(low, 0.0), high))
    return sets
