"""Attention residuals: the residual stream as a learned softmax mixture over block snapshots.

K3 replaces ``x_{l+1} = x_l + f(x_l)`` by a mixture over earlier outputs grouped in blocks of
``residual_block_layers`` (12) layers. Our exact formulation (f32 throughout):

- **Sources.** ``blocks[0]`` is the token embedding; ``blocks[i]`` (``i >= 1``) is the sum of
  every sublayer output (attention and MLP) of block ``i - 1`` (layers ``12(i-1) .. 12i-1``),
  snapshotted when that block ends; ``partial`` is the running sum of the sublayer outputs of
  the current block so far (empty at a block's first attention sublayer, then excluded).
- **Mixture.** Each sublayer ``s`` of layer ``l`` (attention, then MLP) has a learned query
  ``q_s`` (``small.residual_mix = [q_attn | q_mlp]``). Its input is
  ``h = sum_i a_i v_i`` with ``a = softmax_i(rmsnorm(v_i) . q_s)`` over the valid sources
  ``v_i`` (the ``1 + l // 12`` blocks so far and, when non-empty, ``partial``), then
  ``rmsnorm(h) * norm_weight`` (``attn_norm`` / ``mlp_norm``) feeds the sublayer (the
  ``*.mix_norm`` ops).
- **Bookkeeping.** After a sublayer, ``partial += output``; after the MLP of layer ``l`` with
  ``(l + 1) % 12 == 0``, ``blocks[1 + l // 12] = partial`` and ``partial = 0``.
- **Final.** The head reads ``sum_i blocks[i] + partial`` (the plain residual sum:
  embedding plus every sublayer output), RMSNorm without weight (the final norm weight is
  folded into ``lm_head`` rows), then ``lm_head``.

Scratch: ``ceil(L / 12) + 1`` block slots plus ``partial`` = 10 hidden-wide f32 rows per
batch row for K3, the ``snapshots`` term of :func:`tpusim.schedule.vmem.activation_bytes`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from megakernel.math_common import rmsnorm

NEG_INF = -1e30


def num_block_slots(num_layers: int, block_layers: int) -> int:
    """Block snapshot slots: the embedding plus one per (possibly unfinished) block."""
    return 1 + math.ceil(num_layers / block_layers)


def mix(
    blocks: jax.Array,  # f32[NB, B, H]  block snapshots (slot 0 = embedding)
    partial: jax.Array,  # f32[B, H]  running sum of the current block
    num_blocks: jax.Array | int,  # valid block slots (1 + layer // block_layers)
    has_partial: jax.Array | bool,  # partial is non-empty
    query: jax.Array,  # f32[1, H]
    eps: float,
) -> jax.Array:
    """Softmax mixture of the valid sources -> f32[B, H]."""
    sources = jnp.concatenate([blocks, partial[None]], axis=0)  # [NB+1, B, H]
    slots = sources.shape[0]
    logits = jnp.sum(rmsnorm(sources, None, eps) * query[None], axis=-1, keepdims=True)  # [S,B,1]
    slot = jax.lax.broadcasted_iota(jnp.int32, (slots, 1, 1), 0)
    valid = (slot < num_blocks) | ((slot == slots - 1) & has_partial)
    logits = jnp.where(valid, logits, NEG_INF)
    weights = jnp.exp(logits - jnp.max(logits, axis=0, keepdims=True))
    weights = jnp.where(valid, weights, 0.0)
    weights = weights / jnp.sum(weights, axis=0, keepdims=True)
    return jnp.sum(weights * sources, axis=0)


def final_hidden(blocks: jax.Array, partial: jax.Array, num_blocks: int) -> jax.Array:
    """The plain residual sum read by the head: f32[B, H]."""
    return jnp.sum(blocks[:num_blocks], axis=0) + partial


def block_ends_after(layer: jax.Array | int, block_layers: int) -> jax.Array | bool:
    return (layer + 1) % block_layers == 0
