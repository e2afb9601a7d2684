"""An independent plain-jnp Kimi K3 decode step: the model's math written a second time.

The kernel and :mod:`megakernel.reference` share the ``megakernel.math_*``, ``residual`` and
``quant`` modules, so comparing them checks data movement, not the math. This module imports
none of them (only jax, numpy and tpusim's model config): every formula is written again
from ``shared/reference/kimi-k3.md`` and the simplifications listed in
:mod:`megakernel` (the model definition the kernel implements), in a different form where
the model allows one:

- **KDA**, per head, in the *untransposed* convention of the delta rule
  (``S[k_dim, v_dim]``): ``S <- diag(exp(g)) S``; ``S <- S + beta k (v - S^T k)^T``;
  ``o = S^T q``. The kernel keeps ``S^T``; the state it returns is compared transposed.
- **MLA** absorbed (the form whose bf16 rounding points the model's numerics fix), written
  as whole-cache einsums with one plain softmax (the kernel streams KV tiles through an
  online softmax, and attends to the new token separately).
- **MoE**: ``lax.top_k`` over ``sigmoid + bias`` (lowest id first on ties), only the chosen
  experts are dequantised and run (the old reference runs all of them densely).
- **Weight formats** decoded with XLA's own ``float8_e4m3fn`` bitcast and an e2m1 lookup
  table (the kernel decodes bit fields by hand).
- **Attention residuals** as an explicit list of sources.

Numerics contract shared with the kernel (it is the model's, not an implementation
detail): matmuls take bf16 operands and accumulate in f32 (the MXU), activations are f32,
the KV cache stores bf16. Orders of summation differ from the kernel's, so the two agree
within rounding (the tolerance helper in the tests), not bit for bit.

Weights are the host arrays of :class:`megakernel.layout.Weights` (its module table gives
names and shapes); the packed small-parameter row is read through the ``small_offsets``
mapping that comes with them. The state is the tuple of arrays of a decode state
(``kda`` transposed as the kernel stores it, ``conv``, ``kv``, ``position``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import (
    HeadTensor,
    KdaTensor,
    MlaTensor,
    MlpTensor,
    MoeTensor,
    SmallParam,
)
from tpusim.workload.sharding import ShardingPlan, round_up

E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
ROPE_BASE = 10000.0


class RefState(NamedTuple):
    """Decode state: ``kda`` f32[n_kda, B, h, hd_v, hd_k] (value-major, as stored by the
    kernel), ``conv`` f32[n_kda, B, K-1, 3W], ``kv`` bf16[n_mla, B, T, C + P(R)], ``position``."""

    kda: jax.Array
    conv: jax.Array
    kv: jax.Array
    position: jax.Array


@dataclass(frozen=True)
class Widths:
    """The plain integers the step needs, from the model config and a one-device plan."""

    hidden: int
    eps: float
    heads: int
    head_dim: int
    pad_w: int  # padded column block of q, k, v, gate in kda.qkvgb
    conv_kernel: int
    lower_bound: float
    mla_heads: int
    kv_lora: int
    nope: int
    rope: int
    rope_pad: int
    v_dim: int
    experts: int
    top_k: int
    routed_scaling: float
    latent: int
    block_layers: int
    kinds: tuple[str, ...]

    @classmethod
    def of(cls, model: ModelConfig, plan: ShardingPlan) -> Widths:
        kda, mla, moe = model.kda, model.mla, model.moe
        assert kda is not None and mla is not None and moe.latent_size is not None
        heads = plan.attention_heads_per_device
        return cls(model.hidden_size, model.rms_norm_eps, heads, kda.head_dim,
                   round_up(heads * kda.head_dim, plan.lane_multiple), kda.conv_kernel,
                   kda.decay_lower_bound, heads, mla.kv_lora_rank, mla.qk_nope_head_dim,
                   mla.qk_rope_head_dim, round_up(mla.qk_rope_head_dim, plan.lane_multiple),
                   mla.v_head_dim, moe.num_experts, moe.top_k, moe.routed_scaling, moe.latent_size,
                   model.residual_block_layers,
                   tuple(model.attention_kind(layer) for layer in range(model.num_layers)))


# ------------------------------------------------------------------------- small helpers


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """bf16 operands, f32 accumulation (what the MXU does)."""
    return jnp.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)


def rms(x: jax.Array, eps: float) -> jax.Array:
    return x / jnp.sqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


def situ(gate: jax.Array, up: jax.Array) -> jax.Array:
    return 4.0 * jnp.tanh(gate / 4.0) * jax.nn.sigmoid(gate) * 25.0 * jnp.tanh(up / 25.0)


def rotate(x: jax.Array, position: jax.Array) -> jax.Array:
    """RoPE, rotate-half pairs (i, i + R/2), frequency ``base ** (-2i/R)``."""
    half = x.shape[-1] // 2
    freq = ROPE_BASE ** (-2.0 * jnp.arange(half, dtype=jnp.float32) / x.shape[-1])
    angle = position.astype(jnp.float32) * freq
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * jnp.cos(angle) - b * jnp.sin(angle), b * jnp.cos(angle) + a * jnp.sin(angle)], -1)


def fp8_weight(bits: jax.Array, scales: jax.Array) -> jax.Array:
    """FP8 e4m3 bits u8[R, C] with bf16 scales [R/256, C] -> f32[R, C]."""
    values = lax.bitcast_convert_type(bits, jnp.float8_e4m3fn).astype(jnp.float32)
    return values * jnp.repeat(scales.astype(jnp.float32), bits.shape[0] // scales.shape[0], axis=0)


def mxfp4_weight(packed: jax.Array, exponents: jax.Array) -> jax.Array:
    """Packed e2m1 nibbles u8[R/2, C] (low nibble row r, high nibble row r + R/2) with E8M0
    exponents u8[R/32, C] -> f32[R, C]."""
    table = jnp.asarray(E2M1_VALUES)
    rows = jnp.concatenate([table[packed & 0xF], table[packed >> 4]], axis=0)
    scale = jnp.exp2(exponents.astype(jnp.float32) - 127.0)
    return rows * jnp.repeat(scale, rows.shape[0] // exponents.shape[0], axis=0)


def mixture(sources: list[jax.Array], query: jax.Array, eps: float) -> jax.Array:
    """Attention residual: softmax over ``rms(source) . query`` of the sources' weighted sum."""
    stacked = jnp.stack(sources)  # [S, B, H]
    weights = jax.nn.softmax(jnp.sum(rms(stacked, eps) * query, axis=-1), axis=0)  # [S, B]
    return jnp.einsum("sb,sbh->bh", weights, stacked)


# ----------------------------------------------------------------------------- sublayers


def kda(w: Widths, p: Mapping[str, jax.Array], small: Mapping[str, jax.Array], x: jax.Array,
        state_t: jax.Array, window: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """KDA for one token. ``state_t`` f32[B, h, v, k] (kernel layout) -> (out, state_t, window)."""
    hd, nh, pw = w.head_dim, w.heads, w.pad_w
    width = nh * hd
    y = matmul(x, p[KdaTensor.QKVGB])
    qkv = jnp.concatenate([y[:, i * pw: i * pw + width] for i in range(3)], axis=1)
    gate, beta = y[:, 3 * pw: 3 * pw + width], jax.nn.sigmoid(y[:, 4 * pw: 4 * pw + nh])
    taps = small[SmallParam.KDA_CONV].reshape(w.conv_kernel, 3 * width)
    history = jnp.concatenate([window, qkv[:, None, :]], axis=1)  # [B, K, 3W], oldest first
    conv = jnp.einsum("bkc,kc->bc", history, taps)
    conv = conv * jax.nn.sigmoid(conv)
    q, k, v = (conv[:, i * width: (i + 1) * width].reshape(-1, nh, hd) for i in range(3))
    q = q / jnp.sqrt(jnp.sum(q * q, -1, keepdims=True) + 1e-6) / math.sqrt(hd)
    k = k / jnp.sqrt(jnp.sum(k * k, -1, keepdims=True) + 1e-6)
    f = matmul(matmul(x, p[KdaTensor.DECAY_A]), p[KdaTensor.DECAY_B]).reshape(-1, nh, hd)
    rate = jnp.exp(small[SmallParam.KDA_A_LOG][:nh])[None, :, None]
    g = w.lower_bound * jax.nn.sigmoid(rate * (f + small[SmallParam.KDA_DT_BIAS].reshape(nh, hd)))
    s = jnp.swapaxes(state_t, -1, -2) * jnp.exp(g)[..., None]  # S[b, h, key, value]
    error = v - jnp.einsum("bhkv,bhk->bhv", s, k)
    s = s + beta[..., None, None] * k[..., :, None] * error[..., None, :]
    o = jnp.einsum("bhkv,bhk->bhv", s, q)
    o = (rms(o, w.eps).reshape(-1, width)) * jax.nn.sigmoid(gate)
    return matmul(o, p[KdaTensor.OUT]), jnp.swapaxes(s, -1, -2), history[:, 1:, :]


def mla(w: Widths, p: Mapping[str, jax.Array], small: Mapping[str, jax.Array], x: jax.Array,
        cache: jax.Array, position: jax.Array) -> tuple[jax.Array, jax.Array]:
    """MLA for one token, absorbed form. ``cache`` bf16[B, T, C + P(R)] -> (out, cache).

    ``W_kv_b`` columns per head are ``[W_uk | W_uv]``; the query absorbs ``W_uk``
    (``q_lat = q_nope W_uk^T``), scores are ``q_lat . c_t + q_rope . r_t``, and ``W_uv``
    expands the softmax-weighted latent. (The unabsorbed form is the same math, but its
    bf16 rounding points differ; over 93 random layers that grew to a few percent of the
    logits, more than the greedy-token check can absorb.)"""
    nh, c, r = w.mla_heads, w.kv_lora, w.rope
    cq = rms(matmul(x, p[MlaTensor.Q_A]), w.eps) * small[SmallParam.MLA_Q_NORM]
    ckv = matmul(x, p[MlaTensor.KV_A])
    latent = rms(ckv[:, :c], w.eps) * small[SmallParam.MLA_KV_NORM]
    entry = jnp.concatenate([latent, rotate(ckv[:, c: c + r], position),
                             jnp.zeros((x.shape[0], w.rope_pad - r), jnp.float32)], axis=1).astype(jnp.bfloat16)
    cache = lax.dynamic_update_slice(cache, entry[:, None, :], (0, position, 0))
    q = matmul(cq, p[MlaTensor.Q_B]).reshape(-1, nh, w.nope + w.rope_pad)
    q_nope, q_rope = q[..., : w.nope], rotate(q[..., w.nope: w.nope + r], position)
    kv_b = p[MlaTensor.KV_B].reshape(c, nh, w.nope + w.v_dim)
    q_lat = jnp.einsum("bhn,chn->bhc", q_nope.astype(jnp.bfloat16), kv_b[..., : w.nope],
                       preferred_element_type=jnp.float32)
    tokens = cache.astype(jnp.float32)  # [B, T, C + P(R)]
    scores = jnp.einsum("bhc,btc->bht", q_lat, tokens[..., :c]) + jnp.einsum("bhr,btr->bht", q_rope, tokens[..., c: c + r])
    visible = jnp.arange(cache.shape[1]) <= position
    scores = jnp.where(visible, scores / math.sqrt(w.nope + r), -jnp.inf)
    o_lat = jnp.einsum("bht,btc->bhc", jax.nn.softmax(scores, axis=-1), tokens[..., :c])
    o = jnp.einsum("bhc,chv->bhv", o_lat.astype(jnp.bfloat16), kv_b[..., w.nope:],
                   preferred_element_type=jnp.float32).reshape(x.shape[0], -1)
    o = o * jax.nn.sigmoid(matmul(x, p[MlaTensor.GATE]))
    return matmul(o, p[MlaTensor.OUT]), cache


def _bf16(x: jax.Array) -> jax.Array:
    """Round to bf16, widened back to f32 (XLA:CPU has no batched bf16 x bf16 -> f32 dot)."""
    return x.astype(jnp.bfloat16).astype(jnp.float32)


def gated_mlp(x: jax.Array, gate_up: jax.Array, down: jax.Array) -> jax.Array:
    h = matmul(x, gate_up)
    half = gate_up.shape[1] // 2
    return matmul(situ(h[:, :half], h[:, half:]), down)


def moe(w: Widths, p: Mapping[str, jax.Array], small: Mapping[str, jax.Array],
        x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Latent MoE + shared experts -> (out f32[B, H], chosen ids i32[B, k] in selection order,
    selection keys f32[B, E] = sigmoid scores + bias)."""
    scores = jax.nn.sigmoid(matmul(x, p[MoeTensor.ROUTER])[:, : w.experts])
    keys = scores + small[SmallParam.ROUTER_BIAS][: w.experts]
    _, ids = lax.top_k(keys, w.top_k)
    chosen = jnp.take_along_axis(scores, ids, axis=1)
    gates = chosen / jnp.sum(chosen, axis=1, keepdims=True) * w.routed_scaling
    lat = rms(matmul(x, p[MoeTensor.LATENT_DOWN])[:, : w.latent], w.eps) * small[SmallParam.LATENT_NORM]
    flat = ids.reshape(-1)  # [B*k]: each row's choices, in selection order
    gate_up = jax.vmap(fp8_weight)(p["expert.gate_up.values"][flat], p["expert.gate_up.scales"][flat])
    down = jax.vmap(mxfp4_weight)(p["expert.down.values"][flat], p["expert.down.scales"][flat])
    rows = jnp.repeat(lat, w.top_k, axis=0)[:, None, :]  # [B*k, 1, L]
    width = gate_up.shape[-1] // 2
    # bf16 operands, f32 products (exact in f32 for one bf16 x bf16 product)
    h = jnp.einsum("nol,nlc->noc", _bf16(rows), _bf16(gate_up))
    y = jnp.einsum("now,nwl->nol", _bf16(situ(h[..., :width], h[..., width:])), _bf16(down))[:, 0, :]
    routed = jnp.zeros_like(lat)
    for slot in range(w.top_k):  # accumulate in selection order
        routed = routed + gates[:, slot: slot + 1] * y.reshape(-1, w.top_k, lat.shape[1])[:, slot, :]
    out = matmul(routed, p[MoeTensor.LATENT_UP])[:, : w.hidden]
    return out + gated_mlp(x, p[MoeTensor.SHARED_GATE_UP], p[MoeTensor.SHARED_DOWN]), ids.astype(jnp.int32), keys


# ------------------------------------------------------------------------------ the step

_kda = jax.jit(kda, static_argnums=0)
_mla = jax.jit(mla, static_argnums=0)
_moe = jax.jit(moe, static_argnums=0)
_mlp = jax.jit(gated_mlp)


@partial(jax.jit, static_argnums=(0, 4))
def _mix_norm(w: Widths, sources: list[jax.Array], query: jax.Array, norm: jax.Array, _sublayer: str) -> jax.Array:
    return rms(mixture(sources, query, w.eps), w.eps) * norm


class ReferenceStep:
    """One decode step of the whole model on one device's weights (all layers).

    ``arrays``: the weight arrays by module-table name; ``small_offsets``: kind ->
    (offset, length) in the packed small-parameter row. After a call, ``router_keys`` holds
    that step's selection keys f32[MoE layers, B, E] (near-tie diagnostics)."""

    def __init__(self, model: ModelConfig, plan: ShardingPlan, arrays: Mapping[str, Any],
                 small_offsets: Mapping[str, tuple[int, int]]) -> None:
        if plan.devices != 1:
            raise ValueError("the reference runs the whole model: give it a one-device plan")
        self.w = Widths.of(model, plan)
        self.arrays = {name: jnp.asarray(value) for name, value in arrays.items()}
        self.small_offsets = dict(small_offsets)
        kinds = self.w.kinds
        self.stack_index = [kinds[:layer].count(kinds[layer]) for layer in range(len(kinds))]
        self.router_keys: jax.Array | None = None

    def _small(self, layer: int) -> dict[str, jax.Array]:
        row = self.arrays["small"][layer]
        return {kind: row[off: off + n] for kind, (off, n) in self.small_offsets.items()}

    def _layer(self, prefix: str, index: int) -> dict[str, jax.Array]:
        return {name: value[index] for name, value in self.arrays.items() if name.startswith(prefix)}

    def __call__(self, state: RefState, tokens: jax.Array) -> tuple[jax.Array, RefState, jax.Array]:
        """``tokens`` i32[B] -> (logits f32[B, V], next state, routing i32[MoE layers, B, k])."""
        w, hidden = self.w, self.w.hidden
        kda_state, conv, kv = list(state.kda), list(state.conv), list(state.kv)
        blocks = [self.arrays["embedding"][tokens].astype(jnp.float32)]
        partial_sum: jax.Array | None = None
        routing, router_keys = [], []
        for layer, kind in enumerate(w.kinds):
            small, i = self._small(layer), self.stack_index[layer]
            mix = small[SmallParam.RESIDUAL_MIX]
            x = _mix_norm(w, blocks + ([partial_sum] if partial_sum is not None else []),
                          mix[:hidden], small[SmallParam.ATTN_NORM], "attn")
            if kind == "kda":
                out, kda_state[i], conv[i] = _kda(w, self._layer("kda.", i), small, x, kda_state[i], conv[i])
            else:
                out, kv[i] = _mla(w, self._layer("mla.", i), small, x, kv[i], state.position)
            partial_sum = out if partial_sum is None else partial_sum + out
            x = _mix_norm(w, [*blocks, partial_sum], mix[hidden:], small[SmallParam.MLP_NORM], "mlp")
            if layer == 0:
                out = _mlp(x, self.arrays[MlpTensor.GATE_UP], self.arrays[MlpTensor.DOWN])
            else:
                p = {**self._layer("moe.", layer - 1), **self._layer("expert.", layer - 1)}
                out, ids, keys = _moe(w, p, small, x)
                routing.append(ids)
                router_keys.append(keys)
            partial_sum = partial_sum + out
            if (layer + 1) % w.block_layers == 0:
                blocks.append(partial_sum)
                partial_sum = None
        final = sum(blocks[1:], blocks[0]) + (partial_sum if partial_sum is not None else 0.0)
        logits = matmul(rms(final, w.eps), self.arrays[HeadTensor.LM_HEAD])
        next_state = RefState(jnp.stack(kda_state), jnp.stack(conv), jnp.stack(kv), state.position + 1)
        self.router_keys = jnp.stack(router_keys)
        return logits, next_state, jnp.stack(routing)
