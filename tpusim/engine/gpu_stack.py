"""The GPU serving stack: a CUDA-graph decode step of fused kernels (the default GPU row).

What vLLM / SGLang / TensorRT-LLM run at decode: the step captured once as a CUDA graph and
replayed; the fused kernels of :mod:`tpusim.engine.gpu_fusion` (fused add+RMSNorm, fused
QKV, a fused-MoE grouped GEMM with routing, split-KV decode attention) plus one FP8/FP4
activation-quantize kernel before every GEMM whose weights are FP8/FP4 (Blackwell and Hopper
multiply FP8 — Blackwell also FP4 — natively on the tensor cores: there is no dequantisation
pass, the activations are quantized instead); small all-reduces as a one-shot NVLink kernel
(:func:`tpusim.engine.gpu.stack_collective`).

Even inside a graph, a decode kernel does not run at a long copy's bandwidth. Per kernel
(figures: ``chip.execution.gpu``, :class:`hwmodels.schema.GpuExecution`)::

    time = kernel_gap_s                          launch: the GPU-side gap inside the graph
         + fixed(kind) - pdl_overlap_s           kernel fixed time (kind: gemm, grouped_gemm,
                                                 attention, small)
         + bytes / B_kernel                      the kernel's weights
    B_kernel = min(B_stream, per_sm_bandwidth x min(sm_count, CTAs))
    B_stream = sustained x per_op_efficiency     (the policy's HBM rate)
    CTAs     = ceil(cols / gemm_tile_cols) x max(1, floor(rows / gemm_split_k_rows))
                                                 (summed over the experts of a grouped GEMM)

so the achieved bandwidth ``bytes / (fixed + bytes / B_kernel)`` rises with the bytes a
kernel moves and with the SMs it occupies. The engine is the TPU's: the gap is the policy's
per-launch cost, the kernel's copies stream through the same HBM server at ``B_stream``,
and :func:`stack_kernel_plan` charges the rest — ``fixed(kind) - pdl_overlap_s`` plus the
ramp ``bytes / B_kernel - bytes / B_stream`` — as the op's ``KernelPlan.fixed_s``.

:func:`stack_kernels` lists every kernel with its kind, stage group and cost, so a
calibration can split a simulated step into the stage groups a profiler reports
(:data:`STAGE_GROUPS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from hwmodels.schema import Chip, GpuExecution
from tpusim.engine.execution import KernelPlan, per_op_efficiency
from tpusim.engine.gpu_fusion import (
    ATTENTION,
    EXPERT_ROLE,
    GEMM,
    GROUPED_GEMM,
    RADIX_ROUTER,
    SINGLE_CTA_ROUTER,
    SMALL,
    OpKernels,
    StackTable,
    load_stack,
    op_kernels,
)
from tpusim.workload.program import Op, Program

# weight formats a stack multiplies natively in low precision (FP8 / FP4 tensor cores): their
# GEMMs get an activation-quantize kernel first
LOW_PRECISION_FORMATS = ("fp8_e4m3_b256", "fp8_e4m3_b128x128", "mxfp4", "nvfp4")
QUANTIZE = "activation quantize"
# stage groups of a profiled decode step, by kernel kind
STAGE_GROUPS = ("gemm", "moe", "attention", "small")
GROUP_OF_KIND = {GEMM: "gemm", GROUPED_GEMM: "moe", ATTENTION: "attention", SMALL: "small",
                 RADIX_ROUTER: "small", SINGLE_CTA_ROUTER: "small"}


@dataclass(frozen=True)
class StackKernel:
    """One kernel of the serving stack, charged before op ``op_index``.

    ``fixed_s`` is its fixed time net of PDL overlap; ``ramp_s`` what its bytes cost beyond
    the stream rate; ``nbytes`` the weight bytes it reads; ``ctas`` its thread blocks (0: not
    a weight-streaming kernel).
    """

    op_index: int
    kind: str
    what: str
    role: str
    nbytes: int
    ctas: int
    fixed_s: float
    ramp_s: float

    @property
    def group(self) -> str:
        """The stage group a profiler books it under (:data:`STAGE_GROUPS`): by kind, so the
        MoE's routing, permute and activation kernels are ``small`` kernels."""
        return GROUP_OF_KIND[self.kind]


def kernel_fixed_s(gpu: GpuExecution, kind: str) -> float:
    """``fixed(kind) - pdl_overlap_s`` of one kernel, seconds (never below 0)."""
    routers = {RADIX_ROUTER: gpu.radix_router_s, SINGLE_CTA_ROUTER: gpu.single_cta_router_s}
    figure = routers.get(kind) or {GEMM: gpu.gemm_fixed_s, GROUPED_GEMM: gpu.gemm_fixed_s,
                                   ATTENTION: gpu.attention_fixed_s}.get(kind, gpu.small_kernel_s)
    return max(0.0, figure.value - gpu.pdl_overlap_s.value)


def chip_stack(chip: Chip) -> StackTable:
    """The fusion table ``chip``'s serving stack runs (``execution.gpu.stack``)."""
    return load_stack(_figures(chip).stack)


def stream_bandwidth(chip: Chip) -> float:
    """``B_stream``: sustained x per_op_efficiency, bytes/s: the per-op-launch policy's HBM rate,
    its efficiency from the policy's one clamp (:func:`tpusim.engine.execution.per_op_efficiency`)."""
    return chip.hbm.sustained_bandwidth_bytes_per_s.value * per_op_efficiency(chip)


def kernel_bandwidth(chip: Chip, ctas: int) -> float:
    """``B_kernel`` of a kernel with ``ctas`` thread blocks, bytes/s."""
    gpu = _figures(chip)
    sms = min(chip.sm_count or ctas, ctas)
    return min(stream_bandwidth(chip), gpu.per_sm_bandwidth_bytes_per_s.value * max(1, sms))


def ramp_s(chip: Chip, nbytes: int, ctas: int) -> float:
    """Seconds a kernel reading ``nbytes`` with ``ctas`` blocks costs beyond ``bytes / B_stream``."""
    if nbytes <= 0 or ctas <= 0:
        return 0.0
    return nbytes / kernel_bandwidth(chip, ctas) - nbytes / stream_bandwidth(chip)


def _figures(chip: Chip) -> GpuExecution:
    gpu = chip.execution.gpu
    if gpu is None:
        raise ValueError(f"{chip.name}: no execution.gpu figures for the serving stack")
    return gpu


def gemm_ctas(rows: int, cols: int, gpu: GpuExecution) -> int:
    """CTAs of a decode GEMM over a ``rows x cols`` weight: output tiles x K splits."""
    tiles = max(1, math.ceil(cols / max(1.0, gpu.gemm_tile_cols.value)))
    return tiles * max(1, int(rows // max(1.0, gpu.gemm_split_k_rows.value)))


def _gemm_operands(op: Op, count: int, gpu: GpuExecution) -> list[tuple[int, int]]:
    """(bytes, CTAs) of each of an op's ``count`` GEMM kernels: tensors pair with kernels in
    order; tensors left over join the last kernel, kernels left over read no weights."""
    out = [(0, 0)] * count
    for position, tensor in enumerate(op.tensors):
        slot = min(position, count - 1)
        nbytes, ctas = out[slot]
        out[slot] = (nbytes + tensor.value_bytes + tensor.scale_bytes, max(ctas, gemm_ctas(tensor.rows, tensor.cols, gpu)))
    return out


def _grouped_operands(ops: list[Op], first: int, gpu: GpuExecution,
                      experts_of: dict[int, list[tuple[int, Op]]] | None = None) -> list[tuple[int, int]]:
    """(bytes, CTAs) of the two grouped GEMMs (gate/up, down) over a layer's routed experts
    (``experts_of``: :func:`_experts_by_layer` of ``ops``, made once by a caller asking per layer)."""
    if experts_of is None:
        experts_of = _experts_by_layer(ops)
    experts = [op for index, op in experts_of.get(ops[first].layer, ()) if index >= first]
    out = []
    for position in (0, 1):
        tensors = [op.tensors[position] for op in experts if len(op.tensors) > position]
        nbytes = sum(t.value_bytes + t.scale_bytes for t in tensors)
        out.append((nbytes, sum(gemm_ctas(t.rows, t.cols, gpu) for t in tensors)))
    return out


def _experts_by_layer(ops: list[Op]) -> dict[int, list[tuple[int, Op]]]:
    """Per layer, its routed experts' (index, op) in program order."""
    experts: dict[int, list[tuple[int, Op]]] = {}
    for index, op in enumerate(ops):
        if op.role == EXPERT_ROLE:
            experts.setdefault(op.layer, []).append((index, op))
    return experts


def stack_kernels(chip: Chip, program: Program, layout: OpKernels | None = None) -> list[list[StackKernel]]:
    """Per op of ``program``: the serving stack's kernels launched before it (see the module
    docstring); an op fused into an earlier kernel gets none (``layout``: ``op_kernels`` of
    ``program`` on the chip's stack, where the caller has it)."""
    gpu = _figures(chip)
    ops = program.ops
    stack = chip_stack(chip)
    if layout is None:
        layout = op_kernels(program, stack)
    experts_of = _experts_by_layer(ops)
    out: list[list[StackKernel]] = []
    for index, (op, kinds) in enumerate(zip(ops, layout.kinds, strict=True)):
        kernels: list[StackKernel] = []
        if kinds:
            gemms = [kind for kind in kinds if kind == GEMM]
            operands = iter(_gemm_operands(op, len(gemms), gpu) if gemms else [])
            grouped = iter(_grouped_operands(ops, index, gpu, experts_of) if op.role == EXPERT_ROLE
                           else [(0, 0), (0, 0)])
            low_precision = any(tensor.fmt.name in LOW_PRECISION_FORMATS for tensor in op.tensors)
            if stack.quantize_kernels and (GEMM in kinds or op.role == EXPERT_ROLE) and low_precision:
                kernels.append(StackKernel(index, SMALL, QUANTIZE, op.role, 0, 0, kernel_fixed_s(gpu, SMALL), 0.0))
            for kind in kinds:
                nbytes, ctas = next(operands) if kind == GEMM else next(grouped) if kind == GROUPED_GEMM else (0, 0)
                kernels.append(StackKernel(index, kind, f"{kind} ({op.name})", op.role, nbytes, ctas, kernel_fixed_s(gpu, kind),
                                           ramp_s(chip, nbytes, ctas)))
        out.append(kernels)
    return out


def stack_kernel_plan(chip: Chip, program: Program) -> KernelPlan:
    """The serving stack's :class:`KernelPlan`: one launch (graph gap) per kernel, and each
    op's kernels' fixed time and ramp as ``fixed_s``."""
    stack = chip_stack(chip)
    layout = op_kernels(program, stack)
    kernels = stack_kernels(chip, program, layout)
    names = tuple(
        f"{len(these)} kernel{'s' if len(these) != 1 else ''} (graph): "
        + ", ".join(kernel.what for kernel in these) if these else ""
        for these in kernels)
    return KernelPlan(
        launches=tuple(len(these) for these in kernels),
        kernel_start=layout.kernel_start,
        kernel_names=names,
        fixed_s=tuple(sum(k.fixed_s + k.ramp_s for k in these) for these in kernels),
        issue_start=pdl_issue_start(layout.kernel_start, tuple(len(these) for these in kernels))
        if stack.pdl_weight_prefetch else (),
    )


def pdl_issue_start(kernel_start: tuple[int, ...], launches: tuple[int, ...]) -> tuple[int, ...]:
    """Per op, the op whose start issues its weights under PDL: the start of the kernel before
    the one it runs in (its prologue's weight loads run under that kernel; the first kernel
    issues at its own start). Ops of a kernel share one issue op."""
    opened = [index for index, count in enumerate(launches) if count > 0]
    previous = {index: before for before, index in pairwise(opened)}
    return tuple(min(previous.get(start, start), start) for start in kernel_start)
