"""The 90 % prediction interval of a calibrated result: parameter spread and model error.

The one place the interval arithmetic lives; ``simulate``, ``compare`` and ``sweep`` all
call it, for TPU and GPU rows alike. A calibration stores in the chip's overlay:

- ``samples``: parameter sets drawn from the fit's uncertainty (:mod:`calibration.core.samples`,
  24 by default); :func:`sample_chips` lays each over the published chip and the caller
  re-runs the same simulation on each;
- ``model_error``: the model's own error measured out of sample by leave-one-group-out
  refits (:mod:`calibration.core.model_error`): ``q`` inside the fit, ``q_extrapolated`` outside
  it (another model, format, chip count or batch than the fit saw).

The interval around the calibrated prediction ``c``::

    sd_rel = sd(re-simulated step times) / c                      (0 without samples)
    t      = √((1.645 · sd_rel)² + q²)                            (parameters ⊥ model error)
    low, high = c · (1 − t), c · (1 + t)                           (two-sided 90 %)

``q`` is the extrapolated term when the row lies outside the fit, and the ``interval`` text
says so and why. ``tokens_per_s`` bounds follow from the step bounds (``batch / step``). A
chip without a calibrated overlay, or whose overlay has neither samples nor a model error,
has no interval: the fields say so (``interval: "none: ..."``) instead of inventing one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hwmodels.catalog import load_chip
from hwmodels.overlay import (
    CalibratedValue,
    ModelErrorTerm,
    apply_overlay,
    has_overlay,
    load_overlay,
    overlay_path,
)
from hwmodels.schema import Chip

Z90 = 1.6448536269514722  # two-sided 90 %: the 95th percentile of the standard normal
LEVEL = 0.9
MS_PER_S = 1e3
INTERVAL_KEYS = ("step_ms_low", "step_ms_high", "tokens_per_s_low", "tokens_per_s_high")


def half_width_rel(param_sd_rel: float, model_rel: float, z: float = Z90) -> float:
    """The interval rule: ``t = √((z · sd / c)² + q²)`` (parameters ⊥ model error); the
    calibration's coverage check (:mod:`calibration.core.model_error`) reads it from here."""
    return math.hypot(z * param_sd_rel, model_rel)


def interval(center: float, samples: Sequence[float], z: float = Z90, model_rel: float = 0.0) -> tuple[float, float]:
    """``center · (1 ∓ t)``, ``t = √((z · sd(samples) / center)² + model_rel²)`` (sample sd,
    ``ddof=1``); needs at least 2 samples unless ``model_rel`` is given."""
    values = np.asarray(samples, dtype=float)
    if values.size < 2 and model_rel <= 0:
        raise ValueError("an interval needs at least 2 re-simulated samples or a model error")
    sd_rel = float(values.std(ddof=1)) / center if values.size >= 2 else 0.0
    t = half_width_rel(sd_rel, model_rel, z)
    return center * (1 - t), center * (1 + t)


@dataclass(frozen=True)
class Terms:
    """What a chip's overlay gives an interval: sampled chips and the model error."""

    chips: list[Chip]
    model_error: ModelErrorTerm | None

    def __bool__(self) -> bool:
        return bool(self.chips) or self.model_error is not None


def derived_overlay_chip(chip: Chip) -> str | None:
    """The chip whose calibrated overlay ``chip``'s execution figures were derived from
    (``execution.gpu.stack_figures_from``, applied by :func:`hwmodels.catalog.load_chip` when
    ``chip`` has no overlay of its own), or None."""
    gpu = chip.execution.gpu
    source = gpu.stack_figures_from if gpu is not None else None
    if chip.is_calibrated or not source or source == chip.name or not has_overlay(source):
        return None
    from tpusim.engine.gpu import derived_origin

    return source if derived_origin(chip) else None


def interval_terms(chip: Chip) -> Terms:
    """The sampled chips (empty: uncalibrated or no samples stored) and the model error. A GPU
    whose execution figures are derived from another chip's fit takes that fit's model error
    (no samples: the other chip's parameters are not this chip's)."""
    source = derived_overlay_chip(chip)
    if source is not None:
        return Terms([], load_overlay(overlay_path(source)).model_error)
    if not chip.is_calibrated or not has_overlay(chip.name):
        return Terms([], None)
    overlay = load_overlay(overlay_path(chip.name))
    chips = []
    if len(overlay.samples) >= 2:
        published = load_chip(chip.name, calibrated=False)
        for values in overlay.samples:
            parameters = {**overlay.parameters, **{p: CalibratedValue(value=v) for p, v in values.items()}}
            chips.append(apply_overlay(published, overlay.model_copy(update={"parameters": parameters}),
                                       origin="interval sample"))
    return Terms(chips, overlay.model_error)


def sample_chips(chip: Chip) -> list[Chip]:
    """The chip once per stored parameter set (empty: uncalibrated, or no samples stored)."""
    return interval_terms(chip).chips


def step_fields(center_step_s: float, sample_steps_s: Sequence[float], batch: int,
                model_error: ModelErrorTerm | None = None, outside: Sequence[str] = ()) -> dict[str, Any]:
    """The interval keys for a step time, its re-simulated samples and the model error;
    ``outside``: why the row lies outside the fit (the extrapolated model error applies)."""
    q = 0.0 if model_error is None else (model_error.extrapolated_rel if outside else model_error.in_range_rel)
    low_s, high_s = interval(center_step_s, sample_steps_s, model_rel=q)
    low_s = max(low_s, 1e-12)
    parts = []
    if len(sample_steps_s) >= 2:
        parts.append(f"{len(sample_steps_s)} re-simulations over the fit's parameter uncertainty")
    else:
        parts.append("no parameter uncertainty (the fit states none)")
    if model_error is None:
        parts.append("no model error (the overlay measured none)")
    elif outside:
        parts.append(f"extrapolated model error ±{100 * q:.1f} % ({'; '.join(outside)})")
    else:
        parts.append(f"model error ±{100 * q:.1f} % (out of sample, {model_error.points} residuals)")
    return {
        "step_ms_low": low_s * MS_PER_S, "step_ms_high": high_s * MS_PER_S,
        "tokens_per_s_low": batch / high_s, "tokens_per_s_high": batch / low_s,
        "interval": f"{LEVEL:.0%} (calibrated: " + "; ".join(parts) + ")",
        "interval_includes": {"parameters": len(sample_steps_s) >= 2, "model_error": model_error is not None,
                              "extrapolated": bool(outside)},
    }


def no_interval(reason: str = "uncalibrated figures") -> dict[str, Any]:
    return {**dict.fromkeys(INTERVAL_KEYS), "interval": f"none: {reason}"}


def outside_fit(chip: Chip, model_spec: str | None, chips: int | None, batch: int | None) -> list[str]:
    """Why a prediction lies outside ``chip``'s fit (empty: inside, or nothing to compare)."""
    if chip.calibration is None or model_spec is None or chips is None:
        return []
    return chip.calibration.warnings(model_spec, chips, batch)


def interval_fields(chip: Chip, run: Callable[[Chip], float], center_step_s: float, batch: int,
                    chips: list[Chip] | None = None, *, terms: Terms | None = None,
                    outside: Sequence[str] = ()) -> dict[str, Any]:
    """Re-run ``run`` (chip -> step seconds) on every sampled chip; the interval keys, or
    :func:`no_interval` when ``chip`` has neither samples nor a model error. ``terms``
    (or the older ``chips``) reuses already loaded terms; ``outside``: why the row
    extrapolates (:func:`outside_fit`)."""
    if terms is None:
        terms = interval_terms(chip) if chips is None else Terms(chips, interval_terms(chip).model_error)
    if not terms:
        return no_interval("uncalibrated figures" if not chip.is_calibrated and derived_overlay_chip(chip) is None
                           else "the overlay stores no samples and no model error")
    return step_fields(center_step_s, [run(sample) for sample in terms.chips], batch, terms.model_error, outside)


def format_interval(fields: dict[str, Any]) -> str:
    """Human text: ``90 % interval 4.12–4.58 ms`` or ``no interval (uncalibrated figures)``."""
    if fields.get("step_ms_low") is None:
        return f"no interval ({str(fields.get('interval', 'none')).removeprefix('none: ')})"
    return f"90 % interval {fields['step_ms_low']:.3f}–{fields['step_ms_high']:.3f} ms"
