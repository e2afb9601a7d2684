"""The part-by-part TPU calibration (:mod:`calibration.sources.tpu_stages` describes the stages).

:func:`calibrate_by_parts` runs the component stages, predicts the end-to-end points with
the parts' chip (the MAPE *before fitting on them*), fits the remaining figures on the
end-to-end points (holding any the data cannot pin), draws the parameter sets for
prediction intervals (:mod:`calibration.core.samples`), and measures the held-out error by
refitting that end-to-end stage exactly as it was fitted without each format and each batch
(:func:`calibration.sources.step_times.held_out_folds`: same problem on the parts' chip,
same options, same start, the hold rule run again). :class:`PartsResult` carries it all;
its :meth:`PartsResult.overlay` is the calibrated overlay with those sets.

Simulated parts (engine runs on the Muse points, ``schedule`` as each record names it —
``muse-published`` for the published set):

- ``slot_sweep``: the Muse int4+bf16 b1 point simulated with the routed-expert buffers at
  4 and 8; predicted value = ratio of the summed per-layer stream times (layers ≥ 0);
- ``breakdown``: the Muse nvfp4+int8 b1 point; ``layer_total`` = summed per-layer stream
  time / layers, ``collectives`` = the stream's collective waits / layers, ``fixed_total``
  = step − summed per-layer time (per-step cost, head, drain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calibration.core import (
    CalibrationResult,
    Coverage,
    Fold,
    ModelError,
    SetErrors,
    coverage,
    model_error,
    parameters,
)
from calibration.core.overlay_builder import build_overlay, fitted_figure
from calibration.core.parameters import figure_value
from calibration.core.samples import METHOD, SEED, draw_samples
from calibration.sources.fit_range import fit_coverage
from calibration.sources.measurements import Measurement
from calibration.sources.predict import Predictor
from calibration.sources.step_times import (
    FitResult,
    fit_chip,
    held_out_folds,
    mape,
    relative_errors,
)
from calibration.sources.tpu_components import ComponentRecord
from calibration.sources.tpu_stages import (
    PART_PARAMETERS,
    PARTS_ORDER,
    StageFit,
    fit_stage,
    isolated_stage,
)
from hwmodels.errors import InputError
from hwmodels.overlay import CalibrationOverlay
from hwmodels.schema import Chip
from tpusim.workload.registry.names import Family

E2E_PARAMETERS = parameters("compute.mxu.weight_push_s_per_tile", "compute.mxu.weight_push_s_per_tile_by_dtype.int8",
                            "execution.per_layer_overhead_s")


def _point(records: Sequence[Measurement], wanted: dict[str, Any]) -> Measurement:
    for record in records:
        if record.model == wanted["model"] and record.batch == wanted["batch"]:
            return record
    raise InputError(f"component data needs the end-to-end point {wanted['model']} b{wanted['batch']}, "
                     "which the measurements lack")


def _layers_s(result: Any) -> float:
    return sum(value for layer, value in result.layer_s.items() if layer >= 0)


def simulated_stage(name: str, base: Chip, published: Chip, records: Sequence[ComponentRecord],
                    points: Sequence[Measurement], predictor: Predictor) -> tuple[Chip, StageFit] | None:
    """The ``slot_sweep`` or ``breakdown`` stage (None when the data has no such record)."""
    used = [r for r in records if r.part == name]
    if not used:
        return None

    def run(chip: Chip, record: ComponentRecord, slots: int | None = None) -> Any:
        point = _point(points, record.measurement)
        schedule = predictor.schedule(chip, point)
        if slots is not None:
            family = schedule.families[Family.ROUTED_EXPERT].model_copy(update={"buffers": slots})
            schedule = schedule.model_copy(update={"families": {**schedule.families, Family.ROUTED_EXPERT: family}})
        return predictor.simulate(chip, point, schedule)

    def predict(chip: Chip) -> np.ndarray:
        values = []
        for record in used:  # the predictor keeps results: records of one point share a run
            if record.slots is not None:
                reference, compared = (run(chip, record, n) for n in record.slots)
                values.append(_layers_s(compared) / _layers_s(reference))
                continue
            result = run(chip, record)
            layers = sum(1 for layer in result.layer_s if layer >= 0)
            values.append({"layer_total": _layers_s(result) / layers,
                           "collectives": result.breakdown_s["collectives"] / layers,
                           "fixed_total": result.step_s - _layers_s(result)}[record.phase or ""])
        return np.array(values)

    return fit_stage(name, base, published, PART_PARAMETERS[name], [r.name for r in used],
                     [r.value for r in used], [r.sigma_rel for r in used], predict, max_nfev=12)


@dataclass
class PartsResult:
    """Everything the part-by-part calibration produced."""

    published: Chip
    stages: list[StageFit]
    parts_chip: Chip
    e2e: FitResult
    e2e_held: dict[str, str]
    samples: list[dict[str, float]] = field(default_factory=list)
    folds: list[Fold] = field(default_factory=list)  # leave-one-group-out refits of the end-to-end stage
    model_error: ModelError | None = None
    coverage: Coverage | None = None
    measurements: str = "end-to-end points"

    @property
    def chip(self) -> Chip:
        """The calibrated chip (the parts' chip when the end-to-end stage held everything)."""
        return self.parts_chip if self.e2e_fully_held else self.e2e.chip

    @property
    def e2e_fully_held(self) -> bool:
        return all(p.path in self.e2e_held for p in self.e2e.parameters)

    def fitted(self) -> dict[str, tuple[float, float | None, str]]:
        """path -> (value, 1σ, data) for every fitted parameter of every stage."""
        out: dict[str, tuple[float, float | None, str]] = {}
        for stage in self.stages:
            for path in stage.fitted:
                out[path] = (stage.values[path], stage.sigma.get(path), f"{stage.name} measurements")
        for p in self.e2e.parameters:
            if p.path not in self.e2e_held:
                out[p.path] = (p.value, p.uncertainty, p.fitted_on)
        return out

    def overlay(self) -> CalibrationOverlay:
        figures = {path: fitted_figure(value, sigma, data) for path, (value, sigma, data) in self.fitted().items()}
        return build_overlay(self.published.name, "part by part: components + " + self.e2e.fitted_on, figures,
                             samples=self.samples, coverage=fit_coverage(self.e2e.split.calibration),
                             interval_method=METHOD.format(seed=SEED), model_error=self.model_error)

    def result(self) -> CalibrationResult:
        """The one result type (:class:`calibration.core.result.CalibrationResult`)."""
        e2e = self.e2e.to_json()
        errors = {self.measurements: SetErrors(
            points=len(self.e2e.records), priors_only=self.e2e.extra.get("mape_published"),
            parts_only=e2e["mape_before"], fitted=e2e["mape_calibration"],
            held_out=None if self.model_error is None else self.model_error.logo_mape,
            priors_only_held_out=self.e2e.extra.get("mape_published_holdout"),
            parts_only_held_out=e2e["mape_before_holdout"], fitted_held_out=e2e["mape_holdout"])}
        for stage in self.stages:
            for name, entry in stage.to_json()["errors_by_measurement_set"].items():
                errors[name] = SetErrors(points=entry["points"], priors_only=entry["mape_before"], parts_only=None,
                                         fitted=entry["mape_after"], held_out=None)
        return CalibrationResult(
            procedure="part by part", chip=self.published.name, errors=errors,
            model_error=None if self.model_error is None else self.model_error.to_json(),
            coverage=None if self.coverage is None else self.coverage.to_json(), details=self.to_json())

    def to_json(self) -> dict[str, Any]:
        e2e = self.e2e.to_json()
        held = {path: why for stage in self.stages for path, why in stage.held.items()}
        held.update(self.e2e_held)
        return {
            "chip": self.published.name, "procedure": "part by part",
            "parts": {stage.name: stage.to_json() for stage in self.stages},
            "errors_by_measurement_set": {name: errors for stage in self.stages
                                          for name, errors in stage.to_json()["errors_by_measurement_set"].items()},
            "mape_e2e_published": self.e2e.extra.get("mape_published"),
            "mape_e2e_parts_only": e2e["mape_before"],
            "mape_e2e_parts_only_holdout": e2e["mape_before_holdout"],
            "mape_calibration": e2e["mape_calibration"], "mape_holdout": e2e["mape_holdout"],
            "max_error_holdout": e2e["max_error_holdout"],
            "holdout": e2e["holdout"],
            "parameters": {path: {"value": v, "uncertainty": s, "fitted_on": d}
                           for path, (v, s, d) in self.fitted().items()},
            "unidentifiable_held": held,
            "pins": {name: pins for stage in self.stages for name, pins in stage.pins.items()},
            "interval_samples": len(self.samples), "interval_method": METHOD.format(seed=SEED),
            "e2e_fit": {k: e2e[k] for k in ("parameters", "identifiability", "points", "engine_calls", "elapsed_s")},
            "contrasts": e2e["contrasts"],
            "leave_one_group_out": [{"fold": f.name, "points": [self.e2e.split.calibration[i].key() for i in f.points],
                                     "errors": [float(e) for e in f.residuals]} for f in self.folds],
        }


def run_stages(names: Sequence[str], published: Chip, points: Sequence[Measurement],
               components: Sequence[ComponentRecord], predictor: Predictor) -> tuple[Chip, list[Any]]:
    """(the chip after, the stage results) of the stages ``names`` in order, each starting on the
    chip the ones before it left: the simulated ones (``slot_sweep``, ``breakdown``) on the
    end-to-end ``points``, the others on their own component records (a stage with none is skipped)."""
    chip, stages = published, []
    for name in names:
        if name in ("slot_sweep", "breakdown"):
            done = simulated_stage(name, chip, published, components, points, predictor)
        elif any(r.part == name for r in components):
            done = isolated_stage(name, chip, published, components)
        else:
            done = None
        if done is not None:
            chip, stage = done
            stages.append(stage)
    return chip, stages


def calibrate_by_parts(published: Chip, points: Sequence[Measurement], components: Sequence[ComponentRecord], *,
                       holdout: str | None = None, predictor: Predictor | None = None,
                       max_nfev: int = 12, logo: bool = True, with_coverage: bool = False,
                       measurements: str = "end-to-end points",
                       logo_dimensions: Sequence[str] | None = None) -> PartsResult:
    """Run the stages of :mod:`calibration.sources.tpu_stages` and the end-to-end fit (module docstring);
    ``logo_dimensions``: refit without each group of only these dimensions (default: every one)."""
    predictor = predictor or Predictor()
    parts_chip, stages = run_stages(PARTS_ORDER, published, points, components, predictor)
    # the end-to-end stage starts on the parts' chip and holds what the step times cannot pin
    e2e = fit_chip(parts_chip, points, parameters=E2E_PARAMETERS, holdout=holdout, predictor=predictor,
                   max_nfev=max_nfev, hold_weak=True)
    held = {path: f"end-to-end: {why}" for path, why in e2e.held.items()}
    records = list(points)
    e2e.extra["mape_published"] = mape(relative_errors([predictor.predict(published, r) for r in records], records))
    if e2e.split.holdout:
        e2e.extra["mape_published_holdout"] = mape(relative_errors(
            [predictor.predict(published, r) for r in e2e.split.holdout], e2e.split.holdout))
    result = PartsResult(published, stages, parts_chip, e2e, held, measurements=measurements)
    result.samples = draw_samples(_stage_draws(result))
    if logo:
        # the end-to-end stage refitted exactly as it was fitted: on the parts' chip (not fitted
        # on the step times), from the same start, holding what each refit cannot pin
        result.folds = held_out_folds(e2e, spread=with_coverage, dimensions=logo_dimensions)
        result.model_error = model_error(result.folds)
        result.coverage = coverage(result.folds) if with_coverage else None
    return result


def _stage_draws(result: PartsResult) -> list[tuple[list[str], np.ndarray, np.ndarray, dict[str, tuple[float, float]]]]:
    draws = []
    for stage in result.stages:
        if stage.fitted and stage.covariance is not None:
            draws.append((stage.fitted, np.array([stage.values[p] for p in stage.fitted]), stage.covariance,
                          stage.bounds))
    cov = result.e2e.extra.get("covariance")
    if cov:
        paths = [p for p in cov["paths"] if p not in result.e2e_held]
        index = [cov["paths"].index(p) for p in paths]
        matrix = np.array(cov["matrix"])[np.ix_(index, index)]
        values = np.array([figure_value(result.e2e.chip, p) for p in paths])
        bounds = {p.path: (p.lower, p.upper) for p in result.e2e.parameters}
        draws.append((paths, values, matrix, bounds))
    return draws
