"""The one overlay builder and the one overlay writer of calibration.

Every calibration source ends the same way: fitted (or measured) figures, keyed by their
dotted catalog path, become a :class:`hwmodels.overlay.CalibrationOverlay` of one chip, and
``tpusim calibrate`` (or a source's own ``--save``) writes it. Both steps live here, once:

- :func:`build_overlay` — the chip, what the fit as a whole ran on, and per figure its value,
  1σ (or None) and the data it was fitted on; optionally the fitted points' coverage, the
  sampled parameter sets behind the prediction intervals, the model error and the
  provenance (measurement set, errors). A trial chip of the solver is built the same way
  (:func:`calibration.core.parameters.chip_with`).
- :func:`model_error_term` — the core's out-of-sample model error
  (:class:`calibration.core.model_error.ModelError`, or its JSON form) as the overlay's term.
- :func:`write_overlay` — the only caller of :func:`hwmodels.overlay.save_overlay` in the tree
  above ``hwmodels``: atomic, refusing the published catalog folder
  (``tests/test_source_registry.py`` checks that no other module builds or saves an overlay).

This module imports nothing of calibration: the core's other modules and every source stand
on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hwmodels.overlay import CalibratedValue, CalibrationOverlay, ModelErrorTerm, save_overlay
from hwmodels.provenance import FitCoverage

# One figure of an overlay: (value, 1σ or None, the data it was fitted on).
Figure = tuple[float, float | None, str]


def fitted_figure(value: float, uncertainty: float | None = None, fitted_on: str = "") -> Figure:
    """One figure's entry for :func:`build_overlay`."""
    return (value, uncertainty, fitted_on)


def build_overlay(chip: str, fitted_on: str, figures: Mapping[str, Figure | CalibratedValue], *,
                  coverage: FitCoverage | None = None, samples: Sequence[dict[str, float]] = (),
                  interval_method: str = "", model_error: Any = None, measurements: str = "",
                  errors: Mapping[str, float | None] | None = None) -> CalibrationOverlay:
    """The overlay of ``chip`` (see the module docstring); ``figures`` maps a dotted figure path
    to :func:`fitted_figure` (or an overlay's existing :class:`CalibratedValue`, kept as it is);
    ``model_error`` is what :func:`model_error_term` takes."""
    parameters = {path: entry if isinstance(entry, CalibratedValue) else
                  CalibratedValue(value=entry[0], uncertainty=entry[1], fitted_on=entry[2])
                  for path, entry in figures.items()}
    return CalibrationOverlay(chip=chip, fitted_on=fitted_on, parameters=parameters, coverage=coverage,
                              samples=list(samples), interval_method=interval_method,
                              model_error=model_error_term(model_error), measurements=measurements,
                              errors=dict(errors or {}))


def model_error_term(error: Any) -> ModelErrorTerm | None:
    """The overlay's model-error term from the core's :class:`~calibration.core.model_error.ModelError`
    (or anything with its five fields, or their JSON mapping); None stays None."""
    if error is None or isinstance(error, ModelErrorTerm):
        return error
    fields = ("in_range_rel", "extrapolated_rel", "method", "points", "exact")
    values = {name: error[name] for name in fields} if isinstance(error, Mapping) else \
        {name: getattr(error, name) for name in fields}
    return ModelErrorTerm(**values)


def write_overlay(overlay: CalibrationOverlay, path: Path | str | None = None, *,
                  provenance: Mapping[str, Any] | None = None) -> Path:
    """Write ``overlay`` (with ``provenance``: fields the fit does not know, such as the
    measurement set and the errors ``tpusim calibrate`` reports) atomically to ``path``
    (default ``<local dir>/calibrated/<chip>.yaml``); returns the path written."""
    if provenance:
        overlay = overlay.model_copy(update=dict(provenance))
    return save_overlay(overlay, path)


__all__ = ["Figure", "build_overlay", "fitted_figure", "model_error_term", "write_overlay"]
