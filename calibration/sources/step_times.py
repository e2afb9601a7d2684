"""The step-time source: a chip's identifiable figures fitted to measured step times.

The problem
-----------
For measurements ``m_i`` (step time ``t_i``) and a chip whose chosen figures are
``θ = (θ_1 .. θ_p)`` (see :mod:`calibration.core.parameters`), the simulator predicts ``T_i(θ)``.
We minimise the **relative** residuals (a 3 ms point and a 30 ms point count alike)::

    r_i(θ) = (T_i(θ) - t_i) / t_i,        minimise  ½ Σ r_i²   subject to  lo ≤ θ ≤ hi

Steps (:func:`fit_chip`):

1. **Split** the records into calibration and held-out points
   (:func:`calibration.sources.splits.split_records`; ``format=int4+bf16`` holds out one
   weight format, ``batch=8`` one batch size); each point is labelled by format, batch,
   model and chip count (the groups leave-one-group-out holds out, :func:`held_out_folds`).
2. **Before**: predict every point with the *published* chip (no overlay): the error the
   user would see uncalibrated.
3. **Start** from the published values (or a previous calibration) and normalise each
   parameter by its start value, ``x_j = θ_j / θ_ref_j``, so every variable is O(1) and one
   relative finite-difference step fits all.
4. **Solve** with the one solver (:func:`calibration.core.fit`: trust-region reflective,
   every iterate inside the bounds; with ``hold_weak`` the parameters the data cannot pin
   are held). Each residual evaluation simulates every calibration
   point once; a forward-difference Jacobian costs ``p`` more simulations per point, so an
   iteration costs ``n (p + 1)`` engine calls. Evaluations are memoised by ``x``.
5. **Uncertainty** from a central-difference Jacobian ``J`` at the solution (2 % steps, see
   :func:`fit_chip`) by the one rule of :mod:`calibration.core.covariance`: ``cov(x) = s² (JᵀJ)⁺``
   with ``s² = Σ r² / (n - p)``, the residual variance; ``σ(θ_j) = θ_ref_j √cov_jj``. A
   parameter stopped at a bound is flagged and held there: it gets no σ (the statement is
   one-sided) and leaves the covariance, so a near-flat column cannot inflate the others.
   The covariance of the free parameters (in their own units) is kept in
   ``FitResult.extra["covariance"]`` for prediction intervals (:mod:`calibration.core.samples`).
6. **Validate**: predict the held-out points with the fitted chip (the honest test), and
   estimate leave-one-out errors on the calibration points from the hat matrix
   ``H = J (JᵀJ)⁻¹ Jᵀ``: ``r_(i) ≈ r_i / (1 - h_ii)`` (exact for a linear model, no refits).
7. **Result**: a :class:`FitResult` whose :meth:`FitResult.overlay` is a
   :class:`~hwmodels.overlay.CalibrationOverlay` naming, per parameter, the data it was
   fitted on; :func:`save_fit` writes it atomically beside (never over) the published YAML.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calibration.core import (
    Fold,
    Parameter,
    Problem,
    Solution,
    SolverOptions,
    fit,
    fold_groups,
    leave_one_group_out,
    parameters,
)
from calibration.core.covariance import Identifiability, identifiability
from calibration.core.overlay_builder import build_overlay, fitted_figure, write_overlay
from calibration.core.parameters import SUSTAINED_PATH, figure_value, implied_values
from calibration.sources.fit_range import fit_coverage
from calibration.sources.format_contrasts import contrasts_json
from calibration.sources.measurements import Measurement
from calibration.sources.predict import PredictFn, Predictor
from calibration.sources.splits import Split, describe_records, groups_of, split_records
from hwmodels.errors import InputError
from hwmodels.overlay import CalibrationOverlay, iter_figures
from hwmodels.schema import Chip

# --------------------------------------------------------------------------- errors


def relative_errors(predicted_s: Sequence[float], records: Sequence[Measurement]) -> np.ndarray:
    """``(predicted - measured) / measured`` per record."""
    measured = np.array([r.step_s for r in records])
    return (np.asarray(predicted_s, dtype=float) - measured) / measured


def mape(errors: Sequence[float] | np.ndarray) -> float | None:
    """Mean absolute relative error (a fraction), or None for an empty set."""
    values = np.abs(np.asarray(errors, dtype=float))
    return float(values.mean()) if values.size else None


def max_error(errors: Sequence[float] | np.ndarray) -> float | None:
    values = np.abs(np.asarray(errors, dtype=float))
    return float(values.max()) if values.size else None


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class FittedParameter:
    """One fitted figure with its uncertainty and the data behind it."""

    path: str
    value: float
    uncertainty: float | None
    start: float
    published: float
    lower: float
    upper: float
    at_bound: bool
    fitted_on: str
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value, "uncertainty": self.uncertainty, "start": self.start,
            "published": self.published, "bounds": [self.lower, self.upper],
            "at_bound": self.at_bound, "fitted_on": self.fitted_on, "why": self.why,
        }


@dataclass
class FitResult:
    """Everything a fit produced: parameters, predictions before/after, errors."""

    chip: Chip  # the calibrated chip (published chip + overlay)
    published_chip: Chip
    parameters: list[FittedParameter]
    split: Split
    fitted_on: str
    before_s: dict[str, float]  # record key -> prediction with the published chip
    after_s: dict[str, float]  # record key -> prediction with the calibrated chip
    loo_errors: list[float]  # linearised leave-one-out relative errors, calibration set
    identifiability: Identifiability | None
    residual_s2: float | None
    engine_calls: int
    elapsed_s: float
    success: bool
    message: str
    extra: dict[str, Any] = field(default_factory=dict)
    problem: Problem | None = None  # what was fitted (leave-one-group-out refits it: held_out_folds)
    solver: SolverOptions | None = None
    solution: Solution | None = None  # what the solver returned (its Jacobian: linearised_folds)
    held: dict[str, str] = field(default_factory=dict)  # parameters held by the identifiability rule

    @property
    def records(self) -> list[Measurement]:
        return self.split.calibration + self.split.holdout

    def errors(self, which: str, subset: str) -> np.ndarray:
        """Relative errors ``which`` in (before, after) on ``subset`` in (calibration,
        holdout, all)."""
        records = {"calibration": self.split.calibration, "holdout": self.split.holdout,
                   "all": self.records}[subset]
        table = self.before_s if which == "before" else self.after_s
        return relative_errors([table[r.key()] for r in records], records)

    def summary(self) -> dict[str, float | None]:
        return {
            "mape_before": mape(self.errors("before", "all")),
            "mape_before_calibration": mape(self.errors("before", "calibration")),
            "mape_before_holdout": mape(self.errors("before", "holdout")),
            "mape_calibration": mape(self.errors("after", "calibration")),
            "mape_holdout": mape(self.errors("after", "holdout")),
            "mape_loo": mape(self.loo_errors),
            "max_error_before": max_error(self.errors("before", "all")),
            "max_error_calibration": max_error(self.errors("after", "calibration")),
            "max_error_holdout": max_error(self.errors("after", "holdout")),
        }

    def overlay(self) -> CalibrationOverlay:
        """The fitted values as a calibration overlay (each with its uncertainty and data),
        plus any figure implied by them (:func:`calibration.core.parameters.implied_values`)."""
        figures = {p.path: fitted_figure(p.value, p.uncertainty, p.fitted_on) for p in self.parameters}
        implied = implied_values(self.published_chip, {p.path: p.value for p in self.parameters})
        for path, value in implied.items():
            figures[path] = fitted_figure(value, fitted_on=f"implied by the fitted {SUSTAINED_PATH} ({self.fitted_on})")
        return build_overlay(self.chip.name, self.fitted_on, figures, coverage=fit_coverage(self.split.calibration))

    def to_json(self) -> dict[str, Any]:
        rows = []
        held = {r.key() for r in self.split.holdout}
        for record in self.records:
            key = record.key()
            rows.append({
                "key": key, "set": "holdout" if key in held else "calibration",
                "measured_ms": record.ms_per_step_median, "measured_label": record.backend,
                "simulated_uncalibrated_ms": self.before_s[key] * 1e3,
                "simulated_calibrated_ms": self.after_s[key] * 1e3,
            })
        return {
            "chip": self.chip.name, "fitted_on": self.fitted_on, "holdout": self.split.spec,
            **self.summary(),
            "parameters": {p.path: p.to_json() for p in self.parameters},
            "identifiability": None if self.identifiability is None else {
                "singular_values": list(self.identifiability.singular_values),
                "condition": self.identifiability.condition,
                "weakest_direction": self.identifiability.weakest,
            },
            "residual_variance": self.residual_s2, "engine_calls": self.engine_calls,
            "elapsed_s": self.elapsed_s, "success": self.success, "message": self.message,
            "points": rows,
            "contrasts": contrasts_json(self.records, self.after_s),
            **self.extra,
        }


# --------------------------------------------------------------------------- fitting


DEFAULT_PARAMETERS = {  # the justified sets per chip kind (the module docstring of calibration.core.parameters)
    "tpu": ("hbm.sustained_bandwidth_bytes_per_s", "compute.mxu.weight_push_s_per_tile",
            "compute.mxu.weight_push_s_per_tile_by_dtype.int8", "execution.per_layer_overhead_s"),
    "gpu": ("hbm.sustained_bandwidth_bytes_per_s", "execution.per_layer_overhead_s"),
    "cpu": ("hbm.sustained_bandwidth_bytes_per_s", "execution.launch_overhead_s", "compute.cpu.peak_flops_per_s.f32"),
}


def default_parameters(chip: Chip) -> tuple[Parameter, ...]:
    """The default set for ``chip``'s kind, those figures the chip has.

    On step times alone (one model, fixed layer counts) a per-step cost, a collective stage
    latency or a DMA issue cost cannot be told apart from the per-layer cost or the
    bandwidth; the part-by-part procedure pins those on their own measurements
    (:mod:`calibration.sources.tpu_stages`). On the CPU loop, the per-step cost stays at the
    probe's measured dispatch for the same reason."""
    available = {path for path, _ in iter_figures(chip)}
    usable = tuple(p for p in parameters(*DEFAULT_PARAMETERS[chip.kind]) if p.path in available)
    if not usable:
        raise InputError(f"chip {chip.name}: none of the default calibration parameters exist")
    return usable


def fit_chip(
    published: Chip,
    records: Sequence[Measurement],
    *,
    parameters: Sequence[Parameter] | None = None,
    holdout: str | None = None,
    start: Chip | None = None,
    predictor: PredictFn | None = None,
    diff_step: float = 1e-3,
    max_nfev: int = 30,
    xtol: float = 1e-6,
    uncertainty_step: float = 0.02,
    hold_weak: bool = False,
) -> FitResult:
    """Fit ``parameters`` of ``published`` to ``records`` (see the module docstring).

    ``start`` is the chip whose values the search starts from (default ``published``; a
    previously calibrated chip continues from its overlay). ``predictor`` maps (chip,
    measurement) to seconds; the default simulates with the engine. ``diff_step`` is the
    solver's relative finite-difference step; the uncertainty and leave-one-out estimates use
    a separate central-difference Jacobian with the larger relative step
    ``uncertainty_step`` (a discrete-event simulator is piecewise smooth: a 2 % step averages
    over event-order kinks that a 0.1 % step can land on). ``hold_weak``: hold the parameters
    the data does not pin (:func:`calibration.core.fit`).
    """
    began = time.perf_counter()
    predict = predictor or Predictor()
    calls = 0

    def run(chip: Chip, record: Measurement) -> float:
        nonlocal calls
        calls += 1
        return predict(chip, record)

    specs = tuple(parameters or default_parameters(published))
    split = split_records(records, holdout)
    cal = split.calibration
    if len(cal) < len(specs):
        raise InputError(
            f"{len(cal)} calibration points cannot determine {len(specs)} parameters; "
            "hold out fewer points or fit fewer parameters"
        )
    fitted_on = describe_records(cal)
    problem = Problem("step times", published, published, specs,
                      lambda chip, points: np.array([run(chip, cal[i]) for i in points]),
                      np.array([r.step_s for r in cal]), groups=groups_of(cal), start=start)
    options = SolverOptions(max_nfev=max_nfev, diff_step=diff_step, xtol=xtol, uncertainty_step=uncertainty_step,
                            hold_weak=hold_weak)
    with _steps_kept(len(records)):  # each residual walks every point's step: kept, repriced, not lowered again
        before = {r.key(): run(published, r) for r in split.calibration + split.holdout}
        solution = fit(problem, options)
    res, theta, free = solution.residuals, solution.values, solution.free
    paths = solution.problem.paths
    sigma = solution.sigma
    fit_cov = solution.covariance
    s2 = fit_cov.s2 if fit_cov is not None else None
    hat = fit_cov.hat if fit_cov is not None else np.zeros(len(res))
    covariance: dict[str, Any] = {}
    if fit_cov is not None and s2 is not None:
        covariance = {"paths": [paths[j] for j in free], "matrix": solution.covariance_theta().tolist()}
    fitted = [
        FittedParameter(
            path=spec.path, value=float(theta[j]),
            uncertainty=None if not math.isfinite(sigma[j]) else float(sigma[j]),
            start=float(solution.start[j]), published=figure_value(published, spec.path),
            lower=float(solution.lower[j]), upper=float(solution.upper[j]), at_bound=bool(solution.at_bound[j]),
            fitted_on=fitted_on, why=spec.why,
        )
        for j, spec in enumerate(solution.problem.parameters)
    ]
    calibrated = solution.chip(fitted_on=fitted_on)
    measured = problem.measured
    after = {r.key(): float(measured[i] * (1.0 + res[i])) for i, r in enumerate(cal)}
    after.update({r.key(): run(calibrated, r) for r in split.holdout})
    leverage = np.clip(1.0 - hat, 1e-6, None)
    jac_all = solution.jacobian
    return FitResult(
        chip=calibrated, published_chip=published, parameters=fitted, split=split,
        fitted_on=fitted_on, before_s=before, after_s=after,
        loo_errors=(res / leverage).tolist(),
        identifiability=identifiability(jac_all, paths) if jac_all.size else None,
        residual_s2=s2, engine_calls=calls, elapsed_s=time.perf_counter() - began,
        success=solution.success, message=solution.message,
        extra={"covariance": covariance} if covariance else {},
        problem=problem, solver=options, solution=solution, held=dict(solution.held),
    )


def save_fit(result: FitResult, path: Path | str | None = None, *, samples: bool = False,
             provenance: dict[str, Any] | None = None) -> Path:
    """Write the fit's overlay atomically (default ``<local dir>/calibrated/<chip>.yaml``).

    The published catalog file is never written: :func:`calibration.core.overlay_builder.write_overlay`
    refuses the built-in folder and replaces the overlay file atomically, so an interrupted
    save leaves the previous overlay intact.
    """
    overlay = result.overlay()
    covariance = result.extra.get("covariance")
    if samples and covariance:
        from calibration.core.samples import METHOD, SEED, draw_samples

        bounds = {p.path: (p.lower, p.upper) for p in result.parameters}
        values = np.array([next(p.value for p in result.parameters if p.path == path) for path in covariance["paths"]])
        overlay = overlay.model_copy(update={
            "samples": draw_samples([(covariance["paths"], values, np.array(covariance["matrix"]), bounds)]),
            "interval_method": METHOD.format(seed=SEED)})
    # provenance: fields of the overlay the fit does not know (measurements, errors)
    return write_overlay(overlay, path, provenance=provenance)


def held_out_folds(result: FitResult, *, spread: bool, dimensions: Sequence[str] | None = None) -> list[Fold]:
    """Leave-one-group-out refits of exactly the fit that produced ``result`` (same problem,
    same options, same start: :func:`calibration.core.leave_one_group_out`), over every
    dimension the calibration points vary in (format, batch, model, chip count), or only
    ``dimensions`` when given (fewer refits, fewer out-of-sample residuals); ``spread``:
    also each held prediction's 1σ from the refit's covariance."""
    if result.problem is None or result.solver is None:
        raise ValueError("this result was not fitted through calibration.core (no problem to refit)")
    folds = fold_groups(result.problem, dimensions) if dimensions is not None else None
    with _steps_kept(len(result.problem.indices)):  # a step per point of the problem refitted
        return leave_one_group_out(result.problem, result.solver, folds=folds, spread=spread)


def _steps_kept(steps: int) -> contextlib.AbstractContextManager[None]:
    """Within: the engine keeps a lowered step per record (:func:`tpusim.engine.reuse.lowerings_kept`):
    a fit's residuals walk the records in turn, and a point's next chip, moving only figures
    that price the pieces, reprices its kept step (:mod:`tpusim.engine.reprice`) where the
    default few kept steps would each be dropped before its turn came round again."""
    from tpusim.engine.reuse import lowerings_kept  # imported late: the engine is the heavy part

    return lowerings_kept(steps)
