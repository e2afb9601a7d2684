"""Does a decode step on Blackwell pay per distinct expert beyond the expert's bytes? A check on
the public sweeps whose expert counts differ (issue 50 item 2).

The step model already streams the bytes of every distinct routed expert a batch touches (the
engine's routing draw) and charges ``grouped_gemm_expert_s`` per distinct expert and grouped
GEMM beyond the batch-1 expectation (:mod:`tpusim.engine.gpu_batch`, ``expert_groups``: a
fused-MoE grouped GEMM gives every expert that received a token its own tiles, prologue and
epilogue). If that cost were a property of the kernels, every model family would ask for the
same figure. The sweeps differ in how many distinct experts a step touches per GPU:

- Kimi-K2.5 (384 experts, top-8): TP4 / INT4 TP8 slice all 384 on every GPU, TP4/EP4 holds 96;
- DeepSeek-R1 (256 experts, top-8, TP8): a slice of every expert on every GPU;
- Qwen3-235B (128 experts, top-8, TP8): the same, half as many.

:func:`family_fits` refits that one figure (the others held at the shipped fit's values,
through the core's one entry) on each family's non-anchor points alone, and on all of them,
and sets it beside the time to copy one expert's slice at the chip's published bandwidth (the
per-expert cost the v5e kernel pays beyond its copy is about 23 µs against 10 µs, 2.3x).

**Honest label: this check refits on held-out rows** (the K2.5 S1c and GB200 sweeps and Qwen3
are held out under the frozen split); it is a diagnostic, and nothing it finds is added to the
shipped model or its held-out figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from calibration.core import fit as core_fit
from calibration.core.parameters import chip_with
from calibration.sources.gpu_batch_data import Sweep, family, sweep_chip
from calibration.sources.gpu_batch_sweeps import (
    HELD,
    OPTIONS,
    PARAMETERS,
    baseline,
    batch_problem,
    calibrate,
    decode_program,
    judged_points,
    points,
)

EXPERT_FIGURE = PARAMETERS[0]  # execution.gpu.grouped_gemm_expert_s
FAMILIES = ("kimi-k2.5", "deepseek-r1", "qwen3-235b-a22b")


@dataclass(frozen=True)
class FamilyFit:
    """The per-expert figure one family's points ask for, and what one expert costs to copy."""

    family: str
    points: int
    value_s: float  # grouped_gemm_expert_s, per distinct expert and grouped GEMM
    sigma_s: float  # 1 sigma (nan at a bound)
    at_bound: bool
    mape: float  # of the family's points with this figure
    extra_expert_gemms: float  # most distinct-expert GEMMs a point adds over its anchor, per step
    expert_slice_bytes: int  # one routed expert's weights on one GPU (the largest of the family)
    expert_copy_s: float  # that slice at the chip's published HBM bandwidth

    @property
    def per_expert_s(self) -> float:
        """The non-byte cost of one more distinct expert in a layer (two grouped GEMMs)."""
        return 2.0 * self.value_s


@cache
def expert_slice(sweep: Sweep) -> tuple[int, float]:
    """One routed expert's weight bytes on one GPU of ``sweep`` and their copy time (seconds) at
    the chip's published HBM bandwidth."""
    anchor = next(p for p in points() if p.sweep == sweep and p.role == "anchor")
    op = next(o for o in decode_program(anchor).ops if o.expert_index is not None)
    bandwidth = sweep_chip(sweep).hbm.peak_bandwidth_bytes_per_s.value
    return op.weight_bytes, op.weight_bytes / bandwidth


@cache
def family_fits() -> tuple[FamilyFit, ...]:
    """Per family (and ``all``): ``grouped_gemm_expert_s`` refitted on its non-anchor points alone,
    the other figures at the shipped fit's values."""
    shipped = calibrate().values
    problem = batch_problem()
    start = chip_with(problem.base, {f.path: shipped[f.name] for f in PARAMETERS}, fitted_on="the shipped fit")
    others = [f.path for f in PARAMETERS if f.path != EXPERT_FIGURE.path and f.path not in HELD]
    problem = problem.without(others, start=start)
    judged, cache_ = judged_points(), baseline()
    anchors = {p.sweep.key: p for p in points() if p.role == "anchor"}
    out = []
    for name in (*FAMILIES, "all"):
        indices = [i for i, p in enumerate(judged) if name == "all" or family(p.sweep) == name]
        solution = core_fit(problem.only(indices), OPTIONS)
        predicted = problem.predict(solution.chip(), indices)
        errors = np.abs(predicted / problem.measured[indices] - 1.0)
        unit = EXPERT_FIGURE.name
        extra = max(cache_[judged[i].key]["terms_per_unit_s"][unit]
                    - cache_[anchors[judged[i].sweep.key].key]["terms_per_unit_s"][unit] for i in indices)
        slice_bytes, copy_s = max(expert_slice(s) for s in {judged[i].sweep for i in indices})
        out.append(FamilyFit(name, len(indices), float(solution.value_map()[EXPERT_FIGURE.path]),
                             float(solution.sigma[0]), bool(solution.at_bound[0]), float(errors.mean()), extra,
                             slice_bytes, copy_s))
    return tuple(out)
