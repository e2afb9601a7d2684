"""Kimi Delta Attention for one decode token: the per-layer math shared by reference and kernel.

Ops (the simulator's vocabulary) and what each computes, per batch row:

1. ``kda.qkvgb``: ``y = x_norm @ W_qkvgb`` split into q, k, v, output gate and beta logits
   (column blocks ``[q | k | v | gate]`` of ``P(h*hd)`` each, then ``P(h)`` beta columns);
   q, k, v pass a short causal depthwise conv (kernel 4, window of the 3 previous inputs kept
   as state) and SiLU; q and k are L2-normalised per head, q scaled by ``hd**-0.5``;
   ``beta = sigmoid(beta logits)``.
2. ``kda.decay``: low-rank gate ``f = (x_norm @ W_decay_a) @ W_decay_b`` (per channel);
   log decay ``g = lb * sigmoid(exp(A_log[h]) * (f + dt_bias))`` in ``(lb, 0)`` with the lower
   bound ``lb = -5`` (our bounded form of K3's gate; documented simplification).
3. ``kda.core``: the gated delta rule on the per-head state. We store the state transposed,
   ``St[v, i]`` (value dim, key dim), so the per-channel decay runs along lanes:
   ``St <- St * exp(g)[None, :]``; ``u = v - St k``; ``St <- St + beta * u k^T``;
   ``o = St q``.
4. ``kda.o``: ``o = rmsnorm_per_head(o) * sigmoid(gate)`` then ``o @ W_o``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from megakernel.math_common import l2norm, rmsnorm, silu


@dataclass(frozen=True)
class KdaDims:
    heads: int  # attention heads on this device
    head_dim: int
    padded_width: int  # P(heads * head_dim): column block of q, k, v, gate
    beta_cols: int  # P(heads)
    conv_kernel: int
    decay_rank: int
    lower_bound: float

    @property
    def width(self) -> int:
        return self.heads * self.head_dim

    @property
    def qkvgb_cols(self) -> int:
        return 4 * self.padded_width + self.beta_cols


def split_qkvgb(y: jax.Array, d: KdaDims) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``y`` f32[B, qkvgb_cols] -> (qkv f32[B, 3W], gate f32[B, W], beta_logits f32[B, h])."""
    pw, w = d.padded_width, d.width
    qkv = jnp.concatenate([y[:, i * pw: i * pw + w] for i in range(3)], axis=1)
    gate = y[:, 3 * pw: 3 * pw + w]
    beta = y[:, 4 * pw: 4 * pw + d.heads]
    return qkv, gate, beta


def short_conv(qkv: jax.Array, window: jax.Array, weight: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Causal depthwise conv over time, one new step.

    ``qkv`` f32[B, C] (this token), ``window`` f32[B, K-1, C] (previous K-1 inputs, oldest
    first), ``weight`` f32[K, C] (tap K-1 multiplies this token) ->
    (SiLU(conv) f32[B, C], new window f32[B, K-1, C]).
    """
    taps = weight.shape[0]
    acc = qkv * weight[taps - 1][None, :]
    for t in range(taps - 1):
        acc = acc + window[:, t, :] * weight[t][None, :]
    new_window = jnp.concatenate([window[:, 1:, :], qkv[:, None, :]], axis=1)
    return silu(acc), new_window


def conv_taps(row: jax.Array, d: KdaDims) -> jax.Array:
    """The short convolution's taps f32[K, 3W] from their small-parameter row f32[1, K*3W], a
    tap per row by lane slices: a reshape of the row is no Mosaic shape cast unless 3W is a
    multiple of 128 lanes (nano on 8 devices: 3W = 96)."""
    cols = 3 * d.width
    return jnp.concatenate([row[:, t * cols: (t + 1) * cols] for t in range(d.conv_kernel)], axis=0)


def heads_of(x: jax.Array, heads: int, head_dim: int) -> list[jax.Array]:
    """f32[B, h*hd] -> h arrays f32[B, hd] (static lane slices)."""
    return [x[:, i * head_dim: (i + 1) * head_dim] for i in range(heads)]


def prepare_qkv(conv_out: jax.Array, d: KdaDims) -> tuple[list[jax.Array], list[jax.Array], list[jax.Array]]:
    """``conv_out`` f32[B, 3W] -> per head q (normalised, scaled), k (normalised), v: f32[B, hd]."""
    w = d.width
    q = heads_of(conv_out[:, :w], d.heads, d.head_dim)
    k = heads_of(conv_out[:, w: 2 * w], d.heads, d.head_dim)
    v = heads_of(conv_out[:, 2 * w: 3 * w], d.heads, d.head_dim)
    scale = d.head_dim ** -0.5
    return [l2norm(x) * scale for x in q], [l2norm(x) for x in k], v


def decay_log(f: jax.Array, a_log: jax.Array, dt_bias: jax.Array, d: KdaDims) -> jax.Array:
    """``f`` f32[B, W] low-rank gate, ``a_log`` f32[1, >=h], ``dt_bias`` f32[1, W] ->
    log decay ``g`` f32[B, W] in ``(lower_bound, 0)``."""
    a = jnp.concatenate(
        [jnp.broadcast_to(jnp.exp(a_log[:, i: i + 1]), (1, d.head_dim)) for i in range(d.heads)], axis=1)
    return d.lower_bound * jax.nn.sigmoid(a * (f + dt_bias))


def delta_rule_head(
    state: jax.Array,  # f32[B, hd_v, hd_k]  (transposed state St)
    q: jax.Array,  # f32[B, hd]
    k: jax.Array,  # f32[B, hd]
    v: jax.Array,  # f32[B, hd]
    g: jax.Array,  # f32[B, hd]  log decay per key channel
    beta: jax.Array,  # f32[B, 1]
) -> tuple[jax.Array, jax.Array]:
    """One gated-delta-rule step for one head -> (o f32[B, hd], new state)."""
    decayed = state * jnp.exp(g)[:, None, :]
    predicted = jnp.sum(decayed * k[:, None, :], axis=-1)  # St k: f32[B, hd_v]
    update = (beta * (v - predicted))[:, :, None] * k[:, None, :]
    new_state = decayed + update
    o = jnp.sum(new_state * q[:, None, :], axis=-1)
    return o, new_state


def delta_rule_heads(state: jax.Array, q: list[jax.Array], k: list[jax.Array], v: list[jax.Array],
                     g: jax.Array, beta: jax.Array, d: KdaDims) -> tuple[list[jax.Array], jax.Array]:
    """:func:`delta_rule_head` for every head: ``state`` f32[B, H, hd_v, hd_k], per-head q/k/v
    lists, ``g`` f32[B, H*hd], ``beta`` f32[B, H] -> (per-head outputs, new state f32[B, H, ...])."""
    outs, states = [], []
    for h in range(d.heads):
        cols = slice(h * d.head_dim, (h + 1) * d.head_dim)
        o, s = delta_rule_head(state[:, h], q[h], k[h], v[h], g[:, cols], beta[:, h: h + 1])
        outs.append(o)
        states.append(s)
    return outs, jnp.stack(states, axis=1)


def output_gate(o_heads: list[jax.Array], gate: jax.Array, eps: float) -> jax.Array:
    """Per-head RMSNorm (no weight) times ``sigmoid(gate)``: -> f32[B, W]."""
    o = jnp.concatenate([rmsnorm(x, None, eps) for x in o_heads], axis=1)
    return o * jax.nn.sigmoid(gate)
