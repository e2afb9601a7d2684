"""Multi-head latent attention, absorbed decode form.

Ops: ``attn.mix_norm`` → ``mla.q_a`` → ``mla.kv_a`` → ``mla.q_b`` → ``mla.kv_b`` →
``mla.core`` (scores over the compressed cache, values in the latent space: it reads
``mla.kv_b`` again) → ``mla.gate`` (optional output gate) → ``mla.o``. Tensors are placed in
declaration order (``q_a, q_b, kv_a, kv_b, gate, o``), not op order.
"""

from __future__ import annotations

from tpusim.workload.registry.block import Block, OpSpec, TensorDecl
from tpusim.workload.registry.names import AttnOp, Family, FormatKey, MlaOp, MlaTensor, Role

BLOCK = Block(
    kind="mla",
    phase="attention",
    tensors=tuple(TensorDecl(name, Family.MLA_PROJ, FormatKey.ATTENTION) for name in MlaTensor),
    ops=(
        OpSpec(AttnOp.MIX_NORM, unit="vpu", reads_small=True),
        OpSpec(MlaOp.Q_A, tensors=(MlaTensor.Q_A,)),
        OpSpec(MlaOp.KV_A, tensors=(MlaTensor.KV_A,)),
        OpSpec(MlaOp.Q_B, tensors=(MlaTensor.Q_B,)),
        OpSpec(MlaOp.KV_B, tensors=(MlaTensor.KV_B,)),
        OpSpec(MlaOp.CORE, role=Role.ATTN_CORE, rereads=(MlaTensor.KV_B,)),
        OpSpec(MlaOp.GATE, tensors=(MlaTensor.GATE,), optional=True),
        OpSpec(MlaOp.OUT, tensors=(MlaTensor.OUT,), role=Role.ATTN_OUT),
    ),
)
