"""The one result type every calibration reports, and its errors per measurement set.

:class:`CalibrationResult` (``--json`` key ``calibration``): the procedure, and per
measurement set (:class:`SetErrors`) the errors with the priors only, with the parts' fit
(not fitted on these points), fitted (in sample) and held out (leave-one-group-out refits of
the shipped fit, :mod:`calibration.core.holdout`), plus the model error measured out of
sample and the coverage of the intervals (:mod:`calibration.core.model_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    """One result type for every procedure (module docstring)."""

    procedure: str  # part by part | end to end | cpu loop | gpu micro | gpu stack
    chip: str
    errors: dict[str, SetErrors]  # measurement set -> errors
    model_error: dict[str, Any] | None = None  # calibration.core.model_error.ModelError.to_json()
    coverage: dict[str, Any] | None = None  # calibration.core.model_error.Coverage.to_json()
    details: dict[str, Any] = field(default_factory=dict)  # the procedure's own report

    def to_json(self) -> dict[str, Any]:
        return {"procedure": self.procedure, "chip": self.chip,
                "errors": {name: e.to_json() for name, e in self.errors.items()},
                "model_error": self.model_error, "coverage": self.coverage}
