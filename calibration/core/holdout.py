"""Leave-one-group-out refits: each group predicted by the shipped procedure fitted without it.

1. **Groups** (:func:`fold_groups`): a problem labels each point per dimension (format,
   batch, model, chip count, stage group); every dimension whose points take at least two
   labels gives one fold per label.
2. **Refit** (:func:`leave_one_group_out`): for each fold, the *same* problem restricted to
   the other points (:meth:`~calibration.core.problem.Problem.only`) goes through the *same*
   :func:`calibration.core.solver.fit` with the *same* options as the fit that was shipped,
   from the same start: the held-out error is the error of the procedure that produced the
   overlay, never of a cheaper stand-in.
3. **Predict** the held points with the refit's chip (or, for a source whose out-of-sample
   quantity is not the held values themselves, its ``score``: the GPU stack scores the
   whole step). The out-of-sample residual is ``(measured − predicted) / predicted``
   (relative to the prediction, so that an interval ``predicted · (1 ± t)`` covers the
   measurement exactly when ``|e| ≤ t``); with ``spread``, each held prediction's 1σ from
   the refit's covariance (a central-difference gradient, 2 % steps).

:func:`linearised_folds` is the cheap version for a regression guard: instead of refitting,
one Gauss–Newton step from the shipped solution without the fold's rows (the Jacobian the
fit already computed for its uncertainty; bounds ignored), the held rows moved along it.
Exact for a linear model; for the simulator, a first-order estimate of the refits, judged
against its own pinned figures, never quoted as the held-out error.

What the folds give (model error, coverage) is :mod:`calibration.core.model_error`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from calibration.core.covariance import fit_covariance
from calibration.core.parameters import chip_with, figure_value
from calibration.core.problem import Problem
from calibration.core.solver import Solution, SolverOptions, fit

SPREAD_STEP = 0.02  # relative step of the held predictions' gradient


@dataclass(frozen=True)
class Fold:
    """One held-out group: its points, their out-of-sample predictions and parameter spread."""

    dimension: str
    value: str
    points: list[int]  # indices into the problem's points (empty when ``score`` replaced them)
    measured: list[float]
    predicted: list[float]
    param_sd: list[float] | None = None  # 1σ of each prediction from the refit's covariance
    values: dict[str, float] | None = None  # the refit's parameters

    @property
    def residuals(self) -> np.ndarray:
        """``(measured − predicted) / predicted`` per held point."""
        predicted = np.asarray(self.predicted, dtype=float)
        return (np.asarray(self.measured, dtype=float) - predicted) / predicted

    @property
    def name(self) -> str:
        return f"{self.dimension}={self.value}"


def fold_groups(problem: Problem, dimensions: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """``(dimension, label)`` per fold: every dimension in which the points take ≥ 2 labels."""
    folds = []
    for dimension in dimensions if dimensions is not None else problem.groups:
        labels = list(dict.fromkeys(problem.groups[dimension][i] for i in problem.indices))
        if len(labels) >= 2:
            folds += [(dimension, label) for label in labels]
    return folds


Score = Callable[[Solution, list[int]], tuple[list[float], list[float]]]


def _spread(solution: Solution, held: list[int]) -> list[float]:
    cov = solution.covariance_theta()
    if cov is None:
        return [0.0] * len(held)
    problem, chip = solution.problem, solution.chip()
    paths = [problem.paths[j] for j in solution.free]
    gradient = []
    for path in paths:
        value = figure_value(chip, path)
        up, down = value * (1 + SPREAD_STEP), value * (1 - SPREAD_STEP)
        gradient.append((problem.predict(chip_with(chip, {path: up}), held)
                         - problem.predict(chip_with(chip, {path: down}), held)) / (up - down))
    g = np.array(gradient).T  # held points × parameters
    return [float(np.sqrt(max(row @ cov @ row, 0.0))) for row in g]


def leave_one_group_out(problem: Problem, options: SolverOptions, *, folds: Sequence[tuple[str, str]] | None = None,
                        spread: bool = False, score: Score | None = None) -> list[Fold]:
    """Steps 2–3 of the module docstring, for ``folds`` (default :func:`fold_groups`)."""
    out = []
    for dimension, label in folds if folds is not None else fold_groups(problem):
        held = [i for i in problem.indices if problem.groups[dimension][i] == label]
        kept = [i for i in problem.indices if problem.groups[dimension][i] != label]
        solution = fit(problem.only(kept), options)
        if score is not None:
            measured, predicted = score(solution, held)
            out.append(Fold(dimension, label, [], measured, predicted, None, solution.value_map()))
            continue
        predicted = problem.predict(solution.chip(), held)
        out.append(Fold(dimension, label, held, [float(problem.measured[i]) for i in held],
                        [float(v) for v in predicted], _spread(solution, held) if spread else None,
                        solution.value_map()))
    return out


def linearised_folds(solution: Solution, folds: Sequence[tuple[str, str]] | None = None) -> list[Fold]:
    """Leave-one-group-out estimated without refits (module docstring); each held point's 1σ
    from the fold's own linearised covariance."""
    problem = solution.problem
    if solution.jacobian.size == 0:
        raise ValueError(f"{problem.name}: the solution has no Jacobian (fit with uncertainty='central')")
    rows = problem.indices
    jac = solution.jacobian[:, solution.free]
    res = solution.residuals
    sigma = problem.sigma_rel[rows] if problem.sigma_rel is not None else np.ones(len(rows))
    measured = problem.measured[rows]
    out = []
    for dimension, label in folds if folds is not None else fold_groups(problem):
        held = np.array([problem.groups[dimension][i] == label for i in rows])
        step = -np.linalg.pinv(jac[~held]) @ res[~held]
        moved = res + jac @ step  # residuals after the step (relative, in units of σ)
        predicted = measured * (1.0 + moved * sigma)
        cov = fit_covariance(jac[~held], moved[~held], stated_sigma=problem.sigma_rel is not None).cov
        sd = [float(measured[k] * sigma[k] * np.sqrt(max(jac[k] @ cov @ jac[k], 0.0))) for k in np.flatnonzero(held)]
        points = [rows[k] for k in np.flatnonzero(held)]
        out.append(Fold(dimension, label, points, [float(m) for m in measured[held]],
                        [float(p) for p in predicted[held]], sd if np.all(np.isfinite(sd)) else None))
    return out
