"""``tpusim calibrate`` on a GPU serving stack: the published per-stage split
(``published:b200-vllm-qwen3.5``) and the SGLang K3 rows (``published:b300-sglang-k3``).

The source is recognised in :mod:`calibration.commands.calibrate` (:func:`calibration.sources.registry.recognise`);
these paths fit, write ``report.md`` and ``fit.json`` to ``--out`` and save the overlay.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from calibration.commands.calibrate_outputs import provenance, uncertainty_lines
from hwmodels.atomic import write_text_atomic
from hwmodels.catalog import load_chip
from hwmodels.errors import InputError
from tpusim.app.cli.common import emit_json

if TYPE_CHECKING:
    from calibration.sources.registry import Source


def run_gpu_stack(args: argparse.Namespace, source: Source) -> int:
    """``--measurements published:b200-vllm-qwen3.5``: fit the GPU serving stack's figures on
    the published per-stage breakdown (:mod:`calibration.sources.gpu_stack`), measure the model error
    by leave-one-stage-group-out refits (:mod:`calibration.sources.gpu_stack`) and save the overlay;
    for a chip of the same GPU (gb200) the fit runs on the chip measured (b200) and the
    overlay is derived from it, saying so."""
    from calibration.core.overlay_builder import write_overlay
    from calibration.core.result import CalibrationResult, SetErrors
    from calibration.sources.gpu_stack import (
        SAME_GPU,
        fit_gpu_stack,
        report_markdown,
        stack_model_error,
        stack_overlay,
    )

    fitted_chip = SAME_GPU.get(args.hardware, args.hardware)
    try:
        measured_on = load_chip(fitted_chip, calibrated=False)
        fit = fit_gpu_stack(measured_on, max_evals=args.max_evals)
    except ValueError as error:
        raise InputError(str(error)) from None
    error = stack_model_error(measured_on, max_evals=args.max_evals)
    step = fit["published_step_us"]
    calibration = CalibrationResult(
        procedure=source.name, chip=args.hardware,
        errors={args.measurements: SetErrors(
            points=1, priors_only=abs(fit["before"]["step_us"] - step) / step, parts_only=None,
            fitted=abs(fit["after"]["step_us"] - step) / step, held_out=error["logo_mape"])},
        model_error={k: v for k, v in error.items() if k != "folds"},
        details={"folds": error["folds"]})
    fit["calibration"] = calibration.to_json()
    fit["leave_one_group_out"] = error["folds"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "report.md", report_markdown(fit) + "\n" + "\n".join(
        f"- {line}" for line in uncertainty_lines(fit["calibration"])) + "\n")
    write_text_atomic(out / "fit.json", json.dumps(fit, indent=2, default=float) + "\n")
    overlay = stack_overlay(fit, error, args.hardware)
    saved = None if args.no_save else write_overlay(overlay, provenance=provenance(args, {}))
    fit["overlay"] = str(saved) if saved else None
    fit["overlay_fitted_on"] = overlay.fitted_on
    if args.json:
        emit_json(fit)
    else:
        Console().print(report_markdown(fit), highlight=False, markup=False)
        for line in uncertainty_lines(fit["calibration"]):
            Console().print(line, highlight=False, markup=False)
    return 0


def run_k3_stack(args: argparse.Namespace, source: Source) -> int:
    """``--measurements published:b300-sglang-k3``: fit the SGLang K3 stack on the published
    B300 K3 rows, each format held out in turn (:mod:`calibration.sources.k3_b300`)."""
    from calibration.core.overlay_builder import write_overlay
    from calibration.sources.k3_b300 import fit_k3_stack, overlay_of, report_markdown

    try:
        fit = fit_k3_stack(load_chip(args.hardware, calibrated=False), max_evals=min(args.max_evals, 30))
    except ValueError as error:
        raise InputError(str(error)) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "report.md", report_markdown(fit))
    write_text_atomic(out / "fit.json", json.dumps(fit, indent=2, default=float) + "\n")
    saved = None if args.no_save else write_overlay(overlay_of(fit), provenance=provenance(args, {}))
    fit["overlay"] = str(saved) if saved else None
    if args.json:
        emit_json(fit)
    else:
        Console().print(report_markdown(fit), highlight=False, markup=False)
    return 0
