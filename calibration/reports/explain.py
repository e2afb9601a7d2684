"""``tpusim calibrate --explain``: the table of calibratable figures for one chip.

One row per figure of :data:`calibration.core.parameters.PARAMETERS` that the chip has and
that is calibrated on its kind: name, unit, the catalog path it overrides, its bounds (the
rule and the values for this chip), its prior (the chip's catalog value, with the catalog's
label and source, or, for a figure the catalog does not carry, the prior the table declares)
and what in the data pins it. Nothing is fitted.
"""

from __future__ import annotations

from calibration.core.parameters import PARAMETERS
from hwmodels.overlay import iter_figures
from hwmodels.schema import Chip


def explain_rows(chip: Chip) -> list[dict[str, str]]:
    """The table's rows for ``chip`` (see the module docstring)."""
    figures = dict(iter_figures(chip))
    rows = []
    for p in PARAMETERS:
        if chip.kind not in p.bounds or (p.path not in figures and p.prior is None):
            continue
        lower, upper = p.bounds_for(chip)
        if p.path in figures:
            prior, source = f"{figures[p.path].value:.4g} ({figures[p.path].label})", figures[p.path].source
        else:  # a figure the catalog does not carry: the prior the table declares
            prior, source = f"{p.prior:.4g} (declared in the table; not in the catalog)", p.prior_source
        rows.append({"name": p.name, "unit": p.unit, "path": p.path,
                     "bounds": f"{lower:.4g} .. {upper:.4g} ({p.bound(chip.kind).text()})",
                     "prior": prior, "source": source, "pinned by": p.why})
    return rows


def explain_lines(chip: Chip) -> list[str]:
    """The rows as a Markdown table (the catalog's source text in full: it is the prior's citation)."""
    rows = explain_rows(chip)
    keys = ["name", "unit", "path", "bounds", "prior", "source", "pinned by"]
    lines = [f"Calibratable figures of {chip.name} ({chip.kind}; calibration.core.parameters):", "",
             "| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(row[k].replace("|", "/") for k in keys) + " |" for row in rows]
    return lines
