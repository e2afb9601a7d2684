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
``attention_fixed_s`` — by bounded least squares (``scipy.optimize.least_squares``, in log
space) on the four groups' relative errors. ``small_kernel_s`` stays at its prior: every
kernel pays the gap, so the small-kernel group alone cannot tell a small kernel's own time
from the gap. The MoE group has no figure of its own (its grouped GEMMs share
``gemm_fixed_s`` with the dense GEMMs), so it is a check, as is the split *within* each
group (w13 vs w2, DeltaNet vs attention, norms vs quantize), reported but not fitted. The
MoE's routing, permute and activation kernels count as small kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from hwmodels.overlay import CalibratedValue, CalibrationOverlay
from hwmodels.schema import Chip
from tpusim.engine import simulate
from tpusim.engine.gpu import gpu_variant
from tpusim.engine.gpu_stack import STAGE_GROUPS, stack_kernels
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import Op, Program, build_program

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
BOUNDS_S = (5e-8, 5e-5)
TOLERANCE = 0.15  # the acceptance bar: every group within 15 %


@dataclass(frozen=True)
class StackSplit:
    """A simulated step split into stage groups (µs), and the step itself."""

    group_us: dict[str, float]
    step_us: float

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


def _main_group(op: Op) -> str:
    if op.role == "moe.expert":
        return "moe"
    if op.role == "attn.core":
        return "attention"
    if op.tensors and op.unit == "mxu":
        return "gemm"
    return "small"


def split_step(chip: Chip, program: Program) -> StackSplit:
    """Simulate ``program`` under ``chip``'s serving stack and split it by stage group."""
    stack = gpu_variant(chip, "stack")
    result = simulate(program, load_schedule("naive"), stack)
    gap_s = stack.execution.gpu.kernel_gap_s.value  # type: ignore[union-attr]
    kernels = stack_kernels(stack, program)
    groups = dict.fromkeys(STAGE_GROUPS, 0.0)
    owner: list[str] = []
    for index, (op, op_s) in enumerate(zip(program.ops, result.op_time_s, strict=True)):
        these = kernels[index]
        owner.append(_main_group(op) if these else owner[-1] if owner else _main_group(op))
        charged = 0.0
        for kernel in these:
            cost = gap_s + kernel.fixed_s + kernel.ramp_s
            groups[kernel.group] += cost
            charged += cost
        groups[owner[-1]] += max(0.0, op_s - charged)
    return StackSplit({k: v * 1e6 for k, v in groups.items()}, result.step_s * 1e6)


def qwen_program(chip: Chip) -> Program:
    model = load_model(MODEL)
    plan = plan_for(model, 1, devices_per_chip=chip.devices_per_chip, intra_link="nvlink")
    return build_program(model, plan, batch=1, context_tokens=CONTEXT_TOKENS)


def _with_figures(chip: Chip, values: dict[str, float]) -> Chip:
    gpu = chip.execution.gpu
    assert gpu is not None
    updates = {path.rsplit(".", 1)[1]: getattr(gpu, path.rsplit(".", 1)[1]).model_copy(
        update={"value": value, "label": "calibrated", "source": f"calibrated on {SOURCE}"})
        for path, value in values.items()}
    return chip.model_copy(update={"execution": chip.execution.model_copy(
        update={"gpu": gpu.model_copy(update=updates)})})


def group_errors(split: StackSplit) -> dict[str, float]:
    """Per group: simulated / published - 1 (published scaled to the step)."""
    target = published_group_us()
    return {group: split.group_us[group] / target[group] - 1.0 for group in STAGE_GROUPS}


def fit_gpu_stack(chip: Chip, *, max_evals: int = 40) -> dict[str, Any]:
    """Fit :data:`FITTED` on the published split; the report as a JSON-ready dict."""
    if chip.name != MEASURED_ON:
        raise ValueError(f"{MEASUREMENT} was measured on one {MEASURED_ON}: use --hardware {MEASURED_ON} "
                         f"(other Blackwell entries take its fit as derived figures)")
    if chip.execution.gpu is None:
        raise ValueError(f"{chip.name}: the GPU stack calibration needs execution.gpu figures")
    program = qwen_program(chip)
    before = split_step(chip, program)
    start = np.log([_figure(chip, path) for path in FITTED])

    def residuals(x: np.ndarray) -> np.ndarray:
        fitted = _with_figures(chip, dict(zip(FITTED, np.exp(x), strict=True)))
        return np.array(list(group_errors(split_step(fitted, program)).values()))

    lower, upper = math.log(BOUNDS_S[0]), math.log(BOUNDS_S[1])
    solution = least_squares(residuals, np.clip(start, lower, upper), bounds=(lower, upper),
                             max_nfev=max_evals, diff_step=1e-3)
    values = dict(zip(FITTED, (float(v) for v in np.exp(solution.x)), strict=True))
    after = split_step(_with_figures(chip, values), program)
    return {
        "chip": chip.name, "measurements": MEASUREMENT, "source": SOURCE, "model": MODEL,
        "published_step_us": STEP_US, "published_stages_us": PUBLISHED_STAGES_US,
        "published_group_us": published_group_us(),
        "before": {"group_us": before.group_us, "step_us": before.step_us, "errors": group_errors(before)},
        "after": {"group_us": after.group_us, "step_us": after.step_us, "errors": group_errors(after)},
        "parameters": {path: {"published": _figure(chip, path), "value": value} for path, value in values.items()},
        "within_tolerance": all(abs(e) <= TOLERANCE for e in group_errors(after).values()),
        "tolerance": TOLERANCE,
    }


def _figure(chip: Chip, path: str) -> float:
    return getattr(chip.execution.gpu, path.rsplit(".", 1)[1]).value


def overlay_of(fit: dict[str, Any]) -> CalibrationOverlay:
    """The fitted figures as a calibrated overlay for :func:`hwmodels.overlay.save_overlay`."""
    return CalibrationOverlay(chip=fit["chip"], fitted_on=f"{MEASUREMENT}: {SOURCE}", parameters={
        path: CalibratedValue(value=entry["value"], fitted_on=MEASUREMENT)
        for path, entry in fit["parameters"].items()})


def report_markdown(fit: dict[str, Any]) -> str:
    """The fit as a short Markdown report (groups before / after, figures)."""
    lines = [f"# GPU stack calibration: {fit['chip']} on {fit['measurements']}", "", f"Data: {fit['source']}.", "",
             "| stage group | published (µs, scaled to the step) | simulated before | error | simulated after | error |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for group in STAGE_GROUPS:
        lines.append(f"| {group} | {fit['published_group_us'][group]:.0f} | {fit['before']['group_us'][group]:.0f} "
                     f"| {fit['before']['errors'][group]:+.1%} | {fit['after']['group_us'][group]:.0f} "
                     f"| {fit['after']['errors'][group]:+.1%} |")
    lines += ["", f"Step: published {fit['published_step_us']:.0f} µs; simulated {fit['before']['step_us']:.0f} µs "
              f"before, {fit['after']['step_us']:.0f} µs after (simulated, calibrated).", ""]
    for path, entry in fit["parameters"].items():
        lines.append(f"- `{path}`: {entry['published'] * 1e6:.2f} µs (prior) -> {entry['value'] * 1e6:.2f} µs (calibrated)")
    return "\n".join(lines) + "\n"
