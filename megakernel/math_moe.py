"""Latent MoE and dense MLP math, shared by reference and kernel.

Routing (``moe.router`` + ``moe.topk``), per batch row:

1. ``scores = sigmoid(x_norm @ W_router)`` over the scored experts (router columns beyond
   the expert count are padding);
2. selection key ``scores + correction_bias``; ``top_k`` rounds of "take the largest key,
   lowest expert id on ties, then mask it" (no sort: lowers on TPU);
3. routing weights: the chosen experts' *scores* renormalised to sum 1, times
   ``routed_scaling``.

The distinct experts a batch needs are listed in **first-appearance order, round-major**
(round 0 of rows 0..B-1, then round 1, ...); the kernel runs ``expert[j]`` ops in that order
and :mod:`megakernel.events` predicts the same list.

Experts work in the latent: ``lat = rmsnorm(x_norm @ W_latent_down, latent_norm)``; expert e
computes ``situ(lat @ W_gate_e, lat @ W_up_e) @ W_down_e``; the weighted sum over chosen
experts goes through ``@ W_latent_up`` back to the hidden size; the shared experts act on
``x_norm`` directly and are added.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from megakernel.dims import ModelDims
from megakernel.math_common import mm, rmsnorm, situ

NEG_INF = -1e30


def select_topk(
    scores: jax.Array,  # f32[B, E]  sigmoid router scores
    bias: jax.Array,  # f32[1, E]  correction bias (selection only)
    top_k: int,
    routed_scaling: float,
) -> tuple[list[jax.Array], list[jax.Array]]:
    """-> (ids, weights): per round r, i32[B, 1] expert ids and f32[B, 1] routing weights."""
    key = scores + bias
    ids, picked = [], []
    for _ in range(top_k):
        idx, score, key = topk_round(key, scores)
        ids.append(idx)
        picked.append(score)
    return ids, renormalise(picked, routed_scaling)


def topk_round(key: jax.Array, scores: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One selection round: -> (ids i32[B, 1], their scores f32[B, 1], key with them masked)."""
    num = key.shape[1]
    iota = jax.lax.broadcasted_iota(jnp.int32, key.shape, 1)
    best = jnp.max(key, axis=1, keepdims=True)
    idx = jnp.min(jnp.where(key == best, iota, num), axis=1, keepdims=True)
    hit = iota == idx
    score = jnp.sum(jnp.where(hit, scores, 0.0), axis=1, keepdims=True)
    return idx, score, jnp.where(hit, NEG_INF, key)


def renormalise(picked: list[jax.Array], routed_scaling: float) -> list[jax.Array]:
    """Chosen scores f32[B, 1] per round -> routing weights summing to ``routed_scaling``."""
    total = picked[0]
    for p in picked[1:]:
        total = total + p
    return [p / total * routed_scaling for p in picked]


def first_appearance(picks: jax.Array) -> jax.Array:
    """``picks`` i32[n] -> bool[n]: whether each pick is its expert's first (the order the
    kernel and the references sum distinct experts in)."""
    n = picks.shape[0]
    earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]
    return ~jnp.any((picks[:, None] == picks[None, :]) & earlier, axis=1)


def row_weight(ids: list[jax.Array], weights: list[jax.Array], expert: jax.Array) -> jax.Array:
    """Weight every row gives ``expert`` (scalar i32): f32[B, 1] (0 where not chosen)."""
    total = jnp.zeros_like(weights[0])
    for idx, w in zip(ids, weights, strict=True):
        total = total + jnp.where(idx == expert, w, 0.0)
    return total


def gated_mlp(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """``x`` [B, K], ``w_gate_up`` bf16[K, 2m] (gate | up), ``w_down`` bf16[m, N] -> f32[B, N]."""
    gu = mm(x, w_gate_up)
    width = w_gate_up.shape[1] // 2
    return mm(situ(gu[:, :width], gu[:, width:]), w_down)


def distinct_experts(choices: np.ndarray) -> list[int]:
    """int[B, k] chosen ids -> distinct ids in first-appearance, round-major order."""
    seen: list[int] = []
    for r in range(choices.shape[1]):
        for b in range(choices.shape[0]):
            e = int(choices[b, r])
            if e not in seen:
                seen.append(e)
    return seen


def latent_input(dims: ModelDims, down: jax.Array, norm: jax.Array) -> jax.Array:
    """latent_down output f32[B, ld], ``norm`` f32[1, L] -> normed expert input f32[B, L]
    (see :mod:`megakernel.dims` for the all-gather stand-in when ``ld != L``)."""
    e = dims.moe
    cols = min(e.latent_down_cols, e.latent)
    lat = down[:, :cols]
    if cols < e.latent:
        lat = jnp.concatenate([lat, jnp.zeros((down.shape[0], e.latent - cols), jnp.float32)], axis=1)
    return rmsnorm(lat, norm, dims.eps)


def moe_output(dims: ModelDims, up: jax.Array) -> jax.Array:
    """latent_up output f32[B, lu] -> f32[B, H] (output all-gather stand-in when lu != H)."""
    cols = min(dims.moe.latent_up_cols, dims.hidden)
    if cols == dims.hidden:
        return up[:, :cols]
    return jnp.concatenate([up[:, :cols], jnp.zeros((up.shape[0], dims.hidden - cols), jnp.float32)], axis=1)
