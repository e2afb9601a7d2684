"""Calibrate a GPU (or this host) on micro-benchmarks only, then predict whole decode steps.

The records come from :mod:`calibration.gpu_bench` (``extra.kind`` says what each is). The
fit never sees a whole step: it fits four figures to the micro-benchmarks with closed-form
models, and the engine then predicts the held-out decode steps with the fitted chip.

The micro models (seconds; ``B`` bytes, ``k`` kernels in the compiled HLO)::

    copy           t = dispatch + gap + 2B / sustained              (read + write bytes)
    gap, compiled  t = dispatch + k * gap
    matmul         t = dispatch + gap + max(bytes / (sustained * eff),
                                            2 * rows_padded * K * N / (peak[dtype] * eff))

(fitted on bf16/f32 matmuls; fp8 ones are predicted and reported as ``matmul_fp8``, see
:func:`is_fitted`)

``bytes`` is the weight plus the activations in and out; ``rows_padded`` is ``rows`` padded
to the matrix unit's ``tile_rows`` (64 on Hopper's tensor cores), as the engine pads them.
The figures, and the chip paths they calibrate:

=====================  ===========================================  ==============================
fitted                 GPU (``kind: gpu``)                          host CPU (``host-cpu``)
=====================  ===========================================  ==============================
dispatch               ``execution.per_step_overhead_s``            the same
gap                    ``execution.gpu.kernel_gap_s``               ``execution.launch_overhead_s``
sustained              ``hbm.sustained_bandwidth_bytes_per_s``      the same
eff                    ``execution.per_op_efficiency``              the same
=====================  ===========================================  ==============================

and, measured directly (not fitted), the eager per-op cost (``gap_eager``) is the GPU's
``execution.launch_overhead_s``: what a stack that launches every kernel from the host pays
(on the host CPU it is only compared with ``dispatch + gap``, one single-kernel executable).

**Execution mode of a JAX step.** ``jax.jit`` compiles a whole decode step into one XLA
executable: one dispatch per step, then the executable's kernels back to back with no host
round trip between them (XLA's GPU runtime issues them from a command buffer). That is the
engine's GPU serving stack (``serving_stack``: the ``stack`` variant of
:func:`tpusim.engine.gpu.gpu_variant`): the fitted gap as the per-kernel graph gap and the
fitted dispatch as the per-step cost (:data:`JAX_STEP_EXECUTION`); the stack's fixed time
per kernel kind and its bandwidth ramp (:mod:`tpusim.engine.gpu_stack`) keep the catalog's
figures. *Caveat:* the compiled-gap micro-benchmark times chains of tiny kernels, so its
``gap`` also holds what the stack calls ``small_kernel_s``; the engine then adds that prior
again to each small kernel of a step. What the engine does not know is how many kernels XLA makes of
each op (it uses the serving stack's fusion table, :mod:`tpusim.engine.gpu_fusion`); the
held-out error says how much that matters.

Whole steps measured on one GPU at another plan's widths (the K3 slice at TP8) are predicted
with that plan (``extra.plan_devices``) and without its collectives, which did not run
(:class:`StepPredictor`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from calibration.core import Problem, SolverOptions, fit, parameters
from calibration.core.covariance import identifiability
from calibration.core.fitting import median
from calibration.core.parameters import chip_with, figure_value
from calibration.sources.measurements import Measurement
from calibration.sources.predict import Predictor
from calibration.sources.splits import split_records
from calibration.sources.step_times import FitResult, FittedParameter, Split, mape, relative_errors
from hwmodels.errors import InputError
from hwmodels.schema import Chip
from tpusim.workload.formats import dtype_bytes
from tpusim.workload.program import Program
from tpusim.workload.sharding import ShardingPlan

MICRO_KINDS = ("copy", "gap_compiled", "gap_eager", "matmul")
FITTED_KINDS = ("copy", "gap_compiled", "matmul")
STEP_KIND = "decode_step"
JAX_STEP_EXECUTION = "stack"
NAMES = ("dispatch", "gap", "sustained", "eff")
# bounds: calibration.core.parameters; the micro model is analytic and cheap, so the solver runs long with
# its own Jacobian scaling and states the uncertainty from its own Jacobian
OPTIONS = SolverOptions(max_nfev=400, diff_step=None, xtol=1e-8, ftol=1e-8, gtol=1e-8, x_scale="jac",
                        start_inside=0.0, uncertainty="solver")


def record_kind(record: Measurement) -> str:
    """What a record measures: ``extra.kind``, or ``decode_step`` when it does not say."""
    return str(record.extra.get("kind", STEP_KIND))


def is_fitted(record: Measurement) -> bool:
    """Whether the micro fit uses ``record``: copies, compiled gaps, and matmuls in the dtypes
    the replayed steps run (fp8 matmuls are predicted and reported, not fitted: whether XLA
    made a real fp8 GEMM of a plain fp8 dot is not known until a trace shows it, and the
    steps the fit must predict run bf16)."""
    kind = record_kind(record)
    return kind in FITTED_KINDS and not (kind == "matmul" and record.extra.get("dtype") == "fp8")


def report_kind(record: Measurement) -> str:
    """The kind errors are reported under (fp8 matmuls apart: they are not fitted)."""
    kind = record_kind(record)
    return "matmul_fp8" if kind == "matmul" and record.extra.get("dtype") == "fp8" else kind


def is_micro_set(records: Sequence[Measurement]) -> bool:
    """True when the records include the harness's micro-benchmarks."""
    return any(record_kind(r) in MICRO_KINDS for r in records)


def parameter_paths(chip: Chip) -> dict[str, str]:
    """Fitted name -> chip figure path (the module docstring's table)."""
    gap = "execution.gpu.kernel_gap_s" if chip.kind == "gpu" else "execution.launch_overhead_s"
    return {"dispatch": "execution.per_step_overhead_s", "gap": gap,
            "sustained": "hbm.sustained_bandwidth_bytes_per_s", "eff": "execution.per_op_efficiency"}


def execution_chip(chip: Chip) -> Chip:
    """``chip`` in the execution mode of a jitted JAX step (GPU: the serving ``stack`` variant)."""
    if chip.kind != "gpu":
        return chip
    from tpusim.engine.gpu import gpu_variant

    return gpu_variant(chip, JAX_STEP_EXECUTION)


# --------------------------------------------------------------------------- micro models


def _peak(chip: Chip, dtype: str) -> tuple[float, int]:
    """The best peak FLOP/s for ``dtype`` (bf16's when the chip lists no such dtype) and that
    unit's tile rows."""
    best, rows = 0.0, 1
    for unit in chip.compute:
        figure = unit.peak_flops_per_s.get(dtype) or unit.peak_flops_per_s.get("bf16") or unit.peak_flops_per_s.get("f32")
        if figure is not None and figure.value > best:
            best, rows = figure.value, unit.row_pad or unit.tile_rows
    if best <= 0:
        raise InputError(f"chip {chip.name}: no matrix peak to price a {dtype} matmul with")
    return best, rows


def micro_time_s(theta: dict[str, float], chip: Chip, record: Measurement) -> float:
    """The micro model's seconds for ``record`` at figures ``theta`` (module docstring)."""
    kind, extra = record_kind(record), record.extra
    dispatch, gap, sustained, eff = (theta[name] for name in NAMES)
    if kind == "copy":
        return dispatch + gap + 2.0 * float(extra["bytes"]) / sustained
    if kind == "gap_compiled":
        return dispatch + int(extra["kernels"]) * gap
    if kind == "matmul":
        rows, k, n, dtype = int(extra["rows"]), int(extra["k"]), int(extra["n"]), str(extra["dtype"])
        weight = k * n * dtype_bytes(dtype)
        moved = weight + rows * k * dtype_bytes(dtype) + rows * n * dtype_bytes("bf16")  # bf16 output
        peak, tile = _peak(chip, dtype)
        padded = math.ceil(rows / tile) * tile
        return dispatch + gap + max(moved / (sustained * eff), 2.0 * padded * k * n / (peak * eff))
    raise InputError(f"{record.key()}: kind {kind!r} has no micro model (use {', '.join(FITTED_KINDS)})")


def chip_theta(chip: Chip) -> dict[str, float]:
    """The chip's current values of the fitted figures."""
    return {name: figure_value(chip, path) for name, path in parameter_paths(chip).items()}


def _check_data(records: Sequence[Measurement]) -> None:
    kinds = Counter(record_kind(r) for r in records)
    kernels = {int(r.extra["kernels"]) for r in records if record_kind(r) == "gap_compiled"}
    missing = [what for what, ok in (
        ("copy records (sustained bandwidth)", kinds["copy"] >= 1),
        ("gap_compiled records at two kernel counts (dispatch vs gap)", len(kernels) >= 2),
        ("matmul records (per-kernel efficiency)", kinds["matmul"] >= 1),
    ) if not ok]
    if missing:
        raise InputError(f"micro-benchmark fit: the calibration set lacks {missing[0]}")


# --------------------------------------------------------------------------- steps


class StepPredictor(Predictor):
    """The engine's prediction of a whole measured step, in the chip's JAX execution mode.

    A record with ``extra.plan_devices`` larger than its system ran one device's share of
    that plan on one device: the plan is that one, and the program loses its collectives.
    """

    def plan(self, chip: Chip, m: Measurement) -> ShardingPlan:
        devices = int(m.extra.get("plan_devices", m.system.chips * chip.devices_per_chip))
        if devices == m.system.chips * chip.devices_per_chip:
            return super().plan(chip, m)
        from tpusim.workload.model_catalog import plan_for

        key = (m.model, devices, chip.devices_per_chip, chip.kind)
        if key not in self._plans:
            intra = "nvlink" if chip.kind == "gpu" else "ici"
            from calibration.sources.predict import resolve_model

            self._plans[key] = plan_for(resolve_model(m.model), devices,
                                        devices_per_chip=chip.devices_per_chip, intra_link=intra)
        return self._plans[key]

    def program(self, chip: Chip, m: Measurement) -> Program:
        program = super().program(chip, m)
        if self.plan(chip, m).devices == m.system.chips * chip.devices_per_chip:
            return program
        return without_collectives(program)

    def predict(self, chip: Chip, m: Measurement) -> float:
        return super().predict(execution_chip(chip), m)


def without_collectives(program: Program) -> Program:
    """``program`` with every collective call removed (one device's share run alone)."""
    strip = lambda op: dataclasses.replace(op, collectives=())  # noqa: E731
    layers = [dataclasses.replace(layer, ops=[strip(op) for op in layer.ops]) for layer in program.layers]
    return dataclasses.replace(program, layers=layers, head_ops=[strip(op) for op in program.head_ops])


# --------------------------------------------------------------------------- the fit


def describe_micro(records: Sequence[Measurement]) -> str:
    """``214 micro-benchmarks on h200 (17 copy, 5 gap_compiled, 192 matmul; gpu-xla, measured-on-h200)``."""
    kinds = Counter(record_kind(r) for r in records)
    chips = sorted({r.system.chip for r in records})
    labels = sorted({r.backend for r in records} | {r.label for r in records})
    parts = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    return f"{len(records)} micro-benchmarks on {','.join(chips)} ({parts}; {', '.join(labels)})"


def micro_problem(published: Chip, micro: list[Measurement], start: Chip | None) -> Problem:
    """The four figures of the module table on the micro-benchmarks (relative residuals)."""
    paths = parameter_paths(published)

    def predict(chip: Chip, points: Sequence[int]) -> np.ndarray:
        theta = {name: figure_value(chip, path) for name, path in paths.items()}
        return np.array([micro_time_s(theta, published, micro[i]) for i in points])

    return Problem("gpu micro", published, published, parameters(*(paths[n] for n in NAMES)), predict,
                   np.array([r.step_s for r in micro]), groups={"kind": tuple(record_kind(r) for r in micro)},
                   start=start)


def _parameters(published: Chip, problem: Problem, fitted_on: str) -> tuple[list[FittedParameter], float | None,
                                                                             np.ndarray, object]:
    solution = fit(problem, OPTIONS)
    fit_cov = solution.covariance
    s2 = fit_cov.s2 if fit_cov is not None else None
    sigma = solution.sigma
    out = []
    for j, name in enumerate(NAMES):
        path = problem.paths[j]
        unknown = bool(solution.at_bound[j]) or s2 is None or not math.isfinite(sigma[j])
        out.append(FittedParameter(
            path=path, value=float(solution.values[j]), uncertainty=None if unknown else float(sigma[j]),
            start=float(solution.start[j]), published=figure_value(published, path),
            lower=float(solution.lower[j]), upper=float(solution.upper[j]), at_bound=bool(solution.at_bound[j]),
            fitted_on=fitted_on, why=f"micro model '{name}' (calibration.sources.gpu_micro)",
        ))
    hat = fit_cov.hat if fit_cov is not None else np.zeros(len(solution.residuals))
    loo = solution.residuals / np.clip(1.0 - hat, 1e-6, None)
    return out, s2, loo, solution


def _eager(published: Chip, records: Sequence[Measurement], fitted_on: str) -> list[FittedParameter]:
    """The GPU's per-launch cost, measured directly by the eager tiny op (median of records)."""
    eager = [r for r in records if record_kind(r) == "gap_eager"]
    if published.kind != "gpu" or not eager:
        return []
    value = float(median([r.step_s for r in eager]))
    spread = max((r.ms_per_step_spread or 0.0) / 1e3 for r in eager)
    path = "execution.launch_overhead_s"
    current = figure_value(published, path)
    return [FittedParameter(path=path, value=value, uncertainty=spread, start=current, published=current,
                            lower=0.0, upper=math.inf, at_bound=False, fitted_on=fitted_on,
                            why="measured directly: median of the eager tiny-op records (not fitted)")]


def _predict_all(chip: Chip, theta: dict[str, float], records: Sequence[Measurement], steps: StepPredictor) -> dict[str, float]:
    out = {}
    for record in records:
        kind = record_kind(record)
        if kind == "gap_eager":  # GPU: the launch figure it measures; CPU: one executable, one kernel
            eager = chip.kind == "gpu"
            out[record.key()] = figure_value(chip, "execution.launch_overhead_s") if eager else theta["dispatch"] + theta["gap"]
        elif kind in FITTED_KINDS:
            out[record.key()] = micro_time_s(theta, chip, record)
        else:
            out[record.key()] = steps.predict(chip, record)
    return out


def fit_micro(published: Chip, records: Sequence[Measurement], *, holdout: str | None = None,
              start: Chip | None = None) -> FitResult:
    """Fit ``published`` on the micro-benchmarks of ``records`` and predict the rest.

    ``holdout`` defaults to ``kind=decode_step`` (every whole step held out). Records of any
    other kind (``profile``: a traced step, which carries per-kernel phases) are left out of
    the fit and the prediction and counted in ``extra``. Whole steps left in the calibration
    set are predicted but never fitted on.
    """
    began = time.perf_counter()
    usable = [r for r in records if record_kind(r) in (*MICRO_KINDS, STEP_KIND)]
    ignored = Counter(record_kind(r) for r in records if r not in usable)
    if holdout is None and any(record_kind(r) == STEP_KIND for r in usable):
        holdout = f"kind={STEP_KIND}"
    split: Split = split_records(usable, holdout)
    micro = [r for r in split.calibration if is_fitted(r)]
    _check_data(micro)
    fitted_on = describe_micro(micro)
    parameters, s2, loo, solution = _parameters(published, micro_problem(published, micro, start), fitted_on)
    parameters += _eager(published, split.calibration, fitted_on)
    chip = chip_with(published, {p.path: p.value for p in parameters}, fitted_on=fitted_on)
    steps = StepPredictor()
    theta = dict(zip(NAMES, (p.value for p in parameters[: len(NAMES)]), strict=True))
    before = _predict_all(published, chip_theta(published), usable, steps)
    after = _predict_all(chip, theta, usable, steps)
    held_steps = [r for r in split.holdout if record_kind(r) == STEP_KIND]
    rows = [{"model": r.model, "batch": r.batch, "measured_ms": r.ms_per_step_median,
             "predicted_ms": after[r.key()] * 1e3, "predicted_uncalibrated_ms": before[r.key()] * 1e3,
             "error": float(relative_errors([after[r.key()]], [r])[0])} for r in held_steps]
    by_kind = {kind: mape(relative_errors([after[r.key()] for r in subset], subset))
               for kind in sorted({report_kind(r) for r in usable})
               for subset in [[r for r in usable if report_kind(r) == kind]]}
    return FitResult(
        chip=chip, published_chip=published, parameters=parameters, split=split, fitted_on=fitted_on,
        before_s=before, after_s=after, loo_errors=[float(v) for v in loo],
        identifiability=identifiability(solution.jacobian, [p.path for p in parameters[: len(NAMES)]]),
        residual_s2=s2, engine_calls=steps.calls, elapsed_s=time.perf_counter() - began,
        success=bool(solution.success), message=str(solution.message),
        extra={"fit": "micro-benchmarks only (calibration.sources.gpu_micro)",
               "step_execution": (f"{JAX_STEP_EXECUTION} variant (serving_stack: graph gap per kernel): one XLA executable per step"
                                  if published.kind == "gpu" else "per_op_launch: one XLA executable per step"),
               "mape_by_kind": by_kind, "holdout_steps": rows,
               "mape_holdout_steps": mape([row["error"] for row in rows]),
               "not_used": dict(ignored)},
    )
