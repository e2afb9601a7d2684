"""What a calibration fits: one :class:`Problem` type for every source.

A source (:mod:`calibration.sources`) turns its measurements into a problem:

- **parameters**: declarations from the one table (:mod:`calibration.core.parameters`);
  their bounds come from it, their priors from the chip the search starts on (``start``,
  default ``base``: the catalog's documented figures, or a previous stage's chip);
- **predict**: ``(chip, point indices) -> predicted values at those points``, so a refit on
  some points and a prediction of the others need no second definition;
- **measured** values, with their stated relative σ (None: plain relative errors), and the
  **groups** of each point per dimension (format, batch, stage group, ...: what
  leave-one-group-out holds out together, :mod:`calibration.core.holdout`);
- **transform**: the solver's variables, ``linear`` (``x = θ / θ_ref``, θ_ref the start
  value) or ``log`` (``x = ln θ``, for figures that span decades);
- **prior_weight**: a pull toward the start values, ``w · (x − x_start)`` appended to the
  residuals (0: none; the K3 stack uses a weak one to split a combination one step time
  pins).

The residual of point ``i`` is ``r_i = (predicted_i − measured_i) / (σ_i · measured_i)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from calibration.core.parameters import Parameter, chip_with, figure_value
from hwmodels.schema import Chip

Transform = Literal["linear", "log"]
Predict = Callable[[Chip, Sequence[int]], np.ndarray]


@dataclass(frozen=True)
class Problem:
    """What a calibration fits (see the module docstring)."""

    name: str
    base: Chip  # trial values are laid over this chip
    published: Chip  # relative bounds are factors of its figures
    parameters: tuple[Parameter, ...]
    predict: Predict
    measured: np.ndarray  # every point, in the points' own unit
    sigma_rel: np.ndarray | None = None  # stated relative σ per point (None: plain relative errors)
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # dimension -> label per point
    start: Chip | None = None  # where the search starts and the priors are read (default ``base``)
    fixed: dict[str, float] = field(default_factory=dict)  # figures laid over ``base`` and not fitted
    transform: Transform = "linear"
    prior_weight: float = 0.0
    points: tuple[int, ...] | None = None  # the points in play (None: all)

    @property
    def indices(self) -> list[int]:
        return list(self.points) if self.points is not None else list(range(len(self.measured)))

    @property
    def paths(self) -> list[str]:
        return [p.path for p in self.parameters]

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = [p.bounds_for(self.published) for p in self.parameters]
        return np.array([b[0] for b in pairs], dtype=float), np.array([b[1] for b in pairs], dtype=float)

    def priors(self) -> np.ndarray:
        """The start values (unclipped: the prior pull is toward them)."""
        chip = self.start or self.base
        return np.array([figure_value(chip, path) for path in self.paths], dtype=float)

    def chip(self, values: dict[str, float], *, fitted_on: str = "trial") -> Chip:
        return chip_with(self.base, {**self.fixed, **values}, fitted_on=fitted_on)

    def residuals(self, predicted: np.ndarray, indices: Sequence[int] | None = None) -> np.ndarray:
        at = list(indices) if indices is not None else self.indices
        measured = self.measured[at]
        scale = measured * (self.sigma_rel[at] if self.sigma_rel is not None else 1.0)
        return (np.asarray(predicted, dtype=float) - measured) / scale

    def without(self, paths: Sequence[str], *, start: Chip | None = None) -> Problem:
        """The problem with ``paths`` held at their start values (the search starting on
        ``start`` when given)."""
        begin = self.start or self.base
        held = {path: figure_value(begin, path) for path in paths}
        return replace(self, parameters=tuple(p for p in self.parameters if p.path not in held),
                       fixed={**self.fixed, **held}, start=start or self.start)

    def only(self, points: Sequence[int]) -> Problem:
        """The problem on ``points`` alone (a leave-one-group-out refit)."""
        return replace(self, points=tuple(points))
