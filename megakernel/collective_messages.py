"""How the decode kernels' collectives lay out and move their messages (one owner for both
kernels: :class:`megakernel.multi_device_decode.DecodeKernel` in interpret mode and
:class:`megakernel.kernel_collectives.KernelLink` in the collective megakernel).

A message is the payload's [B, w] (one row per token), folded into the two rows a bf16 sublane
packs where that fills whole tiles (:meth:`CollectiveMessages.folds`); a reduce-scatter sends
one chunk of its flat payload to each peer, chunk ``g`` on a leading dimension of its send
buffer. :meth:`~CollectiveMessages.issue` stores a payload and starts the remote copies,
:meth:`~CollectiveMessages.wait` waits for them and combines what arrived
(:mod:`megakernel.collective_combine`). The mixin reads the kernel's collectives (``colls``),
payload widths and dtypes (``payload``), ``batch``, ``bugs`` and its routes-table words
(``route``, ``own_word``, ``chunk_word``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from megakernel.collective_combine import fold, joined, ranked, sum_blocks, unflatten, unfold
from megakernel.multi_device import ISSUE, WAIT
from tpusim.schedule.kernel_layout import LANES


class CollectiveMessages:
    """Message layout, issue and wait of a decode kernel's collectives (module docstring)."""

    colls: Any
    payload: dict[int, tuple[int, Any]]
    batch: int
    bugs: Any

    def scatters(self, c: int) -> bool:
        return self.colls[c].algorithm == "reduce_scatter_all_gather"

    def chunk(self, c: int) -> int:
        """Values per message: the payload, or for a reduce-scatter a 1/group share (rounded up)."""
        coll, n = self.colls[c], self.batch * self.payload[c][0]
        return -(-n // coll.members.shape[1]) if self.scatters(c) else n

    def folds(self, c: int) -> int:
        """Rows each token's payload takes in a message (:func:`collective_combine.fold`): as
        many as make the message's rows fill what one sublane packs (2 for bf16 at batch 1),
        where each part stays whole 128-lane columns; else 1. Mosaic pads a one-row bf16
        array to two rows, so an unfolded message would take twice the bytes it carries."""
        width, dtype = self.payload[c]
        packed = max(1, 4 // np.dtype(dtype).itemsize)
        if self.scatters(c):  # one flat chunk, as rows of what a sublane packs
            return packed if packed > 1 and self.chunk(c) % (packed * LANES) == 0 else 1
        parts = packed // self.batch if self.batch < packed else 1
        return parts if parts > 1 and width % (parts * LANES) == 0 else 1

    def message_shape(self, c: int) -> tuple[int, int]:
        """(rows, columns) of one message: the payload's [B, w] (one row per token, so that
        Mosaic tiles a bf16 message at batch 8 without padding and the combine works on full
        vector registers), folded to [B·f, w/f] by :meth:`folds`, or for a reduce-scatter its
        flat chunk in :meth:`folds` rows."""
        parts = self.folds(c)
        if self.scatters(c):
            return parts, self.chunk(c) // parts
        return self.batch * parts, self.payload[c][0] // parts

    def send_shape(self, c: int) -> tuple[int, ...]:
        """Send buffer ``[phases, rows, columns]``: one message per phase; a reduce-scatter's
        ``[phases, group, rows, columns]``: its flat payload padded to whole chunks, chunk ``g``
        at ``[phase, g]`` (a traced chunk index on an untiled leading dimension: a chunk of
        224 columns, K3's shared reduce over 32 devices, cannot be sliced at a traced lane
        offset)."""
        rows, cols = self.message_shape(c)
        coll = self.colls[c]
        return (coll.phases, coll.members.shape[1], rows, cols) if self.scatters(c) else (coll.phases, rows, cols)

    def recv_shape(self, c: int, phase: int, copies: int) -> tuple[int, int, int, int]:
        """Receive buffer of ``phase``: ``[copies, messages, rows, columns]``, a slot per
        incoming message on an untiled leading dimension (a remote copy to a traced slot)."""
        return (copies, self.colls[c].counts[phase], *self.message_shape(c))

    def issue(self, ctx: Any, c: int, layer: int, payload: jax.Array, phase: int = 0) -> None:
        """Put ``payload`` f32[B, w] (a reduce-scatter's phase 1: its reduced chunk, a message)
        in ``send[c][phase]`` in the message layout (:meth:`message_shape`) and start the
        phase's copies."""
        dtype = self.payload[c][1]
        if not self.scatters(c):
            ctx.send[c][phase] = fold(payload, self.folds(c)).astype(dtype)
        elif phase == 0:  # the flat payload, chunk by chunk, each in the message's rows
            rows, cols = self.message_shape(c)
            flat = payload.reshape(1, -1)
            flat = jnp.pad(flat, ((0, 0), (0, self.send_shape(c)[1] * rows * cols - flat.shape[1])))
            for g in range(self.send_shape(c)[1]):
                ctx.send[c][phase, g] = fold(flat[:, g * rows * cols: (g + 1) * rows * cols], rows).astype(dtype)
        else:  # the reduced chunk, already a message
            ctx.send[c][phase, 0] = payload.astype(dtype)
        for i in range(self.colls[c].counts[phase]):
            copy, dst = self._copy(ctx, c, phase, i, layer)  # type: ignore[arg-type]
            copy.start()
            ctx.record(ISSUE, c, phase, dst, layer)

    def _slot_parity(self, c: int, layer: Any) -> Any:
        """The receive slots' copy (of ``recv_shape``'s ``copies``) ``layer`` uses for ``c``."""
        return self._parity(layer)

    def _copy(self, ctx: Any, c: int, phase: int, i: int, layer: Any) -> Any:
        """Message ``i`` of ``phase``: its chunk of ``send[c][phase]`` -> the destination's slot."""
        dst = ctx.routes[self.route(c, phase, i, "dst")]
        slot = ctx.routes[self.route(c, phase, i, "slot")]
        par = self._slot_parity(c, layer)
        return pltpu.make_async_remote_copy(
            self._own(ctx, c, phase, ctx.routes[self.chunk_word(c, i)]), ctx.recv[c][phase].at[par, slot],
            ctx.send_sem[c].at[phase], ctx.recv_sem[c].at[par, phase],
            device_id=(dst,), device_id_type=pltpu.DeviceIdType.MESH), dst

    def _own(self, ctx: Any, c: int, phase: int, chunk: Any) -> Any:
        """This rank's message of ``phase`` in its send buffer (a view): a reduce-scatter's
        phase 0 sends and keeps ``chunk`` of its payload, its phase 1 the reduced chunk."""
        if not self.scatters(c):
            return ctx.send[c].at[phase]
        return ctx.send[c].at[phase, chunk if phase == 0 else 0]

    def wait(self, ctx: Any, c: int, layer: int) -> jax.Array:
        """Wait for collective ``c`` of ``layer`` and combine: -> f32[B, w·members] (gather,
        exchange: contributions in rank order) or f32[B, w] (reductions: summed in rank order,
        so every member computes the same value)."""
        coll, (width, _) = self.colls[c], self.payload[c]
        par, b, cols = self._slot_parity(c, layer), self.batch, self.message_shape(c)[1]
        scatter = self.scatters(c)
        for phase in range(coll.phases):
            count = coll.counts[phase]
            for i in range(count):
                copy, _ = self._copy(ctx, c, phase, i, layer)  # type: ignore[arg-type]
                if self.bugs.skip_wait != coll.name:
                    copy.wait_recv()
                ctx.record(WAIT, c, phase, i, layer)
            at = ctx.routes[self.own_word(c, phase)]
            # this rank's own contribution: its chunk of its partial (reduce-scatter), else its payload
            terms = ranked(ctx.recv[c][phase], par, count, self._own(ctx, c, phase, at), at, cols)
            if scatter and phase == 0:  # reduce this rank's chunk, then gather everyone's
                for i in range(count):
                    self._copy(ctx, c, phase, i, layer)[0].wait_send()  # type: ignore[arg-type]
                self.issue(ctx, c, layer, sum_blocks(terms), 1)
                continue
            if scatter:  # each rank's chunk, its rows end to end
                out = jnp.concatenate([unfold(joined(blocks), self.folds(c)) for blocks in terms], axis=1)
                out = unflatten(out[:, : b * width], b, width)
            elif coll.algorithm != "one_shot_two_level" and not coll.reduces:  # a gather or exchange
                out = jnp.concatenate([unfold(joined(blocks), self.folds(c)) for blocks in terms], axis=1)
                break
            else:  # a reduction (direct_all_gather: every member's whole partial, summed here)
                out = unfold(sum_blocks(terms), self.folds(c))
                if phase + 1 < coll.phases:  # the host sum goes to the cross-host peers
                    for i in range(count):
                        self._copy(ctx, c, phase, i, layer)[0].wait_send()  # type: ignore[arg-type]
                    self.issue(ctx, c, layer, out, phase + 1)
        for i in range(coll.counts[-1]):
            self._copy(ctx, c, coll.phases - 1, i, layer)[0].wait_send()  # type: ignore[arg-type]
        return out
