"""Calibrated or not: the one place a loaded chip says which figures were fitted, and on what.

A chip loaded with its calibrated overlay (:func:`hwmodels.catalog.load_chip`) carries a
:class:`Calibration` in ``chip.calibration``; a chip with published figures only carries
``None``. Every label that says *calibrated* or *simulated* reads this property
(:attr:`hwmodels.schema.Chip.is_calibrated`), never the figures' labels or a source string.

What a fit saw
--------------
A fit is only trustworthy near the points it was fitted on. :class:`FitCoverage` records
them (models, chip counts, format variants, batches, backends), so a prediction elsewhere
can say so::

    calibrated on 8 points: muse-spark@{nvfp4+bf16,nvfp4+int8} b1..8 on tpu-v7x4
    warning: kimi-k3 was not among the fitted models (muse-spark)
    warning: 16 chips was not among the fitted chip counts (4)

A model spec ``name@variant[overrides]`` names a model family (``name``) and a format
variant (``variant``; ``default`` when absent): :func:`model_family_and_format`.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_FORMAT = "default"


def model_family_and_format(spec: str) -> tuple[str, str]:
    """(model family, format variant) of a model spec: ``muse-spark@int4+bf16[layers=4]`` →
    ``("muse-spark", "int4+bf16")``; no ``@variant`` → ``"default"``. A path keeps its stem."""
    base = spec.partition("[")[0]
    name, _, variant = base.partition("@")
    if name.endswith((".yaml", ".yml", ".json")):
        name = name.replace("\\", "/").rsplit("/", 1)[-1]
    return name, variant or DEFAULT_FORMAT


class FitCoverage(BaseModel):
    """The points a calibration was fitted on, by dimension (sorted, distinct)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: list[str] = Field(default_factory=list, description="model families, e.g. muse-spark")
    formats: list[str] = Field(default_factory=list, description="format variants ('default' when none)")
    chip_counts: list[int] = Field(default_factory=list, description="chips per system")
    batches: list[int] = Field(default_factory=list, description="batch sizes")
    backends: list[str] = Field(default_factory=list, description="where the measurements ran")

    def gaps(self, model_spec: str, chips: int, batch: int | None = None) -> list[str]:
        """One sentence per dimension where (``model_spec``, ``chips``, ``batch``) lies outside
        the fit (a batch outside the fitted range; none given: not checked)."""
        family, variant = model_family_and_format(model_spec)
        gaps = []
        if self.models and family not in self.models:
            gaps.append(f"{family} was not among the fitted models ({', '.join(self.models)})")
        if self.formats and variant not in self.formats:
            gaps.append(f"format {variant} was not among the fitted formats ({', '.join(self.formats)})")
        if self.chip_counts and chips not in self.chip_counts:
            counts = ", ".join(str(count) for count in self.chip_counts)
            gaps.append(f"{chips} chips was not among the fitted chip counts ({counts})")
        if batch is not None and self.batches and not min(self.batches) <= batch <= max(self.batches):
            gaps.append(f"batch {batch} lies outside the fitted batches ({min(self.batches)}..{max(self.batches)})")
        return gaps


class Calibration(BaseModel):
    """Which figures of a chip come from a calibrated overlay, and what that fit was run on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    overlay: str = Field(description="the overlay file applied (as displayed)")
    created: datetime = Field(description="when the fit was made (UTC)")
    fitted_on: str = Field(min_length=1, description="what the fit as a whole was run on")
    figures: list[str] = Field(description="dotted paths of the calibrated figures")
    coverage: FitCoverage | None = Field(
        default=None, description="the fitted points by dimension (None: an older overlay)"
    )

    def note(self) -> str:
        """``calibrated on <what> (2 figures: a, b; overlay <file>)``."""
        count = len(self.figures)
        shown = ", ".join(self.figures[:4]) + (f", +{count - 4} more" if count > 4 else "")
        return (f"calibrated on {self.fitted_on} ({count} figure{'s' if count != 1 else ''}: {shown}; "
                f"overlay {self.overlay})")

    def warnings(self, model_spec: str, chips: int, batch: int | None = None) -> list[str]:
        """Why a prediction for ``model_spec`` on ``chips`` chips (at ``batch``) extrapolates from the fit."""
        if self.coverage is None:
            return [f"the overlay {self.overlay} does not record its fitted points; "
                    "recalibrate to check coverage"]
        return self.coverage.gaps(model_spec, chips, batch)
