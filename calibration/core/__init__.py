"""The calibration core: one problem type, one solver, one table of parameters, one result.

Every source (:mod:`calibration.sources`) turns its measurements into a
:class:`Problem` and calls :func:`fit` — the one entry point — then reports through
:class:`CalibrationResult` and builds its overlay with
:func:`~calibration.core.overlay_builder.build_overlay`; each source is registered once in
:mod:`calibration.sources.registry` (``calibration/README.md``)::

    from calibration.core import Problem, SolverOptions, fit, parameters

    problem = Problem("my source", base=chip, published=chip,
                      parameters=parameters("execution.gpu.kernel_gap_s"),
                      predict=lambda trial, points: my_predictions(trial, points),
                      measured=measured, groups={"batch": batch_labels})
    solution = fit(problem, SolverOptions(max_nfev=30))
    solution.value_map(), solution.sigma, solution.chip()

Modules, bottom to top (each imports only those before it):

0. :mod:`~calibration.core.fitting` — the direct rules (a least-squares line, a median) that
   set a figure where a solve adds nothing; no other module fits a line or takes a median.
0. :mod:`~calibration.core.overlay_builder` — the one overlay builder (fitted figures of a
   chip -> :class:`hwmodels.overlay.CalibrationOverlay`) and the one writer of overlays.
1. :mod:`~calibration.core.parameters` — the table of calibratable figures (name, unit,
   catalog path, bounds per chip kind, why); laying trial values over a chip.
2. :mod:`~calibration.core.covariance` — the uncertainty rule, identifiability, draws.
3. :mod:`~calibration.core.problem` — :class:`Problem` (parameters, prediction, measured
   values with σ and groups, transform, prior pull).
4. :mod:`~calibration.core.solver` — :func:`fit` / :func:`solve` (the project's one
   least-squares call), hold-at-bound and hold-the-weakest.
5. :mod:`~calibration.core.holdout` — leave-one-group-out refits of the shipped procedure.
6. :mod:`~calibration.core.model_error` — the out-of-sample model error and the coverage
   of the intervals (the interval rule is read from :mod:`tpusim.report.intervals`).
7. :mod:`~calibration.core.samples` — parameter sets drawn for prediction intervals.
8. :mod:`~calibration.core.result` — :class:`CalibrationResult`, :class:`SetErrors`.
"""

from calibration.core.holdout import Fold, fold_groups, leave_one_group_out, linearised_folds
from calibration.core.model_error import Coverage, ModelError, coverage, model_error
from calibration.core.parameters import PARAMETERS, Parameter, parameter, parameters
from calibration.core.problem import Problem
from calibration.core.result import CalibrationResult, SetErrors
from calibration.core.solver import Solution, SolverOptions, fit, solve

__all__ = ["PARAMETERS", "CalibrationResult", "Coverage", "Fold", "ModelError", "Parameter", "Problem",
           "SetErrors", "Solution", "SolverOptions", "coverage", "fit", "fold_groups", "leave_one_group_out",
           "linearised_folds", "model_error", "parameter", "parameters", "solve"]
