"""Kernel fusion of a conventional GPU serving stack: which kernels a decode step launches.

Read by both conventional GPU stacks: ``:eager`` pays a launch per kernel, the default
serving stack (:mod:`tpusim.engine.gpu_stack`) a graph gap and a fixed time by kernel *kind*
(``gemm``, ``grouped_gemm``, ``attention``, ``small``), so every kernel below carries one.

A serving stack (vLLM, SGLang, TensorRT-LLM running a DeepSeek/Kimi-style model) does not
launch one kernel per op of our program, nor one per line of the model's Python: some ops
are several kernels (a GEMM and its activation), some ops share one (the q/kv LoRA down
projections as one GEMM; one grouped GEMM for every routed expert of a layer). This module
holds that mapping as a table and lists, per op of a program, the kernels launched before it
(:func:`op_kernels`); :mod:`tpusim.engine.gpu_stack` prices them.

The table (assumed: our reading of those stacks' decode paths, not a measurement; the
serving stack's per-kernel figures are calibrated against it — calibration.sources.gpu_stack):

====================  =======  ====================================================================
program op            kernels  what the stack launches (kinds in FUSION_TABLE)
====================  =======  ====================================================================
``attn.mix_norm``     1        residual mix + RMSNorm (+ activation quant), one fused kernel
``kda.qkvgb``         1        fused q/k/v/gate/beta projection GEMM
``kda.decay``         2        low-rank decay gate: two chained GEMMs (7168→128→heads·128)
``kda.core``          3        short-conv state update; fused recurrent gated-delta-rule step;
                               gated RMSNorm of the output
``kda.o``             1        output projection GEMM
``mla.q_a``           1        q_a and kv_a down projections as one GEMM (``fused_qkv_a_proj``)
``mla.kv_a``          0        fused into ``mla.q_a``'s GEMM (its weights stream with it)
``mla.q_b``           2        q LoRA RMSNorm; q_b GEMM
``mla.kv_b``          2        kv LoRA RMSNorm + RoPE; absorbed W_UK batched GEMM
``mla.core``          2        KV-cache append; MLA decode attention (split-KV, merge fused)
``mla.gate``          1        output-gate GEMM
``mla.o``             2        absorbed W_UV batched GEMM with the gate; output projection GEMM
``gqa.q``             1        fused QKV GEMM
``gqa.k``, ``gqa.v``  0        fused into ``gqa.q``'s GEMM
``gqa.core``          2        RoPE + KV-cache append; decode attention
``gqa.gate``          1        output-gate GEMM
``gqa.o``             1        output projection GEMM
``mlp.mix_norm``      1        residual mix + RMSNorm, one fused kernel
``moe.router``        1        router GEMM
``moe.topk``          1        fused sigmoid + bias + top-k + renormalise
``moe.latent_down``   2        latent down GEMM; latent RMSNorm
``moe.shared_gate_up``2        shared-expert gate/up GEMM; activation
``moe.shared_down``   1        shared-expert down GEMM
``expert[*]``         4        **once per layer for all routed experts** (a fused-MoE grouped
                               GEMM): token permute/align; grouped gate/up GEMM; activation;
                               grouped down GEMM. Every routed expert's weights are requested
                               when the first of them starts. A layer whose device got no
                               expert still launches them (with ``moe.combine``).
``moe.combine``       1        un-permute + weighted sum + shared-expert add
``moe.latent_up``     1        latent up GEMM
``mlp.gate_up``       2        dense MLP gate/up GEMM; activation
``mlp.down``          1        dense MLP down GEMM
``head.norm``         1        final RMSNorm
``head.lm_head``      1        lm_head GEMM
other ops             1        one kernel each (a GEMM when the op reads weights on the MXU)
collectives           1 each   an NCCL kernel per call (counted by the engine's stream, not here)
====================  =======  ====================================================================

K3 per layer: a KDA + MoE layer is 8 + 14 = 22 kernels plus 3 NCCL calls (attention
all-reduce, latent all-gather, MoE all-reduce); an MLA + MoE layer 11 + 14 + 3 — the "tens
of kernels per layer plus NCCL collectives" of a conventional decode step.

Norms are **not** fused into the following GEMM: the stacks above run RMSNorm as its own
(fused residual-add + norm + quant) kernel. Some fuse the norm into the preceding NCCL
all-reduce instead (TensorRT-LLM's all-reduce fusion); K3's attention-residual mixture is
not one of the patterns those kernels cover, so the table keeps the norm as a kernel.

**Stack files.** The table above is the ``generic`` stack. A chip names its stack in
``execution.gpu.stack``; any other name is a data file ``tpusim/stacks/<name>.yaml``
(:func:`load_stack`), e.g. ``sglang-k3``: SGLang's K3 decode path on Blackwell, read from the
public code (merged MoE front GEMM, fused KDA decode, trtllm-gen MLA, the routed-expert path
by weight format, K3's fused all-reduce + norm). A stack file may list *side-stream* kernels
per op (SGLang's alternate streams during capture): counted and listed, assumed overlapped
with the main stream and not charged. :func:`stack_kernel_table` lists one layer's kernels
(``tpusim plan --kernels``).

Steps of :func:`op_kernels`, with the invariant each keeps:

1. Walk the ops in program order; look up each op's rule (routed experts by role).
2. A routed expert that follows another routed expert of the same layer joins its kernel
   (0 launches, same ``kernel_start``); the first one pays the grouped-GEMM launches.
3. An op whose rule says ``fused_into_previous`` joins the previous op's kernel when that
   op is in the same layer. *Invariant:* ``kernel_start[i] <= i`` and a kernel never
   spans two layers.
4. ``moe.combine`` of a layer that had no routed-expert op also pays the grouped-GEMM
   launches (the stack launches them with zero rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from hwmodels.errors import InputError
from tpusim.workload.program import Op, Program
from tpusim.workload.registry.names import (
    AttnOp,
    Collective,
    GqaOp,
    HeadOp,
    KdaOp,
    MlaOp,
    MlpOp,
    MoeOp,
    Role,
)

EXPERT_ROLE = Role.MOE_EXPERT
COMBINE = MoeOp.COMBINE
# kernel kinds (what sets a kernel's fixed time in the serving stack)
GEMM, GROUPED_GEMM, ATTENTION, SMALL = "gemm", "grouped_gemm", "attention", "small"
# routing kernels of a fused MoE (stack files): a multi-CTA fused route + quant kernel, and a
# fused MoE's in-op routing on one CTA (execution.gpu.radix_router_s / single_cta_router_s)
RADIX_ROUTER, SINGLE_CTA_ROUTER = "radix_router", "single_cta_router"
KERNEL_KINDS = (GEMM, GROUPED_GEMM, ATTENTION, SMALL, RADIX_ROUTER, SINGLE_CTA_ROUTER)
GENERIC_STACK = "generic"
# How a stack file may say it runs one of the plan's collectives itself (``collectives:``):
# ``side``: on a side stream (its kernel is among an op's ``side`` kernels), ``fused``: inside
# an op's kernel (SGLang's ``gemm_ag``: latent_up GEMV + multicast). Neither is launched nor
# charged as a collective of its own; any other collective keeps its kernel.
STACK_COLLECTIVE_MODES = ("side", "fused")
STACKS_DIR = Path(__file__).resolve().parents[1] / "stacks"


@dataclass(frozen=True)
class FusionRule:
    """How one program op maps onto kernels of a conventional stack."""

    kinds: tuple[str, ...]  # the kernels launched before the op when it opens them, by kind
    what: str
    fused_into_previous: bool = False  # runs inside the previous op's kernel (same layer)
    side: tuple[str, ...] = ()  # kernels on a side stream (counted, overlapped: not charged)

    @property
    def kernels(self) -> int:
        return len(self.kinds)


FUSION_TABLE: dict[str, FusionRule] = {
    AttnOp.MIX_NORM: FusionRule((SMALL,), "residual mix + RMSNorm"),
    KdaOp.QKVGB: FusionRule((GEMM,), "q/k/v/gate/beta GEMM"),
    KdaOp.DECAY: FusionRule((GEMM, GEMM), "decay-gate GEMMs (low rank)"),
    KdaOp.CORE: FusionRule((SMALL, ATTENTION, SMALL), "conv update, gated delta rule, gated RMSNorm"),
    KdaOp.OUT: FusionRule((GEMM,), "o_proj GEMM"),
    MlaOp.Q_A: FusionRule((GEMM,), "fused q_a/kv_a GEMM"),
    MlaOp.KV_A: FusionRule((), "in the fused q_a/kv_a GEMM", fused_into_previous=True),
    MlaOp.Q_B: FusionRule((SMALL, GEMM), "q LoRA RMSNorm, q_b GEMM"),
    MlaOp.KV_B: FusionRule((SMALL, GEMM), "kv LoRA RMSNorm + RoPE, W_UK bmm"),
    MlaOp.CORE: FusionRule((SMALL, ATTENTION), "KV append, MLA decode attention"),
    MlaOp.GATE: FusionRule((GEMM,), "gate GEMM"),
    MlaOp.OUT: FusionRule((GEMM, GEMM), "W_UV bmm, o_proj GEMM"),
    GqaOp.Q: FusionRule((GEMM,), "fused QKV GEMM"),
    GqaOp.K: FusionRule((), "in the fused QKV GEMM", fused_into_previous=True),
    GqaOp.V: FusionRule((), "in the fused QKV GEMM", fused_into_previous=True),
    GqaOp.CORE: FusionRule((SMALL, ATTENTION), "RoPE + KV append, decode attention"),
    GqaOp.GATE: FusionRule((GEMM,), "gate GEMM"),
    GqaOp.OUT: FusionRule((GEMM,), "o_proj GEMM"),
    MlpOp.MIX_NORM: FusionRule((SMALL,), "residual mix + RMSNorm"),
    MoeOp.ROUTER: FusionRule((GEMM,), "router GEMM"),
    MoeOp.TOPK: FusionRule((SMALL,), "fused sigmoid/bias/top-k"),
    MoeOp.LATENT_DOWN: FusionRule((GEMM, SMALL), "latent_down GEMM, latent RMSNorm"),
    MoeOp.SHARED_GATE_UP: FusionRule((GEMM, SMALL), "shared gate/up GEMM, activation"),
    MoeOp.SHARED_DOWN: FusionRule((GEMM,), "shared down GEMM"),
    COMBINE: FusionRule((SMALL,), "un-permute + weighted sum"),
    MoeOp.LATENT_UP: FusionRule((GEMM,), "latent_up GEMM"),
    MlpOp.GATE_UP: FusionRule((GEMM, SMALL), "dense gate/up GEMM, activation"),
    MlpOp.DOWN: FusionRule((GEMM,), "dense down GEMM"),
    HeadOp.NORM: FusionRule((SMALL,), "final RMSNorm"),
    HeadOp.LM_HEAD: FusionRule((GEMM,), "lm_head GEMM"),
}
ROUTED_EXPERTS = FusionRule((SMALL, GROUPED_GEMM, SMALL, GROUPED_GEMM),
                            "fused MoE: permute, grouped gate/up GEMM, activation, grouped down GEMM")
DEFAULT_RULE = FusionRule((SMALL,), "one kernel")
DEFAULT_GEMM_RULE = FusionRule((GEMM,), "one GEMM")  # an op not in the table that reads weights on the MXU


@dataclass(frozen=True)
class StackTable:
    """One serving stack's fusion table: rules by op name, the routed-expert rule by weight
    format (``default`` for other formats), and whether the engine adds an activation-quantize
    kernel before every low-precision GEMM (the generic stack) or the table names them."""

    name: str
    ops: dict[str, FusionRule]
    experts: dict[str, FusionRule] = field(default_factory=dict)
    default_experts: FusionRule = ROUTED_EXPERTS
    quantize_kernels: bool = True
    pdl_weight_prefetch: bool = False  # PDL: a kernel's weight loads run under the previous kernel
    description: str = ""
    source: str = ""
    collectives: dict[str, str] = field(default_factory=dict)  # name -> side | fused (see STACK_COLLECTIVE_MODES)

    def runs_inside(self, collective: str) -> bool:
        """Whether the stack runs the plan's ``collective`` on a side stream or inside an op's
        kernel (listed with that op's kernels, not launched or charged on its own)."""
        return collective in self.collectives

    def expert_rule(self, fmt: str) -> FusionRule:
        return self.experts.get(fmt, self.default_experts)


GENERIC = StackTable(GENERIC_STACK, FUSION_TABLE, description="generic CUDA-graph stack (vLLM class)",
                     source="assumed: our reading of vLLM / SGLang / TensorRT-LLM decode paths")


def _rule(entry: object, where: str) -> FusionRule:
    if not isinstance(entry, dict) or not isinstance(entry.get("kernels", []), list):
        raise InputError(f"{where}: expected a mapping with a kernels list")
    unknown = set(entry) - {"kernels", "side", "what", "fused_into_previous"}
    if unknown:
        raise InputError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    kinds = tuple(entry.get("kernels", []))
    side = tuple(entry.get("side", []))
    bad = [kind for kind in kinds + side if kind not in KERNEL_KINDS]
    if bad:
        raise InputError(f"{where}: unknown kernel kind {bad[0]!r}; known: {', '.join(KERNEL_KINDS)}")
    return FusionRule(kinds, str(entry.get("what", "")), bool(entry.get("fused_into_previous", False)), side)


@cache
def load_stack(name: str) -> StackTable:
    """The fusion table of stack ``name``: ``generic`` (this module's table) or the file
    ``tpusim/stacks/<name>.yaml`` (its keys are program op names of the registry)."""
    if name == GENERIC_STACK:
        return GENERIC
    path = STACKS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted([GENERIC_STACK, *(p.stem for p in STACKS_DIR.glob("*.yaml"))])
        raise InputError(f"unknown serving stack {name!r}; known: {', '.join(known)}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    where = f"tpusim/stacks/{path.name}"
    if not isinstance(data, dict) or data.get("name") != name:
        raise InputError(f"{where}: expected a mapping whose name is {name!r}")
    known_ops = set(FUSION_TABLE)
    ops = {}
    for key, entry in (data.get("ops") or {}).items():
        if key not in known_ops:
            raise InputError(f"{where}: ops.{key}: not a program op with a fusion rule ({', '.join(sorted(known_ops))})")
        ops[key] = _rule(entry, f"{where}: ops.{key}")
    experts = {str(fmt): _rule(entry, f"{where}: experts.{fmt}") for fmt, entry in (data.get("experts") or {}).items()}
    default = experts.pop("default", ROUTED_EXPERTS)
    collectives = {}
    for key, mode in (data.get("collectives") or {}).items():
        if key not in set(Collective) or mode not in STACK_COLLECTIVE_MODES:
            raise InputError(f"{where}: collectives.{key}: expected a plan collective "
                             f"({', '.join(Collective)}) run {' or '.join(STACK_COLLECTIVE_MODES)}")
        collectives[str(key)] = str(mode)
    return StackTable(name, {**FUSION_TABLE, **ops}, experts, default, bool(data.get("quantize_kernels", True)),
                      bool(data.get("pdl_weight_prefetch", False)), str(data.get("description", "")),
                      str(data.get("source", "")), collectives)


def expert_format(op: Op) -> str:
    """The weight format that picks a routed expert's kernel path (its first tensor's)."""
    return op.tensors[0].fmt.name if op.tensors else ""


def rule_for(name: str, role: str, stack: StackTable = GENERIC, fmt: str = "") -> FusionRule:
    """The fusion rule of an op (routed experts by role and format, everything else by name)."""
    if role == EXPERT_ROLE:
        return stack.expert_rule(fmt)
    return stack.ops.get(name, DEFAULT_RULE)


@dataclass(frozen=True)
class OpKernels:
    """Per op of a program: the kernels launched before it (kinds) and what they are."""

    kinds: tuple[tuple[str, ...], ...]
    kernel_start: tuple[int, ...]
    names: tuple[str, ...]


def _layer_expert_format(ops: list[Op]) -> dict[int, str]:
    return {op.layer: expert_format(op) for op in ops if op.role == EXPERT_ROLE}


def op_kernels(program: Program, stack: StackTable = GENERIC) -> OpKernels:
    """The kernels a conventional GPU stack launches for ``program`` (steps in the docstring)."""
    ops = program.ops
    formats = _layer_expert_format(ops)
    kinds: list[tuple[str, ...]] = []
    starts: list[int] = []
    names: list[str] = []
    experts_in_layer: dict[int, bool] = {}
    for index, op in enumerate(ops):
        rule = rule_for(op.name, op.role, stack, expert_format(op))
        if rule is DEFAULT_RULE and op.tensors and op.unit == "mxu":
            rule = DEFAULT_GEMM_RULE
        previous = ops[index - 1] if index else None
        same_layer = previous is not None and previous.layer == op.layer
        if op.role == EXPERT_ROLE:
            experts_in_layer[op.layer] = True
            joins = same_layer and previous is not None and previous.role == EXPERT_ROLE
        else:
            joins = rule.fused_into_previous and same_layer
        if joins:
            kinds.append(())
            starts.append(starts[index - 1])
            names.append("")
            continue
        these, what = rule.kinds, rule.what
        if op.name == COMBINE and not experts_in_layer.get(op.layer, False):
            experts = stack.expert_rule(formats.get(op.layer, ""))
            these = experts.kinds + these
            what = f"{experts.what} (no local expert); {what}"
        kinds.append(these)
        starts.append(index)
        count = len(these)
        names.append(f"{count} kernel{'s' if count != 1 else ''}: {what}" if count else "")
    return OpKernels(tuple(kinds), tuple(starts), tuple(names))


@dataclass(frozen=True)
class KernelRow:
    """One kernel of a layer in :func:`stack_kernel_table`: the op that opens it, its kind,
    whether it runs on a side stream, and what the stack's table says it is."""

    op: str
    kind: str
    side: bool
    what: str


def stack_kernel_table(program: Program, stack: StackTable, layer: int) -> list[KernelRow]:
    """The kernels of one layer of ``program`` under ``stack``, in order: main-stream kernels
    by op, each op's side-stream kernels after them, and one row per collective the program
    issues after an op (a collective kernel of the stack). Routed experts appear once."""
    ops = [op for op in program.ops if op.layer == layer]
    rows: list[KernelRow] = []
    seen_expert = False
    has_expert = any(op.role == EXPERT_ROLE for op in ops)
    fmt = next((expert_format(op) for op in ops if op.role == EXPERT_ROLE), "")
    for index, op in enumerate(ops):
        if op.role == EXPERT_ROLE:
            if seen_expert:
                continue
            seen_expert = True
        rule = rule_for(op.name, op.role, stack, expert_format(op))
        if rule is DEFAULT_RULE and op.tensors and op.unit == "mxu":
            rule = DEFAULT_GEMM_RULE
        if rule.fused_into_previous and index > 0:
            kinds: tuple[str, ...] = ()
        else:
            kinds = rule.kinds
        if op.name == COMBINE and not has_expert:
            experts = stack.expert_rule(fmt)
            rows += [KernelRow(str(op.name), kind, False, experts.what) for kind in experts.kinds]
        rows += [KernelRow(str(op.name), kind, False, rule.what) for kind in kinds]
        rows += [KernelRow(str(op.name), kind, True, rule.what) for kind in rule.side]
        rows += [KernelRow(str(op.name), "collective", False, f"{call.spec.kind} kernel")
                 for call in op.collectives if not stack.runs_inside(call.spec.name)]
    return rows


def kernel_lists(program: Program, stack: StackTable) -> list[dict[str, object]]:
    """One layer of each kind in ``program`` (its attention + MLP blocks, e.g. KDA + MoE and
    MLA + MoE) with its kernels under ``stack`` and their counts: main stream (collectives
    included) and side stream (``tpusim plan --kernels``)."""
    out: list[dict[str, object]] = []
    seen: set[tuple[str, ...]] = set()
    for layer in sorted({op.layer for op in program.ops}):
        ops = [op for op in program.ops if op.layer == layer]
        signature = tuple(sorted({str(op.name).split(".")[0] for op in ops if op.role != EXPERT_ROLE}))
        if signature in seen:
            continue
        seen.add(signature)
        rows = stack_kernel_table(program, stack, layer)
        out.append({"layer": layer, "blocks": "+".join(signature), "main": sum(not r.side for r in rows),
                    "side": sum(r.side for r in rows),
                    "kernels": [{"op": r.op, "kind": r.kind, "side": r.side, "what": r.what} for r in rows]})
    return out
