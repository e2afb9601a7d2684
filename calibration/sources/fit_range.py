"""What a fit was fitted on, by dimension: the record an overlay keeps of its points.

:func:`fit_coverage` turns the calibration points of a fit into a
:class:`hwmodels.provenance.FitCoverage` (model families, format variants, chip counts,
batches, backends). The overlay stores it, and every prediction made with that overlay
compares its own model, format and chip count against it
(:meth:`hwmodels.provenance.Calibration.warnings`).
"""

from __future__ import annotations

from collections.abc import Sequence

from calibration.sources.measurements import Measurement
from hwmodels.provenance import FitCoverage, model_family_and_format


def fit_coverage(records: Sequence[Measurement]) -> FitCoverage:
    """The distinct models, formats, chip counts, batches and backends of ``records``."""
    split = [model_family_and_format(record.model) for record in records]
    return FitCoverage(
        models=sorted({family for family, _ in split}),
        formats=sorted({variant for _, variant in split}),
        chip_counts=sorted({record.system.chips for record in records}),
        batches=sorted({record.batch for record in records}),
        backends=sorted({record.backend for record in records}),
    )
