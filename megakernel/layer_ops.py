"""A layer's op bodies, written once for both kernels that run them.

The single-device kernel (:mod:`megakernel.kernel_attention`, :mod:`megakernel.kernel_moe`)
and the multi-device decode (:mod:`megakernel.decode_ops`) run the ops of a layer in the
registry's order (:mod:`tpusim.workload.registry`: ``attn.mix_norm`` → ``kda.qkvgb`` → ...
→ ``head.lm_head``) with the same math (:mod:`megakernel.math_kda`, :mod:`megakernel.math_mla`,
:mod:`megakernel.math_moe`, :mod:`megakernel.residual`). What differs is where an op's
operands live: on one chip a weight is streamed slab by slab through its ring buffers and the
KDA state is copied in and out of VMEM by DMA; across devices each layer's shard is a VMEM
operand. So each body below is one op's math between its operands' arrival and its result,
and takes the kernel's :class:`LayerIo` for the operands:

- ``product(tensor, layer, x)``: ``x`` f32[B, R] @ ``layer``'s weight ``tensor`` -> f32[B, C];
- ``resident(tensor, layer)``: the whole bf16[R, C] matrix (``mla.kv_b``, read twice);
- ``small(layer, kind)``: one small-parameter vector, f32[1, n];
- ``state_in(kind, layer)`` / ``state(kind, layer)`` / ``keep_state(kind, layer, value)``:
  the KDA short-convolution window (``kind`` :data:`CONV`, f32[B, K-1, 3W]) or recurrent state
  (:data:`RECURRENT`, f32[B, h, hd, hd]) of ``layer``: made ready (the kernel waits for the
  previous write-back and copies it in), read, and written (the kernel starts its write-back).

The op order, the collectives between ops and what a kernel does with a body's result stay
with the kernel; the order in which a body reads its operands is the kernel's too (every read
in the single-device kernel is an ordered load or copy in its program). Shapes: activations
f32[B, n]; ``h`` heads, ``hd`` head dim.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from megakernel import math_kda, math_mla, residual
from megakernel.dims import ModelDims
from megakernel.kernel_refs import idiv, imod
from megakernel.math_common import rmsnorm, situ
from tpusim.workload.registry.names import KdaTensor, MlaTensor, MoeTensor, SmallParam

# The KDA state a layer keeps between steps (LayerIo.state_in / state / keep_state)
CONV, RECURRENT = "conv", "state"


class LayerIo(Protocol):
    """Where a kernel keeps a layer's operands (module docstring)."""

    @property
    def dims(self) -> ModelDims: ...

    def product(self, tensor: str, layer: Any, x: jax.Array) -> jax.Array: ...

    def resident(self, tensor: str, layer: Any) -> jax.Array: ...

    def small(self, layer: Any, kind: str) -> jax.Array: ...

    def state_in(self, kind: str, layer: Any) -> None: ...

    def state(self, kind: str, layer: Any) -> jax.Array: ...

    def keep_state(self, kind: str, layer: Any, value: jax.Array) -> None: ...


# ---------------------------------------------------------------------------- residual


def mix_norm(io: LayerIo, layer: Any, sublayer: str, blocks: jax.Array, partial: jax.Array) -> jax.Array:
    """``attn.mix_norm`` / ``mlp.mix_norm`` (``sublayer`` "attn" | "mlp"): the attention-residual
    mixture of ``blocks`` f32[slots, B, H] and ``partial`` f32[B, H], RMS-normed -> f32[B, H]."""
    d, h = io.dims, io.dims.hidden
    mix = io.small(layer, SmallParam.RESIDUAL_MIX)
    query = mix[:, :h] if sublayer == "attn" else mix[:, h:]
    has_partial = (imod(layer, d.block_layers) > 0) if sublayer == "attn" else True
    mixed = residual.mix(blocks, partial, 1 + idiv(layer, d.block_layers), has_partial, query, d.eps)
    norm = io.small(layer, SmallParam.ATTN_NORM if sublayer == "attn" else SmallParam.MLP_NORM)
    return rmsnorm(mixed, norm, d.eps)


def head_norm(dims: ModelDims, blocks: jax.Array, partial: jax.Array) -> jax.Array:
    """``head.norm``: the plain residual sum of ``blocks`` and ``partial``, RMS-normed (the
    final norm's weight is folded into ``lm_head``) -> f32[B, H]."""
    return rmsnorm(residual.final_hidden(blocks, partial, dims.block_slots), None, dims.eps)


# ---------------------------------------------------------------------------------- KDA


def kda_qkvgb(io: LayerIo, layer: Any, x: jax.Array) -> tuple[tuple[Any, Any, Any], jax.Array, jax.Array]:
    """``kda.qkvgb``: the fused projection, the short convolution over the layer's window (the
    window written back) -> ((q, k, v) per-head lists, gate f32[B, W], beta f32[B, h])."""
    kd = io.dims.kda
    y = io.product(KdaTensor.QKVGB, layer, x)
    io.state_in(CONV, layer)
    qkv, gate, beta_logits = math_kda.split_qkvgb(y, kd)
    conv_w = math_kda.conv_taps(io.small(layer, SmallParam.KDA_CONV), kd)
    conv_out, window = math_kda.short_conv(qkv, io.state(CONV, layer), conv_w)
    io.keep_state(CONV, layer, window)
    q, k, v = math_kda.prepare_qkv(conv_out, kd)
    return (q, k, v), gate, jax.nn.sigmoid(beta_logits)


def kda_decay(io: LayerIo, layer: Any, x: jax.Array) -> jax.Array:
    """``kda.decay``: the low-rank decay projection -> log decay f32[B, h*hd]."""
    low = io.product(KdaTensor.DECAY_A, layer, x)
    f = io.product(KdaTensor.DECAY_B, layer, low)
    return math_kda.decay_log(f, io.small(layer, SmallParam.KDA_A_LOG), io.small(layer, SmallParam.KDA_DT_BIAS),
                              io.dims.kda)


def kda_core(io: LayerIo, layer: Any, qkv: tuple[Any, Any, Any], g: jax.Array, beta: jax.Array) -> list[jax.Array]:
    """``kda.core``: the delta rule over the layer's recurrent state (written back) -> the
    per-head outputs f32[B, hd] (gated by :func:`megakernel.math_kda.output_gate`)."""
    io.state_in(RECURRENT, layer)
    q, k, v = qkv
    outs, new_state = math_kda.delta_rule_heads(io.state(RECURRENT, layer), q, k, v, g, beta, io.dims.kda)
    io.keep_state(RECURRENT, layer, new_state)
    return outs


# ---------------------------------------------------------------------------------- MLA


def mla_q_a(io: LayerIo, layer: Any, x: jax.Array) -> jax.Array:
    """``mla.q_a``: the query's low-rank latent, RMS-normed -> f32[B, q_rank]."""
    return rmsnorm(io.product(MlaTensor.Q_A, layer, x), io.small(layer, SmallParam.MLA_Q_NORM), io.dims.eps)


def mla_kv_a(io: LayerIo, layer: Any, x: jax.Array, position: jax.Array) -> jax.Array:
    """``mla.kv_a``: this token's cache entry (normed latent, roped key at f32 ``position``) ->
    bf16[B, C + R]."""
    d = io.dims
    return math_mla.kv_entry(io.product(MlaTensor.KV_A, layer, x), io.small(layer, SmallParam.MLA_KV_NORM), position,
                             d.mla, d.eps).astype(jnp.bfloat16)


def mla_q_b(io: LayerIo, layer: Any, cq: jax.Array, position: jax.Array) -> tuple[list[jax.Array], jax.Array]:
    """``mla.q_b``: the queries -> (per-head no-rope parts f32[B, nope], roped parts f32[B, h, R])."""
    q_nope, q_rope = math_mla.split_q(io.product(MlaTensor.Q_B, layer, cq), position, io.dims.mla)
    return q_nope, jnp.stack(q_rope, axis=1)


def mla_kv_b(io: LayerIo, layer: Any, q_nope: list[jax.Array]) -> tuple[jax.Array, jax.Array]:
    """``mla.kv_b``: the no-rope queries absorbed into the latent -> (q_lat f32[B, h, C], the
    resident ``kv_b`` bf16[C, h*(nope+v)], read again by ``mla.core``)."""
    w_kv_b = io.resident(MlaTensor.KV_B, layer)
    return math_mla.absorb(q_nope, w_kv_b, io.dims.mla), w_kv_b


def mla_fold_entry(carry: tuple[jax.Array, jax.Array, jax.Array], q_lat: jax.Array, q_rope: jax.Array,
                   entry: jax.Array, w_kv_b: jax.Array, d: ModelDims) -> jax.Array:
    """The end of ``mla.core``: this token's own ``entry`` bf16[B, C + R] folded in last (after
    the cache), then each head's value output -> f32[B, h*v]."""
    carry = math_mla.attend_tile(carry, q_lat, q_rope, entry[:, None, :], jnp.ones((1, 1, 1), bool), d.mla)
    return math_mla.attend_output(carry, w_kv_b, d.mla)


def mla_gate(io: LayerIo, layer: Any, x: jax.Array, o: jax.Array) -> jax.Array:
    """``mla.gate``: the heads' output ``o`` gated by ``sigmoid(x @ W_gate)``."""
    return o * jax.nn.sigmoid(io.product(MlaTensor.GATE, layer, x))


# ---------------------------------------------------------------------------------- MLP


def moe_router(io: LayerIo, layer: Any, x: jax.Array) -> jax.Array:
    """``moe.router``: every expert's sigmoid score this device holds -> f32[B, experts]."""
    return jax.nn.sigmoid(io.product(MoeTensor.ROUTER, layer, x))


def gate_up(io: LayerIo, tensor: str, layer: Any, x: jax.Array, width: int) -> jax.Array:
    """``mlp.gate_up`` / ``moe.shared_gate_up``: ``situ(gate, up)`` of the fused projection whose
    first ``width`` columns are the gate -> f32[B, width]."""
    gu = io.product(tensor, layer, x)
    return situ(gu[:, :width], gu[:, width:])
