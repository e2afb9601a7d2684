"""Calibrated overlays: fitted values laid over a published chip without touching its file.

Why an overlay
--------------
A catalog YAML states what the vendor published (or what we assumed, labelled so).
Calibration fits some of those numbers to measurements — the sustained HBM rate, the DMA
issue latency, the per-layer overhead. Writing the fit back into the catalog file would lose
the published value and its source, so the fit goes into a separate file::

    <local dir>/calibrated/<chip>.yaml        (see overlay_path; local dir: hwmodels.catalog)

    chip: tpu-v7
    created: 2025-01-01T12:00:00Z
    fitted_on: "8 points: muse-spark@{nvfp4+bf16,nvfp4+int8} b1..8 on tpu-v7x4 (tpu7x (published))"
    coverage: {models: [muse-spark], formats: [nvfp4+bf16, nvfp4+int8], chip_counts: [4], ...}
    parameters:
      hbm.sustained_bandwidth_bytes_per_s: {value: 2.98e12, uncertainty: 2.0e10, fitted_on: ...}
      links.ici.collective_stage_latency_s: {value: 4.1e-6, uncertainty: 3.0e-7}

Parameter paths
---------------
A key is a dotted path into the :class:`~hwmodels.schema.Chip`. Mapping fields are followed
by field name or dict key; list elements (``on_chip``, ``compute``, ``links``) by their
``name``. The path must end at a :class:`~hwmodels.schema.Figure` (or at an optional figure
field that is unset, such as ``compute.mxu.weight_push_s_per_tile`` on a chip that does not
publish one). Examples: ``hbm.sustained_bandwidth_bytes_per_s``, ``dma.issue_latency_s``,
``dma.concurrency_penalty_per_dma``, ``execution.per_layer_overhead_s``,
``links.ici.collective_stage_latency_s``, ``compute.mxu.weight_push_s_per_tile``,
``compute.mxu.peak_flops_per_s.bf16``. :func:`iter_figures` lists every valid path of a chip.

Applying
--------
:func:`apply_overlay` returns a **new** chip (chips are frozen) whose replaced figures carry
``label: calibrated``, the fit's uncertainty, and a source naming the overlay and quoting
the published value it replaced. The published chip stays reachable through
``load_chip(name, calibrated=False)`` / :func:`hwmodels.catalog.published_chip`.

Saving
------
:func:`save_overlay` writes atomically (temporary file in the same folder, fsync,
``os.replace``): an interrupted save leaves the previous overlay intact. It refuses to write
into the built-in catalog folder. ``tpusim calibrate`` saves only a fit that passed its
checks (:mod:`calibration.reports.trust`) and records the measurement set and the fit's errors
(``measurements``, ``errors``).

Listing and removing
--------------------
:func:`overlay_paths` lists the overlays of the local folder, :func:`remove_overlay` deletes
one (``tpusim overlays list|show|remove``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hwmodels.atomic import write_text_atomic
from hwmodels.errors import InputError
from hwmodels.files import (
    BUILTIN_DIR,
    display_path,
    format_validation_error,
    local_dir,
    read_yaml_mapping,
)
from hwmodels.provenance import Calibration, FitCoverage
from hwmodels.schema import Chip, Figure


class CalibratedValue(BaseModel):
    """One fitted number, in the unit of the field it replaces."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float = Field(ge=0.0, description="fitted value, in the unit the field name states")
    uncertainty: float | None = Field(default=None, ge=0.0, description="one-sigma uncertainty")
    fitted_on: str = Field(default="", description="the data this parameter was fitted on")


class ModelErrorTerm(BaseModel):
    """The model error a fit measured out of sample (:mod:`calibration.core.model_error`): the
    relative half-width an interval adds for what no fitted figure absorbs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    in_range_rel: float = Field(ge=0.0, description="90 % conformal quantile of |measured - predicted| / "
                                "predicted over leave-one-group-out refits (a prediction inside the fit)")
    extrapolated_rel: float = Field(ge=0.0, description="the same for a prediction outside the fit "
                                    "(another model, format, chip count or batch)")
    method: str = Field(min_length=1, description="how both were measured")
    points: int = Field(ge=0, description="out-of-sample residuals behind the quantile")
    exact: bool = Field(default=True, description="False: too few residuals for a 90 % conformal rank "
                        "(the largest was used)")


class CalibrationOverlay(BaseModel):
    """Fitted values for one chip, keyed by dotted field path (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chip: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="catalog name of the chip")
    created: datetime = Field(
        default_factory=lambda: datetime.now(UTC), description="when the fit was made (UTC)"
    )
    fitted_on: str = Field(min_length=1, description="what the fit as a whole was run on")
    coverage: FitCoverage | None = Field(
        default=None, description="the fitted points by dimension (models, chip counts, formats)"
    )
    parameters: dict[str, CalibratedValue] = Field(description="dotted field path -> fitted value")
    samples: list[dict[str, float]] = Field(
        default_factory=list,
        description="parameter sets drawn from the fit's uncertainty (each: path -> value, laid "
        "over ``parameters``); re-simulating each gives the prediction interval",
    )
    interval_method: str = Field(default="", description="how ``samples`` were drawn")
    model_error: ModelErrorTerm | None = Field(
        default=None, description="model error measured out of sample; intervals add it to the "
        "samples' spread (tpusim.report.intervals)")
    measurements: str = Field(default="", description="the measurement file or set the fit read "
                              "(as ``tpusim calibrate --measurements`` named it)")
    errors: dict[str, float | None] = Field(
        default_factory=dict, description="the fit's errors as fractions (mape_before, "
        "mape_calibration, mape_holdout, ...), as ``tpusim calibrate --json`` reports them")

    @field_validator("parameters")
    @classmethod
    def _check_paths(cls, parameters: dict[str, CalibratedValue]) -> dict[str, CalibratedValue]:
        for key in parameters:
            if not key or any(not part for part in key.split(".")):
                raise ValueError(f"parameter path {key!r} is not a dotted field path")
        return parameters


def overlay_path(chip_name: str) -> Path:
    """Where the calibrated overlay of ``chip_name`` lives: ``<local dir>/calibrated/<chip>.yaml``."""
    return local_dir() / "calibrated" / f"{chip_name}.yaml"


def has_overlay(chip_name: str) -> bool:
    """Whether a calibrated overlay exists for ``chip_name``."""
    return overlay_path(chip_name).is_file()


def overlay_paths() -> list[Path]:
    """Every overlay file in ``<local dir>/calibrated/``, sorted by chip name."""
    folder = local_dir() / "calibrated"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def remove_overlay(chip_name: str) -> Path:
    """Delete the overlay of ``chip_name`` (the published figures apply again); returns its
    path. InputError naming the overlays that exist when there is none for the chip."""
    path = overlay_path(chip_name)
    if not path.is_file():
        existing = ", ".join(p.stem for p in overlay_paths()) or "(none)"
        raise InputError(f"no calibrated overlay for {chip_name!r} in {display_path(path.parent)} "
                         f"(overlays: {existing})")
    path.unlink()
    return path


# --------------------------------------------------------------------------- field paths


def iter_figures(chip: Chip) -> Iterator[tuple[str, Figure]]:
    """Every figure of ``chip`` with its dotted path, in schema order (list elements by name)."""
    yield from _walk(chip, "")


def _walk(node: Any, prefix: str) -> Iterator[tuple[str, Figure]]:
    if isinstance(node, Figure):
        yield prefix, node
    elif isinstance(node, BaseModel):
        for field_name in type(node).model_fields:
            yield from _walk(getattr(node, field_name), _join(prefix, field_name))
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, _join(prefix, str(key)))
    elif isinstance(node, list):
        for index, element in enumerate(node):
            name = getattr(element, "name", None)
            yield from _walk(element, _join(prefix, name if isinstance(name, str) else str(index)))


def _join(prefix: str, part: str) -> str:
    return f"{prefix}.{part}" if prefix else part


def _step(node: Any, part: str, walked: str) -> Any:
    """Follow one path segment through dumped chip data."""
    if isinstance(node, dict):
        if part not in node:
            options = ", ".join(sorted(str(key) for key in node)) or "(none)"
            raise KeyError(
                f"{_join(walked, part)!r} does not exist (under {walked or 'the chip'}: {options})"
            )
        return node[part]
    if isinstance(node, list):
        for element in node:
            if isinstance(element, dict) and element.get("name") == part:
                return element
        names = ", ".join(str(element.get("name")) for element in node if isinstance(element, dict))
        raise KeyError(f"{walked} has no element named {part!r} (available: {names or '(none)'})")
    raise KeyError(f"{walked!r} is a plain value, not a group of fields")


def _figure_slot(data: dict[str, Any], key: str) -> tuple[dict[str, Any], str]:
    """The mapping and key holding the figure at dotted path ``key`` in dumped chip data."""
    parts = key.split(".")
    node: Any = data
    walked = ""
    for part in parts[:-1]:
        node = _step(node, part, walked)
        walked = _join(walked, part)
    last = parts[-1]
    _step(node, last, walked)  # raises a helpful KeyError when the field does not exist
    if not isinstance(node, dict):
        raise KeyError(f"{key!r} does not name a field")
    current = node[last]
    if current is not None and not (isinstance(current, dict) and "value" in current):
        raise KeyError(f"{key!r} is not a figure (only figures can be calibrated)")
    return node, last


# --------------------------------------------------------------------------- applying


def apply_overlay(chip: Chip, overlay: CalibrationOverlay, *, origin: str | None = None) -> Chip:
    """A new chip with ``overlay``'s values laid over ``chip``'s figures.

    Every replaced figure gets ``label: calibrated``, the fitted uncertainty, and a source
    naming the overlay (``origin``, default ``calibrated/<chip>.yaml``) and quoting the
    published value; ``chip.calibration`` records the overlay, its figures and what it was
    fitted on (:class:`hwmodels.provenance.Calibration`). ``chip`` itself is not changed. Raises InputError if the overlay is for
    another chip, names a path that is not a figure, or yields an invalid chip.
    """
    where = origin or f"calibrated/{overlay.chip}.yaml"
    if overlay.chip != chip.name:
        raise InputError(f"{where}: chip: overlay is for {overlay.chip!r}, not {chip.name!r}")
    data = chip.model_dump(mode="python")
    created = overlay.created.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    for key, fitted in overlay.parameters.items():
        try:
            parent, field_name = _figure_slot(data, key)
        except KeyError as error:
            raise InputError(f"{where}: parameters.{key}: {error.args[0]}") from None
        previous = parent[field_name]
        replaced = (
            f"published {previous['value']:.6g} ({previous['label']}: {previous['source']})"
            if previous is not None
            else "no published value"
        )
        fitted_on = fitted.fitted_on or overlay.fitted_on
        parent[field_name] = {
            "value": fitted.value,
            "uncertainty": fitted.uncertainty,
            "label": "calibrated",
            "source": f"calibrated overlay {where} ({created}), fitted on {fitted_on}; {replaced}",
        }
    data["calibration"] = Calibration(
        overlay=where, created=overlay.created, fitted_on=overlay.fitted_on,
        figures=list(overlay.parameters), coverage=overlay.coverage,
    )
    try:
        return Chip.model_validate(data)
    except ValidationError as error:
        raise InputError(format_validation_error(where, error, data)) from None


# --------------------------------------------------------------------------- files


def save_overlay(overlay: CalibrationOverlay, path: Path | str | None = None) -> Path:
    """Write ``overlay`` atomically to ``path`` (default :func:`overlay_path`); returns the path.

    An interrupted write leaves any previous overlay intact. Writing into the built-in
    catalog folder is refused: published YAMLs are never overwritten.
    """
    target = Path(path) if path is not None else overlay_path(overlay.chip)
    if target.resolve().parent == BUILTIN_DIR.resolve():
        raise InputError(
            f"{display_path(target)}: refusing to write an overlay into the published catalog"
        )
    header = (
        f"# Calibrated overlay for {overlay.chip}; written by hwmodels.overlay.save_overlay.\n"
        "# Values replace the published figures at load time; the catalog file is unchanged.\n"
    )
    body = yaml.safe_dump(
        overlay.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=100
    )
    return write_text_atomic(target, header + body)


def load_overlay(path: Path | str) -> CalibrationOverlay:
    """Read and validate an overlay file; problems become one-line InputErrors."""
    data = read_yaml_mapping(path)
    try:
        return CalibrationOverlay.model_validate(data)
    except ValidationError as error:
        raise InputError(format_validation_error(display_path(path), error, data, schema=None)) from None
