"""The calibration core: one problem definition, one solver path, one result type.

Every calibration procedure — the TPU part-by-part stages and the end-to-end fit
(:mod:`calibration.parts`, :mod:`calibration.fit`), the CPU loop (:mod:`calibration.cpu_loop`,
through :func:`calibration.fit.fit_chip`), the GPU serving stack (:mod:`calibration.gpu_stack`)
and the GPU micro-benchmark fit (:mod:`calibration.gpu_fit`) — states what it fits as a
:class:`Problem` and reports a :class:`CalibrationResult`:

1. **Problem** (:class:`Problem`): the parameters (:class:`~calibration.params.ParameterSpec`:
   a figure path, physical bounds, why), their **priors** (the values of the chip the fit
   starts from: the catalog's documented figures, labelled ``prior`` where a calibration
   fits them, or a previous stage's chip), a prediction function ``chip -> values``, the
   measured values with their stated relative σ (none: plain relative errors) and the
   **measurement group** of each value (format, batch, stage group: what leave-one-group-out
   holds out together).
2. **Solver** (:func:`solve`): the residual is ``r_i = (predicted_i - measured_i) /
   (σ_i · measured_i)``, minimised with :func:`scipy.optimize.least_squares` (trust-region
   reflective, every iterate inside the bounds) in variables scaled by the start values
   (``x = θ / θ_ref``), a prior sitting on a bound started 5 % of the range inside it; then a central-difference Jacobian and the one covariance rule of
   :mod:`calibration.covariance` (``stated_sigma`` when σ is given). A parameter stopped at a
   bound is held there and leaves the covariance.
3. **Result** (:class:`CalibrationResult`): the procedure (chosen by
   :func:`choose_procedure` from the chip and the data, never by the command line), the
   errors per measurement set — *priors only*, *parts only* (not fitted on the end-to-end
   points), *fitted* — each with its held-out error, the model error measured out of sample
   (:mod:`calibration.discrepancy`: leave-one-group-out refits) and the empirical coverage of
   the intervals, and the overlay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from calibration.covariance import JACOBIAN_STEP, FitCovariance, central_jacobian, fit_covariance
from calibration.params import ParameterSpec, chip_with, figure_value
from hwmodels.schema import Chip

# --------------------------------------------------------------------------- the problem


@dataclass(frozen=True)
class Problem:
    """What a calibration fits (see the module docstring, step 1)."""

    name: str
    base: Chip  # trial values are laid over this chip
    published: Chip  # relative bounds are factors of its figures
    parameters: tuple[ParameterSpec, ...]
    predict: Callable[[Chip], np.ndarray]  # chip -> predicted value per measurement
    measured: np.ndarray
    sigma_rel: np.ndarray | None = None  # stated relative σ per measurement (None: plain relative errors)
    groups: tuple[str, ...] = ()  # measurement group per value ("" when not grouped)
    start: Chip | None = None  # where the search starts (default ``base``: the priors)
    fixed: dict[str, float] = field(default_factory=dict)  # figures laid over ``base`` and not fitted

    @property
    def paths(self) -> list[str]:
        return [spec.path for spec in self.parameters]

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = [spec.bounds_for(self.published) for spec in self.parameters]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])

    def priors(self) -> np.ndarray:
        """The start values, clipped to the bounds."""
        lower, upper = self.bounds()
        chip = self.start or self.base
        return np.clip([figure_value(chip, path) for path in self.paths], lower, upper)

    def chip(self, values: dict[str, float], *, fitted_on: str = "trial") -> Chip:
        return chip_with(self.base, {**self.fixed, **values}, fitted_on=fitted_on)

    def residuals(self, predicted: np.ndarray) -> np.ndarray:
        scale = self.measured * (self.sigma_rel if self.sigma_rel is not None else 1.0)
        return (np.asarray(predicted, dtype=float) - self.measured) / scale

    def without(self, paths: Sequence[str]) -> Problem:
        """The problem with ``paths`` held at their start values."""
        start = self.start or self.base
        held = {path: figure_value(start, path) for path in paths}
        return Problem(self.name, self.base, self.published,
                       tuple(s for s in self.parameters if s.path not in held), self.predict, self.measured,
                       self.sigma_rel, self.groups, self.start, {**self.fixed, **held})


# --------------------------------------------------------------------------- the solver

START_INSIDE = 0.05  # a prior on a bound starts the search this fraction of the bound range inside


@dataclass(frozen=True)
class Solution:
    """What :func:`solve` found, in the parameters' own units."""

    problem: Problem
    values: np.ndarray  # θ per parameter
    start: np.ndarray  # θ at the start (the priors)
    lower: np.ndarray
    upper: np.ndarray
    residuals: np.ndarray  # r at the solution
    at_bound: np.ndarray  # bool per parameter
    free: np.ndarray  # indices of the parameters in the covariance (not at a bound, see solve)
    jacobian: np.ndarray  # central-difference ∂r/∂x over all parameters (scaled variables)
    covariance: FitCovariance | None  # over ``free`` (scaled variables); None when every parameter is at a bound
    ref: np.ndarray  # θ_ref: x = θ / θ_ref
    success: bool
    message: str
    evaluations: int

    @property
    def sigma(self) -> np.ndarray:
        """1σ per parameter (NaN: at a bound, in a flat direction, or undefined)."""
        out = np.full(len(self.values), np.nan)
        cov = self.covariance
        if cov is None or (cov.s2 is None and self.problem.sigma_rel is None):
            return out
        sig = cov.sigma
        sig[cov.flat] = np.nan
        out[self.free] = sig * self.ref[self.free]
        return out

    def covariance_theta(self) -> np.ndarray | None:
        """The covariance of the free parameters in their own units."""
        if self.covariance is None:
            return None
        return self.covariance.scaled(self.ref[self.free])

    def value_map(self) -> dict[str, float]:
        return dict(zip(self.problem.paths, self.values.tolist(), strict=True))

    def chip(self, *, fitted_on: str = "trial") -> Chip:
        return self.problem.chip(self.value_map(), fitted_on=fitted_on)


def solve(problem: Problem, *, max_nfev: int = 30, diff_step: float = 1e-3, xtol: float = 1e-6,
          ftol: float = 1e-10, gtol: float = 1e-10, uncertainty_step: float = JACOBIAN_STEP,
          drop_at_bound: bool = True) -> Solution:
    """Bounded least squares on ``problem`` and its uncertainty (module docstring, step 2).

    Evaluations are memoised by ``x``; the uncertainty Jacobian uses central differences of
    relative size ``uncertainty_step`` (a discrete-event simulator is piecewise smooth: a 2 %
    step averages over event-order kinks that the solver's 0.1 % step can land on).
    ``drop_at_bound``: a parameter stopped at a bound leaves the covariance (its error bar is
    one-sided); False keeps every parameter in it (the part stages, which then hold the
    weakest parameter and fit again).
    """
    paths = problem.paths
    lower, upper = problem.bounds()
    theta0 = problem.priors()
    ref = np.where(theta0 > 0, theta0, np.maximum(upper * 1e-2, 1e-30))
    memo: dict[bytes, np.ndarray] = {}

    def residual(x: np.ndarray) -> np.ndarray:
        key = np.asarray(x, dtype=float).tobytes()
        if key not in memo:
            chip = problem.chip(dict(zip(paths, (np.asarray(x) * ref).tolist(), strict=True)))
            memo[key] = problem.residuals(problem.predict(chip))
        return memo[key]

    # A prior on a bound starts the search START_INSIDE of the range inside it: the solver's
    # finite-difference step at a bound is too small for a discrete-event engine to respond to
    # (tpu-v7's DMA concurrency penalty: prior 0, bounds 0-0.6).
    inside = START_INSIDE * (upper - lower)
    begin = np.clip(theta0, np.minimum(lower + inside, upper), np.maximum(upper - inside, lower))
    solution = least_squares(residual, begin / ref, bounds=(lower / ref, upper / ref), method="trf",
                             jac="2-point", diff_step=diff_step, x_scale=1.0, max_nfev=max_nfev,
                             xtol=xtol, ftol=ftol, gtol=gtol)
    x = solution.x
    theta = x * ref
    res = residual(x)
    tolerance = 1e-6 * (upper - lower)
    at_bound = (theta - lower <= tolerance) | (upper - theta <= tolerance)
    free = np.flatnonzero(~at_bound) if drop_at_bound else np.arange(len(theta))
    jac = central_jacobian(residual, x, lower / ref, upper / ref, uncertainty_step)
    covariance = (fit_covariance(jac[:, free], res, stated_sigma=problem.sigma_rel is not None)
                  if free.size else None)
    return Solution(problem, theta, theta0, lower, upper, res, at_bound, free, jac, covariance, ref,
                    bool(solution.success), str(solution.message), len(memo))


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class SetErrors:
    """The errors of one measurement set (fractions; None where not measured)."""

    points: int
    priors_only: float | None  # MAPE with the catalog's priors, nothing fitted
    parts_only: float | None  # MAPE with the parts' fit, not fitted on these points
    fitted: float | None  # MAPE of the fit on the points it was fitted on
    held_out: float | None  # MAPE of leave-one-group-out refits on the groups they did not see
    priors_only_held_out: float | None = None  # the same three on the --holdout points, when given
    parts_only_held_out: float | None = None
    fitted_held_out: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CalibrationResult:
    """One result type for every procedure (module docstring, step 3)."""

    procedure: str  # part by part | end to end | cpu loop | gpu micro | gpu stack
    chip: str
    errors: dict[str, SetErrors]  # measurement set -> errors
    model_error: dict[str, Any] | None = None  # calibration.discrepancy.ModelError.to_json()
    coverage: dict[str, Any] | None = None  # calibration.discrepancy.Coverage.to_json()
    details: dict[str, Any] = field(default_factory=dict)  # the procedure's own report

    def to_json(self) -> dict[str, Any]:
        return {"procedure": self.procedure, "chip": self.chip,
                "errors": {name: e.to_json() for name, e in self.errors.items()},
                "model_error": self.model_error, "coverage": self.coverage}


# --------------------------------------------------------------------------- the procedure


PROCEDURES = ("part by part", "end to end", "cpu loop", "gpu micro", "gpu stack", "gpu k3 stack")
GPU_K3_STACK_SETS = ("published:b300-sglang-k3",)  # published K3 rows on B300 (calibration.k3_stack_fit)
GPU_STACK_SETS = ("published:b200-vllm-qwen3.5",)  # published per-stage splits (calibration.gpu_stack)


def choose_procedure(chip: Chip, *, measurements: str, micro_set: bool = False, has_components: bool = False,
                     parameters_given: bool = False) -> str:
    """The calibration procedure for ``chip`` and its data (not the command line's choice):

    - a CPU chip measured by the closed loop → ``cpu loop``;
    - a GPU serving stack's published per-stage split → ``gpu stack``;
    - the published K3 rows on B300 → ``gpu k3 stack`` (:mod:`calibration.k3_stack_fit`, which
      still has its own solver and result);
    - a :mod:`calibration.gpu_bench` file (micro-benchmarks + whole steps) → ``gpu micro``;
    - component measurements for this chip exist and no figure list was given → ``part by part``;
    - otherwise → ``end to end``.
    """
    if chip.kind == "cpu" and measurements.startswith("cpu-loop"):
        return "cpu loop"
    if chip.kind == "gpu" and measurements in GPU_STACK_SETS:
        return "gpu stack"
    if measurements in GPU_K3_STACK_SETS:
        return "gpu k3 stack"
    if micro_set:
        return "gpu micro"
    if has_components and not parameters_given:
        return "part by part"
    return "end to end"
