"""``tpusim calibrate`` and ``tpusim report``: fit hardware figures to measured step times.

Usage::

    tpusim calibrate --hardware tpu-v7 --measurements published:tpu7x-musespark \\
        --holdout format=int4+bf16 --out calib/tpu-v7 [--json] [--uncalibrated-start]
    tpusim calibrate --hardware host-cpu --measurements cpu-loop [--quick] --out calib/host
    tpusim report --hardware tpu-v7 --measurements published:tpu7x-musespark [--out DIR]

``calibrate`` predicts every measurement with the published figures (*simulated,
uncalibrated*), fits the chip's identifiable figures by bounded least squares
(:mod:`calibration.fit`), writes the overlay to ``<local dir>/calibrated/<chip>.yaml``
(atomically; the published catalog YAML is never written) and a report to ``--out``:
``report.md`` (tables), ``scatter.png``, ``fit.json``, ``measurements.jsonl`` (the points
used). Every command taking ``--hardware`` then uses the overlay unless ``--uncalibrated``.
``--measurements cpu-loop`` runs the CPU closed loop (:mod:`calibration.cpu_loop`): probe
this host, time jitted decode steps, fit ``host-cpu``.

``--json`` prints ``mape_before``, ``mape_calibration``, ``mape_holdout`` (fractions; None
when nothing is held out) and ``parameters`` (``value``, ``uncertainty``, ``fitted_on``, …).

``--procedure parts`` (the default for tpu-v7) fits each part on its own measurements
first (:mod:`calibration.parts`: links, HBM, host, expert-slot sweep, Muse breakdown; the
component data is ``--components``), reports the end-to-end MAPE with those values *before*
fitting on the step times (``mape_e2e_parts_only``), then fits the rest on them
(``mape_calibration``, ``mape_holdout``); ``parts`` holds per-part errors, ``pins`` which
parameters each measurement constrains, ``unidentifiable_held`` what the data cannot pin.
Either procedure stores sampled parameter sets in the overlay for 90 % prediction
intervals (:mod:`calibration.intervals`).

``report`` fits nothing: it compares a measurement file with the simulator, uncalibrated and
(if an overlay exists) calibrated.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from calibration.fit import FitResult, fit_chip, save_fit
from calibration.loaders import load_measurements, usable_for
from calibration.measurements import write_measurements
from calibration.params import parse_parameters
from calibration.predict import Predictor
from calibration.report import (
    comparison_report,
    comparison_rows,
    error_summary,
    rows_from_fit,
    scatter_plot,
    write_fit_report,
)
from hwmodels.atomic import write_text_atomic
from hwmodels.catalog import display_path, load_chip
from hwmodels.errors import InputError
from hwmodels.overlay import has_overlay, overlay_path
from tpusim.app.cli.common import emit_json

CPU_LOOP = ("cpu-loop", "cpu-loop-quick")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    calibrate = subparsers.add_parser(
        "calibrate",
        help="fit hardware figures to measured step times; write a calibrated overlay",
        description="Fit a chip's identifiable figures to measurements and report the error "
        "before and after, on calibration and held-out points.",
    )
    calibrate.add_argument("--hardware", required=True, help="catalog chip (tpu-v7, host-cpu, ...)")
    calibrate.add_argument(
        "--measurements", required=True,
        help="a .jsonl file, published:tpu7x-musespark, or cpu-loop (measure this host)",
    )
    calibrate.add_argument("--holdout", default=None,
                           help="points to hold out: key=value[|value][;key=value], keys format, batch, "
                           "width, model, context, backend, index (e.g. format=int4+bf16)")
    calibrate.add_argument("--parameters", default=None,
                           help="comma-separated figure paths to fit (default: the chip's justified set)")
    calibrate.add_argument("--out", type=Path, required=True, help="folder for report.md, scatter.png, fit.json")
    calibrate.add_argument("--json", action="store_true", help="print the fit as JSON")
    calibrate.add_argument("--uncalibrated-start", action="store_true",
                           help="start from the published figures even if an overlay exists")
    calibrate.add_argument("--no-save", action="store_true", help="do not write the overlay")
    calibrate.add_argument("--max-evals", type=int, default=30, help="least-squares evaluations (default 30)")
    calibrate.add_argument("--procedure", choices=("auto", "parts", "end-to-end"), default="auto",
                           help="parts: fit each part on its own measurements, then the end-to-end points "
                           "(default where component data exists: tpu-v7); end-to-end: one fit on step times")
    calibrate.add_argument("--components", default="published:tpu7x-components",
                           help="component measurements for --procedure parts (default published:tpu7x-components)")
    calibrate.add_argument("--quick", action="store_true", help="cpu-loop: the small CI variant")
    calibrate.add_argument("--no-probe", action="store_true",
                           help="cpu-loop: reuse the saved host-cpu entry instead of probing again")
    calibrate.set_defaults(func=run_calibrate)

    report = subparsers.add_parser(
        "report",
        help="predicted vs measured for a measurement file (no fitting)",
        description="Compare measurements with the simulator: published figures and, if an "
        "overlay exists, calibrated ones.",
    )
    report.add_argument("--hardware", required=True, help="catalog chip the measurements ran on")
    report.add_argument("--measurements", required=True, help="a .jsonl file or published:<name>")
    report.add_argument("--out", type=Path, default=None, help="write report.md and scatter.png here")
    report.add_argument("--json", action="store_true", help="print rows and errors as JSON")
    report.add_argument("--uncalibrated", action="store_true", help="ignore any calibrated overlay")
    report.set_defaults(func=run_report)


# --------------------------------------------------------------------------- calibrate


def _fit(args: argparse.Namespace, console: Console) -> tuple[FitResult, list]:
    if args.measurements in CPU_LOOP:
        from calibration.cpu_loop import CpuLoopConfig, run_cpu_loop

        if args.hardware != "host-cpu":
            raise InputError("--measurements cpu-loop calibrates host-cpu; use --hardware host-cpu")
        config = CpuLoopConfig.quick() if args.quick or args.measurements == "cpu-loop-quick" else CpuLoopConfig()
        return run_cpu_loop(config, probe=not args.no_probe, holdout=args.holdout,
                            progress=lambda line: console.print(f"  {line}", highlight=False))
    published = load_chip(args.hardware, calibrated=False)
    records = usable_for(load_measurements(args.measurements), published.name, published.kind)
    start = None if args.uncalibrated_start else load_chip(args.hardware, calibrated=True)
    parameters = parse_parameters(args.parameters, published) if args.parameters else None
    result = fit_chip(published, records, parameters=parameters, holdout=args.holdout, start=start,
                      predictor=Predictor(), max_nfev=args.max_evals)
    return result, records


def _use_parts(args: argparse.Namespace) -> bool:
    if args.procedure != "auto":
        return args.procedure == "parts"
    return args.hardware == "tpu-v7" and args.measurements not in CPU_LOOP and not args.parameters


def _run_parts(args: argparse.Namespace, console: Console) -> int:
    """``--procedure parts``: components first, then the end-to-end points (calibration.by_parts)."""
    from calibration.by_parts import calibrate_by_parts
    from calibration.components import load_components
    from hwmodels.overlay import save_overlay

    if not args.components.startswith("published:"):
        raise InputError(f"--components {args.components}: expected published:<name>")
    published = load_chip(args.hardware, calibrated=False)
    records = usable_for(load_measurements(args.measurements), published.name, published.kind)
    components = load_components(args.components.removeprefix("published:"))
    result = calibrate_by_parts(published, records, components, holdout=args.holdout, predictor=Predictor(),
                                max_nfev=min(args.max_evals, 12))
    out = Path(args.out)
    paths = write_fit_report(result.e2e, out, predictor=Predictor())
    summary = result.to_json()
    write_text_atomic(out / "fit.json", json.dumps(summary, indent=2, default=float) + "\n")
    write_measurements(out / "measurements.jsonl", records)
    saved = None if args.no_save else save_overlay(result.overlay())
    summary["overlay"] = str(saved) if saved else None
    summary["report"] = str(paths["report"])
    if args.json:
        emit_json(summary)
        return 0
    stdout = Console()
    for name, part in summary["parts"].items():
        before, after = part["mape_before"], part["mape_after"]
        stdout.print(f"part {name}: MAPE {100 * before:.1f} % (published) -> {100 * after:.1f} % (fitted on it)",
                     highlight=False)
    stdout.print(f"end to end: MAPE {100 * summary['mape_e2e_published']:.1f} % (published), "
                 f"{100 * summary['mape_e2e_parts_only']:.1f} % (parts only, not fitted on it), "
                 f"{100 * summary['mape_calibration']:.1f} % (fitted on it)"
                 + (f", held out {100 * summary['mape_holdout']:.1f} %" if summary["mape_holdout"] is not None else ""),
                 highlight=False)
    for path, p in summary["parameters"].items():
        sigma = f" ± {p['uncertainty']:.3g}" if p["uncertainty"] is not None else ""
        stdout.print(f"{path}: {p['value']:.4g}{sigma} (calibrated; {p['fitted_on']})", highlight=False)
    for path, why in summary["unidentifiable_held"].items():
        stdout.print(f"{path}: unidentifiable on this data, held ({why})", highlight=False)
    stdout.print(f"prediction intervals: {summary['interval_samples']} sampled parameter sets stored", highlight=False)
    stdout.print(f"overlay: {display_path(saved) if saved else 'not saved (--no-save)'}", highlight=False)
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    console.print(f"calibrating {args.hardware} on {args.measurements} ...", highlight=False)
    if _use_parts(args):
        return _run_parts(args, console)
    result, records = _fit(args, console)
    out = Path(args.out)
    paths = write_fit_report(result, out, predictor=Predictor())
    write_text_atomic(out / "fit.json", json.dumps(result.to_json(), indent=2, default=float) + "\n")
    write_measurements(out / "measurements.jsonl", records)
    saved = None if args.no_save else save_fit(result, samples=True)
    summary = result.to_json()
    summary["overlay"] = str(saved) if saved else None
    summary["report"] = str(paths["report"])
    if args.json:
        emit_json(summary)
        return 0
    stdout = Console()
    stdout.print(error_summary(rows_from_fit(result)), highlight=False)
    for p in result.parameters:
        sigma = f" ± {p.uncertainty:.4g}" if p.uncertainty is not None else ""
        flag = " (at bound)" if p.at_bound else ""
        stdout.print(f"{p.path}: {p.published:.4g} (published) -> {p.value:.4g}{sigma} (calibrated){flag}",
                     highlight=False)
    stdout.print(f"report: {display_path(paths['report'])}", highlight=False)
    stdout.print(f"overlay: {display_path(saved) if saved else 'not saved (--no-save)'}", highlight=False)
    return 0


# --------------------------------------------------------------------------- report


def run_report(args: argparse.Namespace) -> int:
    published = load_chip(args.hardware, calibrated=False)
    records = [r for r in load_measurements(args.measurements) if r.system.chip == published.name]
    if not records:
        raise InputError(f"--measurements {args.measurements}: no records measured on {published.name}")
    predictor = Predictor()
    before = [predictor.predict(published, r) for r in records]
    calibrated = None
    if not args.uncalibrated and has_overlay(published.name):
        calibrated = load_chip(published.name, calibrated=True)
    after = [predictor.predict(calibrated, r) for r in records] if calibrated else None
    note = (
        f"*simulated, calibrated* uses the overlay {display_path(overlay_path(published.name))}."
        if calibrated else "No calibrated overlay in use: every prediction uses the published figures."
    )
    rows = comparison_rows(records, before, after)
    text = comparison_report(rows, published, calibrated_note=note)
    if args.out:
        folder = Path(args.out)
        plot = scatter_plot(rows, folder / "scatter.png", title=f"predicted vs measured, {published.name}")
        write_text_atomic(folder / "report.md", text + f"\n![predicted vs measured]({plot.name})\n")
    if args.json:
        emit_json({
            "chip": published.name, "calibrated_overlay": str(overlay_path(published.name)) if calibrated else None,
            "points": [
                {"key": row.record.key(), "measured_ms": row.record.ms_per_step_median,
                 "measured_backend": row.record.backend,
                 "simulated_uncalibrated_ms": row.before_s * 1e3,
                 "simulated_calibrated_ms": None if row.after_s is None else row.after_s * 1e3}
                for row in rows
            ],
        })
        return 0
    Console().print(text, highlight=False, markup=False)
    return 0
