"""The one solver: bounded least squares on a :class:`~calibration.core.problem.Problem`.

Library: SciPy's bounded least-squares solver (``scipy.optimize``, trust-region reflective,
every iterate inside the bounds). Chosen over ``lmfit`` on merit: lmfit wraps the same MINPACK/TRF
solvers and adds named parameters and reports, which the parameter table and
:class:`Solution` already give; scipy is already a dependency, and its ``x_scale``,
``diff_step`` and bounds are all a discrete-event simulator needs. This module holds the
project's only call of it.

:func:`solve`, step by step:

1. **Variables**: ``x = θ / θ_ref`` (``linear``; θ_ref the start value, so each variable is
   O(1) and one relative finite-difference step fits all) or ``x = ln θ`` (``log``).
2. **Start**: the priors clipped to the bounds; with ``start_inside > 0`` a prior within that
   fraction of the bound range of a bound starts that far inside (a discrete-event engine
   does not respond to the solver's tiny step at a bound: tpu-v7's DMA penalty, prior 0,
   bounds 0–0.6).
3. **Solve** the residuals of the problem (plus the prior pull, when the problem has one);
   evaluations memoised by ``x``.
4. **At a bound**: a parameter within ``1e-6`` of the range of a bound is flagged; with
   ``drop_at_bound`` it leaves the covariance (its error bar is one-sided).
5. **Uncertainty** (:mod:`calibration.core.covariance`, the one rule): a central-difference
   Jacobian of relative step ``uncertainty_step`` (a simulator is piecewise smooth: a 2 %
   step averages over event-order kinks), or the solver's own Jacobian (``solver``: for an
   analytic model), or none.

:func:`fit` is what sources call: :func:`solve`, and with ``hold_weak`` the identifiability
rule: a parameter whose 1σ is not below ``weak_ratio`` of its value, that stops at a bound,
or that the data cannot see is held at its start value and the rest fitted again (from the
start values again), until every fitted parameter is pinned. When several are weak,
the highest ``hold_rank`` is held first (a per-copy issue cost before a latency), then the
one the data says least about.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from scipy.optimize import least_squares

from calibration.core.covariance import (
    JACOBIAN_STEP,
    FitCovariance,
    central_jacobian,
    fit_covariance,
)
from calibration.core.problem import Problem
from hwmodels.schema import Chip
from tpusim.collector import collector_paused
from tpusim.progress_notes import note


@dataclass(frozen=True)
class SolverOptions:
    """How a source asks the one solver to run (module docstring)."""

    max_nfev: int = 30
    diff_step: float | None = 1e-3  # relative finite-difference step of the solver (None: scipy's default)
    xtol: float = 1e-6
    ftol: float = 1e-10
    gtol: float = 1e-10
    x_scale: float | Literal["jac"] = 1.0
    start_inside: float = 0.05
    uncertainty: Literal["central", "solver", "none"] = "central"
    uncertainty_step: float = JACOBIAN_STEP
    drop_at_bound: bool = True
    hold_weak: bool = False
    weak_ratio: float = 0.5


@dataclass(frozen=True)
class Solution:
    """What the solver found, in the parameters' own units."""

    problem: Problem
    options: SolverOptions
    values: np.ndarray  # θ per parameter
    start: np.ndarray  # θ at the start (the priors)
    lower: np.ndarray
    upper: np.ndarray
    residuals: np.ndarray  # r at the solution (the points in play; no prior rows)
    at_bound: np.ndarray  # bool per parameter
    free: np.ndarray  # indices of the parameters in the covariance
    jacobian: np.ndarray  # ∂r/∂x over every parameter (empty without uncertainty)
    covariance: FitCovariance | None  # over ``free``, in x; None without one
    success: bool
    message: str
    evaluations: int
    held: dict[str, str] = field(default_factory=dict)  # path -> why it was held (hold_weak)

    def _dtheta_dx(self) -> np.ndarray:
        if self.problem.transform == "log":
            return self.values.copy()
        return _reference(self.start, self.upper)

    @property
    def sigma(self) -> np.ndarray:
        """1σ per parameter (NaN: at a bound, in a flat direction, or undefined)."""
        out = np.full(len(self.values), np.nan)
        cov = self.covariance
        if cov is None or (cov.s2 is None and self.problem.sigma_rel is None):
            return out
        sig = cov.sigma
        sig[cov.flat] = np.nan
        out[self.free] = sig * self._dtheta_dx()[self.free]
        return out

    def covariance_theta(self) -> np.ndarray | None:
        """The covariance of the free parameters in their own units."""
        if self.covariance is None:
            return None
        return self.covariance.scaled(self._dtheta_dx()[self.free])

    def value_map(self) -> dict[str, float]:
        return dict(zip(self.problem.paths, self.values.tolist(), strict=True))

    def chip(self, *, fitted_on: str = "trial") -> Chip:
        return self.problem.chip(self.value_map(), fitted_on=fitted_on)

    def weak(self) -> list[tuple[int, float, str, str]]:
        """``(hold rank, σ/θ, path, why)`` per parameter the data does not pin."""
        sig = np.where(np.isnan(self.sigma), np.inf, self.sigma)
        out = []
        for i, spec in enumerate(self.problem.parameters):
            theta = self.values[i]
            if self.at_bound[i] or not np.isfinite(sig[i]) or sig[i] >= self.options.weak_ratio * theta:
                why = ("stopped at a bound" if self.at_bound[i] else "not seen by the data (a flat direction)"
                       if not np.isfinite(sig[i]) else f"1σ {sig[i]:.3g} >= {self.options.weak_ratio:g} x its "
                       f"value {theta:.3g}")
                out.append((spec.hold_rank, float(sig[i] / max(theta, 1e-300)), spec.path, why))
        return out


def _reference(theta0: np.ndarray, upper: np.ndarray) -> np.ndarray:
    return np.where(theta0 > 0, theta0, np.maximum(upper * 1e-2, 1e-30))


def solve(problem: Problem, options: SolverOptions | None = None) -> Solution:
    """Bounded least squares on ``problem`` and its uncertainty (module docstring)."""
    options = options or SolverOptions()
    lower, upper = problem.bounds()
    prior = problem.priors()
    theta0 = np.clip(prior, lower, upper)
    if problem.transform == "log":
        to_x, to_theta = np.log, np.exp
    else:
        ref = _reference(theta0, upper)
        to_x, to_theta = (lambda t: np.asarray(t) / ref), (lambda x: np.asarray(x) * ref)
    lo_x, hi_x = to_x(lower), to_x(upper)
    memo: dict[bytes, np.ndarray] = {}
    points = problem.indices

    def residual(x: np.ndarray) -> np.ndarray:
        key = np.asarray(x, dtype=float).tobytes()
        if key not in memo:
            note(f"least squares: {len(memo) + 1} evaluations of {len(points)} points")
            chip = problem.chip(dict(zip(problem.paths, to_theta(x).tolist(), strict=True)))
            memo[key] = problem.residuals(problem.predict(chip, points))
        return memo[key]

    pull = problem.prior_weight
    x_prior = to_x(prior) if pull else None

    def objective(x: np.ndarray) -> np.ndarray:
        return residual(x) if not pull else np.concatenate([residual(x), pull * (x - x_prior)])

    if not problem.parameters:  # every parameter held: the start chip stands
        res = residual(np.zeros(0))
        empty = np.zeros(0)
        return Solution(problem, options, empty, empty, empty, empty, res, empty.astype(bool), np.zeros(0, int),
                        np.zeros((len(res), 0)), None, True, "nothing to fit: every parameter held", len(memo))
    inside = options.start_inside * (hi_x - lo_x)
    begin = np.clip(to_x(theta0), np.minimum(lo_x + inside, hi_x), np.maximum(hi_x - inside, lo_x))
    found = least_squares(objective, begin, bounds=(lo_x, hi_x), method="trf", jac="2-point",
                          diff_step=options.diff_step, x_scale=options.x_scale, max_nfev=options.max_nfev,
                          xtol=options.xtol, ftol=options.ftol, gtol=options.gtol)
    x = found.x
    theta = to_theta(x)
    res = residual(x)
    tolerance = 1e-6 * (upper - lower)
    at_bound = (theta - lower <= tolerance) | (upper - theta <= tolerance)
    free = np.flatnonzero(~at_bound) if options.drop_at_bound else np.arange(len(theta))
    if options.uncertainty == "central":
        jac = central_jacobian(residual, x, lo_x, hi_x, options.uncertainty_step,
                               absolute=problem.transform == "log")
    elif options.uncertainty == "solver":
        jac = np.asarray(found.jac)[: len(res)]
    else:
        jac = np.zeros((len(res), 0))
    covariance = (fit_covariance(jac[:, free], res, stated_sigma=problem.sigma_rel is not None)
                  if jac.size and free.size else None)
    return Solution(problem, options, theta, theta0, lower, upper, res, at_bound, free, jac, covariance,
                    bool(found.success), str(found.message), len(memo))


def fit(problem: Problem, options: SolverOptions | None = None) -> Solution:
    """The calibration of ``problem``: :func:`solve`, and with ``options.hold_weak`` the
    identifiability rule of the module docstring (the held parameters in ``Solution.held``)."""
    options = options or SolverOptions()
    # the cyclic collector paused for the whole fit: each residual's simulations leave thousands
    # of new acyclic objects (a repriced step's pieces, the results kept), which the collections
    # the engine's own pauses end in would scan again and again (a third of the TPU7x end-to-end
    # fit's CPU time); a simulation leaves ~20 objects in cycles, collected after the fit
    with collector_paused():
        solution = solve(problem, options)
        held: dict[str, str] = {}
        while options.hold_weak and solution.problem.parameters:
            weak = solution.weak()
            if not weak:
                break
            _rank, _ratio, worst, why = max(weak)
            held[worst] = f"{why}; held at its start value"
            # every round starts from the problem's own start values: the result does not depend on
            # where a previous round stopped (a solve truncated at max_nfev would otherwise carry over)
            solution = solve(solution.problem.without([worst]), options)
    return replace(solution, held=held) if held else solution
