"""Multi-head latent attention for one decode token (absorbed form), shared by reference and
kernel.

Ops and their math, per batch row (``C`` = kv LoRA rank, ``R`` = rope dim, stored padded to
``Rp`` columns; the first ``R`` are used):

1. ``mla.q_a``: ``cq = rmsnorm(x_norm @ W_q_a, q_norm)``.
2. ``mla.kv_a``: ``[c | r] = x_norm @ W_kv_a``; the cache entry of this token is
   ``[rmsnorm(c, kv_norm) | rope(r[:R], pos) | 0]`` (bf16, ``C + Rp`` wide, shared by heads).
3. ``mla.q_b``: ``q = cq @ W_q_b``, per head ``[nope | rope(Rp)]``; rope applied to ``q_rope``.
4. ``mla.kv_b``: absorb the key up-projection into the query:
   ``q_lat[h] = q_nope[h] @ W_uk[h]^T`` (``W_kv_b`` columns per head are ``[W_uk | W_uv]``).
5. ``mla.core``: softmax over the cached tokens and this one of
   ``(q_lat[h] . c_t + q_rope[h] . r_t) * (nope + R)**-0.5``, streamed in KV tiles with an
   online softmax; ``o[h] = (sum_t p_t c_t) @ W_uv[h]``.
6. ``mla.gate``: ``o *= sigmoid(x_norm @ W_gate)``; 7. ``mla.o``: ``o @ W_o``.

RoPE: rotate-half convention, base 10000, position = the token's index in its sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from megakernel.math_common import mm, mm_t, rmsnorm

ROPE_BASE = 10000.0
NEG_INF = -1e30
EXACT = jax.lax.Precision.HIGHEST  # f32 x f32 products: every bit, as the reference computes them


@dataclass(frozen=True)
class MlaDims:
    heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    rope_pad: int  # P(rope)
    v_dim: int

    @property
    def q_head_cols(self) -> int:
        return self.nope + self.rope_pad

    @property
    def kv_cols(self) -> int:
        """Columns of one KV-cache entry (latent + padded rope key)."""
        return self.kv_lora + self.rope_pad

    @property
    def kv_b_head_cols(self) -> int:
        return self.nope + self.v_dim

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.nope + self.rope)


def rope(x: jax.Array, position: jax.Array) -> jax.Array:
    """``x`` f32[..., R] (R even), ``position`` f32 scalar -> rotated f32[..., R]."""
    half = x.shape[-1] // 2
    idx = jax.lax.broadcasted_iota(jnp.int32, (1, half), 1).astype(jnp.float32)
    inv_freq = jnp.exp(idx * (-2.0 * math.log(ROPE_BASE) / x.shape[-1]))
    angle = position * inv_freq
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    if x.ndim == 3:
        cos, sin = cos[None], sin[None]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def kv_entry(ckv: jax.Array, kv_norm: jax.Array, position: jax.Array, d: MlaDims, eps: float) -> jax.Array:
    """``ckv`` f32[B, C + Rp] -> this token's cache entry f32[B, C + Rp]."""
    latent = rmsnorm(ckv[:, : d.kv_lora], kv_norm, eps)
    k_rope = rope(ckv[:, d.kv_lora: d.kv_lora + d.rope], position)
    if d.rope_pad == d.rope:  # no padding columns (a zero-width vector has no Mosaic type)
        return jnp.concatenate([latent, k_rope], axis=1)
    pad = jnp.zeros((ckv.shape[0], d.rope_pad - d.rope), jnp.float32)
    return jnp.concatenate([latent, k_rope, pad], axis=1)


def split_q(q: jax.Array, position: jax.Array, d: MlaDims) -> tuple[list[jax.Array], list[jax.Array]]:
    """``q`` f32[B, h*(nope+Rp)] -> per head (q_nope f32[B, nope], roped q_rope f32[B, R])."""
    nopes, ropes = [], []
    for h in range(d.heads):
        base = h * d.q_head_cols
        nopes.append(q[:, base: base + d.nope])
        ropes.append(rope(q[:, base + d.nope: base + d.nope + d.rope], position))
    return nopes, ropes


def absorb(q_nope: list[jax.Array], w_kv_b: jax.Array, d: MlaDims) -> jax.Array:
    """per head q_nope f32[B, nope], ``w_kv_b`` bf16[C, h*(nope+v)] -> q_lat f32[B, h, C]."""
    outs = []
    for h in range(d.heads):
        base = h * d.kv_b_head_cols
        outs.append(mm_t(q_nope[h], w_kv_b[:, base: base + d.nope]))
    return jnp.stack(outs, axis=1)


def attend_init(batch: int, d: MlaDims) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Online-softmax carry: (max f32[B, h, 1], denominator f32[B, h, 1], acc f32[B, h, C])."""
    return (jnp.full((batch, d.heads, 1), NEG_INF, jnp.float32),
            jnp.zeros((batch, d.heads, 1), jnp.float32),
            jnp.zeros((batch, d.heads, d.kv_lora), jnp.float32))


def attend_tile(
    carry: tuple[jax.Array, jax.Array, jax.Array],
    q_lat: jax.Array,  # f32[B, h, C]
    q_rope: jax.Array,  # f32[B, h, R]
    kv: jax.Array,  # bf16|f32[B, T, C + Rp]  cache entries of T tokens
    valid: jax.Array,  # bool[1, 1, T]  which of the T tokens exist
    d: MlaDims,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Fold T tokens into the online softmax."""
    m, denom, acc = carry
    kv = jnp.where(jnp.swapaxes(valid, 1, 2), kv.astype(jnp.float32), 0.0)  # [1, T, 1] mask
    latent = kv[:, :, : d.kv_lora]
    k_rope = kv[:, :, d.kv_lora: d.kv_lora + d.rope]
    if kv.shape[1] == 1:  # one token (this step's own entry): a broadcast product, no matmul
        # (Mosaic has no batched dot with a one-row operand: "Lane broadcast" at batch > 1)
        scores = (jnp.sum(q_lat * latent, axis=-1, keepdims=True)
                  + jnp.sum(q_rope * k_rope, axis=-1, keepdims=True))
    else:
        # f32 x f32 at full precision: a TPU's default is one bf16 pass, which moves scores by
        # ~0.4 % and, compounded over the layers, the routers' choices (the reference is exact)
        scores = jnp.einsum("bhc,btc->bht", q_lat, latent, precision=EXACT, preferred_element_type=jnp.float32)
        scores = scores + jnp.einsum("bhr,btr->bht", q_rope, k_rope, precision=EXACT,
                                     preferred_element_type=jnp.float32)
    scores = jnp.where(valid, scores * d.scale, NEG_INF)
    m_new = jnp.maximum(m, jnp.max(scores, axis=-1, keepdims=True))
    p = jnp.where(valid, jnp.exp(scores - m_new), 0.0)
    correction = jnp.exp(m - m_new)
    denom_new = denom * correction + jnp.sum(p, axis=-1, keepdims=True)
    if kv.shape[1] == 1:
        acc_new = acc * correction + p * latent
    else:
        acc_new = acc * correction + jnp.einsum("bht,btc->bhc", p, latent, precision=EXACT,
                                                preferred_element_type=jnp.float32)
    return m_new, denom_new, acc_new


# Every implementation folds the KV cache into the online softmax this many tokens at a time,
# in token order (the kernel: each streamed tile in such parts; the references: the whole
# cache), so that they add in one order. One bf16 tile of rows: the kernel folded whole
# 128-token tiles before, and at batch 8 on 32 TPU7x devices Mosaic held 2.9 MiB more
# register-allocator spill slots for them (docs/multi-device.md).
KV_FOLD_TOKENS = 16


def attend_parts(
    carry: tuple[jax.Array, jax.Array, jax.Array],
    q_lat: jax.Array,  # f32[B, h, C]
    q_rope: jax.Array,  # f32[B, h, R]
    kv: jax.Array,  # bf16|f32[B, T, C + Rp]  cache entries of tokens first .. first + T - 1
    first: jax.Array | int,  # the token index of kv's row 0
    position: jax.Array,  # tokens [0, position) exist
    d: MlaDims,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`attend_tile` over ``kv`` in :data:`KV_FOLD_TOKENS`-token parts, in order (a
    runtime loop; a last part of fewer tokens when ``T`` is not a multiple)."""
    part = KV_FOLD_TOKENS
    full, tail = divmod(kv.shape[1], part)

    def fold(lo: jax.Array | int, size: int, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[
            jax.Array, jax.Array, jax.Array]:
        rows = jax.lax.dynamic_slice_in_dim(kv, lo, size, axis=1)
        token = first + lo + jax.lax.broadcasted_iota(jnp.int32, (1, 1, size), 2)
        return attend_tile(carry, q_lat, q_rope, rows, token < position, d)

    if full:
        carry = jax.lax.fori_loop(0, full, lambda i, c: fold(i * part, part, c), carry)
    return fold(full * part, tail, carry) if tail else carry


def attend_output(carry: tuple[jax.Array, jax.Array, jax.Array], w_kv_b: jax.Array, d: MlaDims) -> jax.Array:
    """Finish the softmax and apply ``W_uv`` per head -> f32[B, h*v]."""
    _, denom, acc = carry
    o_lat = acc / denom
    outs = []
    for h in range(d.heads):
        base = h * d.kv_b_head_cols + d.nope
        outs.append(mm(o_lat[:, h, :], w_kv_b[:, base: base + d.v_dim]))
    return jnp.concatenate(outs, axis=1)
