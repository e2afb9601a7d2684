"""Calibration part by part: each part of the chip fitted on measurements of that part.

The default TPU procedure (:func:`calibration.sources.tpu_calibration.calibrate_by_parts`), in order, each stage starting from
the chip the previous stages produced:

1. **links** — link latencies, per-copy issue costs and bandwidths on the collective
   microbenchmarks and link copies (priced on idle links, no engine run);
2. **hbm** — the sustained HBM rate on the achieved rate of the dense DMA ring;
3. **host** — the per-step fixed cost on the published host figure;
4. **slot_sweep** — the DMA engine's sharing among outstanding copies
   (``dma.concurrency_penalty_per_dma``: the aggregate-rate loss per address stream past
   ``dma.efficient_in_flight``, :class:`hwmodels.schema.DmaSpec`) on the 8-vs-4
   expert-slot ratio (two engine runs);
5. **breakdown** — the per-layer overhead on the Muse per-layer total (one engine run);
6. **end to end** — the step times predicted with the parts' chip (*without* fitting on
   them: the honest test of the parts), then the remaining figures (MXU weight push per
   dtype, per-layer overhead) fitted on them (:func:`calibration.sources.step_times.fit_chip`).

Each stage (:func:`fit_stage`) minimises ``Σ ((predicted - measured) / (σ_rel · measured))²``
with the one solver (:func:`calibration.core.fit`) over its parameters (bounds from
:mod:`calibration.core.parameters`), scaled to their start values; the
covariance is ``(JᵀJ)⁺ · max(1, s²)`` from a central-difference Jacobian (2 % steps) with
``s² = Σ r² / (n - p)`` (the stated measurement σ, inflated when the residuals say the
model does worse than that): the ``stated_sigma`` case of the one rule in
:mod:`calibration.core.covariance`. **Identifiability rule**: a parameter whose 1σ is not below
half its value (or that stops at a bound) is *unidentifiable* on this data: it is held at
its start value (the published one, or the previous stage's) and the stage is fitted again
without it (:func:`calibration.core.fit`, ``hold_weak``), until every fitted parameter is pinned. When several are weak, the one held
first is the one the data says least about, except that a per-copy issue cost is held
before a latency (``hold_rank``): the microbenchmarks always issue 7 ICI copies per phase,
so only ``7 × issue + latency`` is seen, and the latency is the figure the engine's
stage-free pricing needs most. Which parameters each measurement
constrains is reported from the same Jacobian: a measurement *pins* a parameter when the
elasticity ``|∂ ln predicted / ∂ ln θ|`` is at least 0.05.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.core import Parameter, Problem, SolverOptions, fit, parameters
from calibration.core.covariance import JACOBIAN_STEP
from calibration.core.parameters import chip_with, figure_value
from calibration.sources.tpu_components import ComponentRecord, predict_isolated
from hwmodels.schema import Chip

PARTS_ORDER = ("links", "hbm", "host", "slot_sweep", "breakdown")
PIN_ELASTICITY = 0.05

PART_PARAMETERS: dict[str, tuple[Parameter, ...]] = {  # bounds and why: calibration.core.parameters
    "links": parameters("links.ici.latency_s", "links.ici.message_issue_s", "links.ici.bandwidth_bytes_per_s_per_direction",
                        "links.sibling.latency_s", "links.sibling.message_issue_s",
                        "links.sibling.bandwidth_bytes_per_s_per_direction"),
    "hbm": parameters("hbm.sustained_bandwidth_bytes_per_s"),
    "host": parameters("execution.per_step_overhead_s"),
    "slot_sweep": parameters("dma.concurrency_penalty_per_dma"),
    "breakdown": parameters("execution.per_layer_overhead_s"),
}


@dataclass
class StageFit:
    """One stage's result: values, 1σ, what was held, per-record errors and pins."""

    name: str
    paths: list[str]
    values: dict[str, float]
    sigma: dict[str, float]
    covariance: np.ndarray | None  # over ``fitted`` (in θ units)
    fitted: list[str]
    held: dict[str, str]  # path -> why it is held
    records: list[str]
    measured: list[float]
    predicted_before: list[float]
    predicted_after: list[float]
    pins: dict[str, list[str]]  # record -> parameters it pins
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    sets: list[str] = field(default_factory=list)  # per record: the measurement set it belongs to

    def errors(self, which: str) -> np.ndarray:
        predicted = np.array(self.predicted_before if which == "before" else self.predicted_after)
        measured = np.array(self.measured)
        return (predicted - measured) / measured

    def to_json(self) -> dict[str, Any]:
        before, after = self.errors("before"), self.errors("after")
        sets = self.sets or [self.name] * len(self.records)
        by_set = {}
        for name in dict.fromkeys(sets):
            chosen = [i for i, s in enumerate(sets) if s == name]
            by_set[name] = {"points": len(chosen), "mape_before": float(np.mean(np.abs(before[chosen]))),
                            "mape_after": float(np.mean(np.abs(after[chosen])))}
        return {
            "errors_by_measurement_set": by_set,
            "parameters": {p: {"value": self.values[p], "uncertainty": self.sigma.get(p),
                               "status": "fitted" if p in self.fitted else f"held: {self.held.get(p, '')}"}
                           for p in self.paths},
            "mape_before": float(np.mean(np.abs(before))) if before.size else None,
            "mape_after": float(np.mean(np.abs(after))) if after.size else None,
            "records": [{"name": name, "measured": m, "predicted_before": b, "predicted_after": a,
                         "error_after": float(e), "pins": self.pins.get(name, [])}
                        for name, m, b, a, e in zip(self.records, self.measured, self.predicted_before,
                                                    self.predicted_after, after, strict=True)],
        }


def fit_stage(name: str, base: Chip, published: Chip, specs: Sequence[Parameter],
              names: Sequence[str], measured: Sequence[float], sigma_rel: Sequence[float],
              predict: Callable[[Chip], np.ndarray], *, max_nfev: int = 40) -> tuple[Chip, StageFit]:
    """Fit ``specs`` on ``base`` so that ``predict(chip)`` matches ``measured`` (see the
    module docstring); returns the chip with the pinned values laid over ``base``."""
    paths = [s.path for s in specs]
    start = {p: figure_value(base, p) for p in paths}
    bounds = {s.path: s.bounds_for(published) for s in specs}
    meas = np.asarray(measured, dtype=float)
    problem = Problem(name, base, published, tuple(specs),
                      lambda chip, points: np.asarray(predict(chip), dtype=float)[list(points)], meas,
                      sigma_rel=np.asarray(sigma_rel, dtype=float), groups={"record": tuple(names)})
    before = list(np.asarray(predict(base), dtype=float))
    solution = fit(problem, SolverOptions(max_nfev=max_nfev, xtol=1e-8, drop_at_bound=False, hold_weak=True))
    held = solution.held
    fitted = [p for p in paths if p not in held]
    values = {**start, **solution.value_map()}
    sigma = dict(zip(solution.problem.paths, solution.sigma.tolist(), strict=True))
    cov = solution.covariance_theta() if fitted else None
    chip = chip_with(base, {p: values[p] for p in fitted}) if fitted else base
    after = list(np.asarray(predict(chip), dtype=float))
    pins = _pins(base, chip, specs, names, predict, after, published)
    return chip, StageFit(name, paths, values, sigma, cov, fitted, held, list(names), list(meas),
                          before, after, pins, bounds)


def _pins(base: Chip, chip: Chip, specs: Sequence[Parameter], names: Sequence[str],
          predict: Callable[[Chip], np.ndarray], after: list[float], published: Chip) -> dict[str, list[str]]:
    """Per record, the parameters whose ±2 % change moves its prediction by ≥ 0.05 × 2 %."""
    center = np.asarray(after, dtype=float)
    pins: dict[str, list[str]] = {name: [] for name in names}
    for spec in specs:
        value = figure_value(chip, spec.path)
        if value <= 0:
            continue
        upper = spec.bounds_for(published)[1]
        bumped = min(value * (1 + JACOBIAN_STEP), max(upper, value))
        moved = np.asarray(predict(chip_with(chip, {spec.path: bumped})), dtype=float)
        elasticity = np.abs((moved - center) / np.where(center != 0, center, 1.0)) / (bumped / value - 1 or 1)
        for name, e in zip(names, elasticity, strict=True):
            if e >= PIN_ELASTICITY:
                pins[name].append(spec.path)
    return pins


def isolated_stage(name: str, base: Chip, published: Chip, records: Sequence[ComponentRecord]
                   ) -> tuple[Chip, StageFit]:
    """A stage whose records are priced without the engine (links, hbm, host)."""
    used = [r for r in records if r.part == name and r.modelled]

    def predict(chip: Chip) -> np.ndarray:
        return np.array([predict_isolated(chip, r) for r in used])

    chip, stage = fit_stage(name, base, published, PART_PARAMETERS[name], [r.name for r in used],
                            [r.value for r in used], [r.sigma_rel for r in used], predict)
    stage.sets = [r.measurement_set or r.part for r in used]
    return chip, stage
