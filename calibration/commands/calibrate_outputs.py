"""What ``tpusim calibrate`` prints and saves beside a fit: the uncertainty lines, the
refusals (:mod:`calibration.reports.trust`) and the provenance an overlay records.

Shared by the end-to-end, part-by-part and serving-stack paths of
:mod:`calibration.commands.calibrate` and :mod:`calibration.commands.calibrate_stacks`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from hwmodels.atomic import write_text_atomic
from hwmodels.catalog import display_path
from hwmodels.errors import InputError

if TYPE_CHECKING:
    from calibration.reports.trust import Refusal


def uncertainty_lines(calibration: dict) -> list[str]:
    """Per measurement set the three errors, then the model error and the coverage."""

    def pct(value: float | None) -> str:
        return "—" if value is None else f"{100 * value:.1f} %"

    lines = []
    for name, e in calibration["errors"].items():
        lines.append(f"{name} ({e['points']} points): priors only {pct(e['priors_only'])}, parts only "
                     f"{pct(e['parts_only'])}, fitted {pct(e['fitted'])}, held out (leave-one-group-out "
                     f"refits) {pct(e['held_out'])}")
    error = calibration.get("model_error")
    if error:
        lines.append(f"model error (out of sample, {error['points']} residuals): ±{pct(error['in_range_rel'])} "
                     f"inside the fit, ±{pct(error['extrapolated_rel'])} outside it"
                     + ("" if error["exact"] else " (too few residuals for a 90 % rank: the largest)"))
    cover = calibration.get("coverage")
    if cover:
        lines.append(f"coverage: {cover['inside']}/{cover['points']} held-out points inside their interval = "
                     f"{pct(cover['empirical'])} (nominal {pct(cover['nominal'])}); mean width "
                     f"{pct(cover['mean_width_rel'])} of the prediction ({cover['mean_width_ms']:.3f} ms)")
    return lines


def allowed_overrides(args: argparse.Namespace) -> set[str]:
    """The refusal overrides given (:class:`calibration.reports.trust.Refusal.override`)."""
    flags = {"--allow-unconverged": args.allow_unconverged, "--allow-at-bounds": args.allow_at_bounds}
    return {flag for flag, given in flags.items() if given}


def record_refusals(summary: dict, refusals: list[Refusal], args: argparse.Namespace) -> list[Refusal]:
    """Put the refusals into the fit's JSON; return those no given flag overrides."""
    from calibration.reports.trust import unresolved

    blocking = unresolved(refusals, allowed_overrides(args))
    summary["refusals"] = [{"reason": r.reason, "override": r.override, "overridden": r not in blocking}
                           for r in refusals]
    summary["refused"] = bool(blocking)
    return blocking


def append_refusals(report: Path, refusals: list[Refusal], blocking: list[Refusal]) -> None:
    """Add the checks' verdict to ``report.md`` (a refused fit still writes its report)."""
    if not refusals:
        return
    heading = "## Refused: overlay not saved" if blocking else "## Kept despite failed checks"
    lines = [f"- {r.reason}" + (" (overridden)" if r not in blocking else "") for r in refusals]
    write_text_atomic(report, report.read_text() + "\n" + heading + "\n\n" + "\n".join(lines) + "\n")


def print_refusals(stdout: Console, refusals: list[Refusal], blocking: list[Refusal]) -> None:
    for refusal in refusals:
        word = "REFUSED" if refusal in blocking else f"warning (kept: {refusal.override})"
        stdout.print(f"{word}: {refusal.reason}", highlight=False, markup=False)


def not_saved(args: argparse.Namespace, blocking: list[Refusal]) -> str:
    return "not saved (" + ("refused, see above" if blocking else "--no-save") + ")"


def refuse(blocking: list[Refusal], report: Path) -> None:
    """Exit 2 (one line on stderr) when the checks refused the fit."""
    from calibration.reports.trust import refusal_message

    if blocking:
        raise InputError(refusal_message(blocking, display_path(report)))


def provenance(args: argparse.Namespace, errors: dict) -> dict:
    """What ``tpusim overlays`` shows beside the fit: the measurement set and the errors."""
    return {"measurements": args.measurements,
            "errors": {key: value for key, value in errors.items() if value is not None}}
