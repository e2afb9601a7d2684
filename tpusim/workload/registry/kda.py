"""Kimi Delta Attention (and Gated DeltaNet, its variant without the low-rank decay).

Ops: ``attn.mix_norm`` (VPU) → ``kda.qkvgb`` (fused q/k/v/gate/beta projection) →
``kda.decay`` (KDA's low-rank decay; Gated DeltaNet's decay input is part of ``kda.qkvgb``)
→ ``kda.core`` (the delta-rule recurrence over the f32 state, VPU) → ``kda.o``.
"""

from __future__ import annotations

from tpusim.workload.registry.block import Block, OpSpec, TensorDecl
from tpusim.workload.registry.names import AttnOp, Family, FormatKey, KdaOp, KdaTensor, Role

BLOCK = Block(
    kind="kda",
    phase="attention",
    tensors=tuple(TensorDecl(name, Family.KDA_PROJ, FormatKey.ATTENTION) for name in KdaTensor),
    ops=(
        OpSpec(AttnOp.MIX_NORM, unit="vpu", reads_small=True),
        OpSpec(KdaOp.QKVGB, tensors=(KdaTensor.QKVGB,)),
        OpSpec(KdaOp.DECAY, tensors=(KdaTensor.DECAY_A, KdaTensor.DECAY_B), optional=True),
        OpSpec(KdaOp.CORE, unit="vpu", role=Role.ATTN_CORE),
        OpSpec(KdaOp.OUT, tensors=(KdaTensor.OUT,), role=Role.ATTN_OUT),
    ),
)
