"""The op and tensor registry: one definition of every model's ops, read by everyone.

A decoder step is a sequence of blocks: per layer an attention block (KDA / Gated DeltaNet,
MLA or GQA) and an MLP block (MoE or dense), then the head. This package names every op,
role, tensor, family, format key and collective (:mod:`.names`, typed :class:`~enum.StrEnum`
members) and declares each block kind's tensors and op sequence once (one module per kind:
:mod:`.kda`, :mod:`.mla`, :mod:`.gqa`, :mod:`.moe`, :mod:`.dense_mlp`, :mod:`.head`).

Who reads it: the program builder (:mod:`tpusim.workload.program`: the op list the engine
simulates), the shapes (:mod:`tpusim.workload.shapes`: each tensor's family and format key),
the issue plan and VMEM accounting (:mod:`tpusim.schedule`: which ops read the small
parameters, which op reads a tensor again, the routing op, arena order), the engine and the
sweep's estimate (roles), and the kernel (:mod:`megakernel.dma_plan`: its prologue and
window op lists are these sequences with layer offsets).

Adding an attention or MLP kind: a module here declaring its :class:`~.block.Block` (its names
in :mod:`.names`), registered in :data:`BLOCKS`; its config fields in
:mod:`tpusim.workload.modelconfig`; its shapes in :mod:`tpusim.workload.shapes`; its op
costs in :mod:`tpusim.workload.program`; tests.
"""

from __future__ import annotations

from tpusim.workload.registry import dense_mlp, gqa, head, kda, mla, moe
from tpusim.workload.registry.block import Block, OpSpec, TensorDecl
from tpusim.workload.registry.names import (
    Family,
    FormatKey,
    MoeOp,
    SmallParam,
    expert_index,
    expert_op,
    is_expert_op,
)

BLOCKS: dict[str, Block] = {block.kind: block for block in
                            (kda.BLOCK, mla.BLOCK, gqa.BLOCK, moe.BLOCK, dense_mlp.BLOCK, head.BLOCK)}
ATTENTION_KINDS = ("kda", "mla", "gqa")
MOE, DENSE, HEAD = moe.BLOCK, dense_mlp.BLOCK, head.BLOCK

# The op whose end is a MoE layer's routing decision: how many expert ops follow is known only then.
ROUTING_OP = MoeOp.TOPK
MOE_PRE_EXPERTS, EXPERT, MOE_POST_EXPERTS = MOE.split_at_experts()
assert EXPERT is not None
# A MoE layer's expert region begins at its first expert op, or at the op after the experts
# when it routes none here: the roles that mark it.
EXPERT_REGION_ROLES = (EXPERT.anchor, MOE_POST_EXPERTS[0].anchor)
# The kernel's window lead-in: from the routing decision to the last op before the experts.
LEAD_IN: tuple[str, ...] = tuple(op.name for op in
                                 MOE_PRE_EXPERTS[[op.name for op in MOE_PRE_EXPERTS].index(ROUTING_OP):])

_SMALL = TensorDecl("", Family.SMALL_PARAMS, FormatKey.SMALL_PARAMS)
TENSORS: dict[str, TensorDecl] = {decl.name: decl for block in BLOCKS.values() for decl in block.tensors}
# Streamed weight tensors in arena placement order (blocks in BLOCKS order, each in declaration order).
TENSOR_ORDER: tuple[str, ...] = tuple(TENSORS)
# Ops that read their layer's small-parameter row (the last of a layer frees its buffer).
SMALL_READERS: frozenset[str] = frozenset(op.name for block in BLOCKS.values() for op in block.ops if op.reads_small)
# Op -> weights it reads again after their own op (absorbed MLA attention).
REREADS: dict[str, tuple[str, ...]] = {op.name: op.rereads for block in BLOCKS.values() for op in block.ops
                                       if op.rereads}


def attention_block(kind: str) -> Block:
    """The attention block of kind ``kind`` (``kda`` covers Gated DeltaNet too)."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; known: {', '.join(ATTENTION_KINDS)}")
    return BLOCKS[kind]


def mlp_block(is_moe: bool) -> Block:
    """The MLP block of a MoE or a dense layer."""
    return BLOCKS[MOE.kind if is_moe else DENSE.kind]


def head_block() -> Block:
    return BLOCKS[HEAD.kind]


def tensor_decl(name: str) -> TensorDecl:
    """Family and format key of weight tensor ``name`` (small parameters share one)."""
    decl = TENSORS.get(name)
    if decl is not None:
        return decl
    if name in SmallParam.__members__.values():
        return TensorDecl(name, _SMALL.family, _SMALL.format_key)
    raise KeyError(f"unknown weight tensor {name!r}")


__all__ = [
    "ATTENTION_KINDS", "BLOCKS", "DENSE", "EXPERT", "EXPERT_REGION_ROLES", "HEAD", "LEAD_IN", "MOE",
    "MOE_POST_EXPERTS", "MOE_PRE_EXPERTS", "REREADS", "ROUTING_OP", "SMALL_READERS", "TENSORS",
    "TENSOR_ORDER", "Block", "OpSpec", "TensorDecl", "attention_block", "expert_index", "expert_op",
    "head_block", "is_expert_op", "mlp_block", "tensor_decl",
]
