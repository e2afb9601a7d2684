"""Attention phase of the megakernel: the mix-norm, KDA and MLA ops of one layer.

Each function runs consecutive ops of one layer. ``begin(op)`` (from :mod:`megakernel.kernel`)
issues the copies the plan starts at that op and records the op's compute event; the
function then runs the op's body from :mod:`megakernel.layer_ops` (written once for this
kernel and the multi-device decode, :mod:`megakernel.decode_ops`) on this kernel's operands,
:class:`KernelIo`: weights streamed through their rings (``ctx.matmul`` waits slab by slab),
the KDA state copied in and out of its VMEM buffers.

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

from megakernel import layer_ops, math_kda, math_mla
from megakernel.kernel_dma import Ctx, idiv, imod
from megakernel.quant import words_to_bf16
from tpusim.schedule.kernel_layout import KV_WRITE_TOKENS, LANES
from tpusim.workload.registry.names import (
    AttnOp,
    Collective,
    KdaOp,
    KdaTensor,
    MlaOp,
    MlaTensor,
    StateBuffer,
    StateFamily,
)

Begin = Callable[[str], None]


def mix_norm(ctx: Ctx, layer: Any, sublayer: str) -> jax.Array:
    """``attn.mix_norm`` / ``mlp.mix_norm`` over the residual blocks and partial in VMEM -> f32[B, H]."""
    b = ctx.batch
    blocks = ctx.scratch["blocks"][:, :b, :]
    partial = ctx.scratch["partial"][:b, :]
    return layer_ops.mix_norm(KernelIo(ctx), layer, sublayer, blocks, partial)


def add_to_residual(ctx: Ctx, out: jax.Array) -> None:
    """``partial += out`` (f32[B, H])."""
    b = ctx.batch
    ctx.scratch["partial"][:b, :] = ctx.scratch["partial"][:b, :] + out


def attention_input(ctx: Ctx, layer: Any, begin: Begin) -> jax.Array:
    """``attn.mix_norm`` of any attention layer: the previous layer's MLP output finished (with
    collectives), the layer's small parameters waited, the mixture normed -> f32[B, H]."""
    begin(AttnOp.MIX_NORM)
    finish_previous(ctx, layer)
    ctx.wait("small", layer, 0)
    return mix_norm(ctx, layer, "attn")


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


# The KDA state's scratch buffer and its copies' names, by layer_ops kind
_STATE_SCRATCH = {layer_ops.CONV: "conv", layer_ops.RECURRENT: StateFamily.KDA_STATE}
_STATE_IN = {layer_ops.CONV: StateBuffer.KDA_CONV_IN, layer_ops.RECURRENT: StateBuffer.KDA_STATE_IN}
_STATE_OUT = {layer_ops.CONV: StateBuffer.KDA_CONV_OUT, layer_ops.RECURRENT: StateBuffer.KDA_STATE_OUT}


class KernelIo:
    """The single-device kernel's operands for :mod:`megakernel.layer_ops`: weights streamed
    through their rings (:meth:`Ctx.matmul`), the small-parameter row, and a KDA layer's
    state in its VMEM buffers, copied in from HBM (after the previous KDA layer's write-back,
    unless ``first_kda``) and written back by ``copies``."""

    def __init__(self, ctx: Ctx, copies: _StateCopies | None = None, first_kda: bool = False) -> None:
        self.ctx, self.copies, self.first_kda = ctx, copies, first_kda

    @property
    def dims(self) -> Any:
        return self.ctx.dims

    def product(self, tensor: str, layer: Any, x: jax.Array) -> jax.Array:
        return self.ctx.matmul(tensor, layer, x)

    def resident(self, tensor: str, layer: Any) -> jax.Array:
        self.ctx.wait(tensor, layer, 0)
        return _panels(self.ctx, tensor, layer)

    def small(self, layer: Any, kind: str) -> jax.Array:
        return self.ctx.small(layer, kind)

    def state_in(self, kind: str, layer: Any) -> None:
        assert self.copies is not None
        if not self.first_kda:
            self.copies[f"{kind}_out"].wait()  # the previous KDA layer's write-back
            _state_event(self.ctx, "dma_wait", _STATE_OUT[kind], layer)
        self.copies[f"{kind}_in"].start()
        _state_event(self.ctx, "dma_start", _STATE_IN[kind], layer)
        self.copies[f"{kind}_in"].wait()
        _state_event(self.ctx, "dma_wait", _STATE_IN[kind], layer)

    def state(self, kind: str, layer: Any) -> jax.Array:
        return self.ctx.scratch[_STATE_SCRATCH[kind]][...]  # one load, one store: every access is a callback

    def keep_state(self, kind: str, layer: Any, value: jax.Array) -> None:
        assert self.copies is not None
        self.ctx.scratch[_STATE_SCRATCH[kind]][...] = value
        self.copies[f"{kind}_out"].start()
        _state_event(self.ctx, "dma_start", _STATE_OUT[kind], layer)


def kda_layer(ctx: Ctx, layer: Any, begin: Begin, first_kda: bool) -> None:
    """``attn.mix_norm`` .. ``kda.o`` of a KDA layer; adds the output to the residual."""
    d = ctx.dims
    m = ctx.instance(ctx.geo.rings[KdaTensor.QKVGB], layer)
    io = KernelIo(ctx, _state_copies(ctx, m), first_kda)
    x = attention_input(ctx, layer, begin)

    begin(KdaOp.QKVGB)
    qkv, gate, beta = layer_ops.kda_qkvgb(io, layer, x)

    begin(KdaOp.DECAY)
    g = layer_ops.kda_decay(io, layer, x)

    begin(KdaOp.CORE)
    outs = layer_ops.kda_core(io, layer, qkv, g, beta)
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
    d, b = ctx.dims, ctx.batch
    io = KernelIo(ctx)
    position = ctx.memo("position", 0, lambda: ctx.ins["smem.scalars"][0])
    pos_f = position.astype(jnp.float32)
    x = attention_input(ctx, layer, begin)

    begin(MlaOp.Q_A)
    cq = layer_ops.mla_q_a(io, layer, x)
    begin(MlaOp.KV_A)
    entry = layer_ops.mla_kv_a(io, layer, x, pos_f)
    begin(MlaOp.Q_B)
    q_nope, q_rope_all = layer_ops.mla_q_b(io, layer, cq, pos_f)

    begin(MlaOp.KV_B)
    q_lat, w_kv_b = layer_ops.mla_kv_b(io, layer, q_nope)

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
    o = layer_ops.mla_fold_entry(carry, q_lat, q_rope_all, entry, w_kv_b, d)
    read.wait()
    row = lax.broadcasted_iota(jnp.int32, (1, block, 1), 1)
    ctx.scratch["kv_entry"][...] = jnp.where(row == position - start, entry[:, None, :], ctx.scratch["kv_entry"][...])
    write.start()
    ctx.event("dma_start", "kv", StateBuffer.MLA_KV_WRITE, dynamic=(layer, 0))
    write.wait()
    ctx.event("dma_wait", "kv", StateBuffer.MLA_KV_WRITE, dynamic=(layer, 0))

    begin(MlaOp.GATE)
    o = layer_ops.mla_gate(io, layer, x, o)
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
