"""``tpusim overlays``: list, show and remove the calibrated overlays of the local folder.

Usage::

    tpusim overlays [list]                 # one row per overlay: chip, fitted on, when, errors
    tpusim overlays show tpu-v7 [--json]   # one overlay: provenance, errors, every parameter
    tpusim overlays remove tpu-v7          # delete it: the published figures apply again
    tpusim overlays list --local-dir DIR   # the overlays of another local folder

An overlay (:mod:`hwmodels.overlay`) is what ``tpusim calibrate`` saved in
``<local dir>/calibrated/<chip>.yaml``; every command taking ``--hardware`` applies it
unless ``--uncalibrated``. The errors are those of the fit that wrote it (fractions in
JSON, per cent on the terminal); an overlay written before they were recorded shows "—".
"""

from __future__ import annotations

import argparse

from hwmodels.files import display_path, local_dir
from hwmodels.overlay import load_overlay, overlay_path, overlay_paths, remove_overlay
from tpusim.app.tables import TableData, add_format_option, emit, output_format

ERROR_COLUMNS = (("mape_calibration", "fitted MAPE"), ("mape_holdout", "held-out MAPE"))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "overlays", help="list, show and remove calibrated overlays",
        description="The calibrated overlays `tpusim calibrate` saved in the local folder "
        "(--local-dir / TPUSIM_LOCAL_DIR): what each was fitted on, when, and its errors.")
    add_format_option(parser)
    parser.set_defaults(func=run_list)
    actions = parser.add_subparsers(dest="overlays_command", metavar="ACTION",
                                    help="list (the default), show CHIP, or remove CHIP")
    listing = actions.add_parser("list", help="one row per overlay",
                                 description="One row per calibrated overlay of the local folder.")
    add_format_option(listing)
    listing.set_defaults(func=run_list)
    show = actions.add_parser("show", help="one overlay in full",
                              description="One overlay: what it was fitted on, when, its errors and "
                              "every fitted parameter.")
    show.add_argument("chip", help="chip name (see `tpusim overlays list`)")
    add_format_option(show)
    show.set_defaults(func=run_show)
    remove = actions.add_parser("remove", help="delete one overlay (published figures apply again)",
                                description="Delete the calibrated overlay of one chip.")
    remove.add_argument("chip", help="chip name (see `tpusim overlays list`)")
    remove.set_defaults(func=run_remove)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def run_list(args: argparse.Namespace) -> int:
    columns = ["chip", "created (UTC)", "measurements", "fitted on", *(name for _, name in ERROR_COLUMNS), "file"]
    table = TableData(title=f"Calibrated overlays in {display_path(local_dir() / 'calibrated')}",
                      columns=columns, records=[])
    for path in overlay_paths():
        overlay = load_overlay(path)
        table.add(overlay.chip, overlay.created.strftime("%Y-%m-%d %H:%M"), overlay.measurements or "—",
                  overlay.fitted_on, *(_pct(overlay.errors.get(key)) for key, _ in ERROR_COLUMNS),
                  display_path(path))
        table.records.append({"chip": overlay.chip, "created": overlay.created.isoformat(),
                              "measurements": overlay.measurements, "fitted_on": overlay.fitted_on,
                              "errors": overlay.errors, "parameters": sorted(overlay.parameters),
                              "file": str(path)})
    fmt = output_format(args)
    notes = [] if fmt == "json" or table.rows else ["no calibrated overlays: every command uses published figures"]
    emit(table, fmt, notes=notes)
    return 0


def run_show(args: argparse.Namespace) -> int:
    path = overlay_path(args.chip)
    if not path.is_file():
        remove_overlay(args.chip)  # raises the one-line "no overlay for ..." error
    overlay = load_overlay(path)
    fmt = output_format(args)
    table = TableData(title=f"{overlay.chip}: calibrated overlay {display_path(path)}",
                      columns=["parameter", "value", "1σ", "fitted on"],
                      records=overlay.model_dump(mode="json", exclude={"samples"}))
    for key, fitted in overlay.parameters.items():
        table.add(key, f"{fitted.value:.6g}", "—" if fitted.uncertainty is None else f"{fitted.uncertainty:.3g}",
                  fitted.fitted_on or overlay.fitted_on)
    errors = ", ".join(f"{key} {_pct(value)}" for key, value in overlay.errors.items()) or "not recorded"
    notes = [] if fmt == "json" else [
        f"created: {overlay.created.strftime('%Y-%m-%d %H:%M UTC')}",
        f"measurements: {overlay.measurements or 'not recorded'}",
        f"fitted on: {overlay.fitted_on}",
        f"errors: {errors}",
        f"prediction intervals: {len(overlay.samples)} sampled parameter sets",
    ]
    emit(table, fmt, notes=notes)
    return 0


def run_remove(args: argparse.Namespace) -> int:
    path = remove_overlay(args.chip)
    print(f"removed {display_path(path)}: {args.chip} uses its published figures again")
    return 0
