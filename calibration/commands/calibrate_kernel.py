"""``tpusim calibrate --hardware tpu-v5e --measurements <kernel records .jsonl>``.

The megakernel's own step times measured on a TPU v5e (``calibration/data/tpu-v5e-kernel.jsonl``,
every K3-shard record it holds of the kernel's decoders,
:data:`calibration.sources.tpu_probes.CALIBRATION_DECODER`: the rows of an earlier decoder are
left out), fitted through the one calibration core and judged on
records each refit never saw (:mod:`calibration.sources.tpu_kernel_fit`). No TPU needed.

Prints the fitted figures labelled ``calibrated on tpu-v5e kernel records``, the errors of
the three ways (catalog, probes only, fitted and held out), the held-out table with each
record's 90 % interval, the coverage and width of the intervals, and the ranking (Kendall τ,
regret). ``--holdout-dimensions schedule`` (or ``batch``) runs one split's refits only (each
split costs about one full fit: the command's time grows with the records). ``--out DIR`` also writes ``report.md``, ``fit.json`` and ``scatter.png``; the fit
(probe figures + fitted figures + the model error) is saved as the tpu-v5e overlay unless
``--no-save``. A missing or malformed records file is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from calibration.commands.calibrate_outputs import provenance
from hwmodels.atomic import write_text_atomic
from hwmodels.catalog import display_path
from hwmodels.errors import InputError
from tpusim.app.cli.common import emit_json

if TYPE_CHECKING:
    from calibration.sources.registry import Source

CHIPS = ("tpu-v5e",)  # chips whose kernel records this path fits


def is_kernel_records(args: argparse.Namespace) -> bool:
    """``--measurements`` names a file of the megakernel's shard runs (rows with ``shard_of``;
    ``--procedure end-to-end`` fits a file's whole-model rows instead); on a chip of
    :data:`CHIPS` also a ``.jsonl`` path that is missing or not JSON, so that the kernel
    records' loader names what is wrong in one line."""
    from calibration.sources.tpu_chip_records import is_kernel_records as records_file

    if args.measurements is None:
        return False
    path = Path(args.measurements)
    if args.hardware in CHIPS and path.suffix == ".jsonl":
        if not path.is_file():
            return True
        first = next((line for line in path.read_text(errors="replace").splitlines() if line.strip()), "")
        try:
            json.loads(first)
        except json.JSONDecodeError:
            return True
    return records_file(path)


def run_kernel_records(args: argparse.Namespace, source: Source) -> int:
    from calibration.core.overlay_builder import write_overlay
    from calibration.reports.tpu_v5e import coverage_lines, markdown, plot, summary_lines, way_table
    from calibration.sources.tpu_kernel_fit import LABEL, SPLITS, calibrate_kernel_records

    if args.hardware not in CHIPS:
        raise InputError(f"--measurements {args.measurements}: kernel records calibrate {', '.join(CHIPS)} "
                         f"(the chip they ran on), not {args.hardware}")
    if args.parameters:
        raise InputError("--parameters: kernel records fit a fixed set (calibration.sources.tpu_kernel_fit.FITTED)")
    from calibration.sources.tpu_chip_records import load_chip_records

    dims = getattr(args, "holdout_dimensions", None)
    splits = tuple(d.strip() for d in dims.split(",") if d.strip()) if dims else SPLITS
    if any(split not in SPLITS for split in splits):
        raise InputError(f"--holdout-dimensions {dims}: kernel records split by {' or '.join(SPLITS)}")
    records = load_chip_records(Path(args.measurements))  # a bad file is one line before anything runs
    console = Console(stderr=True)
    console.print(f"calibrating {args.hardware} on {args.measurements} ({source.name}: {len(records)} "
                  "K3-shard points) ...", highlight=False, soft_wrap=True)
    fit = calibrate_kernel_records(Path(args.measurements), holdout=splits,
                                   progress=lambda line: console.print(f"  {line}", highlight=False))
    calibration = fit.result()
    summary = {**fit.to_json(), "calibration": calibration.to_json()}
    saved = None if args.no_save else write_overlay(fit.overlay(), provenance=provenance(args, {
        "mape_before": fit.mape("b"), "mape_calibration": fit.mape("c:fit"),
        "mape_holdout": calibration.errors[fit.path].held_out}))
    summary["overlay"] = str(saved) if saved else None
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = f"tpusim calibrate --hardware {args.hardware} --measurements {args.measurements}"
        write_text_atomic(out / "report.md", markdown(fit, command))
        write_text_atomic(out / "fit.json", json.dumps(summary, indent=2, default=float) + "\n")
        plot(fit, out / "scatter.png")
        summary["report"] = str(out / "report.md")
    if args.json:
        emit_json(summary)
        return 0
    stdout = Console(soft_wrap=True)

    def say(line: str = "") -> None:
        stdout.print(line, highlight=False, markup=False)

    say(f"{len(fit.records)} K3-shard records ({fit.engine_runs} engine runs, {fit.seconds:.0f} s)")
    for path, value in fit.values().items():
        sigma = fit.sigma()[path]
        say(f"{path}: {value:.4g}{'' if sigma is None else f' ± {sigma:.2g}'} ({LABEL}: "
            f"{len(fit.records)} step times, starting from the probe figures)")
    for path, figure in fit.probe_figures.items():
        if path not in fit.values():
            say(f"{path}: {figure['value']:.4g} ({figure['source'].split(':', 1)[0]})")
    say()
    for line in summary_lines(fit):
        say(line)
    for split in SPLITS:
        if f"c:{split}" in fit.ways:
            say(f"\nheld out by {split} half (each row predicted by a refit that never saw it):")
            for line in way_table(fit, f"c:{split}"):
                say(line)
    say()
    for line in coverage_lines(fit):
        say(line)
    if args.out:
        say(f"report: {display_path(Path(args.out) / 'report.md')}")
    say(f"overlay: {display_path(saved) if saved else 'not saved (--no-save)'}")
    return 0
