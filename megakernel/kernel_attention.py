"""Attention phase of the megakernel: the mix-norm, KDA and MLA ops of one layer.

Each function runs consecutive ops of one layer. ``begin(op)`` (from :mod:`megakernel.kernel`)
issues the copies the plan starts at that op and records the op's compute event; the
function then waits for the op's own weights (``ctx.matmul`` waits slab by slab) and
computes with the shared math of :mod:`megakernel.math_kda` / :mod:`megakernel.math_mla`.

State traffic (not in the schedule; each has its own small VMEM buffer):

- KDA conv window: read at ``kda.qkvgb``, written back at its end; KDA recurrent state:
  read at ``kda.core``, written back at its end. A write-back is waited on at the next KDA
  layer's read (the buffer's next use) or at kernel exit.
- MLA KV cache: ``mla.core`` streams ``ceil(p / kv_tile_tokens)`` tiles through ``kv_buffers``
  buffers (tile ``t + kv_buffers`` is issued when tile ``t`` is consumed), folds this token's
  entry in last, then writes the entry to the cache at position ``p`` and waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel import math_kda, math_mla, residual
from megakernel.kernel_dma import Ctx, idiv, imod
from megakernel.math_common import mm_t, rmsnorm
from megakernel.quant import words_to_bf16
from tpusim.schedule.kernel_layout import KV_WRITE_TOKENS, LANES
from tpusim.workload.registry.names import (
    AttnOp,
    Collective,
    KdaOp,
    KdaTensor,
    MlaOp,
    MlaTensor,
    SmallParam,
    StateBuffer,
    StateFamily,
)

Begin = Callable[[str], None]


def mix_norm(ctx: Ctx, layer: Any, sublayer: str) -> jax.Array:
    """``attn.mix_norm`` / ``mlp.mix_norm``: attention-residual mixture + RMSNorm -> f32[B, H]."""
    b, h, d = ctx.batch, ctx.dims.hidden, ctx.dims
    blocks = ctx.scratch["blocks"][:, :b, :]
    partial = ctx.scratch["partial"][:b, :]
    mix = ctx.small(layer, SmallParam.RESIDUAL_MIX)
    query = mix[:, :h] if sublayer == "attn" else mix[:, h:]
    has_partial = (imod(layer, d.block_layers) > 0) if sublayer == "attn" else True
    mixed = residual.mix(blocks, partial, 1 + idiv(layer, d.block_layers), has_partial, query, d.eps)
    norm = ctx.small(layer, SmallParam.ATTN_NORM if sublayer == "attn" else SmallParam.MLP_NORM)
    return rmsnorm(mixed, norm, d.eps)


def add_to_residual(ctx: Ctx, out: jax.Array) -> None:
    """``partial += out`` (f32[B, H])."""
    b = ctx.batch
    ctx.scratch["partial"][:b, :] = ctx.scratch["partial"][:b, :] + out


def finish_previous(ctx: Ctx, layer: Any) -> None:
    """With collectives: wait for the previous layer's MLP output (its all-reduce or all-gather,
    consumed here at ``attn.mix_norm``), add it to the residual and close its block."""
    if ctx.link is not None and not (isinstance(layer, int) and layer == 0):
        ctx.link.finish_mlp(ctx, layer)


class _StateCopies:
    """Descriptors of the KDA conv-window / state copies of stack index ``m`` (built on use)."""

    def __init__(self, ctx: Ctx, m: Any) -> None:
        self.ctx, self.m = ctx, m

    def __getitem__(self, name: str) -> Any:
        s, o, m = self.ctx.scratch, self.ctx.outs, self.m
        sem = s["state_sem"]
        hbm = {"conv": o["state.conv"], "state": o["state.kda"]}
        buf = {"conv": s["conv"], "state": s[StateFamily.KDA_STATE]}
        kind, direction = name.split("_")
        index = {"conv_in": 0, "conv_out": 1, "state_in": 2, "state_out": 3}[name]
        if direction == "in":
            return pltpu.make_async_copy(hbm[kind].at[m], buf[kind], sem.at[index])
        return pltpu.make_async_copy(buf[kind], hbm[kind].at[m], sem.at[index])


def _state_copies(ctx: Ctx, m: Any) -> _StateCopies:
    return _StateCopies(ctx, m)


def _state_event(ctx: Ctx, kind: str, tensor: str, layer: Any) -> None:
    ctx.event(kind, StateFamily.KDA_STATE, tensor, dynamic=(layer, 0))


def kda_layer(ctx: Ctx, layer: Any, begin: Begin, first_kda: bool) -> None:
    """``attn.mix_norm`` .. ``kda.o`` of a KDA layer; adds the output to the residual."""
    d, kd = ctx.dims, ctx.dims.kda
    m = ctx.instance(ctx.geo.rings[KdaTensor.QKVGB], layer)
    copies = _state_copies(ctx, m)
    begin(AttnOp.MIX_NORM)
    finish_previous(ctx, layer)
    ctx.wait("small", layer, 0)
    x = mix_norm(ctx, layer, "attn")

    begin(KdaOp.QKVGB)
    y = ctx.matmul(KdaTensor.QKVGB, layer, x)
    if not first_kda:
        copies["conv_out"].wait()  # the previous KDA layer's write-back
        _state_event(ctx, "dma_wait", StateBuffer.KDA_CONV_OUT, layer)
    copies["conv_in"].start()
    _state_event(ctx, "dma_start", StateBuffer.KDA_CONV_IN, layer)
    copies["conv_in"].wait()
    _state_event(ctx, "dma_wait", StateBuffer.KDA_CONV_IN, layer)
    qkv, gate, beta_logits = math_kda.split_qkvgb(y, kd)
    # f32[K, 3w], a tap per row by lane slices: a reshape of the f32[1, K*3w] row is no Mosaic
    # shape cast unless 3w is a multiple of 128 lanes (nano on 8 devices: 3w = 96)
    taps, cols = ctx.small(layer, SmallParam.KDA_CONV), 3 * kd.width
    conv_w = jnp.concatenate([taps[:, t * cols: (t + 1) * cols] for t in range(kd.conv_kernel)], axis=0)
    conv_out, window = math_kda.short_conv(qkv, ctx.scratch["conv"][...], conv_w)
    ctx.scratch["conv"][...] = window
    copies["conv_out"].start()
    _state_event(ctx, "dma_start", StateBuffer.KDA_CONV_OUT, layer)
    q, k, v = math_kda.prepare_qkv(conv_out, kd)
    beta = jax.nn.sigmoid(beta_logits)

    begin(KdaOp.DECAY)
    low = ctx.matmul(KdaTensor.DECAY_A, layer, x)
    f = ctx.matmul(KdaTensor.DECAY_B, layer, low)
    g = math_kda.decay_log(f, ctx.small(layer, SmallParam.KDA_A_LOG), ctx.small(layer, SmallParam.KDA_DT_BIAS), kd)

    begin(KdaOp.CORE)
    if not first_kda:
        copies["state_out"].wait()
        _state_event(ctx, "dma_wait", StateBuffer.KDA_STATE_OUT, layer)
    copies["state_in"].start()
    _state_event(ctx, "dma_start", StateBuffer.KDA_STATE_IN, layer)
    copies["state_in"].wait()
    _state_event(ctx, "dma_wait", StateBuffer.KDA_STATE_IN, layer)
    state = ctx.scratch[StateFamily.KDA_STATE][...]  # one load, one store: every access is a callback
    outs, new_state = math_kda.delta_rule_heads(state, q, k, v, g, beta, kd)
    ctx.scratch[StateFamily.KDA_STATE][...] = new_state
    copies["state_out"].start()
    _state_event(ctx, "dma_start", StateBuffer.KDA_STATE_OUT, layer)
    if ctx.link is not None:  # the exchange carries this device's gated heads
        ctx.link.issue(ctx, Collective.ATTN_HEAD_EXCHANGE, layer, math_kda.output_gate(outs, gate, d.eps))

    begin(KdaOp.OUT)
    if ctx.link is not None:
        ctx.link.attention_output(ctx, KdaTensor.OUT, layer)
        return
    o = math_kda.output_gate(outs, gate, d.eps)
    add_to_residual(ctx, ctx.matmul(KdaTensor.OUT, layer, o))


def finish_kda_state(ctx: Ctx, last_kda_layer: int) -> None:
    """Wait for the last KDA layer's write-backs (kernel exit)."""
    copies = _state_copies(ctx, 0)
    copies["conv_out"].wait()
    _state_event(ctx, "dma_wait", StateBuffer.KDA_CONV_OUT, last_kda_layer)
    copies["state_out"].wait()
    _state_event(ctx, "dma_wait", StateBuffer.KDA_STATE_OUT, last_kda_layer)


def _panels(ctx: Ctx, ring: str, layer: Any) -> jax.Array:
    """A resident single-slab tensor as its full bf16[R, C] matrix (panels side by side)."""
    r = ctx.geo.rings[ring]
    w = words_to_bf16(ctx.view(ring, layer, 0)).reshape(r.panels, r.slab_rows, LANES)
    return jnp.concatenate([w[p] for p in range(r.panels)], axis=1)[: r.rows]


def mla_layer(ctx: Ctx, layer: Any, begin: Begin) -> None:
    """``attn.mix_norm`` .. ``mla.o`` of an MLA layer; adds the output to the residual."""
    d, md = ctx.dims, ctx.dims.mla
    b = ctx.batch
    position = ctx.memo("position", 0, lambda: ctx.ins["smem.scalars"][0])
    pos_f = position.astype(jnp.float32)
    begin(AttnOp.MIX_NORM)
    finish_previous(ctx, layer)
    ctx.wait("small", layer, 0)
    x = mix_norm(ctx, layer, "attn")

    begin(MlaOp.Q_A)
    cq = rmsnorm(ctx.matmul(MlaTensor.Q_A, layer, x), ctx.small(layer, SmallParam.MLA_Q_NORM), d.eps)
    begin(MlaOp.KV_A)
    entry = math_mla.kv_entry(ctx.matmul(MlaTensor.KV_A, layer, x), ctx.small(layer, SmallParam.MLA_KV_NORM), pos_f,
                              md, d.eps).astype(jnp.bfloat16)
    begin(MlaOp.Q_B)
    q_nope, q_rope = math_mla.split_q(ctx.matmul(MlaTensor.Q_B, layer, cq), pos_f, md)
    q_rope_all = jnp.stack(q_rope, axis=1)

    begin(MlaOp.KV_B)
    ctx.wait(MlaTensor.KV_B, layer, 0)
    w_kv_b = _panels(ctx, MlaTensor.KV_B, layer)
    q_lat = jnp.stack([mm_t(q_nope[hd], w_kv_b[:, hd * md.kv_b_head_cols: hd * md.kv_b_head_cols + md.nope])
                       for hd in range(md.heads)], axis=1)

    begin(MlaOp.CORE)
    m = ctx.instance(ctx.geo.rings[MlaTensor.Q_A], layer)
    # The cache row of ``position`` is written as its whole (16, 128) tile of tokens (a DMA
    # may not start mid-tile): the tile's earlier rows are read back first (overlapping the
    # attention below), the new entry is merged in VMEM, and the tile is written back.
    block = KV_WRITE_TOKENS
    start = pl.multiple_of(idiv(position, block) * block, block)
    read, write = _kv_block_copies(ctx, m, start)
    read.start()
    carry = _attend_cache(ctx, layer, m, position, q_lat, q_rope_all)
    carry = math_mla.attend_tile(carry, q_lat, q_rope_all, entry[:, None, :], jnp.ones((1, 1, 1), bool), md)
    o = math_mla.attend_output(carry, w_kv_b, md)
    read.wait()
    row = lax.broadcasted_iota(jnp.int32, (1, block, 1), 1)
    ctx.scratch["kv_entry"][...] = jnp.where(row == position - start, entry[:, None, :], ctx.scratch["kv_entry"][...])
    write.start()
    ctx.event("dma_start", "kv", StateBuffer.MLA_KV_WRITE, dynamic=(layer, 0))
    write.wait()
    ctx.event("dma_wait", "kv", StateBuffer.MLA_KV_WRITE, dynamic=(layer, 0))

    begin(MlaOp.GATE)
    o = o * jax.nn.sigmoid(ctx.matmul(MlaTensor.GATE, layer, x))
    if ctx.link is not None:  # issued after the gate: its weights hold this device's heads only
        ctx.link.issue(ctx, Collective.ATTN_HEAD_EXCHANGE, layer, o[:b])
    begin(MlaOp.OUT)
    if ctx.link is not None:
        ctx.link.attention_output(ctx, MlaTensor.OUT, layer)
        return
    add_to_residual(ctx, ctx.matmul(MlaTensor.OUT, layer, o)[:b])


def _kv_block_copies(ctx: Ctx, m: Any, start: Any) -> tuple[Any, Any]:
    """(read, write) of the KV tile of tokens ``[start, start + KV_WRITE_TOKENS)`` of stack
    entry ``m``, through the ``kv_entry`` staging buffer."""
    rows = ctx.outs["state.kv"].at[m, :, pl.ds(start, KV_WRITE_TOKENS), :]
    sems = ctx.scratch["kv_write_sem"]
    return (pltpu.make_async_copy(rows, ctx.scratch["kv_entry"], sems.at[1]),
            pltpu.make_async_copy(ctx.scratch["kv_entry"], rows, sems.at[0]))


def _attend_cache(ctx: Ctx, layer: Any, m: Any, position: jax.Array, q_lat: jax.Array,
                  q_rope: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Online softmax over the cached tokens [0, position), streamed in KV tiles, each folded
    in :data:`~megakernel.math_mla.KV_FOLD_TOKENS`-token parts."""
    md, tile, nbuf = ctx.dims.mla, ctx.geo.kv_tile_tokens, ctx.geo.kv_buffers
    tiles = idiv(position + tile - 1, tile)

    def copy(t: Any) -> Any:
        slot = imod(t, nbuf)
        return pltpu.make_async_copy(ctx.outs["state.kv"].at[m, :, pl.ds(t * tile, tile), :],
                                     ctx.scratch["kv_tiles"].at[slot], ctx.scratch["kv_sem"].at[slot])

    def start(t: Any) -> None:
        copy(t).start()
        ctx.event("dma_start", "kv", StateBuffer.MLA_KV_TILE, dynamic=(layer, t))

    capacity_tiles = ctx.outs["state.kv"].shape[2] // tile
    for t in range(min(nbuf, capacity_tiles)):
        ctx.when(t < tiles, lambda t=t: start(t))

    # Each tile is folded in math_mla.KV_FOLD_TOKENS-token parts (a runtime loop), the order
    # the references fold the cache in (math_mla.attend_parts); by whole tiles at once, widened
    # to f32, Mosaic spilled megabytes of vector values. (A tile of another size is folded
    # whole: the same values, added in another order than the references'.)
    fold = math_mla.KV_FOLD_TOKENS if tile % math_mla.KV_FOLD_TOKENS == 0 else tile

    def body(t: Any, carry: Any) -> Any:
        copy(t).wait()
        ctx.event("dma_wait", "kv", StateBuffer.MLA_KV_TILE, dynamic=(layer, t))

        def part(s: Any, carry: Any) -> Any:
            lo = pl.multiple_of(s * fold, fold)
            kv = ctx.scratch["kv_tiles"][imod(t, nbuf), :, pl.ds(lo, fold), :]
            token = t * tile + lo + lax.broadcasted_iota(jnp.int32, (1, 1, fold), 2)
            return math_mla.attend_tile(carry, q_lat, q_rope, kv, token < position, md)

        carry = ctx.fori(0, tile // fold, part, carry)
        ctx.when(t + nbuf < tiles, lambda: start(t + nbuf))
        return carry

    return ctx.fori(0, tiles, body, math_mla.attend_init(ctx.batch, md))
