"""The prefill program: one chunk of a prompt through the model, op by op.

``build_prefill_program(model, plan, tokens=C, prefix_tokens=P)`` is the per-device
:class:`~tpusim.workload.program.Program` of a chunked-prefill step that fills the KV cache
of ``C`` new prompt tokens of one sequence whose first ``P`` tokens are already cached. It
walks the same registry block sequences as the decode program
(:func:`~tpusim.workload.program.build_program`, ``rows = C``, ``sequences = 1``) and
prices each op with :func:`prefill_op_cost` instead of the decode costs:

| op | decode (program.py) | prefill (here) |
| --- | --- | --- |
| weight matmuls | ``B x K x N`` | ``C x K x N``: the same weights, many rows (compute-bound) |
| routed experts | distinct experts of ``B`` rows | distinct experts of ``C`` rows from the same routing draw (at 8k tokens, top-16 of 896: every expert, ~146 rows each) |
| ``mla.kv_b`` | absorbed: ``B x kv_lora x h(nope+v)`` | **not absorbed**: decompress the latent of every attended token, ``(P + C) x kv_lora x h(nope+v)`` |
| ``mla.core`` | scores and values in the latent space over the span | multi-head attention with ``qk_head_dim`` keys and ``v_head_dim`` values, causal: ``P + (C+1)/2`` keys per query on average |
| ``gqa.core`` | one query row per sequence over the span | causal, ``min(window, P + (C+1)/2)`` keys per query |
| ``kda.core`` | delta-rule recurrence, one token (VPU) | **chunked** (chunks of :data:`LINEAR_CHUNK_TOKENS`, the FLA ``chunk_kda`` / ``chunk_gated_delta_rule`` form) on the matrix unit: intra-chunk ``QK^T``, ``AV`` and the WY/UT correction, inter-chunk ``QS``, ``WS`` and the state update ``K^T V``; the state is read and written once per chunk step |
| ``head.lm_head`` | every row | the last row only (the logits of the next token) |
| ``moe.combine`` | the megakernel's: every distinct expert's output over all ``B`` rows, weighted | **by pairs**: each token sums the outputs of its top-k picks this device ran, ``2 x width x`` (token, expert) pairs (:func:`prefill_combine_flops`) |

KV bytes: the prefix's cache is read once (``P x kv bytes per token``) and the chunk's
``C`` entries are written; the causal mask halves the chunk's own score work.

Activations: a prefill chunk streams its rows through on-chip memory in tiles of
:data:`PREFILL_ROW_TILE` rows (``Program.resident_row_tile``), so the schedule's static
scratch is sized for one tile; the activation traffic between tiles and HBM is **not priced**
(assumption: hidden behind the compute-bound matmuls).
"""

from __future__ import annotations

import dataclasses

from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import (
    DELTA_RULE_FLOPS_PER_STATE_ELEMENT,
    Program,
    StepPhase,
    _BlockContext,
    _op_cost,
    build_program,
)
from tpusim.workload.registry.names import GqaOp, HeadOp, HeadTensor, KdaOp, MlaOp, MlaTensor, MoeOp
from tpusim.workload.routing import RoutingModel
from tpusim.workload.shapes import (
    attention_span_tokens,
    kv_cache_bytes_per_token,
    recurrent_state_bytes,
)
from tpusim.workload.sharding import ShardingPlan

# Tokens per chunk of the chunked delta-rule kernels (FLA's chunk_kda / chunk_gated_delta_rule
# default BT = 64).
LINEAR_CHUNK_TOKENS = 64
# Rows of activations a prefill step keeps on chip at once (assumption: a 32-row tile, the
# order of a TPU prefill kernel's row block; it only sizes the static scratch check).
PREFILL_ROW_TILE = 32
SOFTMAX_FLOPS_PER_SCORE = 5.0


def causal_keys_per_query(prefix_tokens: int, chunk_tokens: int) -> float:
    """Mean keys a chunk's query attends to under the causal mask: the whole prefix plus,
    for query ``i`` of the chunk, ``i + 1`` chunk tokens."""
    return prefix_tokens + (chunk_tokens + 1) / 2


def prefill_combine_flops(ctx: _BlockContext) -> float:
    """``moe.combine`` of a prefill chunk: the routing-weighted sum of each token's top-k expert
    outputs over the (token, expert) pairs this device ran (``ctx.routed_pairs``), one
    multiply-add per output element of each pair.

    No prefill kernel runs an expert over rows that did not pick it: vLLM's ``fused_moe``
    writes each pair's output into ``[tokens, top_k, hidden]`` and ``moe_sum`` reduces it over
    ``top_k``; FlashInfer's CUTLASS MoE (TensorRT-LLM's ``finalizeMoeRouting``) walks every
    token's ``top_k`` picks and adds the rows of the experts on this rank. Under expert TP each
    rank runs a column slice of every pick (all ``tokens x top_k`` pairs, a partial sum the
    all-reduce after ``moe.combine`` completes); under EP only its experts' picks. The decode
    megakernel's rule (every distinct expert over every row, :func:`_op_cost`) would charge a
    7.4k-token prompt 384 experts x 7.4k rows on one of 4 expert-TP GPUs (Kimi-K2.5), 48x the
    pairs it has.
    """
    moe = ctx.model.moe
    assert moe is not None
    return 2.0 * (moe.latent_size or ctx.model.hidden_size) * max(1, ctx.routed_pairs)


def prefill_op_cost(name: str, ctx: _BlockContext, rows: int) -> dict[str, object]:
    """The non-weight costs of op ``name`` in a prefill chunk of ``rows`` tokens over a prefix
    of ``ctx.context_tokens - rows`` (table in the module docstring); other ops as in decode."""
    model, plan = ctx.model, ctx.plan
    heads = plan.attention_heads_per_device
    prefix = max(0, ctx.context_tokens - rows)
    if name == HeadOp.LM_HEAD:
        tensor = ctx.tensors[HeadTensor.LM_HEAD]
        return {"matmuls": ((1, tensor.rows, tensor.cols),)}
    if name == MlaOp.KV_B:
        tensor = ctx.tensors[MlaTensor.KV_B]
        return {"matmuls": ((prefix + rows, tensor.rows, tensor.cols),)}
    if name in (MlaOp.CORE, GqaOp.CORE):
        window = attention_span_tokens(model, ctx.layer, ctx.context_tokens)
        keys = max(1, round(min(window, causal_keys_per_query(prefix, rows))))
        cached = min(window, prefix)
        kv_per_token = kv_cache_bytes_per_token(model, plan, ctx.layer)
        if name == MlaOp.CORE:
            mla = model.mla
            assert mla is not None
            core: tuple[tuple[int, int, int], ...] = (
                (heads * rows, mla.qk_head_dim, keys), (heads * rows, keys, mla.v_head_dim))
        else:
            gqa = model.gqa
            assert gqa is not None
            group = max(1, heads // plan.kv_heads_per_device)
            core = ((group * rows, gqa.head_dim, keys), (group * rows, keys, gqa.head_dim)) * plan.kv_heads_per_device
        return {"matmuls": core, "vector_flops": SOFTMAX_FLOPS_PER_SCORE * heads * rows * keys,
                "kv_read_bytes": kv_per_token * cached, "kv_write_bytes": kv_per_token * rows}
    if name == KdaOp.CORE:
        kda = model.kda
        assert kda is not None
        value_heads = heads * kda.value_heads_per_key_head
        d_k, d_v, chunk = kda.head_dim, kda.value_dim, LINEAR_CHUNK_TOKENS
        chunks = -(-rows // chunk)
        m = value_heads * rows
        core = ((m, d_k, chunk), (m, chunk, d_v), (m, chunk, d_k),  # intra-chunk: QK^T, AV, WY/UT
                (m, d_k, d_v), (m, d_k, d_v),  # inter-chunk: QS and WS
                (value_heads * chunks * d_k, chunk, d_v))  # state update K^T V per chunk
        state = recurrent_state_bytes(model, plan, ctx.layer)
        vector = DELTA_RULE_FLOPS_PER_STATE_ELEMENT * m * (d_k + d_v + chunk)
        return {"unit": "mxu", "matmuls": core, "vector_flops": vector, "kv_read_bytes": state,
                "kv_write_bytes": state}
    if name == MoeOp.COMBINE:
        return {"vector_flops": prefill_combine_flops(ctx)}
    return _op_cost(name, ctx, rows)


def build_prefill_program(
    model: ModelConfig,
    plan: ShardingPlan,
    *,
    tokens: int,
    prefix_tokens: int = 0,
    routing: RoutingModel | None = None,
    seed: int = 0,
    device_view: str | int = "critical",
    row_tile: int = PREFILL_ROW_TILE,
) -> Program:
    """The per-device program of one prefill chunk (see the module docstring): ``tokens``
    new prompt tokens of one sequence after ``prefix_tokens`` cached ones, ``row_tile`` rows
    of activations on chip at a time."""
    if tokens < 1:
        raise ValueError("prefill tokens must be >= 1")
    if prefix_tokens < 0:
        raise ValueError("prefix tokens must be >= 0")
    program = build_program(model, plan, batch=tokens, context_tokens=prefix_tokens + tokens, routing=routing,
                            seed=seed, device_view=device_view, sequences=1, op_cost=prefill_op_cost)
    meta = {**program.meta, "prefix_tokens": prefix_tokens}
    return dataclasses.replace(program, phase=StepPhase.PREFILL, resident_row_tile=row_tile, meta=meta)
