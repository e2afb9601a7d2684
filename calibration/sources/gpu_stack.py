"""Calibrate a GPU serving stack on a published per-stage breakdown of one decode step.

The data (``shared/reference/gpu-serving.md``, *published*, measured by the Mirage project):
vLLM 0.25.1 on one B200, Qwen3.5-35B-A3B-FP8, CUDA graphs on, batch 1, 256 input tokens:
3,567 µs per step, split into eight stages (:data:`PUBLISHED_STAGES_US`). The eight stages
sum to 4,015 µs — more than the step (profiled kernel durations overlap the step's gaps) —
so what the fit reproduces is the **split**: each stage group's share of the step,
scaled to the measured 3,567 µs.

Stage groups (:data:`STAGE_GROUP`): ``gemm`` (dense FP8 projections; lm_head and small bf16
GEMMs), ``moe`` (the two grouped GEMMs), ``attention`` (Gated DeltaNet recurrence and full
attention), ``small`` (norms / RoPE and FP8 activation quantize).

The simulated split: the model (``qwen3.5-35b-a3b-fp8``) on one GPU of the chip under its
serving stack (:mod:`tpusim.engine.gpu_stack`), simulated by the engine; each op's stream time
(``SimResult.op_time_s``) is split over the stage groups: every kernel's graph gap, fixed
time and ramp go to its own group, the rest of the op (copies and compute) to the group of
the op's main kernel.

The fit: three figures of ``execution.gpu`` — ``kernel_gap_s``, ``gemm_fixed_s``,
``attention_fixed_s`` — by the one solver (:func:`calibration.core.fit`, bounds from the
parameter table, in log space) on the four groups' relative errors (:func:`stack_problem`). ``small_kernel_s`` stays at its prior: every
kernel pays the gap, so the small-kernel group alone cannot tell a small kernel's own time
from the gap. The MoE group has no figure of its own (its grouped GEMMs share
``gemm_fixed_s`` with the dense GEMMs), so it is a check, as is the split *within* each
group (w13 vs w2, DeltaNet vs attention, norms vs quantize), reported but not fitted. The
MoE's routing, permute and activation kernels count as small kernels.

The model error (:func:`stack_model_error`): each stage group held out in turn and *the same
problem, with the same options*, refitted on the other three (before, the refits solved a
linear-space variant of the problem, so the quoted held-out error was not that of the
shipped fit); the overlay of b200, or a derived one for a chip of the same GPU
(:func:`stack_overlay`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from calibration.core import (
    Problem,
    Solution,
    SolverOptions,
    fit,
    leave_one_group_out,
    model_error,
    parameters,
)
from calibration.core.model_error import EXTRAPOLATION_FACTOR
from calibration.core.overlay_builder import build_overlay, fitted_figure
from hwmodels.overlay import CalibrationOverlay
from hwmodels.provenance import FitCoverage
from hwmodels.schema import Chip
from tpusim.engine import simulate
from tpusim.engine.gpu import gpu_variant
from tpusim.engine.gpu_fusion import ATTENTION as ATTENTION_KIND
from tpusim.engine.gpu_fusion import GEMM, GROUPED_GEMM
from tpusim.engine.gpu_stack import (
    LOW_PRECISION_FORMATS,
    QUANTIZE,
    STAGE_GROUPS,
    StackKernel,
    stack_kernels,
)
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import Op, Program, build_program
from tpusim.workload.registry.names import KdaOp, Role

SOURCE = ("published: vLLM 0.25.1 on one B200, Qwen3.5-35B-A3B-FP8, CUDA graphs, batch 1, 256 input "
          "tokens (Mirage project comparison notes, via shared/reference/gpu-serving.md)")
MEASUREMENT = "published:b200-vllm-qwen3.5"
MEASURED_ON = "b200"
MODEL = "qwen3.5-35b-a3b-fp8"
CONTEXT_TOKENS = 256
STEP_US = 3567.0
PUBLISHED_STAGES_US = {
    "dense FP8 GEMMs (projections)": 1353.0,
    "MoE up/gate (w13)": 337.0,
    "MoE down (w2)": 301.0,
    "Gated DeltaNet recurrence": 164.0,
    "attention": 134.0,
    "lm_head + small bf16 GEMMs": 609.0,
    "norms / RoPE": 558.0,
    "FP8 activation quantize": 559.0,
}
STAGE_GROUP = {
    "dense FP8 GEMMs (projections)": "gemm", "lm_head + small bf16 GEMMs": "gemm",
    "MoE up/gate (w13)": "moe", "MoE down (w2)": "moe",
    "Gated DeltaNet recurrence": "attention", "attention": "attention",
    "norms / RoPE": "small", "FP8 activation quantize": "small",
}
FITTED = ("execution.gpu.kernel_gap_s", "execution.gpu.gemm_fixed_s", "execution.gpu.attention_fixed_s")
# log-space variables (the figures span decades), starting at the priors, no parameter uncertainty
# (three figures on four shares): the shipped fit and its leave-one-group-out refits alike
OPTIONS = SolverOptions(max_nfev=40, diff_step=1e-3, xtol=1e-8, ftol=1e-8, gtol=1e-8, start_inside=0.0,
                        uncertainty="none")
TOLERANCE = 0.15  # the acceptance bar: every group within 15 %


@dataclass(frozen=True)
class StackSplit:
    """A simulated step split into stage groups (µs), and the step itself."""

    group_us: dict[str, float]
    step_us: float
    stage_us: dict[str, float]

    def shares(self) -> dict[str, float]:
        total = sum(self.group_us.values())
        return {group: value / total for group, value in self.group_us.items()}


def published_group_us() -> dict[str, float]:
    """The published stages summed per group and scaled to the measured step (the split)."""
    total = sum(PUBLISHED_STAGES_US.values())
    out = dict.fromkeys(STAGE_GROUPS, 0.0)
    for stage, value in PUBLISHED_STAGES_US.items():
        out[STAGE_GROUP[stage]] += value * STEP_US / total
    return out


DENSE, BF16_GEMMS = "dense FP8 GEMMs (projections)", "lm_head + small bf16 GEMMs"
W13, W2, DELTANET, ATTENTION = "MoE up/gate (w13)", "MoE down (w2)", "Gated DeltaNet recurrence", "attention"
NORMS, QUANTIZE_STAGE = "norms / RoPE", "FP8 activation quantize"


def _gemm_stage(op: Op) -> str:
    low = any(tensor.fmt.name in LOW_PRECISION_FORMATS for tensor in op.tensors)
    return DENSE if low else BF16_GEMMS


def _kernel_stage(op: Op, kernel: StackKernel, position: int) -> str:
    """The published stage a kernel belongs to (``position``: its index among the op's
    grouped GEMMs — the first is w13, the second w2)."""
    if kernel.kind == GEMM:
        return _gemm_stage(op)
    if kernel.kind == GROUPED_GEMM:
        return W13 if position == 0 else W2
    if kernel.kind == ATTENTION_KIND:
        return DELTANET if op.name == KdaOp.CORE else ATTENTION
    return QUANTIZE_STAGE if kernel.what == QUANTIZE else NORMS


def _remainder_stages(op: Op) -> dict[str, float]:
    """Where an op's copies and compute go, as shares (experts: w13 / w2 by bytes)."""
    if op.role == Role.MOE_EXPERT and len(op.tensors) >= 2:
        up, down = (t.value_bytes + t.scale_bytes for t in op.tensors[:2])
        return {W13: up / (up + down), W2: down / (up + down)}
    if op.role == Role.ATTN_CORE:
        return {DELTANET if op.name == KdaOp.CORE else ATTENTION: 1.0}
    if op.tensors and op.unit == "mxu":
        return {_gemm_stage(op): 1.0}
    return {NORMS: 1.0}


def split_stages(chip: Chip, program: Program) -> tuple[dict[str, float], float]:
    """Simulate ``program`` under ``chip``'s serving stack; its time per published stage (s)
    and the step (s). Each kernel's gap, fixed time and ramp go to its own stage; the rest
    of an op (copies, compute) to the op's stage (an op fused into an earlier kernel: that
    kernel's op's)."""
    stack = gpu_variant(chip, "stack")
    result = simulate(program, load_schedule("naive"), stack)
    gap_s = stack.execution.gpu.kernel_gap_s.value  # type: ignore[union-attr]
    kernels = stack_kernels(stack, program)
    stages = dict.fromkeys(PUBLISHED_STAGES_US, 0.0)
    owner: dict[str, float] = {}
    for index, (op, op_s) in enumerate(zip(program.ops, result.op_time_s, strict=True)):
        these = kernels[index]
        if these or not owner:
            owner = _remainder_stages(op)
        charged = 0.0
        grouped = 0
        for kernel in these:
            cost = gap_s + kernel.fixed_s + kernel.ramp_s
            stages[_kernel_stage(op, kernel, grouped)] += cost
            grouped += kernel.kind == GROUPED_GEMM
            charged += cost
        for stage, share in owner.items():
            stages[stage] += share * max(0.0, op_s - charged)
    return stages, result.step_s


def split_step(chip: Chip, program: Program) -> StackSplit:
    """:func:`split_stages` summed into the stage groups, in µs."""
    stages, step_s = split_stages(chip, program)
    groups = dict.fromkeys(STAGE_GROUPS, 0.0)
    for stage, seconds in stages.items():
        groups[STAGE_GROUP[stage]] += seconds * 1e6
    return StackSplit(groups, step_s * 1e6, {stage: seconds * 1e6 for stage, seconds in stages.items()})


def qwen_program(chip: Chip) -> Program:
    model = load_model(MODEL)
    plan = plan_for(model, 1, devices_per_chip=chip.devices_per_chip, intra_link="nvlink")
    return build_program(model, plan, batch=1, context_tokens=CONTEXT_TOKENS)


def group_errors(split: StackSplit) -> dict[str, float]:
    """Per group: simulated / published - 1 (published scaled to the step)."""
    target = published_group_us()
    return {group: split.group_us[group] / target[group] - 1.0 for group in STAGE_GROUPS}


def stack_problem(chip: Chip, program: Program | None = None) -> Problem:
    """The stack fit: :data:`FITTED` on the four stage groups' times (µs), one group per point."""
    program = program or qwen_program(chip)
    target = published_group_us()
    groups = tuple(STAGE_GROUPS)

    def predict(trial: Chip, points: Sequence[int]) -> np.ndarray:
        split = split_step(trial, program)
        return np.array([split.group_us[groups[i]] for i in points])

    return Problem("gpu stack", chip, chip, parameters(*FITTED), predict, np.array([target[g] for g in groups]),
                   groups={"stage group": groups}, transform="log")


def fit_gpu_stack(chip: Chip, *, max_evals: int = 40) -> dict[str, Any]:
    """Fit :data:`FITTED` on the published split; the report as a JSON-ready dict."""
    if chip.name != MEASURED_ON:
        raise ValueError(f"{MEASUREMENT} was measured on one {MEASURED_ON}: use --hardware {MEASURED_ON} "
                         f"(other Blackwell entries take its fit as derived figures)")
    if chip.execution.gpu is None:
        raise ValueError(f"{chip.name}: the GPU stack calibration needs execution.gpu figures")
    program = qwen_program(chip)
    before = split_step(chip, program)
    solution = fit(stack_problem(chip, program), replace(OPTIONS, max_nfev=max_evals))
    values = solution.value_map()
    after = split_step(solution.chip(fitted_on=MEASUREMENT), program)
    return {
        "chip": chip.name, "measurements": MEASUREMENT, "source": SOURCE, "model": MODEL,
        "published_step_us": STEP_US, "published_stages_us": PUBLISHED_STAGES_US,
        "published_group_us": published_group_us(),
        "before": _summary(before), "after": _summary(after),
        "parameters": {path: {"published": _figure(chip, path), "value": value} for path, value in values.items()},
        "within_tolerance": all(abs(e) <= TOLERANCE for e in group_errors(after).values()),
        "tolerance": TOLERANCE,
    }


def stage_errors(split: StackSplit) -> dict[str, float]:
    """Per published stage (not fitted): simulated / published - 1, both as shares of their sums."""
    total_sim, total_pub = sum(split.stage_us.values()), sum(PUBLISHED_STAGES_US.values())
    return {stage: (split.stage_us[stage] / total_sim) / (value / total_pub) - 1.0
            for stage, value in PUBLISHED_STAGES_US.items()}


def _summary(split: StackSplit) -> dict[str, Any]:
    return {"group_us": split.group_us, "step_us": split.step_us, "errors": group_errors(split),
            "stage_us": split.stage_us, "stage_errors": stage_errors(split)}


def _figure(chip: Chip, path: str) -> float:
    return getattr(chip.execution.gpu, path.rsplit(".", 1)[1]).value


def report_markdown(fit: dict[str, Any]) -> str:
    """The fit as a short Markdown report (groups before / after, figures)."""
    lines = [f"# GPU stack calibration: {fit['chip']} on {fit['measurements']}", "", f"Data: {fit['source']}.", "",
             "| stage group | published (µs, scaled to the step) | simulated before | error | simulated after | error |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for group in STAGE_GROUPS:
        lines.append(f"| {group} | {fit['published_group_us'][group]:.0f} | {fit['before']['group_us'][group]:.0f} "
                     f"| {fit['before']['errors'][group]:+.1%} | {fit['after']['group_us'][group]:.0f} "
                     f"| {fit['after']['errors'][group]:+.1%} |")
    lines += ["", "Within the groups (not fitted; shares of the stage sum):", "",
              "| stage | published (µs) | simulated after (µs) | error of its share |", "| --- | ---: | ---: | ---: |"]
    for stage, value in PUBLISHED_STAGES_US.items():
        lines.append(f"| {stage} | {value:.0f} | {fit['after']['stage_us'][stage]:.0f} "
                     f"| {fit['after']['stage_errors'][stage]:+.1%} |")
    lines += ["", f"Step: published {fit['published_step_us']:.0f} µs; simulated {fit['before']['step_us']:.0f} µs "
              f"before, {fit['after']['step_us']:.0f} µs after (simulated, calibrated).", ""]
    for path, entry in fit["parameters"].items():
        lines.append(f"- `{path}`: {entry['published'] * 1e6:.2f} µs (prior) -> {entry['value'] * 1e6:.2f} µs (calibrated)")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- model error and overlays

SAME_GPU = {"gb200": MEASURED_ON}  # chip -> the chip whose stack fit it takes (same Blackwell GPU)
ERROR_METHOD = ("leave-one-stage-group-out refits of the shipped serving-stack fit (calibration.sources.gpu_stack); "
                "model error = the largest out-of-sample step error of the 4 folds (too few for a 90 % conformal "
                "rank); outside the fit (another model, chip count or batch): x " f"{EXTRAPOLATION_FACTOR:g} (assumed)")


def stack_model_error(chip: Chip, *, max_evals: int = 40) -> dict[str, Any]:
    """Leave-one-stage-group-out refits of the shipped fit (:func:`stack_problem`, the same
    options); the out-of-sample residual of a fold is the whole step's, ``(published step −
    simulated step) / simulated step``, the quantity a compare row predicts. Four folds are too
    few for a 90 % conformal rank: the model error is the largest (``exact: False``). The fit
    states no parameter uncertainty, so an interval from this overlay is model error alone."""
    program = qwen_program(chip)

    def whole_step(solution: Solution, _held: list[int]) -> tuple[list[float], list[float]]:
        return [STEP_US], [split_step(solution.chip(), program).step_us]

    folds = leave_one_group_out(stack_problem(chip, program), replace(OPTIONS, max_nfev=max_evals), score=whole_step)
    error = model_error(folds, ERROR_METHOD)
    assert error is not None
    return {**error.to_json(), "folds": [{"fold": f.name, "step_us": f.predicted[0], "error": float(f.residuals[0]),
                                          "values": f.values} for f in folds]}


def stack_overlay(fit: dict[str, Any], error: dict[str, Any] | None, chip_name: str) -> CalibrationOverlay:
    """The overlay of ``chip_name`` from the stack fit ``fit`` (made on ``fit['chip']``): the
    chip the split was measured on (b200), or for another chip of the same GPU
    (:data:`SAME_GPU`) a **derived** overlay naming the fit it came from (the catalog keeps
    its priors: fitted values reach a chip only through overlays)."""
    derived = chip_name != fit["chip"]
    fitted_on = f"{MEASUREMENT}: {SOURCE}"
    if derived:
        fitted_on = (f"derived: the {fit['chip']} serving-stack fit on {MEASUREMENT} "
                     f"(tpusim calibrate --hardware {fit['chip']}), {chip_name} being the same GPU; {SOURCE}")
    data = f"derived from the {fit['chip']} fit on {MEASUREMENT}" if derived else MEASUREMENT
    return build_overlay(
        chip_name, fitted_on, {path: fitted_figure(entry["value"], fitted_on=data) for path, entry in fit["parameters"].items()},
        coverage=FitCoverage(models=[MODEL], formats=[], chip_counts=[1], batches=[1], backends=["published"]),
        model_error=error)
