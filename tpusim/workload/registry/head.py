"""After the last layer: the final norm and the vocabulary projection.

Ops: ``head.norm`` (VPU) → ``head.lm_head``.
"""

from __future__ import annotations

from tpusim.workload.registry.block import Block, OpSpec, TensorDecl
from tpusim.workload.registry.names import Family, FormatKey, HeadOp, HeadTensor

BLOCK = Block(
    kind="head",
    phase="head",
    tensors=(TensorDecl(HeadTensor.LM_HEAD, Family.LM_HEAD, FormatKey.LM_HEAD),),
    ops=(
        OpSpec(HeadOp.NORM, unit="vpu"),
        OpSpec(HeadOp.LM_HEAD, tensors=(HeadTensor.LM_HEAD,)),
    ),
)
