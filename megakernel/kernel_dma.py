"""The kernel's DMA layer: the copies of weights into their ring buffers, and :class:`Ctx`.

:class:`Ctx` is what the op code works with, one per trace; it joins the kernel's roles:
refs, tables, the trace-time cache and trace events (:class:`megakernel.kernel_refs.KernelRefs`),
control flow (:class:`megakernel.kernel_control.ControlFlow`), the copies here
(:class:`Copies`) and the products streamed through them
(:class:`megakernel.kernel_products.StreamedProducts`). The copies:

- ``start(ring, layer, k)`` / ``wait(ring, layer, k)``: copy slab ``k`` of ``ring``'s tensor of
  ``layer`` from HBM into its ring buffer ``(m*K + k) % buffers`` (``m`` = the layer's index in
  the ring's stack, read from the SMEM layer table) and wait for it; a ring-pool member goes
  to bank ``(base + offset + k) % banks`` (:meth:`Ctx.buffer`, :mod:`megakernel.ring_pool`);
- ``start_expert(layer, j)`` / ``wait_expert(j)``: the two copies (gate/up with its scales,
  down with its scales) of the ``j``-th distinct routed expert into slot ``j % slots``, the
  expert id read from SMEM (written by ``moe.topk``);
- ``view(ring, layer, k)`` / ``small(layer, kind)`` / ``expert_row(j)``: what landed (a slab's
  words, one small-parameter kind of the layer's row, the first arena row of an expert slot).

The issue table's reads (``table(template, n, unit)``, one VMEM vector load per window) are
:class:`~megakernel.kernel_refs.KernelRefs`'; :meth:`megakernel.kernel.Megakernel._issue_at`
turns them into ``pl.when``s of these starts, static where the plan does not depend on ``n``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.dma_plan import Ring
from megakernel.kernel_control import ControlFlow
from megakernel.kernel_products import StreamedProducts
from megakernel.kernel_refs import (
    COL_IS_MLA,
    COL_KIND_INDEX,
    COL_TEMPLATE,
    LAYER_COLS,
    N_CURRENT,
    N_NEXT,
    SMEM_WORDS,
    TEMPLATES,
    KernelRefs,
    Recorder,
    idiv,
    imod,
    layer_table,
)
from megakernel.ring_pool import bank_word, part_of
from tpusim.schedule.kernel_layout import LANES, TILE_ROWS
from tpusim.workload.registry.names import ExpertTensor, Family

__all__ = [
    "COL_IS_MLA", "COL_KIND_INDEX", "COL_TEMPLATE", "LAYER_COLS", "N_CURRENT", "N_NEXT", "SMEM_WORDS", "TEMPLATES",
    "Copies", "Ctx", "KernelRefs", "Recorder", "idiv", "imod", "layer_table",
]


class Copies(ControlFlow):
    """Copies of ring slabs and routed experts into the arena, and views of what landed."""

    def buffer(self, ring: Ring, layer: Any, k: int) -> Any:
        """The buffer slab ``k`` of ``layer``'s tensor lands in (an int where static).

        A ring's own: ``(m*K + k) % buffers``. A ring-pool member's bank: from the plan for a
        static layer or a kind only one layer has, else the layer's part base (SMEM, read once
        per region) plus the kind's static offset."""
        if ring.bank_rows:
            banks = self.geo.pools[ring.pool]
            part = part_of(ring.name)
            if part is None:  # layer 0's MLP, the head: one layer (traced only in an untaken branch)
                layer = banks.only_layer(ring.name)
            if isinstance(layer, int):
                return imod(banks.first_bank(ring.name, layer) + k, ring.buffers)
            assert part is not None
            word = bank_word(layer, len(self.geo.pools), banks.index, part)
            base = self.memo(f"bank/{ring.pool}/{part}", layer, lambda: self.ins["smem.banks"][word])
            return imod(base + (banks.offset[ring.name] + k), ring.buffers)
        if ring.buffers == 1:
            return 0
        return imod(self.instance(ring, layer) * ring.num_slabs + k, ring.buffers)

    def _copy(self, ring: Ring, layer: Any, k: int, *, for_wait: bool = False) -> Any:
        """The descriptor of slab k's copy. A wait only needs the shapes and the semaphore,
        so ``for_wait`` skips the HBM index (no SMEM read) when it can."""
        m = 0 if for_wait and (ring.buffers == 1 or ring.bank_rows) else self.instance(ring, layer)
        buffer = self.buffer(ring, layer, k)
        arena = self.scratch["arena"][ring.pool]
        entry = self.dims.stack_entry(m)  # the HBM entry (m itself unless weights are banked)
        src = self.ins[f"hbm.{ring.name}"].at[entry] if ring.name == "small" else self.ins[f"hbm.{ring.name}"].at[entry, k]
        dst = arena.at[pl.ds(ring.buffer_row(buffer), ring.slab_arena_rows), :]
        return pltpu.make_async_copy(src, dst, self.scratch["sem"][ring.sem_key].at[buffer])

    def start(self, ring_name: str, layer: Any, k: int) -> None:
        ring = self.geo.rings[ring_name]
        self._copy(ring, layer, k).start()
        self.event("dma_start", ring.family, ring_name, dynamic=(layer, k))

    def wait(self, ring_name: str, layer: Any, k: int) -> None:
        ring = self.geo.rings[ring_name]
        self._copy(ring, layer, k, for_wait=True).wait()
        self.event("dma_wait", ring.family, ring_name, dynamic=(layer, k))

    def view(self, ring_name: str, layer: Any, k: int) -> jax.Array:
        """The words of slab ``k`` (already waited): u16[slab_arena_rows, 128]."""
        ring = self.geo.rings[ring_name]
        row = ring.buffer_row(self.buffer(ring, layer, k))
        return self.scratch["arena"][ring.pool][pl.ds(row, ring.slab_arena_rows), :]
    def small_row(self, layer: Any) -> jax.Array:
        """This layer's small parameters (waited): f32[S/128, 128]."""
        words = self.view("small", layer, 0)
        half = self.dims.small_cols // LANES  # the region is padded to whole tiles past 2 * half
        hi = words[:half].astype(jnp.uint32)
        lo = words[half: 2 * half].astype(jnp.uint32)
        return jax.lax.bitcast_convert_type((hi << 16) | lo, jnp.float32)

    def small(self, layer: Any, kind: str) -> jax.Array:
        """One small-parameter kind of ``layer``: f32[1, n] (the row is loaded once per trace
        region, after the op that waited for it)."""
        offset, length = self.dims.small_offsets[kind]
        first, count = offset // LANES, -(-length // LANES)
        rows = self.memo("small_row", layer, lambda: self.small_row(layer))
        return rows[first: first + count].reshape(1, count * LANES)[:, :length]

    # ----------------------------------------------------------------------- experts

    def _expert_copies(self, layer: Any, j: Any, *, for_wait: bool = False) -> tuple[Any, Any]:
        ring = self.geo.rings["expert"]
        slot = imod(j, ring.buffers)
        row = ring.offset + (ring.buffers - 1 - slot) * ring.slab_arena_rows
        eid = self.scratch["experts"][j] if not for_wait else 0
        arena, sem = self.scratch["arena"][ring.pool], self.scratch["sem"]["expert"].at[slot]
        es = self.geo.expert_slot
        entry = self.dims.stack_entry(layer - 1)
        gu = pltpu.make_async_copy(self.ins["hbm.expert.gate_up"].at[entry, eid],
                                   arena.at[pl.ds(row, es.gate_up_total), :], sem)
        dn = pltpu.make_async_copy(self.ins["hbm.expert.down"].at[entry, eid],
                                   arena.at[pl.ds(row + es.gate_up_total, es.down_total), :], sem)
        return gu, dn

    def start_expert(self, layer: Any, j: Any) -> None:
        gu, dn = self._expert_copies(layer, j)
        gu.start()
        dn.start()
        self.event("dma_start", Family.ROUTED_EXPERT, ExpertTensor.GATE_UP, dynamic=(layer, j))
        self.event("dma_start", Family.ROUTED_EXPERT, ExpertTensor.DOWN, dynamic=(layer, j))

    def wait_expert(self, layer: Any, j: Any) -> None:
        gu, dn = self._expert_copies(layer, j, for_wait=True)
        gu.wait()
        self.event("dma_wait", Family.ROUTED_EXPERT, ExpertTensor.GATE_UP, dynamic=(layer, j))
        dn.wait()
        self.event("dma_wait", Family.ROUTED_EXPERT, ExpertTensor.DOWN, dynamic=(layer, j))

    def expert_row(self, j: Any) -> Any:
        """First arena row of entry ``j``'s slot (a tile multiple)."""
        ring = self.geo.rings["expert"]
        return pl.multiple_of(ring.offset + (ring.buffers - 1 - imod(j, ring.buffers)) * ring.slab_arena_rows,
                              TILE_ROWS)

    def expert_view(self, j: Any) -> tuple[jax.Array, jax.Array]:
        """(gate_up words u16[gu_total, 128], down words u16[dn_total, 128]) of entry j."""
        ring = self.geo.rings["expert"]
        row = ring.offset + (ring.buffers - 1 - imod(j, ring.buffers)) * ring.slab_arena_rows
        es = self.geo.expert_slot
        words = self.scratch["arena"][ring.pool][pl.ds(row, es.total), :]
        return words[: es.gate_up_total], words[es.gate_up_total:]


class Ctx(StreamedProducts, Copies):
    """Refs and static facts the kernel body works with (one per trace): refs, tables and the
    trace-time cache, control flow, copies and streamed products (see the module docstring)."""
