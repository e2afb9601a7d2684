"""The kernel's streamed products: a weight tensor multiplied slab by slab as its copies land.

- ``matmul(ring, layer, x)``: ``x @ W`` streamed slab by slab: wait slab k, multiply it,
  refill its buffer with slab ``k + buffers`` (the in-op part of the pipeline); as runtime
  loops over slabs, row chunks and 128-column panels where the tensor is large
  (:func:`tpusim.schedule.kernel_layout.matmul_loops`);
- ``panel_products(row, ...)``: a routed expert's quantized part at an arena row, panel by
  panel (decoded and multiplied by the chip's :class:`~megakernel.expert_products.ExpertProducts`).

The copies it waits for and refills are :class:`megakernel.kernel_dma.Copies`'; the two are
joined in :class:`megakernel.kernel_dma.Ctx`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from megakernel.dma_plan import Ring
from megakernel.kernel_control import ControlFlow
from megakernel.quant import words_to_bf16
from tpusim.schedule.kernel_layout import (
    LANES,
    MATMUL_CHUNK_ROWS,
    TILE_ROWS,
    matmul_loops,
    matmul_stage_chunks,
)


class StreamedProducts(ControlFlow):
    """Products streamed through the copies of :class:`megakernel.kernel_dma.Copies`."""

    if TYPE_CHECKING:  # provided by Copies (megakernel.kernel_dma), joined in Ctx
        def buffer(self, ring: Ring, layer: Any, k: int) -> Any: ...
        def start(self, ring_name: str, layer: Any, k: int) -> None: ...
        def wait(self, ring_name: str, layer: Any, k: int) -> None: ...
        def view(self, ring_name: str, layer: Any, k: int) -> jax.Array: ...

    def matmul(self, ring_name: str, layer: Any, x: jax.Array) -> jax.Array:
        """``x`` f32[B, R] @ the ring's bf16[R, C] tensor of ``layer`` -> f32[B, C], streamed."""
        ring = self.geo.rings[ring_name]
        rows, s = ring.rows, ring.slab_rows
        if matmul_loops(ring.num_slabs, s, ring.panels) and x.shape[0] <= self.scratch["panel_out"].shape[1]:
            return self._looped_matmul(ring, layer, x)
        acc = None
        for k in range(ring.num_slabs):
            self.wait(ring_name, layer, k)
            w = words_to_bf16(self.view(ring_name, layer, k)).reshape(ring.panels, s, LANES)
            xk = x[:, k * s: min((k + 1) * s, rows)]
            if xk.shape[1] < s:
                xk = jnp.concatenate([xk, jnp.zeros((x.shape[0], s - xk.shape[1]), x.dtype)], axis=1)
            y = jnp.einsum("bs,psn->bpn", xk.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32)
            acc = y if acc is None else acc + y
            if k + ring.buffers < ring.num_slabs:
                self.start(ring_name, layer, k + ring.buffers)
        assert acc is not None
        out = acc.reshape(x.shape[0], ring.padded_cols)
        return out if ring.padded_cols == ring.cols else out[:, : ring.cols]

    def _looped_matmul(self, ring: Ring, layer: Any, x: jax.Array) -> jax.Array:
        """:meth:`matmul` as runtime loops (:func:`tpusim.schedule.vmem.matmul_loops`): over
        slabs (wait slab k, refill its buffer with slab k + buffers) and, inside a slab, over
        ``MATMUL_CHUNK_ROWS``-row chunks (then a static tail chunk), and over the 128-column
        panels, each product added into the ``panel_out`` scratch. ``x`` is staged in VMEM as
        [chunk, rows, MATMUL_CHUNK_ROWS] so a chunk is a load at a traced leading index."""
        s, big_r = ring.slab_rows, MATMUL_CHUNK_ROWS
        full, tail = divmod(s, big_r)
        per_slab = matmul_stage_chunks(1, s)
        stage = self.scratch["xstage"]
        rows8 = stage.shape[1]
        xp = x.astype(jnp.float32)  # padded with zero rows and columns (no scatter in Mosaic)
        if xp.shape[0] < rows8:
            xp = jnp.concatenate([xp, jnp.zeros((rows8 - xp.shape[0], xp.shape[1]), jnp.float32)], axis=0)
        if xp.shape[1] < ring.num_slabs * s:
            xp = jnp.concatenate([xp, jnp.zeros((rows8, ring.num_slabs * s - xp.shape[1]), jnp.float32)], axis=1)
        for k in range(ring.num_slabs):
            for c in range(per_slab):
                lo = k * s + c * big_r
                width = min(big_r, s - c * big_r)
                chunk = xp[:, lo: lo + width]
                if width < big_r:
                    chunk = jnp.concatenate([chunk, jnp.zeros((rows8, big_r - width), jnp.float32)], axis=1)
                stage[k * per_slab + c] = chunk
        arena, out = self.scratch["arena"][ring.pool], self.scratch["panel_out"]
        out[: ring.panels] = jnp.zeros((ring.panels, *out.shape[1:]), jnp.float32)

        def products(base: Any, start: Any, xk: jax.Array, rows: int) -> None:
            """out[p] += xk @ rows [start, start + rows) of panel p, for every panel."""
            xk = xk.astype(jnp.bfloat16)

            def panel(p: Any, carry: Any) -> Any:
                w = words_to_bf16(arena[pl.ds(pl.multiple_of(base + p * s + start, TILE_ROWS), rows), :])
                out[p] = out[p] + jnp.dot(xk, w, preferred_element_type=jnp.float32)
                return carry

            jax.lax.fori_loop(0, ring.panels, panel, 0, unroll=min(self.panel_unroll, ring.panels))

        def slab(k: Any, carry: Any) -> Any:
            self.wait(ring.name, layer, k)
            base = ring.buffer_row(self.buffer(ring, layer, k))

            def chunk(c: Any, carry: Any) -> Any:
                products(base, pl.multiple_of(c * big_r, big_r), stage[k * per_slab + c], big_r)
                return carry

            if full:
                jax.lax.fori_loop(0, full, chunk, 0)
            if tail:
                products(base, full * big_r, stage[k * per_slab + full][:, :tail], tail)
            self.when(k + ring.buffers < ring.num_slabs, lambda: self.start(ring.name, layer, k + ring.buffers))
            return carry

        self.fori(0, ring.num_slabs, slab, 0)
        acc = jnp.swapaxes(out[: ring.panels, : x.shape[0], :], 0, 1)
        out_cols = acc.reshape(x.shape[0], ring.padded_cols)
        return out_cols if ring.padded_cols == ring.cols else out_cols[:, : ring.cols]
    def panel_products(self, row: Any, value_rows: int, panels: int, panel_rows: int, scale_rows: int,
                       x: jax.Array, product: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]) -> jax.Array:
        """``x`` [B, R] @ a quantized expert part at arena ``row`` -> f32[B, panels * 128].

        The part is ``panels`` 128-column panels of ``panel_rows`` value-word rows each, then
        its scale words (``scale_rows`` in all). Its scales are copied once into the
        ``panel_scales`` scratch, one tile per panel (a panel's scale rows do not start at a
        tile multiple in the slot); then a runtime loop dequantizes one panel (``dequant(value
        words [1, r, 128], scale words [1, s, 128])`` -> bf16[1, R, 128]), multiplies it and
        stores the product in ``panel_out``."""
        arena = self.scratch["arena"][self.geo.rings["expert"].pool]
        per_panel = scale_rows // panels
        scales = arena[pl.ds(pl.multiple_of(row + value_rows, TILE_ROWS), scale_rows), :]
        stage, out = self.scratch["panel_scales"], self.scratch["panel_out"]
        for p in range(panels):
            stage[p, :per_panel, :] = scales[p * per_panel: (p + 1) * per_panel]
        b = x.shape[0]

        def panel(p: Any, carry: Any) -> Any:
            words = arena[pl.ds(pl.multiple_of(row + p * panel_rows, TILE_ROWS), panel_rows), :]
            out[p, :b, :] = product(x, words, stage[p, :per_panel, :])
            return carry

        jax.lax.fori_loop(0, panels, panel, 0, unroll=min(self.expert_panel_unroll, panels))
        return jnp.swapaxes(out[:panels, :b, :], 0, 1).reshape(b, panels * LANES)

