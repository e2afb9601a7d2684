"""Typed names: every op, role, weight tensor, family, format key, state buffer and collective.

Each is a :class:`~enum.StrEnum`, so a member *is* its string (``MoeOp.TOPK == "moe.topk"``):
files, plans, traces and JSON keep the plain words, while code names them through these
types and a typo is an ``AttributeError`` at import, not a silent miss at run time. Outside
this package and the tests no code spells one of these words as a string literal
(``tests/test_registry.py`` walks every module to check).

The per-layer op sequences built from these names live beside them, one module per block
kind (:mod:`.kda`, :mod:`.mla`, :mod:`.gqa`, :mod:`.moe`, :mod:`.dense_mlp`, :mod:`.head`).
"""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """Weight families: what a schedule streams with one set of knobs (distance, chunk, buffers)."""

    KDA_PROJ = "kda_proj"  # KDA / Gated DeltaNet fused q/k/v/gate/beta, decay low-rank, output
    MLA_PROJ = "mla_proj"  # MLA q_a/q_b/kv_a/kv_b, output gate, output projection
    GQA_PROJ = "gqa_proj"  # GQA q/k/v/o (+ output gate)
    SMALL_PARAMS = "small_params"  # norms, router bias, decay and residual-mixture parameters (f32)
    ROUTER = "router"  # router projection
    LATENT_PROJ = "latent_proj"  # latent_down / latent_up
    SHARED_EXPERT = "shared_expert"  # shared experts' gate/up/down
    ROUTED_EXPERT = "routed_expert"  # routed experts' gate/up/down (one slice per expert)
    DENSE_MLP = "dense_mlp"  # dense MLP of the dense layers
    LM_HEAD = "lm_head"  # vocabulary projection
    MTP_PROJ = "mtp_proj"  # multi-token-prediction projection (resident, not in the decode step)


# Families a schedule controls, in the order tables and files list them.
WEIGHT_FAMILIES: tuple[Family, ...] = (
    Family.KDA_PROJ, Family.MLA_PROJ, Family.GQA_PROJ, Family.SMALL_PARAMS, Family.ROUTER,
    Family.LATENT_PROJ, Family.SHARED_EXPERT, Family.ROUTED_EXPERT, Family.DENSE_MLP, Family.LM_HEAD,
)
ATTENTION_FAMILIES: tuple[Family, ...] = (Family.KDA_PROJ, Family.MLA_PROJ, Family.GQA_PROJ)


class StateFamily(StrEnum):
    """Per-sequence state streamed besides the weights (engine and kernel traces)."""

    KDA_STATE = "kda_state"  # delta-rule recurrent state (and the short-conv window in the kernel)
    KV = "kv"  # MLA / GQA KV cache


class FormatKey(StrEnum):
    """Keys of a model's ``formats`` table: which storage format a group of tensors uses."""

    DENSE = "dense"  # projections without a key of their own
    ROUTER = "router"
    SMALL_PARAMS = "small_params"
    ROUTED_GATE_UP = "routed_gate_up"
    ROUTED_DOWN = "routed_down"
    LM_HEAD = "lm_head"
    EMBEDDING = "embedding"
    ATTENTION = "attention"  # optional: kda_proj / mla_proj / gqa_proj (falls back to dense)
    LATENT_PROJ = "latent_proj"  # optional (dense)
    SHARED_EXPERT = "shared_expert"  # optional (dense)
    DENSE_MLP = "dense_mlp"  # optional (dense)
    KV = "kv"  # optional: KV cache values ("" = bf16)


class AttnOp(StrEnum):
    """Ops every attention block starts with."""

    MIX_NORM = "attn.mix_norm"  # residual mixture + RMSNorm before attention (VPU)


class KdaOp(StrEnum):
    QKVGB = "kda.qkvgb"
    DECAY = "kda.decay"
    CORE = "kda.core"
    OUT = "kda.o"


class MlaOp(StrEnum):
    Q_A = "mla.q_a"
    KV_A = "mla.kv_a"
    Q_B = "mla.q_b"
    KV_B = "mla.kv_b"
    CORE = "mla.core"
    GATE = "mla.gate"
    OUT = "mla.o"


class GqaOp(StrEnum):
    Q = "gqa.q"
    K = "gqa.k"
    V = "gqa.v"
    CORE = "gqa.core"
    GATE = "gqa.gate"
    OUT = "gqa.o"


class MlpOp(StrEnum):
    """Ops of the MLP half of a layer (MoE or dense)."""

    MIX_NORM = "mlp.mix_norm"
    GATE_UP = "mlp.gate_up"
    DOWN = "mlp.down"


class MoeOp(StrEnum):
    ROUTER = "moe.router"
    LATENT_DOWN = "moe.latent_down"
    TOPK = "moe.topk"
    SHARED_GATE_UP = "moe.shared_gate_up"
    SHARED_DOWN = "moe.shared_down"
    COMBINE = "moe.combine"
    LATENT_UP = "moe.latent_up"


class HeadOp(StrEnum):
    NORM = "head.norm"
    LM_HEAD = "head.lm_head"


class Role(StrEnum):
    """Roles that differ from an op's name: where plans anchor collectives (``after``,
    ``consumed_by``) on any attention kind. Every other op's role is its name."""

    ATTN_CORE = "attn.core"  # kda.core / mla.core / gqa.core
    ATTN_OUT = "attn.out"  # kda.o / mla.o / gqa.o
    MOE_SHARED = "moe.shared"  # moe.shared_down: the shared expert's result is ready
    MOE_EXPERT = "moe.expert"  # expert[j]


class KdaTensor(StrEnum):
    QKVGB = "kda.qkvgb"
    DECAY_A = "kda.decay_a"
    DECAY_B = "kda.decay_b"
    OUT = "kda.o"


class MlaTensor(StrEnum):
    Q_A = "mla.q_a"
    Q_B = "mla.q_b"
    KV_A = "mla.kv_a"
    KV_B = "mla.kv_b"
    GATE = "mla.gate"
    OUT = "mla.o"


class GqaTensor(StrEnum):
    Q = "gqa.q"
    K = "gqa.k"
    V = "gqa.v"
    GATE = "gqa.gate"
    OUT = "gqa.o"


class MoeTensor(StrEnum):
    ROUTER = "moe.router"
    LATENT_DOWN = "moe.latent_down"
    LATENT_UP = "moe.latent_up"
    SHARED_GATE_UP = "moe.shared_gate_up"
    SHARED_DOWN = "moe.shared_down"


class ExpertTensor(StrEnum):
    """One routed expert's slice (the kernel's expert slot holds both)."""

    GATE_UP = "expert.gate_up"
    DOWN = "expert.down"


class MlpTensor(StrEnum):
    GATE_UP = "mlp.gate_up"
    DOWN = "mlp.down"


class HeadTensor(StrEnum):
    LM_HEAD = "head.lm_head"


class MtpTensor(StrEnum):
    EH_PROJ = "mtp.eh_proj"


class SmallParam(StrEnum):
    """Entries of a layer's small-parameter row (f32 vectors)."""

    ATTN_NORM = "small.attn_norm"
    MLP_NORM = "small.mlp_norm"
    RESIDUAL_MIX = "small.residual_mix"
    KDA_A_LOG = "small.kda_a_log"
    KDA_DT_BIAS = "small.kda_dt_bias"
    KDA_OUT_NORM = "small.kda_out_norm"  # Gated DeltaNet only
    KDA_CONV = "small.kda_conv"
    MLA_Q_NORM = "small.mla_q_norm"
    MLA_KV_NORM = "small.mla_kv_norm"
    GQA_Q_NORM = "small.gqa_q_norm"
    GQA_K_NORM = "small.gqa_k_norm"
    ROUTER_BIAS = "small.router_bias"
    LATENT_NORM = "small.latent_norm"
    MTP_NORMS = "small.mtp_norms"


class StateBuffer(StrEnum):
    """Per-sequence state the engine and the kernel move besides weights."""

    KDA_STATE = "kda.state"  # the engine's recurrent-state read
    KDA_STATE_WRITEBACK = "kda.state.writeback"  # the engine's recurrent-state write
    KDA_STATE_IN = "kda.state_in"  # kernel HBM operands / outputs
    KDA_STATE_OUT = "kda.state_out"
    KDA_CONV_IN = "kda.conv_in"
    KDA_CONV_OUT = "kda.conv_out"
    MLA_KV_TILE = "mla.kv_tile"
    MLA_KV_WRITE = "mla.kv_write"


class Collective(StrEnum):
    """Collectives the published and generic plans name (a plan file may name others)."""

    ATTN_PARTIAL_REDUCE = "attn.partial_reduce"
    ATTN_HEAD_EXCHANGE = "attn.head_exchange"
    ATTN_HALF_GATHER = "attn.half_gather"
    ATTN_ALLREDUCE = "attn.allreduce"
    ATTN_DP_ALLGATHER = "attn.dp_allgather"
    MOE_LATENT_ALLGATHER = "moe.latent_allgather"
    MOE_ROUTER_EXCHANGE = "moe.router_exchange"
    MOE_ROUTED_REDUCE = "moe.routed_reduce"
    MOE_SHARED_REDUCE = "moe.shared_reduce"
    MOE_OUTPUT_ALLGATHER = "moe.output_allgather"
    MOE_ALLREDUCE = "moe.allreduce"
    MOE_FUSED_REDUCE = "moe.fused_reduce"  # shared + routed expert reductions in one (plan_variants)
    MLP_ALLREDUCE = "mlp.allreduce"


OP_NAMES = (AttnOp, KdaOp, MlaOp, GqaOp, MlpOp, MoeOp, HeadOp)
TENSOR_NAMES = (KdaTensor, MlaTensor, GqaTensor, MoeTensor, ExpertTensor, MlpTensor, HeadTensor, MtpTensor,
                SmallParam)
# Every vocabulary the "no literal" check covers.
VOCABULARIES: tuple[type[StrEnum], ...] = (
    Family, StateFamily, FormatKey, *OP_NAMES, Role, *TENSOR_NAMES, StateBuffer, Collective,
)

EXPERT_OP_PREFIX = "expert["


def expert_op(index: int) -> str:
    """The name of a layer's ``index``-th routed-expert op (``expert[3]``)."""
    return f"{EXPERT_OP_PREFIX}{index}]"


def expert_index(name: str) -> int | None:
    """``index`` of an ``expert[index]`` op name, None for any other op."""
    if name.startswith(EXPERT_OP_PREFIX) and name.endswith("]"):
        return int(name[len(EXPERT_OP_PREFIX):-1])
    return None


def is_expert_op(name: str) -> bool:
    """Whether ``name`` is a routed-expert op (``expert[j]``)."""
    return expert_index(name) is not None
