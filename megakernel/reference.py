"""Pure-JAX Kimi K3 decode step: the ground truth the megakernel is tested against.

One decode step for a batch of ``B`` sequences, one new token each, all at the same position
``p`` (tokens already in the KV cache):

1. ``blocks[0] = embedding[tokens]`` (f32), ``partial = 0``;
2. for every layer ``l`` (layer 0 peeled, then ``lax.fori_loop`` over 1..92 so compile time
   does not grow with depth):

   - attention sublayer: ``x = rmsnorm(mix(q_attn), attn_norm)`` (:mod:`megakernel.residual`),
     then KDA (:mod:`megakernel.math_kda`, recurrent state + conv window updated) or MLA
     (:mod:`megakernel.math_mla`, this token's entry written at ``p``) chosen by
     ``lax.cond`` on the layer's kind; ``partial += out``;
   - MLP sublayer: ``x = rmsnorm(mix(q_mlp), mlp_norm)``; layer 0 runs the dense MLP, the
     others the latent MoE (:mod:`megakernel.math_moe`); ``partial += out``; at a block end
     ``partial`` becomes the next block snapshot;
3. ``logits = rmsnorm(sum(blocks) + partial) @ lm_head``.

The reference evaluates every routed expert densely (simple, independent of the kernel's
expert streaming) and sums the chosen ones in the kernel's order (first appearance,
round-major), so kernel and reference agree bit for bit at every batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from megakernel import math_kda, math_mla, math_moe, residual
from megakernel.dims import ModelDims
from megakernel.layout import Weights
from megakernel.math_common import mm, rmsnorm, situ
from megakernel.quant import dequant_mxfp4
from megakernel.quant_pairs import fp8_blocked_products
from tpusim.workload.registry.names import (
    HeadTensor,
    KdaTensor,
    MlaTensor,
    MlpTensor,
    MoeTensor,
    SmallParam,
)

Params = dict[str, jax.Array]


@jax.tree_util.register_dataclass
@dataclass
class DecodeState:
    """Per-sequence decode state of one device (all rows share ``position``)."""

    kda_state: jax.Array  # f32[n_kda, B, h, hd_v, hd_k]  transposed delta-rule state
    conv_state: jax.Array  # f32[n_kda, B, K-1, 3*h*hd]  conv window (oldest first)
    kv_cache: jax.Array  # bf16[n_mla, B, T_max, kv_lora + P(rope)]
    position: jax.Array  # i32[]  tokens already cached = position of the new token


def first_tokens(batch: int, vocab_size: int) -> np.ndarray:
    """i32[batch]: the tokens every multi-device checker decodes from (distinct per row)."""
    return ((37 + 101 * np.arange(batch)) % vocab_size).astype(np.int32)


def init_state(dims: ModelDims, batch: int, max_context: int, context: int = 0, seed: int = 0) -> DecodeState:
    """A decode state as after a prefill of ``context`` tokens (random but well scaled)."""
    rng = np.random.default_rng(seed)
    n_kda, n_mla = len(dims.kda_layers), len(dims.mla_layers)
    k, m = dims.kda, dims.mla
    state = rng.standard_normal((n_kda, batch, k.heads, k.head_dim, k.head_dim), np.float32) * 0.05
    conv = rng.standard_normal((n_kda, batch, k.conv_kernel - 1, 3 * k.width), np.float32)
    kv = rng.standard_normal((n_mla, batch, max_context, m.kv_cols), np.float32)
    kv[..., m.kv_lora + m.rope:] = 0.0
    kv[:, :, context:, :] = 0.0
    return DecodeState(jnp.asarray(state), jnp.asarray(conv), jnp.asarray(kv, jnp.bfloat16),
                       jnp.asarray(context, jnp.int32))


def device_params(weights: Weights) -> Params:
    """Host weights -> device arrays (same names)."""
    return {name: jnp.asarray(value) for name, value in weights.arrays.items()}


def layer_tables(dims: ModelDims) -> dict[str, np.ndarray]:
    """Per-layer int tables: ``is_mla`` and the index of each layer in its kind's stack."""
    return {
        "is_mla": np.array([kind == "mla" for kind in dims.kinds], np.int32),
        "kind_index": np.array([dims.kind_index(layer) for layer in range(dims.num_layers)], np.int32),
    }


# ------------------------------------------------------------------------------ sublayers


def kda_attention(dims: ModelDims, p: Params, small: jax.Array, x: jax.Array, state: jax.Array,
                  window: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``x`` f32[B, H] normed input, ``small`` f32[S], ``state`` f32[B, h, hd, hd], ``window``
    f32[B, K-1, 3W] -> (out f32[B, H], state, window)."""
    d = dims.kda
    qkv, gate, beta_logits = math_kda.split_qkvgb(mm(x, p[KdaTensor.QKVGB]), d)
    conv_w = dims.small(small, SmallParam.KDA_CONV).reshape(d.conv_kernel, 3 * d.width)
    conv_out, window = math_kda.short_conv(qkv, window, conv_w)
    q, k, v = math_kda.prepare_qkv(conv_out, d)
    beta = jax.nn.sigmoid(beta_logits)
    f = mm(mm(x, p[KdaTensor.DECAY_A]), p[KdaTensor.DECAY_B])
    g = math_kda.decay_log(f, dims.small(small, SmallParam.KDA_A_LOG)[None], dims.small(small, SmallParam.KDA_DT_BIAS)[None], d)
    outs, new_state = math_kda.delta_rule_heads(state, q, k, v, g, beta, d)
    o = math_kda.output_gate(outs, gate, dims.eps)
    return mm(o, p[KdaTensor.OUT]), new_state, window


def mla_attention(dims: ModelDims, p: Params, small: jax.Array, x: jax.Array, cache: jax.Array,
                  position: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x`` f32[B, H], ``cache`` bf16[B, T_max, C+Rp] -> (out f32[B, H], cache with entry at p)."""
    d = dims.mla
    pos_f = position.astype(jnp.float32)
    cq = rmsnorm(mm(x, p[MlaTensor.Q_A]), dims.small(small, SmallParam.MLA_Q_NORM)[None], dims.eps)
    entry = math_mla.kv_entry(mm(x, p[MlaTensor.KV_A]), dims.small(small, SmallParam.MLA_KV_NORM)[None], pos_f, d, dims.eps)
    entry = entry.astype(jnp.bfloat16)
    q_nope, q_rope = math_mla.split_q(mm(cq, p[MlaTensor.Q_B]), pos_f, d)
    q_lat = math_mla.absorb(q_nope, p[MlaTensor.KV_B], d)
    q_rope_all = jnp.stack(q_rope, axis=1)
    carry = math_mla.attend_init(x.shape[0], d)
    carry = math_mla.attend_parts(carry, q_lat, q_rope_all, cache, 0, position, d)
    carry = math_mla.attend_tile(carry, q_lat, q_rope_all, entry[:, None, :], jnp.ones((1, 1, 1), bool), d)
    o = math_mla.attend_output(carry, p[MlaTensor.KV_B], d)
    o = o * jax.nn.sigmoid(mm(x, p[MlaTensor.GATE]))
    cache = lax.dynamic_update_slice(cache, entry[:, None, :], (0, position, 0))
    return mm(o, p[MlaTensor.OUT]), cache


def latent_moe(dims: ModelDims, p: Params, experts: Params, small: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x`` f32[B, H] normed input; ``experts`` this layer's expert arrays [E, ...] ->
    (out f32[B, H], chosen expert ids i32[B, k] in selection order)."""
    e = dims.moe
    logits = mm(x, p[MoeTensor.ROUTER])[:, : e.scored_experts]
    scores = jax.nn.sigmoid(logits)
    bias = dims.small(small, SmallParam.ROUTER_BIAS)[None, : e.scored_experts]
    ids, weights = math_moe.select_topk(scores, bias, e.top_k, e.routed_scaling)
    lat = math_moe.latent_input(dims, mm(x, p[MoeTensor.LATENT_DOWN]), dims.small(small, SmallParam.LATENT_NORM)[None])
    down = jax.vmap(dequant_mxfp4)(experts["expert.down.values"], experts["expert.down.scales"])
    # bf16 operands, f32 products and sums (what the MXU does); XLA:CPU has no batched
    # bf16 x bf16 -> f32 dot, so the operands are widened exactly to f32 first. The FP8
    # gate/up goes block by block with its scales after the products, as the kernel does.
    gu = fp8_blocked_products(lat, experts["expert.gate_up.values"], experts["expert.gate_up.scales"])
    act = situ(gu[..., : e.slice_width], gu[..., e.slice_width:])
    y = jnp.einsum("bew,ewl->bel", _bf16_f32(act), down.astype(jnp.float32))
    # Sum the chosen experts in the kernel's order (distinct experts by first appearance,
    # round-major), so batch > 1 matches the kernel bit for bit, not just within rounding.
    picks = jnp.concatenate(ids, axis=0)[:, 0]  # [k*B] round-major
    new = math_moe.first_appearance(picks)
    routed = jnp.zeros((x.shape[0], e.latent), jnp.float32)
    for t in range(picks.shape[0]):
        eid = picks[t]
        contribution = math_moe.row_weight(ids, weights, eid) * y[:, eid]
        routed = jnp.where(new[t], routed + contribution, routed)
    out = math_moe.moe_output(dims, mm(routed, p[MoeTensor.LATENT_UP]))
    shared = math_moe.gated_mlp(x, p[MoeTensor.SHARED_GATE_UP], p[MoeTensor.SHARED_DOWN])
    return out + shared, jnp.concatenate(ids, axis=1)


MoeFn = Callable[[ModelDims, Params, Params, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _bf16_f32(x: jax.Array) -> jax.Array:
    return x.astype(jnp.bfloat16).astype(jnp.float32)


# --------------------------------------------------------------------------------- the step


def _take(p: Params, names: list[str], index: jax.Array) -> Params:
    return {name: lax.dynamic_index_in_dim(p[name], index, keepdims=False) for name in names}


KDA_NAMES = [KdaTensor.QKVGB, KdaTensor.DECAY_A, KdaTensor.DECAY_B, KdaTensor.OUT]
MLA_NAMES = [MlaTensor.Q_A, MlaTensor.Q_B, MlaTensor.KV_A, MlaTensor.KV_B, MlaTensor.GATE, MlaTensor.OUT]
MOE_NAMES = [MoeTensor.ROUTER, MoeTensor.LATENT_DOWN, MoeTensor.LATENT_UP, MoeTensor.SHARED_GATE_UP, MoeTensor.SHARED_DOWN]
EXPERT_NAMES = ["expert.gate_up.values", "expert.gate_up.scales", "expert.down.values", "expert.down.scales"]


@partial(jax.jit, static_argnums=0)
def decode_step(dims: ModelDims, p: Params, state: DecodeState, tokens: jax.Array) -> tuple[jax.Array, DecodeState]:
    """``tokens`` i32[B] -> (logits f32[B, V], next state)."""
    logits, next_state, _ = decode_step_with_routing(dims, p, state, tokens)
    return logits, next_state


@partial(jax.jit, static_argnums=(0, 4))
def decode_step_with_routing(dims: ModelDims, p: Params, state: DecodeState, tokens: jax.Array,
                             moe: MoeFn = latent_moe) -> tuple[jax.Array, DecodeState, jax.Array]:
    """As :func:`decode_step`, plus the routing: i32[MoE layers, B, top_k] expert ids per row
    in selection order (the format of ``tpusim.workload.routing``'s ``trace:`` files).

    ``moe`` computes one MoE sublayer (default :func:`latent_moe`, every expert densely); the
    plain-XLA baseline (:mod:`megakernel.xla_baseline`) passes one that reads only the
    chosen experts, so the rest of the step is this same code."""
    tables = {name: jnp.asarray(v) for name, v in layer_tables(dims).items()}
    batch, hidden = tokens.shape[0], dims.hidden
    blocks = jnp.zeros((dims.block_slots, batch, hidden), jnp.float32)
    blocks = blocks.at[0].set(p["embedding"][tokens].astype(jnp.float32))
    partial_sum = jnp.zeros((batch, hidden), jnp.float32)

    def run_layer(layer, carry, dense: bool):
        blocks, partial_sum, kda_state, conv_state, kv_cache, routing = carry
        small = p["small"][dims.stack_entry(layer)]
        num_blocks = 1 + layer // dims.block_layers
        has_partial = layer % dims.block_layers > 0
        q_attn = dims.small(small, SmallParam.RESIDUAL_MIX)[None, :hidden]
        x = rmsnorm(residual.mix(blocks, partial_sum, num_blocks, has_partial, q_attn, dims.eps),
                    dims.small(small, SmallParam.ATTN_NORM)[None], dims.eps)
        index = tables["kind_index"][layer]
        entry = dims.stack_entry(index)  # weight bank entry (index itself unless banked)

        def kda_branch(operands):
            kda_state, conv_state, kv_cache = operands
            out, s, w = kda_attention(dims, _take(p, KDA_NAMES, entry), small, x, kda_state[index], conv_state[index])
            return out, kda_state.at[index].set(s), conv_state.at[index].set(w), kv_cache

        def mla_branch(operands):
            kda_state, conv_state, kv_cache = operands
            out, cache = mla_attention(dims, _take(p, MLA_NAMES, entry), small, x, kv_cache[index], state.position)
            return out, kda_state, conv_state, kv_cache.at[index].set(cache)

        if dense:
            out, kda_state, conv_state, kv_cache = kda_branch((kda_state, conv_state, kv_cache))
        else:
            out, kda_state, conv_state, kv_cache = lax.cond(
                tables["is_mla"][layer] == 1, mla_branch, kda_branch, (kda_state, conv_state, kv_cache))
        partial_sum = partial_sum + out
        q_mlp = dims.small(small, SmallParam.RESIDUAL_MIX)[None, hidden:]
        x = rmsnorm(residual.mix(blocks, partial_sum, num_blocks, True, q_mlp, dims.eps),
                    dims.small(small, SmallParam.MLP_NORM)[None], dims.eps)
        if dense:
            out = math_moe.gated_mlp(x, p[MlpTensor.GATE_UP], p[MlpTensor.DOWN])
        else:
            moe_index = layer - 1
            bank = dims.stack_entry(moe_index)
            out, ids = moe(dims, _take(p, MOE_NAMES, bank), _take(p, EXPERT_NAMES, bank), small, x)
            routing = lax.dynamic_update_index_in_dim(routing, ids, moe_index, 0)
        partial_sum = partial_sum + out
        ends = residual.block_ends_after(layer, dims.block_layers)
        slot = 1 + layer // dims.block_layers
        blocks = jnp.where(ends, lax.dynamic_update_index_in_dim(blocks, partial_sum, slot, 0), blocks)
        partial_sum = jnp.where(ends, 0.0, partial_sum)
        return blocks, partial_sum, kda_state, conv_state, kv_cache, routing

    routing = jnp.zeros((dims.num_layers - 1, batch, dims.moe.top_k), jnp.int32)
    carry = (blocks, partial_sum, state.kda_state, state.conv_state, state.kv_cache, routing)
    carry = run_layer(0, carry, dense=True)
    carry = lax.fori_loop(1, dims.num_layers, lambda layer, c: run_layer(layer, c, dense=False), carry)
    blocks, partial_sum, kda_state, conv_state, kv_cache, routing = carry
    final = residual.final_hidden(blocks, partial_sum, dims.block_slots)
    logits = mm(rmsnorm(final, None, dims.eps), p[HeadTensor.LM_HEAD])
    return logits, DecodeState(kda_state, conv_state, kv_cache, state.position + 1), routing
