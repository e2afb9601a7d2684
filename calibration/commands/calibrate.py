"""``tpusim calibrate`` and ``tpusim report``: fit hardware figures to measured step times.

Usage::

    tpusim calibrate --hardware tpu-v7 --measurements published:tpu7x-musespark \\
        --holdout format=int4+bf16 --out calib/tpu-v7 [--json] [--uncalibrated-start]
    tpusim calibrate --hardware host-cpu --measurements cpu-loop [--quick] --out calib/host
    tpusim calibrate --hardware b200 --measurements published:b200-vllm-qwen3.5 --out calib/b200
    tpusim calibrate --hardware b300 --measurements published:b300-sglang-k3 --out calib/b300
    tpusim calibrate --hardware tpu-v5e --measurements calibration/data/tpu-v5e-kernel.jsonl [--out DIR]
    tpusim calibrate --explain --hardware tpu-v7     # the table of calibratable figures; fits nothing
    tpusim report --hardware tpu-v7 --measurements published:tpu7x-musespark [--out DIR]

``calibrate`` predicts every measurement with the published figures (*simulated,
uncalibrated*), fits the chip's identifiable figures by bounded least squares
(:mod:`calibration.sources.step_times`), writes the overlay to ``<local dir>/calibrated/<chip>.yaml``
(atomically; the published catalog YAML is never written) and a report to ``--out``:
``report.md`` (tables), ``scatter.png``, ``fit.json``, ``measurements.jsonl`` (the points
used). Every command taking ``--hardware`` then uses the overlay unless ``--uncalibrated``.
A file written by :mod:`calibration.gpu_bench` (micro-benchmarks and whole steps) is fitted
on its micro-benchmarks only and predicts the held-out steps (:mod:`calibration.sources.gpu_micro`;
``--holdout kind=decode_step``, the default for such a file).
``--measurements cpu-loop`` runs the CPU closed loop (:mod:`calibration.sources.cpu_loop`): probe
this host, time jitted decode steps, fit ``host-cpu``.

The terminal summary (:mod:`calibration.commands.fit_summary`) gives the solver's convergence, the
errors before / after / leave-one-out / held out, every parameter with its 95 % interval and
identifiability, and the points the overlay was fitted on. A solve that stops before
converging exits 2 without saving the overlay unless ``--allow-unconverged``.

Refused fits
------------
Before saving, the fit is checked (:mod:`calibration.reports.trust`, thresholds and why there):
units sane (step times ≈ 1000× their prediction are reported as a likely unit error),
solver converged, no parameter at a bound, fitted rates physically plausible against the
chip's published (or probed) peaks, median error on the fitted points ≤ 25 %. A fit that
fails any check still writes ``report.md`` (with a "Refused" section), ``fit.json``
(``refusals``, ``refused``) and ``measurements.jsonl``, saves **no** overlay, and exits 2
with one line on stderr naming every reason. ``--allow-unconverged`` and
``--allow-at-bounds`` keep a fit despite those two checks (the terminal still says so); the
others have no override. A saved overlay records the measurement set and the fit's errors
(``tpusim overlays list|show|remove``).

``--json`` prints ``mape_before``, ``mape_calibration``, ``mape_holdout`` (fractions; None
when nothing is held out) and ``parameters`` (``value``, ``uncertainty``, ``fitted_on``, …).

``--measurements published:b200-vllm-qwen3.5`` fits the GPU serving stack's figures on a
published per-stage split instead (:mod:`calibration.sources.gpu_stack`); its ``--json`` gives
``before`` / ``after`` (``group_us``, ``errors``, ``stage_us``, ``stage_errors``, ``step_us``),
``parameters``, ``within_tolerance`` and ``overlay``.

The procedure is chosen by calibration from the chip and the data
(:func:`calibration.sources.registry.recognise`), unless ``--procedure`` says otherwise; every
procedure's ``--json`` has ``calibration`` (:class:`calibration.core.result.CalibrationResult`): per
measurement set the errors with priors only, parts only, fitted and held out
(leave-one-group-out refits), the model error measured out of sample and, with
``--coverage``, the empirical coverage of the 90 % intervals over the held-out groups with
the mean width (:mod:`calibration.core.model_error`).

``--measurements published:b300-sglang-k3`` fits the SGLang K3 stack on the published K3
rows on 8 x B300 (:mod:`calibration.sources.k3_b300`): ``errors``, ``holdout`` (each format held
out in turn), ``format_difference``, ``dspark_checks``, ``parameters``, ``pins``.

``--procedure parts`` (the default where component data exists: tpu-v7) fits each part on its own measurements
first (:mod:`calibration.sources.tpu_stages`: links, HBM, host, expert-slot sweep, Muse breakdown; the
component data is ``--components``), reports the end-to-end MAPE with those values *before*
fitting on the step times (``mape_e2e_parts_only``), then fits the rest on them
(``mape_calibration``, ``mape_holdout``); ``parts`` holds per-part errors, ``pins`` which
parameters each measurement constrains, ``unidentifiable_held`` what the data cannot pin.
Either procedure stores sampled parameter sets in the overlay for 90 % prediction
intervals (:mod:`calibration.core.samples`).

``--measurements <kernel records .jsonl>`` on ``tpu-v5e`` fits the chip on its own megakernel
step times, each record also predicted by refits that never saw it
(:mod:`calibration.commands.calibrate_kernel`, :mod:`calibration.sources.tpu_kernel_fit`).

``report`` fits nothing: it compares a measurement file with the simulator, uncalibrated and
(if an overlay exists) calibrated.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from calibration.commands.calibrate_outputs import (
    append_refusals,
    not_saved,
    print_refusals,
    provenance,
    record_refusals,
    refuse,
    uncertainty_lines,
)
from hwmodels.atomic import write_text_atomic
from hwmodels.catalog import display_path, load_chip
from hwmodels.errors import InputError
from hwmodels.overlay import overlay_path
from tpusim.app.cli.common import emit_json, output_folder
from tpusim.cli_options import HARDWARE_HELP, add_hardware_option, positive_int

if TYPE_CHECKING:
    from calibration.sources.registry import Source
    from calibration.sources.step_times import FitResult

# The calibration package (scipy, the engine) is imported inside the commands that use it,
# so ``tpusim --help`` and every other command stay light.

CPU_LOOP = ("cpu-loop", "cpu-loop-quick")
OUT_OPTIONAL = ("tpu kernel records",)  # sources whose runner prints its tables; --out only adds files


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``tpusim calibrate`` (the ``calibrate`` entry point of group ``tpusim.commands``)."""
    calibrate = subparsers.add_parser(
        "calibrate",
        help="fit hardware figures to measured step times; write a calibrated overlay",
        description="Fit a chip's identifiable figures to measurements and report the error "
        "before and after, on calibration and held-out points.",
    )
    add_hardware_option(calibrate, required=True, help="chip name from the catalog (tpu-v7, host-cpu, ...)")
    calibrate.add_argument(
        "--measurements", default=None,
        help="a .jsonl file, published:tpu7x-musespark, published:b300-sglang-k3 (K3 on 8 B300, SGLang), published:b200-vllm-qwen3.5 (a GPU serving "
        "stack's per-stage split), or cpu-loop (measure this host)",
    )
    calibrate.add_argument("--holdout", default=None,
                           help="points to hold out: key=value[|value][;key=value], keys format, batch, "
                           "width, model, context, backend, index, kind (e.g. format=int4+bf16, kind=decode_step)")
    calibrate.add_argument("--parameters", default=None,
                           help="comma-separated figure paths to fit (default: the chip's justified set)")
    calibrate.add_argument("--out", type=output_folder, default=None, help="folder for report.md, scatter.png, "
                           "fit.json (required unless --explain)")
    calibrate.add_argument("--explain", action="store_true",
                           help="print the table of calibratable figures for --hardware (name, unit, catalog path, "
                           "bounds, prior and its source) and exit; nothing is fitted")
    calibrate.add_argument("--json", action="store_true", help="print the fit as JSON")
    calibrate.add_argument("--uncalibrated-start", action="store_true",
                           help="start from the published figures even if an overlay exists")
    calibrate.add_argument("--no-save", action="store_true", help="do not write the overlay")
    calibrate.add_argument("--max-evals", type=positive_int, default=30,
                           help="least-squares evaluations before the solver stops (default 30)")
    calibrate.add_argument("--allow-unconverged", action="store_true",
                           help="save the overlay and exit 0 even when the solver stopped before "
                           "converging (default: exit 2, overlay not saved)")
    calibrate.add_argument("--allow-at-bounds", action="store_true",
                           help="save the overlay even when a fitted parameter stopped at one of its "
                           "physical bounds (default: exit 2, overlay not saved)")
    calibrate.add_argument("--procedure", choices=("auto", "parts", "end-to-end"), default="auto",
                           help="parts: fit each part on its own measurements, then the end-to-end points "
                           "(default where component data exists: tpu-v7); end-to-end: one fit on step times")
    calibrate.add_argument("--components", default="published:tpu7x-components",
                           help="component measurements for --procedure parts (default published:tpu7x-components)")
    calibrate.add_argument("--coverage", action="store_true",
                           help="also report the empirical coverage of the 90 %% intervals over "
                           "leave-one-group-out folds, with the mean interval width (calibration.core.model_error)")
    calibrate.add_argument("--holdout-dimensions", default=None, metavar="DIM[,DIM]",
                           help="leave-one-group-out refits over these point dimensions only (format, batch, "
                           "model, chips; kernel records: schedule, batch; default every one the points vary "
                           "in): fewer refits, fewer out-of-sample residuals behind the model error")
    calibrate.add_argument("--quick", action="store_true", help="cpu-loop: the small CI variant")
    calibrate.add_argument("--no-probe", action="store_true",
                           help="cpu-loop: reuse the saved host-cpu entry instead of probing again")
    # flags the chosen path ignores are refused (tpusim.app.cli.flag_rules), before any work
    calibrate.set_defaults(func=run_calibrate, output_lock="folder", flag_rules=(
        ("quick", _cpu_loop_only), ("no_probe", _cpu_loop_only), ("max_evals", _not_cpu_loop)))


def _cpu_loop_only(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "measurements", None) not in CPU_LOOP:
        return "used only with --measurements cpu-loop (the CPU closed loop on this host)"
    return None


def _not_cpu_loop(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "measurements", None) in CPU_LOOP:
        return "not used by --measurements cpu-loop (its fit sets its own limits; --quick makes it small)"
    return None


def register_report(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``tpusim report`` (the ``report`` entry point of group ``tpusim.commands``)."""
    report = subparsers.add_parser(
        "report",
        help="predicted vs measured for a measurement file (no fitting)",
        description="Compare measurements with the simulator: published figures and, if an "
        "overlay exists, calibrated ones.",
    )
    add_hardware_option(report, required=True, help=f"{HARDWARE_HELP}: the chip the measurements ran on")
    report.add_argument("--measurements", required=True, help="a .jsonl file or published:<name>")
    report.add_argument("--out", type=output_folder, default=None, help="write report.md and scatter.png here")
    report.add_argument("--json", action="store_true", help="print rows and errors as JSON")
    report.add_argument("--uncalibrated", action="store_true", help="ignore any calibrated overlay")
    report.set_defaults(func=run_report, output_lock="folder")


# --------------------------------------------------------------------------- calibrate


def _fit(args: argparse.Namespace, console: Console) -> tuple[FitResult, list]:
    from calibration.core.parameters import parse_parameters
    from calibration.sources.loaders import load_measurements, usable_for
    from calibration.sources.predict import Predictor
    from calibration.sources.step_times import fit_chip

    if args.measurements in CPU_LOOP:
        from calibration.sources.cpu_loop import CpuLoopConfig, run_cpu_loop

        if args.hardware != "host-cpu":
            raise InputError("--measurements cpu-loop calibrates host-cpu; use --hardware host-cpu")
        config = CpuLoopConfig.quick() if args.quick or args.measurements == "cpu-loop-quick" else CpuLoopConfig()
        return run_cpu_loop(config, probe=not args.no_probe, holdout=args.holdout,
                            progress=lambda line: console.print(f"  {line}", highlight=False))
    published = load_chip(args.hardware, calibrated=False)
    records = usable_for(load_measurements(args.measurements), published.name, published.kind)
    start = None if args.uncalibrated_start else load_chip(args.hardware, calibrated=True)
    from calibration.sources.gpu_micro import fit_micro, is_micro_set

    if is_micro_set(records):  # calibration.gpu_bench output: fit micro-benchmarks, predict steps
        if args.parameters:
            raise InputError("--parameters: a gpu_bench file fits its fixed micro-model figures "
                             "(calibration.sources.gpu_micro); drop --parameters")
        return fit_micro(published, records, holdout=args.holdout, start=start), records
    parameters = parse_parameters(args.parameters, published) if args.parameters else None
    result = fit_chip(published, records, parameters=parameters, holdout=args.holdout, start=start,
                      predictor=Predictor(), max_nfev=args.max_evals)
    return result, records


def _dimensions(args: argparse.Namespace) -> list[str] | None:
    """``--holdout-dimensions`` as a list (None: every dimension)."""
    value = getattr(args, "holdout_dimensions", None)
    if not value:
        return None
    from calibration.sources.splits import GROUP_DIMENSIONS as known

    dims = [d.strip() for d in value.split(",") if d.strip()]
    unknown = [d for d in dims if d not in known]
    if unknown:
        raise InputError(f"--holdout-dimensions: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return dims


def _source(args: argparse.Namespace) -> Source:
    """The source to fit: the one ``--procedure`` names when given, else the one the registry
    recognises from the chip and the data (:func:`calibration.sources.registry.recognise`)."""
    from calibration.sources.registry import Request, recognise, source
    from calibration.sources.tpu_components import has_components

    if args.procedure != "auto":
        return source("part by part" if args.procedure == "parts" else "end to end")
    if args.measurements in CPU_LOOP:  # the loop probes this host first: no host entry to read yet
        return source("cpu loop")
    from calibration.commands.calibrate_kernel import is_kernel_records

    chip = load_chip(args.hardware, calibrated=False)
    return recognise(Request(chip, args.measurements, kernel_records=is_kernel_records(args),
                             has_components=has_components(chip.name, args.components),
                             parameters_given=bool(args.parameters)))


def _announce(args: argparse.Namespace, source: Source) -> Console:
    console = Console(stderr=True)
    console.print(f"calibrating {args.hardware} on {args.measurements} ({source.name}) ...", highlight=False)
    return console


def run_parts(args: argparse.Namespace, source: Source) -> int:
    """``--procedure parts``: components first, then the end-to-end points (calibration.sources.tpu_calibration)."""
    from calibration.core.overlay_builder import write_overlay
    from calibration.reports.fit_report import write_fit_report
    from calibration.reports.trust import check_fit
    from calibration.sources.format_contrasts import contrast_lines
    from calibration.sources.loaders import load_measurements, usable_for
    from calibration.sources.measurements import write_measurements
    from calibration.sources.predict import Predictor
    from calibration.sources.tpu_calibration import calibrate_by_parts
    from calibration.sources.tpu_components import load_components
    from tpusim.app.interrupts import deferred_interrupts

    _announce(args, source)
    if not args.components.startswith("published:"):
        raise InputError(f"--components {args.components}: expected published:<name>")
    published = load_chip(args.hardware, calibrated=False)
    records = usable_for(load_measurements(args.measurements), published.name, published.kind)
    components = load_components(args.components.removeprefix("published:"))
    result = calibrate_by_parts(published, records, components, holdout=args.holdout, predictor=Predictor(),
                                max_nfev=min(args.max_evals, 12), with_coverage=args.coverage,
                                measurements=args.measurements, logo_dimensions=_dimensions(args))
    out = Path(args.out)
    calibration = result.result()
    summary = {**calibration.details, "calibration": calibration.to_json(),
               "holdout_dimensions": _dimensions(args)}
    refusals = check_fit(result.e2e, values={path: value for path, (value, _, _) in result.fitted().items()},
                         parameters=[p for p in result.e2e.parameters if p.path not in result.e2e_held],
                         published=published)
    blocking = record_refusals(summary, refusals, args)
    with deferred_interrupts():  # the report, fit, points and overlay change together or not at all
        paths = write_fit_report(result.e2e, out, predictor=Predictor())
        append_refusals(paths["report"], refusals, blocking)
        write_text_atomic(out / "fit.json", json.dumps(summary, indent=2, default=float) + "\n")
        write_measurements(out / "measurements.jsonl", records)
        saved = None if args.no_save or blocking else write_overlay(result.overlay(), provenance=provenance(args, {
            key: summary[key] for key in ("mape_e2e_published", "mape_e2e_parts_only", "mape_calibration",
                                          "mape_holdout")}))
    summary["overlay"] = str(saved) if saved else None
    summary["report"] = str(paths["report"])
    if args.json:
        emit_json(summary)
        refuse(blocking, paths["report"])
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
    for line in contrast_lines(summary["contrasts"]):
        stdout.print(line, highlight=False)
    for path, p in summary["parameters"].items():
        sigma = f" ± {p['uncertainty']:.3g}" if p["uncertainty"] is not None else ""
        stdout.print(f"{path}: {p['value']:.4g}{sigma} (calibrated; {p['fitted_on']})", highlight=False)
    for path, why in summary["unidentifiable_held"].items():
        stdout.print(f"{path}: unidentifiable on this data, held ({why})", highlight=False)
    for line in uncertainty_lines(calibration.to_json()):
        stdout.print(line, highlight=False)
    stdout.print(f"prediction intervals: {summary['interval_samples']} sampled parameter sets stored", highlight=False)
    print_refusals(stdout, refusals, blocking)
    stdout.print(f"overlay: {display_path(saved) if saved else not_saved(args, blocking)}", highlight=False)
    refuse(blocking, paths["report"])
    return 0


def _end_to_end_result(args: argparse.Namespace, result: FitResult, procedure: str) -> tuple:
    """The one result type for a single fit (end to end, CPU loop, GPU micro); with
    ``--coverage`` (end to end and CPU loop) the leave-one-group-out refits, the model error
    (stored in the overlay) and the coverage."""
    from calibration.core.model_error import coverage, model_error
    from calibration.core.overlay_builder import model_error_term
    from calibration.core.result import CalibrationResult, SetErrors
    from calibration.sources.step_times import held_out_folds

    if procedure == "end to end" and args.measurements in CPU_LOOP:
        procedure = "cpu loop"
    from calibration.sources.gpu_micro import is_micro_set

    if procedure == "end to end" and is_micro_set(result.records):
        procedure = "gpu micro"
    folds = []
    if args.coverage and procedure in ("end to end", "cpu loop"):
        folds = held_out_folds(result, spread=True, dimensions=_dimensions(args))  # refitted without each group
    error, cover = model_error(folds), coverage(folds)
    summary = result.summary()
    calibration = CalibrationResult(
        procedure=procedure, chip=result.published_chip.name,
        errors={args.measurements: SetErrors(
            points=len(result.records), priors_only=summary["mape_before"], parts_only=None,
            fitted=summary["mape_calibration"], held_out=None if error is None else error.logo_mape,
            priors_only_held_out=summary["mape_before_holdout"], fitted_held_out=summary["mape_holdout"])},
        model_error=None if error is None else error.to_json(),
        coverage=None if cover is None else cover.to_json())
    return calibration, model_error_term(error)


def run_calibrate(args: argparse.Namespace) -> int:
    """Explain, or fit the source the registry recognises through its ``tpusim calibrate``
    runner (:attr:`calibration.sources.registry.Source.command`)."""
    if args.explain:
        from calibration.reports.explain import explain_lines

        for line in explain_lines(load_chip(args.hardware, calibrated=False)):
            print(line)
        return 0
    if args.measurements is None:
        raise InputError("calibrate needs --measurements and --out (or --explain; kernel records need no --out)")
    source = _source(args)
    if args.out is None and source.name not in OUT_OPTIONAL:
        raise InputError("calibrate needs --measurements and --out (or --explain)")
    return source.hook("command")(args, source)


def run_single_fit(args: argparse.Namespace, source: Source) -> int:
    """One fit of the step times (end to end, the CPU loop, a GPU micro-benchmark set): report,
    fit, points and overlay (:func:`calibration.sources.step_times.save_fit`)."""
    from calibration.commands.fit_summary import convergence_problem, summary_lines
    from calibration.reports.fit_report import write_fit_report
    from calibration.reports.trust import check_fit
    from calibration.sources.format_contrasts import contrast_lines
    from calibration.sources.measurements import write_measurements
    from calibration.sources.predict import Predictor
    from calibration.sources.step_times import save_fit
    from tpusim.app.interrupts import deferred_interrupts

    procedure = source.name
    console = _announce(args, source)
    result, records = _fit(args, console)
    out = Path(args.out)
    problem = convergence_problem(result)
    refusals = check_fit(result, convergence=problem)
    summary = result.to_json()
    calibration, model_error = _end_to_end_result(args, result, procedure)
    summary["calibration"] = calibration.to_json()
    blocking = record_refusals(summary, refusals, args)
    with deferred_interrupts():  # the report, fit, points and overlay change together or not at all
        paths = write_fit_report(result, out, predictor=Predictor())
        append_refusals(paths["report"], refusals, blocking)
        write_text_atomic(out / "fit.json", json.dumps(summary, indent=2, default=float) + "\n")
        write_measurements(out / "measurements.jsonl", records)
        saved = None if args.no_save or blocking else save_fit(
            result, samples=True, provenance={**provenance(args, result.summary()), "model_error": model_error})
    summary["overlay"] = str(saved) if saved else None
    summary["report"] = str(paths["report"])
    if args.json:
        emit_json(summary)
    else:
        stdout = Console(soft_wrap=True)
        for line in [*summary_lines(result), *contrast_lines(summary["contrasts"]),
                     *uncertainty_lines(summary["calibration"])]:
            stdout.print(line, highlight=False, markup=False)
        for row in result.extra.get("holdout_steps", []):  # gpu_bench files: held-out whole steps
            stdout.print(f"held out {row['model']} b{row['batch']}: measured {row['measured_ms']:.3f} ms, "
                         f"predicted {row['predicted_ms']:.3f} ms (calibrated), error {row['error']:+.1%}",
                         highlight=False, markup=False)
        stdout.print(f"report: {display_path(paths['report'])}", highlight=False, markup=False)
        print_refusals(stdout, refusals, blocking)
        stdout.print(f"overlay: {display_path(saved) if saved else not_saved(args, blocking)}",
                     highlight=False, markup=False)
    if problem and blocking and all(r.override == "--allow-unconverged" for r in blocking):
        raise InputError(f"{problem}; the overlay was not saved. Raise --max-evals (now "
                         f"{args.max_evals}) or pass --allow-unconverged to keep it anyway")
    refuse(blocking, paths["report"])
    return 0


# --------------------------------------------------------------------------- report


def run_report(args: argparse.Namespace) -> int:
    from calibration.reports.fit_report import comparison_report, comparison_rows, scatter_plot
    from calibration.sources.loaders import load_measurements
    from calibration.sources.predict import Predictor

    published = load_chip(args.hardware, calibrated=False)
    records = [r for r in load_measurements(args.measurements) if r.system.chip == published.name]
    if not records:
        raise InputError(f"--measurements {args.measurements}: no records measured on {published.name}")
    predictor = Predictor()
    before = [predictor.predict(published, r) for r in records]
    loaded = None if args.uncalibrated else load_chip(published.name, calibrated=True)
    calibrated = loaded if loaded is not None and loaded.calibration is not None else None
    after = [predictor.predict(calibrated, r) for r in records] if calibrated else None
    note = "No calibrated overlay in use: every prediction uses the published figures."
    if calibrated is not None and calibrated.calibration is not None:
        gaps = sorted({gap for r in records for gap in calibrated.calibration.warnings(r.model, r.system.chips)})
        note = (f"*simulated, calibrated*: {calibrated.calibration.note()}."
                + "".join(f" Warning: {gap}." for gap in gaps))
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
    print(text)  # markdown as written: not re-wrapped to the terminal (or to 80 columns when piped)
    return 0
