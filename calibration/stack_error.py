"""The GPU serving-stack fit as a core problem, its model error, and the overlays it feeds.

:mod:`calibration.gpu_stack` owns the stack's structure (stage groups, the published split,
the fitted figures). This module states that fit as a :class:`calibration.core.Problem` —
parameters ``execution.gpu.{kernel_gap_s, gemm_fixed_s, attention_fixed_s}`` with the
stack's absolute bounds, predictions = the simulated time of each stage group, measured =
the published group times scaled to the step, one measurement group per stage group — so
that the leave-one-group-out refits of :mod:`calibration.discrepancy` run through the one
solver (:func:`calibration.core.solve`).

Out-of-sample residual of a fold (one stage group held out, the three figures refitted on
the other three): ``(published step − simulated step) / simulated step`` of the whole
decode step, the quantity a compare row predicts. Four folds give four residuals: too few
for a 90 % conformal rank, so the model error is the largest of them (flagged ``exact:
False``). The fit states no parameter uncertainty (three figures on four shares), so an
interval from this overlay is model error alone, and says so.

:func:`stack_overlay` writes the overlay of the chip the split was measured on (b200) or,
for another chip of the same GPU (:data:`SAME_GPU`), a **derived** overlay naming the fit it
came from (the catalog keeps its priors: fitted values reach a chip only through overlays).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calibration.core import Problem, solve
from calibration.discrepancy import EXTRAPOLATION_FACTOR, conformal_quantile
from calibration.gpu_stack import (
    BOUNDS_S,
    FITTED,
    MEASURED_ON,
    MEASUREMENT,
    MODEL,
    SOURCE,
    STEP_US,
    published_group_us,
    qwen_program,
    split_step,
)
from calibration.params import ParameterSpec
from hwmodels.overlay import CalibratedValue, CalibrationOverlay, ModelErrorTerm
from hwmodels.provenance import FitCoverage
from hwmodels.schema import Chip
from tpusim.engine.gpu_stack import STAGE_GROUPS

SAME_GPU = {"gb200": MEASURED_ON}  # chip -> the chip whose stack fit it takes (same Blackwell GPU)
METHOD = ("leave-one-stage-group-out refits of the serving-stack figures (calibration.stack_error); "
          "model error = the largest out-of-sample step error of the 4 folds (too few for a 90 % conformal "
          "rank); outside the fit (another model, chip count or batch): x " f"{EXTRAPOLATION_FACTOR:g} (assumed)")


def stack_problem(chip: Chip, groups: tuple[str, ...] = tuple(STAGE_GROUPS)) -> Problem:
    """The stack fit of :func:`calibration.gpu_stack.fit_gpu_stack` on ``groups``."""
    program = qwen_program(chip)
    target = published_group_us()
    specs = tuple(ParameterSpec(path, BOUNDS_S[0], BOUNDS_S[1], "serving-stack figure") for path in FITTED)

    def predict(trial: Chip) -> np.ndarray:
        split = split_step(trial, program)
        return np.array([split.group_us[g] for g in groups])

    return Problem("gpu stack", chip, chip, specs, predict, np.array([target[g] for g in groups]),
                   groups=groups)


def stack_model_error(chip: Chip, *, max_evals: int = 40) -> dict[str, Any]:
    """Leave-one-stage-group-out refits; per fold the held group and the step residual."""
    program = qwen_program(chip)
    folds = []
    for held in STAGE_GROUPS:
        kept = tuple(g for g in STAGE_GROUPS if g != held)
        solution = solve(stack_problem(chip, kept), max_nfev=max_evals)
        step_us = split_step(solution.chip(), program).step_us
        folds.append({"fold": f"stage group={held}", "step_us": step_us,
                      "error": (STEP_US - step_us) / step_us, "values": solution.value_map()})
    q, exact = conformal_quantile([f["error"] for f in folds])
    return {"folds": folds, "in_range_rel": q, "extrapolated_rel": EXTRAPOLATION_FACTOR * q, "exact": exact,
            "points": len(folds), "logo_mape": float(np.mean([abs(f["error"]) for f in folds])), "method": METHOD}


def stack_overlay(fit: dict[str, Any], error: dict[str, Any] | None, chip_name: str) -> CalibrationOverlay:
    """The overlay of ``chip_name`` from the stack fit ``fit`` (made on ``fit['chip']``)."""
    derived = chip_name != fit["chip"]
    fitted_on = f"{MEASUREMENT}: {SOURCE}"
    if derived:
        fitted_on = (f"derived: the {fit['chip']} serving-stack fit on {MEASUREMENT} "
                     f"(tpusim calibrate --hardware {fit['chip']}), {chip_name} being the same GPU; {SOURCE}")
    return CalibrationOverlay(
        chip=chip_name, fitted_on=fitted_on,
        parameters={path: CalibratedValue(value=entry["value"], fitted_on=(
            f"derived from the {fit['chip']} fit on {MEASUREMENT}" if derived else MEASUREMENT))
            for path, entry in fit["parameters"].items()},
        coverage=FitCoverage(models=[MODEL], formats=[], chip_counts=[1], batches=[1], backends=["published"]),
        model_error=None if error is None else ModelErrorTerm(
            in_range_rel=error["in_range_rel"], extrapolated_rel=error["extrapolated_rel"], method=error["method"],
            points=error["points"], exact=error["exact"]))
