"""The 90 % prediction interval of a calibrated result, by re-simulating sampled chips.

A calibration (:mod:`calibration.intervals`) stores in the chip's overlay a few parameter
sets drawn from the fit's uncertainty (``CalibrationOverlay.samples``, 24 by default).
:func:`sample_chips` lays each set over the published chip; the caller re-runs the same
simulation on each (:func:`interval_fields`) and the interval is::

    low, high = center ∓ 1.645 · sd(re-simulated step times)      (two-sided 90 %)

``center`` is the calibrated prediction; ``tokens_per_s`` bounds follow from the step
bounds (``batch / step``). The cost is one extra simulation per sample (24 for a
calibrated ``simulate``; per row for ``compare`` and per design point for ``sweep``'s
top results). A chip without a calibrated overlay, or an overlay without samples, has no
interval: the fields say so (``interval: "none: ..."``) instead of inventing one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hwmodels.catalog import load_chip
from hwmodels.overlay import CalibratedValue, apply_overlay, has_overlay, load_overlay, overlay_path
from hwmodels.schema import Chip

Z90 = 1.6448536269514722  # two-sided 90 %: the 95th percentile of the standard normal
LEVEL = 0.9
MS_PER_S = 1e3
INTERVAL_KEYS = ("step_ms_low", "step_ms_high", "tokens_per_s_low", "tokens_per_s_high")


def interval(center: float, samples: Sequence[float], z: float = Z90) -> tuple[float, float]:
    """``center ∓ z · sd(samples)`` (sample sd, ``ddof=1``); needs at least 2 samples."""
    values = np.asarray(samples, dtype=float)
    if values.size < 2:
        raise ValueError("an interval needs at least 2 re-simulated samples")
    spread = z * float(values.std(ddof=1))
    return center - spread, center + spread


def sample_chips(chip: Chip) -> list[Chip]:
    """The chip once per stored parameter set (empty: uncalibrated, or no samples stored)."""
    if not chip.is_calibrated or not has_overlay(chip.name):
        return []
    overlay = load_overlay(overlay_path(chip.name))
    if len(overlay.samples) < 2:
        return []
    published = load_chip(chip.name, calibrated=False)
    chips = []
    for values in overlay.samples:
        parameters = {**overlay.parameters, **{p: CalibratedValue(value=v) for p, v in values.items()}}
        chips.append(apply_overlay(published, overlay.model_copy(update={"parameters": parameters}),
                                   origin="interval sample"))
    return chips


def step_fields(center_step_s: float, sample_steps_s: Sequence[float], batch: int) -> dict[str, Any]:
    """The interval keys for a step time and its re-simulated samples."""
    low_s, high_s = interval(center_step_s, sample_steps_s)
    low_s = max(low_s, 1e-12)
    return {
        "step_ms_low": low_s * MS_PER_S, "step_ms_high": high_s * MS_PER_S,
        "tokens_per_s_low": batch / high_s, "tokens_per_s_high": batch / low_s,
        "interval": f"{LEVEL:.0%} (calibrated: {len(sample_steps_s)} re-simulations over the fit's uncertainty)",
    }


def no_interval(reason: str = "uncalibrated figures") -> dict[str, Any]:
    return {**dict.fromkeys(INTERVAL_KEYS), "interval": f"none: {reason}"}


def interval_fields(chip: Chip, run: Callable[[Chip], float], center_step_s: float, batch: int,
                    chips: list[Chip] | None = None) -> dict[str, Any]:
    """Re-run ``run`` (chip -> step seconds) on every sampled chip; the interval keys, or
    :func:`no_interval` when ``chip`` has none. ``chips`` reuses an already loaded sample."""
    samples = sample_chips(chip) if chips is None else chips
    if not samples:
        return no_interval("uncalibrated figures" if not chip.is_calibrated else "the overlay stores no samples")
    return step_fields(center_step_s, [run(sample) for sample in samples], batch)


def format_interval(fields: dict[str, Any]) -> str:
    """Human text: ``90 % interval 4.12–4.58 ms`` or ``no interval (uncalibrated figures)``."""
    if fields.get("step_ms_low") is None:
        return f"no interval ({str(fields.get('interval', 'none')).removeprefix('none: ')})"
    return f"90 % interval {fields['step_ms_low']:.3f}–{fields['step_ms_high']:.3f} ms"
