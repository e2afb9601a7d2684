"""A per-device program as a plain-JSON *step description* the JAX replay can run.

:func:`describe_program` walks a :class:`~tpusim.workload.program.Program` (whose shapes come
from :mod:`tpusim.workload.shapes`, their one owner) and writes each op as the replay's
entry (the table in :mod:`calibration.gpu_bench.replay`). The description carries shapes
only, no tpusim types, so the replay runs where only jax and numpy exist (the lent GPU
machine) and the CPU loop replays through the same code.

``group_experts=True`` folds the routed-expert ops of one layer into one ``experts`` entry
(a grouped GEMM over the layer's routed experts, rows padded to the busiest expert), as a
JAX MoE layer runs them; ``False`` keeps one matmul per expert (the CPU loop's replay).
"""

from __future__ import annotations

from typing import Any

from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import KdaOp, MoeOp, Role

NATIVE_FORMATS = ("bf16", "f32")


def _dtype(format_name: str, where: str) -> str:
    if format_name not in NATIVE_FORMATS:
        raise ValueError(
            f"{where}: weight format {format_name!r} has no native dtype in the replay; use a "
            "model with [formats=bf16] or [formats=f32]"
        )
    return format_name


def _pairs(op: Op) -> list[list[int]]:
    """Attention cores list (q·Kᵀ, P·V) matmul pairs: ``[m, k, span, n]`` per pair."""
    mats = list(op.matmuls)
    return [[mats[i][0], mats[i][1], mats[i][2], mats[i + 1][2]] for i in range(0, len(mats) - 1, 2)]


def describe_op(program: Program, op: Op) -> dict[str, Any]:
    """One op as a replay entry (see the module docstring)."""
    model = program.model
    if op.name == MoeOp.TOPK:
        return {"kind": "topk", "experts": model.moe.num_experts, "k": model.moe.top_k}
    if op.name == KdaOp.CORE:
        assert model.kda is not None
        return {"kind": "state", "heads": program.plan.attention_heads_per_device, "dim": model.kda.head_dim}
    if op.unit == "mxu" and op.tensors:
        return {"kind": "matmul", "mats": [
            [rows, k, n, _dtype(t.format_name, t.name)]
            for t, (rows, k, n) in zip(op.tensors, op.matmuls, strict=True)
        ]}
    if op.unit == "mxu":
        return {"kind": "attention", "pairs": _pairs(op), "shares_latent": op.name.startswith("mla")}
    return {"kind": "vector", "cols": [t.cols for t in op.tensors]}


def _grouped(experts: list[Op]) -> dict[str, Any]:
    first = experts[0]
    return {
        "kind": "experts", "count": len(experts),
        "rows": max(op.matmuls[0][0] for op in experts),
        "mats": [[k, n, _dtype(t.format_name, t.name)] for t, (_, k, n) in zip(first.tensors, first.matmuls, strict=True)],
    }


def describe_program(program: Program, *, group_experts: bool = False) -> dict[str, Any]:
    """``{"batch", "hidden", "ops"}`` for :func:`calibration.gpu_bench.replay.build_step`."""
    ops: list[dict[str, Any]] = []
    pending: list[Op] = []
    for op in program.ops:
        if group_experts and op.role == Role.MOE_EXPERT:
            if pending and pending[-1].layer != op.layer:
                ops.append(_grouped(pending))
                pending = []
            pending.append(op)
            continue
        if pending:
            ops.append(_grouped(pending))
            pending = []
        ops.append(describe_op(program, op))
    if pending:
        ops.append(_grouped(pending))
    return {"batch": program.batch, "hidden": program.model.hidden_size, "ops": ops}
