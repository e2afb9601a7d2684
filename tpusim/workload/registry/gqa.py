"""Grouped-query attention (optional output gate, optional sliding window).

Ops: ``attn.mix_norm`` → ``gqa.q`` → ``gqa.k`` → ``gqa.v`` → ``gqa.core`` (over the KV
cache) → ``gqa.gate`` (optional) → ``gqa.o``.
"""

from __future__ import annotations

from tpusim.workload.registry.block import Block, OpSpec, TensorDecl
from tpusim.workload.registry.names import AttnOp, Family, FormatKey, GqaOp, GqaTensor, Role

BLOCK = Block(
    kind="gqa",
    phase="attention",
    tensors=tuple(TensorDecl(name, Family.GQA_PROJ, FormatKey.ATTENTION) for name in GqaTensor),
    ops=(
        OpSpec(AttnOp.MIX_NORM, unit="vpu", reads_small=True),
        OpSpec(GqaOp.Q, tensors=(GqaTensor.Q,)),
        OpSpec(GqaOp.K, tensors=(GqaTensor.K,)),
        OpSpec(GqaOp.V, tensors=(GqaTensor.V,)),
        OpSpec(GqaOp.CORE, role=Role.ATTN_CORE),
        OpSpec(GqaOp.GATE, tensors=(GqaTensor.GATE,), optional=True),
        OpSpec(GqaOp.OUT, tensors=(GqaTensor.OUT,), role=Role.ATTN_OUT),
    ),
)
