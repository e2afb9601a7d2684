"""A mixture-of-experts MLP with optional latent projections and shared experts.

Ops: ``mlp.mix_norm`` → ``moe.router`` → ``moe.latent_down`` (before the top-k, so its
all-gather overlaps the selection: the K3 kernel's order) → ``moe.topk`` (the routing
decision: how many experts follow is known only after it) → ``moe.shared_gate_up`` →
``moe.shared_down`` → ``expert[0] .. expert[n-1]`` → ``moe.combine`` → ``moe.latent_up``.
The small-parameter row (router bias, latent norm) is read by ``mlp.mix_norm``,
``moe.latent_down`` and ``moe.topk``.
"""

from __future__ import annotations

from tpusim.workload.registry.block import Block, OpSpec, TensorDecl
from tpusim.workload.registry.names import (
    ExpertTensor,
    Family,
    FormatKey,
    MlpOp,
    MoeOp,
    MoeTensor,
    Role,
)

BLOCK = Block(
    kind="moe",
    phase="moe",
    tensors=(
        TensorDecl(MoeTensor.ROUTER, Family.ROUTER, FormatKey.ROUTER),
        TensorDecl(MoeTensor.LATENT_DOWN, Family.LATENT_PROJ, FormatKey.LATENT_PROJ),
        TensorDecl(MoeTensor.LATENT_UP, Family.LATENT_PROJ, FormatKey.LATENT_PROJ),
        TensorDecl(MoeTensor.SHARED_GATE_UP, Family.SHARED_EXPERT, FormatKey.SHARED_EXPERT),
        TensorDecl(MoeTensor.SHARED_DOWN, Family.SHARED_EXPERT, FormatKey.SHARED_EXPERT),
        TensorDecl(ExpertTensor.GATE_UP, Family.ROUTED_EXPERT, FormatKey.ROUTED_GATE_UP),
        TensorDecl(ExpertTensor.DOWN, Family.ROUTED_EXPERT, FormatKey.ROUTED_DOWN),
    ),
    ops=(
        OpSpec(MlpOp.MIX_NORM, unit="vpu", reads_small=True),
        OpSpec(MoeOp.ROUTER, tensors=(MoeTensor.ROUTER,)),
        OpSpec(MoeOp.LATENT_DOWN, tensors=(MoeTensor.LATENT_DOWN,), reads_small=True, optional=True),
        OpSpec(MoeOp.TOPK, unit="vpu", reads_small=True),
        OpSpec(MoeOp.SHARED_GATE_UP, tensors=(MoeTensor.SHARED_GATE_UP,), optional=True),
        OpSpec(MoeOp.SHARED_DOWN, tensors=(MoeTensor.SHARED_DOWN,), role=Role.MOE_SHARED, optional=True),
        OpSpec("expert", tensors=(ExpertTensor.GATE_UP, ExpertTensor.DOWN), role=Role.MOE_EXPERT,
               repeated=True),
        OpSpec(MoeOp.COMBINE, unit="vpu"),
        OpSpec(MoeOp.LATENT_UP, tensors=(MoeTensor.LATENT_UP,), optional=True),
    ),
)
