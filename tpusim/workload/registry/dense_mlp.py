"""A dense SwiGLU MLP (the dense layers of a MoE model, every layer of a dense model).

Ops: ``mlp.mix_norm`` → ``mlp.gate_up`` → ``mlp.down``.
"""

from __future__ import annotations

from tpusim.workload.registry.block import Block, OpSpec, TensorDecl
from tpusim.workload.registry.names import Family, FormatKey, MlpOp, MlpTensor

BLOCK = Block(
    kind="dense",
    phase="mlp",
    tensors=tuple(TensorDecl(name, Family.DENSE_MLP, FormatKey.DENSE_MLP) for name in MlpTensor),
    ops=(
        OpSpec(MlpOp.MIX_NORM, unit="vpu", reads_small=True),
        OpSpec(MlpOp.GATE_UP, tensors=(MlpTensor.GATE_UP,)),
        OpSpec(MlpOp.DOWN, tensors=(MlpTensor.DOWN,)),
    ),
)
