"""Fit the SGLang K3 serving stack on the published B300 K3 step times (``published:b300-sglang-k3``).

The data (``calibration/data/b300-sglang-k3.json``, *published*: the SGLang Kimi-K3 cookbook's
B300 1x8 cells, via ``shared/reference/gpu-serving.md``): K3 on 8 x B300, TP8, CUDA graphs,
concurrency 1, 8k prompt: TPOT 8.51 ms (MXFP4 experts), 10.12 ms (NVFP4), 2.84 / 3.24 ms with
DSpark. Four :class:`~calibration.sources.measurements.Measurement` records (:func:`load_b300_k3`).

The model: ``kimi-k3@<format>`` on ``b300 x 8`` under the chip's serving stack
(``execution.gpu.stack: sglang-k3``, :mod:`tpusim.engine.gpu_fusion`), batch 1, context
8192 + 512 tokens (the mean over the 1024 output tokens), plan :data:`PLAN`: the published
deployment is plain TP8 (SGLang's K3 TP path without an all-to-all: every rank reads 1/8 of
each selected expert, ``k3-on-sglang.md`` 2.2), not expert parallelism.

What each row pins:

- a plain row (no speculation) is one step time: it pins one combination of the per-kernel
  time and the per-kernel stream rate. The fit moves :data:`FITTED` — ``kernel_gap_s`` (the
  graph gap every one of ~1,500 kernels pays) and ``per_op_efficiency`` (the fraction of the
  sustained HBM rate one kernel reaches) — by the one solver (:func:`calibration.core.fit`,
  :func:`k3_problem`) in log space with a weak
  pull toward the priors (:data:`PRIOR_WEIGHT`), which splits the one pinned combination
  between the two and makes a one-row fit (a format held out) well posed. Every other figure
  stays at its prior, including the two routing-kernel figures read in SGLang's code
  (``radix_router_s``, ``single_cta_router_s``);
- the MXFP4 / NVFP4 difference is **not** fitted: it comes from the stack's kernel path by
  format (the MXFP4 runner routes in K3's fused radix route + quant kernel; the NVFP4 runner
  quantizes in its own kernel and routes inside the fused MoE on one CTA) plus the bytes
  (NVFP4's scale per 16 values against MXFP4's per 32);
- a DSpark row is a check, never fitted: its acceptance length was forced but not published,
  so its TPOT alone cannot be predicted. What can be checked is the *implied* acceptance
  (predicted draft + verify step / measured TPOT; it must lie in 1..8) and that both formats
  imply the same acceptance (the benchmark forced one): :func:`dspark_checks`.

Held out in turn (:func:`calibration.core.leave_one_group_out` on the same problem and
options): each format's plain row is fitted alone and the other format's plain row
predicted (:func:`fit_k3_stack`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from calibration.core import Problem, SolverOptions, fit, leave_one_group_out, parameters
from calibration.core.overlay_builder import build_overlay, fitted_figure
from calibration.core.parameters import chip_with, figure_value
from calibration.sources.measurements import Measurement, SystemRef
from hwmodels.catalog import display_path
from hwmodels.errors import InputError
from hwmodels.overlay import CalibrationOverlay
from hwmodels.schema import Chip
from hwmodels.textfile import read_user_json
from tpusim.engine import simulate
from tpusim.engine.gpu import gpu_breakdown, gpu_variant
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.speculative import load_drafter

NAME = "b300-sglang-k3"
MEASUREMENT = f"published:{NAME}"
DATA_FILE = Path(__file__).resolve().parents[1] / "data" / f"{NAME}.json"
MEASURED_ON = "b300"
CHIPS = 8
FORMATS = ("mxfp4", "nvfp4")
CONTEXT_TOKENS = 8192 + 1024 // 2
BACKEND = "b300 sglang (published)"
FITTED = ("execution.gpu.kernel_gap_s", "execution.per_op_efficiency")  # bounds: calibration.core.parameters
PRIOR_WEIGHT = 0.05  # residual per unit log-distance from the prior (a weak pull)
# log-space variables from the priors; no parameter uncertainty (two figures on one or two step times)
OPTIONS = SolverOptions(max_nfev=30, diff_step=1e-2, xtol=1e-8, ftol=1e-8, gtol=1e-8, start_inside=0.0,
                        uncertainty="none")
PLAN = "tp=8,expert_groups=1,expert_tp=8"  # attention TP8, experts TP8 (SGLang's K3 TP8 recipe)
MAX_ACCEPTANCE = 8  # DSpark verifies 8 rows: at most 7 accepted + 1 bonus token


def load_b300_k3() -> list[Measurement]:
    """The four published rows as measurement records (TPOT in ``ms_per_step_median``;
    ``extra.speculative`` names the drafter, ``extra.acceptance_length`` is None: not published)."""
    shown = display_path(DATA_FILE)
    data = read_user_json(DATA_FILE, shown=shown)
    rows = data.get("measurements") if isinstance(data, dict) else None
    if not isinstance(rows, list) or len(rows) != 4:
        raise InputError(f"{shown}: measurements: expected the four B300 rows")
    records = []
    for index, row in enumerate(rows):
        where = f"{shown}: measurements[{index}]"
        if row.get("format") not in FORMATS or not isinstance(row.get("tpot_ms"), int | float):
            raise InputError(f"{where}: expected format in {', '.join(FORMATS)} and a numeric tpot_ms")
        spec = row.get("speculative")
        records.append(Measurement(
            model=f"kimi-k3@{row['format']}", system=SystemRef(chip=MEASURED_ON, chips=CHIPS, execution="graphs"),
            batch=1, context=CONTEXT_TOKENS, routing="uniform", schedule=None, backend=BACKEND,
            ms_per_step_median=float(row["tpot_ms"]), spread_kind="not published",
            provenance=f"{data.get('source', 'published')}; {where}", label="published",
            extra={"metric": "tpot_ms", "plan": PLAN, "speculative": spec, "acceptance_length": None,
                   "ttft_ms": row.get("ttft_ms"), "format": row["format"]}))
    return records


@functools.lru_cache(maxsize=16)
def _program(fmt: str, rows: int = 1, model_name: str | None = None):
    """The per-device program (built once: a fit simulates it for every trial chip, and the
    issue plan's cache knows a program by identity)."""
    model = load_model(model_name or f"kimi-k3@{fmt}")
    plan = plan_for(model, CHIPS, devices_per_chip=1, intra_link="nvlink", choice=PLAN)
    return build_program(model, plan, batch=rows, context_tokens=CONTEXT_TOKENS, sequences=1)


def step_s(chip: Chip, fmt: str) -> float:
    """Simulated plain decode step of ``kimi-k3@fmt`` on ``chip`` x 8 (serving stack), seconds."""
    return simulate(_program(fmt), load_schedule("naive"), gpu_variant(chip, "stack")).step_s


def breakdown_ms(chip: Chip, fmt: str) -> dict[str, float]:
    result = simulate(_program(fmt), load_schedule("naive"), gpu_variant(chip, "stack"))
    return {key: value * 1e3 for key, value in gpu_breakdown(result).items()} | {"step": result.step_s * 1e3}


def dspark_step_s(chip: Chip, fmt: str) -> tuple[float, float]:
    """(draft forward, verify step) of a DSpark step at batch 1, seconds: one drafter forward
    over anchor + 7 rows, one target forward over 8 rows."""
    drafter = load_drafter("kimi-k3-dspark")
    rows = drafter.draft_tokens + 1
    stack = gpu_variant(chip, "stack")
    verify = simulate(_program(fmt, rows), load_schedule("naive"), stack).step_s
    draft = simulate(_program(fmt, rows, drafter.model), load_schedule("naive"), stack).step_s
    return draft, verify


def _chip(base: Chip, values: dict[str, float]) -> Chip:
    return chip_with(base, values, fitted_on=MEASUREMENT)


def _prior(chip: Chip, path: str) -> float:
    return figure_value(chip, path)


def k3_problem(chip: Chip, targets_ms: dict[str, float]) -> Problem:
    """:data:`FITTED` on the plain rows ``targets_ms`` (format -> measured ms), one format per
    point, in log space with the weak pull toward the priors (module docstring)."""
    formats = tuple(targets_ms)

    def predict(trial: Chip, points: Sequence[int]) -> np.ndarray:
        return np.array([step_s(trial, formats[i]) * 1e3 for i in points])

    return Problem("gpu k3 stack", chip, chip, parameters(*FITTED), predict, np.array([targets_ms[f] for f in formats]),
                   groups={"format": formats}, transform="log", prior_weight=PRIOR_WEIGHT)


def fit_on(chip: Chip, targets_ms: dict[str, float], *, max_evals: int = 30) -> dict[str, float]:
    """:data:`FITTED` on the plain rows ``targets_ms`` (format -> measured ms)."""
    return fit(k3_problem(chip, targets_ms), replace(OPTIONS, max_nfev=max_evals)).value_map()


def dspark_checks(chip: Chip, measured: dict[str, float]) -> dict[str, Any]:
    """Implied acceptance per format (predicted DSpark step / measured TPOT) and whether both
    formats imply the same one (the benchmark forced one acceptance length)."""
    out: dict[str, Any] = {}
    for fmt, tpot_ms in measured.items():
        draft, verify = dspark_step_s(chip, fmt)
        implied = (draft + verify) * 1e3 / tpot_ms
        out[fmt] = {"draft_ms": draft * 1e3, "verify_ms": verify * 1e3, "measured_tpot_ms": tpot_ms,
                    "implied_acceptance": implied, "plausible": 1.0 <= implied <= MAX_ACCEPTANCE}
    if len(measured) == 2:
        a, b = (out[fmt]["implied_acceptance"] for fmt in FORMATS)
        out["acceptance_agreement"] = b / a - 1.0  # 0: both formats imply the same forced acceptance
    return out


def fit_k3_stack(chip: Chip, *, max_evals: int = 30) -> dict[str, Any]:
    """The fit on both plain rows, each format held out in turn, and the DSpark checks."""
    if chip.name != MEASURED_ON:
        raise ValueError(f"{MEASUREMENT} was measured on {CHIPS} x {MEASURED_ON}: use --hardware {MEASURED_ON}")
    if chip.execution.gpu is None or chip.execution.gpu.stack != "sglang-k3":
        raise ValueError(f"{chip.name}: the K3 stack fit needs execution.gpu.stack: sglang-k3")
    records = load_b300_k3()
    plain = {r.extra["format"]: r.ms_per_step_median for r in records if r.extra["speculative"] is None}
    spec = {r.extra["format"]: r.ms_per_step_median for r in records if r.extra["speculative"]}
    before = {fmt: step_s(chip, fmt) * 1e3 for fmt in FORMATS}
    values = fit_on(chip, plain, max_evals=max_evals)
    fitted = _chip(chip, values)
    after = {fmt: breakdown_ms(fitted, fmt) for fmt in FORMATS}
    # each format held out in turn: the shipped problem refitted on the other row
    folds = leave_one_group_out(k3_problem(chip, plain), replace(OPTIONS, max_nfev=max_evals))
    holdout = {}
    for fold in folds:
        held = fold.value
        holdout[held] = {"fitted_on": sorted(f for f in plain if f != held), "parameters": fold.values,
                         "predicted_ms": fold.predicted[0], "measured_ms": plain[held],
                         "error": fold.predicted[0] / plain[held] - 1.0}
    errors = {fmt: after[fmt]["step"] / plain[fmt] - 1.0 for fmt in FORMATS}
    return {
        "chip": chip.name, "measurements": MEASUREMENT, "stack": chip.execution.gpu.stack,
        "context_tokens": CONTEXT_TOKENS, "plan": PLAN, "fitted": list(FITTED),
        "pins": {"plain rows": "one combination of kernel_gap_s and per_op_efficiency per row (a step time); "
                 "the weak prior pull splits it", "dspark rows": "nothing: checks (acceptance not published)",
                 "held at priors": "every other execution.gpu figure, incl. radix_router_s and single_cta_router_s"},
        "measured_ms": {"plain": plain, "dspark": spec},
        "before_ms": before, "after": after, "errors": errors,
        "mape_calibration": float(np.mean([abs(e) for e in errors.values()])),
        "holdout": holdout,
        "format_difference": {"measured": plain["nvfp4"] / plain["mxfp4"] - 1.0,
                              "predicted_before": before["nvfp4"] / before["mxfp4"] - 1.0,
                              "predicted_after": after["nvfp4"]["step"] / after["mxfp4"]["step"] - 1.0},
        "dspark_checks": dspark_checks(fitted, spec),
        "parameters": {path: {"prior": _prior(chip, path), "value": value} for path, value in values.items()},
    }


def overlay_of(fit: dict[str, Any]) -> CalibrationOverlay:
    """The fitted figures as a calibrated overlay (:func:`calibration.core.overlay_builder.build_overlay`)."""
    return build_overlay(fit["chip"], f"{MEASUREMENT}: plain MXFP4 and NVFP4 rows",
                         {path: fitted_figure(entry["value"], fitted_on=MEASUREMENT) for path, entry in fit["parameters"].items()})


def report_markdown(fit: dict[str, Any]) -> str:
    """The fit as a short Markdown report."""
    lines = [f"# K3 stack calibration: {fit['chip']} x {CHIPS} on {fit['measurements']} ({fit['stack']} stack)", "",
             "| row | measured (ms) | simulated before | simulated after (calibrated) | error after |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for fmt in FORMATS:
        lines.append(f"| {fmt} plain | {fit['measured_ms']['plain'][fmt]:.2f} | {fit['before_ms'][fmt]:.2f} "
                     f"| {fit['after'][fmt]['step']:.2f} | {fit['errors'][fmt]:+.1%} |")
    lines += ["", "Held out in turn (fitted on the other format's plain row):", ""]
    for fmt, entry in fit["holdout"].items():
        lines.append(f"- {fmt}: predicted {entry['predicted_ms']:.2f} ms, measured {entry['measured_ms']:.2f} ms, "
                     f"error {entry['error']:+.1%}")
    diff = fit["format_difference"]
    lines += ["", f"NVFP4 / MXFP4 - 1: measured {diff['measured']:+.1%}, simulated {diff['predicted_before']:+.1%} "
              f"before and {diff['predicted_after']:+.1%} after the fit (from the kernel path and bytes; not fitted).",
              "", "DSpark (checks; acceptance not published):", ""]
    for fmt in FORMATS:
        entry = fit["dspark_checks"][fmt]
        lines.append(f"- {fmt}: draft {entry['draft_ms']:.2f} ms + verify {entry['verify_ms']:.2f} ms; measured TPOT "
                     f"{entry['measured_tpot_ms']:.2f} ms implies acceptance {entry['implied_acceptance']:.2f}")
    agreement = fit["dspark_checks"].get("acceptance_agreement")
    if agreement is not None:
        lines.append(f"- the two formats' implied acceptances differ by {agreement:+.1%} (0 if the model is right)")
    lines.append("")
    for path, entry in fit["parameters"].items():
        lines.append(f"- `{path}`: {entry['prior']:.4g} (prior) -> {entry['value']:.4g} (calibrated)")
    return "\n".join(lines) + "\n"


__all__ = ["MEASUREMENT", "fit_k3_stack", "load_b300_k3", "overlay_of", "report_markdown"]
