"""Which hardware figures a calibration fits, their physical bounds, and why those.

A parameter is a dotted figure path of a :class:`~hwmodels.schema.Chip` (the same paths a
:class:`~hwmodels.overlay.CalibrationOverlay` uses) with bounds that keep it physical. The
fit varies a chip by laying a trial overlay over the *published* chip
(:func:`chip_with`), so every candidate passes the schema's own checks (a sustained HBM
rate above the published peak is rejected by the schema and excluded by the bounds).

Choosing the parameters (identifiability)
-----------------------------------------
A parameter can only be fitted if the measurements move when it moves, *differently* from
how they move for the other parameters. On the published TPU7x set (one model, 62 layers,
three weight formats, batch 1–8, identical routing) that selects:

| parameter | what in the data pins it |
| --- | --- |
| ``hbm.sustained_bandwidth_bytes_per_s`` | formats differ in bytes per step (4.70 vs 7.02 GB/core) |
| ``compute.mxu.weight_push_s_per_tile`` | decode matmuls are push-bound (rows pad only to the 8-row sublane tile); int8 dense pushes as many tiles as bf16 with half the bytes |
| ``execution.per_layer_overhead_s`` | what remains per layer once bytes, tiles and payloads are priced |

Left at their published or prior values, because this data cannot tell them apart from
the ones above: ``dma.concurrency_penalty_per_dma`` (on tpu-v7 the DMA contention counts
address streams, and the published kernel's 1 ring + 4 expert slots are within the 5 it
serves at full rate, so no step time sees it; the expert-slot sweep does,
:mod:`calibration.parts`), ``links.ici.bandwidth_bytes_per_s_per_direction`` (collectives run as
remote copies whose small payloads are latency-bound: a 33 % change of the ICI rate moves a
Muse b8 step by about 1.5 %; the link-copy measurements pin it, :mod:`calibration.parts`), ``execution.per_step_overhead_s`` (every point has 62 layers, so a
per-step cost and 62 per-layer costs are the same number; the ≈ 70 µs published per-step
figure [INF] is kept), ``links.ici.collective_stage_latency_s`` (4 stages per layer: the
same per-layer constant as the per-layer overhead; [INF] measured 3.5–4.7 µs) and
``dma.issue_latency_s`` (with 2 MiB chunks everywhere it is a fixed fraction of each copy,
nearly indistinguishable from bandwidth). :func:`identifiability` reports how well a chosen
set is pinned (the condition number of the scaled Jacobian and its weakest direction), so a
fit on other data can choose differently (``tpusim calibrate --parameters``).

Bounds are physical, not convenient, and per chip: relative ones are factors of the chip's
own published value (``ParameterSpec.relative``), so tpu-v5e's 0.8 TB/s and gb200's 8 TB/s
each get bounds around their own figure: the sustained HBM rate 0.45–1.25x and never above
the chip's peak, the push time 0.25–5x (on tpu-v7: 5 ns, four MXUs sharing the published
20 ns, to 100 ns). A fit that stops at a bound is flagged in the
report: the model is missing something, and the flag says where to look.

The CPU loop (``host-cpu``, one launch per op) fits ``hbm.sustained_bandwidth_bytes_per_s``
(weights streamed from DRAM/LLC), ``execution.launch_overhead_s`` (per-op cost inside the
XLA executable) and ``compute.cpu.peak_flops_per_s.f32`` (the matmul rate at batch > 1; the
loop runs f32 weights). ``execution.per_step_overhead_s`` stays at the probe's measured
dispatch of one jitted call: every point has the same layer count, so a per-step cost and
the per-op costs of a fixed op count cannot be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hwmodels.errors import InputError
from hwmodels.overlay import CalibratedValue, CalibrationOverlay, apply_overlay, iter_figures
from hwmodels.schema import Chip


@dataclass(frozen=True)
class ParameterSpec:
    """One fitted figure: its path, bounds, and why it is fitted.

    ``relative`` bounds are factors of the chip's own published value (so one spec serves
    tpu-v5e at 0.8 TB/s and gb200 at 8 TB/s); absolute ones are in the field's unit.
    """

    path: str
    lower: float
    upper: float
    why: str = ""
    relative: bool = False
    hold_rank: int = 0  # among unidentifiable parameters, higher ranks are held first

    def bounds_for(self, chip: Chip) -> tuple[float, float]:
        """Bounds for ``chip`` (relative ones scaled by its value of the figure), tightened
        by the chip itself (a sustained rate never above the peak)."""
        lower, upper = self.lower, self.upper
        if self.relative:
            value = figure_value(chip, self.path)
            lower, upper = lower * value, upper * value
        if self.path == SUSTAINED_PATH and chip.kind != "cpu":
            upper = min(upper, chip.hbm.peak_bandwidth_bytes_per_s.value)
        return lower, upper


def figure_value(chip: Chip, path: str) -> float:
    """The value of the figure at ``path`` (``KeyError`` naming the path if there is none)."""
    for candidate, figure in iter_figures(chip):
        if candidate == path:
            return figure.value
    raise KeyError(f"chip {chip.name} has no figure {path!r}")


HOST_PEAK_PATH = "hbm.peak_bandwidth_bytes_per_s"
SUSTAINED_PATH = "hbm.sustained_bandwidth_bytes_per_s"


def implied_values(base: Chip, values: dict[str, float]) -> dict[str, float]:
    """Figures that must move with the fitted ones to keep the chip valid.

    Only one case: on a host CPU the "peak" HBM figure is the probe's copy rate (read +
    write), not a published limit, and a streaming read can beat it; when the fitted
    sustained rate exceeds it, the peak is raised to match. Published chips never get this:
    their sustained rate is bounded by the peak instead (:meth:`ParameterSpec.bounds_for`).
    """
    sustained = values.get(SUSTAINED_PATH)
    peak = base.hbm.peak_bandwidth_bytes_per_s.value
    if base.kind == "cpu" and sustained is not None and sustained > peak:
        return {HOST_PEAK_PATH: sustained}
    return {}


def chip_with(base: Chip, values: dict[str, float], *, fitted_on: str = "trial") -> Chip:
    """``base`` with ``values`` (and :func:`implied_values`) laid over it as an overlay."""
    merged = {**values, **implied_values(base, values)}
    overlay = CalibrationOverlay(
        chip=base.name, fitted_on=fitted_on,
        parameters={path: CalibratedValue(value=value) for path, value in merged.items()},
    )
    return apply_overlay(base, overlay, origin="trial fit")


TPU_PARAMETERS: tuple[ParameterSpec, ...] = (
    ParameterSpec("hbm.sustained_bandwidth_bytes_per_s", 0.45, 1.25,
                  "bytes per step differ across formats; never above the published peak", relative=True),
    ParameterSpec("compute.mxu.weight_push_s_per_tile", 0.25, 5.0,
                  "decode matmuls are push-bound; 20 ns published per tile on tpu-v7, >= 1/4 (4 MXUs)",
                  relative=True),
    ParameterSpec("compute.mxu.weight_push_s_per_tile_by_dtype.int8", 0.25, 4.0,
                  "int8 dense weights are converted to bf16 on their way into the MXU; the nvfp4+int8 "
                  "and nvfp4+bf16 rows differ only in the dense format, which separates it", relative=True),
    ParameterSpec("execution.per_layer_overhead_s", 0.0, 20e-6,
                  "the per-layer remainder (62 layers at every point)"),
)

CPU_PARAMETERS: tuple[ParameterSpec, ...] = (
    ParameterSpec("hbm.sustained_bandwidth_bytes_per_s", 1e9, 1e13,
                  "weight bytes per step grow with the model width squared"),
    ParameterSpec("execution.launch_overhead_s", 1e-8, 1e-3,
                  "ops per step are fixed by the layer count; dominates small widths"),
    ParameterSpec("compute.cpu.peak_flops_per_s.f32", 1e9, 1e14,
                  "matmul FLOPs grow with batch at a fixed weight size"),
)


def default_parameters(chip: Chip) -> tuple[ParameterSpec, ...]:
    """The justified default set for ``chip`` (see the module docstring)."""
    specs = CPU_PARAMETERS if chip.kind == "cpu" else TPU_PARAMETERS
    available = {path for path, _ in iter_figures(chip)}
    usable = tuple(spec for spec in specs if spec.path in available)
    if not usable:
        raise InputError(f"chip {chip.name}: none of the default calibration parameters exist")
    return usable


def parse_parameters(text: str, chip: Chip) -> tuple[ParameterSpec, ...]:
    """Comma-separated figure paths; known ones keep their default bounds, others get
    [0.1x, 10x] of the chip's current value."""
    known = {spec.path: spec for spec in (*TPU_PARAMETERS, *CPU_PARAMETERS)}
    specs = []
    for path in filter(None, (part.strip() for part in text.split(","))):
        try:
            value = figure_value(chip, path)
        except KeyError as error:
            raise InputError(f"--parameters: {error.args[0]}") from None
        specs.append(known.get(path) or ParameterSpec(path, 0.1 * value, 10.0 * value or 1.0, "user"))
    if not specs:
        raise InputError("--parameters: no parameter paths given")
    return tuple(specs)


@dataclass(frozen=True)
class Identifiability:
    """How well the data pins each parameter: singular values and the weakest direction."""

    singular_values: tuple[float, ...]
    condition: float
    weakest: dict[str, float]  # parameter -> component of the weakest singular vector

    def summary(self) -> str:
        worst = max(self.weakest, key=lambda key: abs(self.weakest[key]))
        return f"condition number {self.condition:.3g}; weakest direction mostly {worst}"


def identifiability(jacobian: np.ndarray, paths: list[str]) -> Identifiability:
    """Singular values of the (scaled) Jacobian: a tiny one means a combination of
    parameters the data cannot see; its singular vector names the parameters involved."""
    _, singular, vt = np.linalg.svd(jacobian, full_matrices=False)
    condition = float(singular[0] / singular[-1]) if singular[-1] > 0 else float("inf")
    return Identifiability(
        singular_values=tuple(float(s) for s in singular),
        condition=condition,
        weakest={path: float(c) for path, c in zip(paths, vt[-1], strict=True)},
    )


RANK_TOLERANCE = 1e-8  # singular values below this fraction of the largest count as zero


def unseen(jacobian: np.ndarray) -> np.ndarray:
    """Boolean per parameter: part of a combination the data cannot see at all (a singular
    value below :data:`RANK_TOLERANCE` of the largest, and a component above 0.1 in its
    singular vector). A pseudo-inverse would give such parameters a small, meaningless
    variance; they are reported unidentifiable instead."""
    flagged = np.zeros(jacobian.shape[1], dtype=bool)
    if not jacobian.size:
        return flagged
    _, singular, vt = np.linalg.svd(jacobian, full_matrices=True)
    largest = singular[0] if singular.size and singular[0] > 0 else 1.0
    padded = np.zeros(vt.shape[0])
    padded[:singular.size] = singular
    for k in np.flatnonzero(padded < RANK_TOLERANCE * largest):
        flagged |= np.abs(vt[k]) > 0.1
    return flagged
