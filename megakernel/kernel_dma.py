"""The kernel's DMA layer: named refs, ring copies, slab-streamed matmuls and trace hooks.

Everything the op code needs to move weights lives on :class:`Ctx`:

- ``start(ring, layer, k)`` / ``wait(ring, layer, k)``: copy slab ``k`` of ``ring``'s tensor of
  ``layer`` from HBM into its ring buffer ``(m*K + k) % buffers`` (``m`` = the layer's index in
  the ring's stack, read from the SMEM layer table) and wait for it; a ring-pool member goes
  to bank ``(base + offset + k) % banks`` (:meth:`Ctx.buffer`, :mod:`megakernel.ring_pool`);
- ``start_expert(layer, j)`` / ``wait_expert(j)``: the two copies (gate/up with its scales,
  down with its scales) of the ``j``-th distinct routed expert into slot ``j % slots``, the
  expert id read from SMEM (written by ``moe.topk``);
- ``table(template, n, unit)``: a unit's planned issue code in the window's row of the issue
  table (one VMEM vector load per window; :meth:`megakernel.kernel.Megakernel._issue_at`
  turns it into ``pl.when``s, static where the plan does not depend on ``n``);
- ``matmul(ring, layer, x)``: ``x @ W`` streamed slab by slab: wait slab k, multiply it,
  refill its buffer with slab ``k + buffers`` (the in-op part of the pipeline);
- ``event(...)``: with tracing on (interpret mode only), an ordered ``io_callback`` appending
  ``("dma_start"|"dma_wait", family, tensor, layer, chunk)`` or ``("compute", op, layer)`` to a
  Python list.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.dims import ModelDims
from megakernel.dma_plan import Geometry, Ring, Unit
from megakernel.expert_products import DECODE, ExpertProducts
from megakernel.quant import words_to_bf16
from megakernel.ring_pool import bank_word, part_of
from tpusim.schedule.kernel_layout import (
    EXPERT_PANEL_UNROLL,
    LANES,
    MATMUL_CHUNK_ROWS,
    PANEL_UNROLL,
    TILE_ROWS,
    matmul_loops,
    matmul_stage_chunks,
)
from tpusim.workload.registry.names import ExpertTensor, Family, expert_op

# Layer table columns (SMEM, flattened [num_layers, LAYER_COLS]).
COL_IS_MLA, COL_KIND_INDEX, COL_TEMPLATE = 0, 1, 2
LAYER_COLS = 4
TEMPLATES = ("kda", "mla", "head")


def idiv(a: Any, b: int) -> Any:
    """``a // b`` for non-negative ``a`` (int or traced i32): truncating ``lax.div``, because
    jnp's floor division lowers through ``sign``, which Mosaic lowering cannot do off-TPU."""
    return a // b if isinstance(a, int) else jax.lax.div(a, jnp.int32(b))


def imod(a: Any, b: int) -> Any:
    """``a % b`` for non-negative ``a`` (see :func:`idiv`)."""
    return a % b if isinstance(a, int) else jax.lax.rem(a, jnp.int32(b))


@dataclass
class Recorder:
    """Collects trace events from ordered io_callbacks (host side)."""

    events: list[tuple[Any, ...]] = field(default_factory=list)

    def callback(self, static: tuple[Any, ...], *values: Any) -> np.ndarray:
        ints = [int(v) for v in values]
        if static[0] == "compute_expert":  # ("compute", "expert[j]", layer)
            self.events.append(("compute", expert_op(ints[1]), ints[0]))
        elif static[0] == "compute":
            self.events.append(("compute", static[1], ints[0]))
        else:  # ("dma_start" | "dma_wait", family, tensor, layer, chunk)
            self.events.append((*static, *ints))
        return np.zeros((), np.int32)


@dataclass
class Ctx:
    """Refs and static facts the kernel body works with (one per trace)."""

    dims: ModelDims
    geo: Geometry
    batch: int
    ins: dict[str, Any]  # SMEM tables, x0, HBM weight refs
    outs: dict[str, Any]  # logits (VMEM) and aliased state (HBM)
    scratch: dict[str, Any]
    units: list[Unit]  # table columns
    n_max: int
    recorder: Recorder | None = None
    # The plan's in-kernel collectives (megakernel.kernel_collectives.KernelLink.bind), or None
    # on one device: the ops then use the single-device stand-ins of megakernel.dims.
    link: Any = None
    branch: str | None = None  # the lax.cond branch being traced ("true" | "false"), for trace-time logs
    # A probe of the kernel's fixed costs: run at most this many of each layer's chosen experts
    # (the first in list order; None: all). Not a decode: its logits are not the model's.
    expert_cap: int | None = None
    # panels a panel loop's iteration issues (tpusim.schedule.kernel_layout.PANEL_UNROLL):
    # streamed dense tensors, routed experts' parts
    panel_unroll: int = PANEL_UNROLL
    expert_panel_unroll: int = EXPERT_PANEL_UNROLL
    expert_products: ExpertProducts = DECODE  # how a routed expert's panels are multiplied on this chip
    _memo: dict[tuple[str, Any], tuple[Any, Any]] = field(default_factory=dict)

    def memo(self, key: str, owner: Any, make: Callable[[], Any]) -> Any:
        """Cache a value derived from ``owner`` (a traced layer index or an int). Every SMEM
        read or VMEM load is an interpreter callback, so per-window scalars and a layer's
        small-parameter row are read once per trace region (see :meth:`region`)."""
        slot = (key, ("int", owner)) if isinstance(owner, int) else (key, id(owner))
        hit = self._memo.get(slot)
        if hit is not None and (isinstance(owner, int) or hit[0] is owner):
            return hit[1]
        value = make()
        self._memo[slot] = (owner, value)
        return value

    @contextlib.contextmanager
    def region(self) -> Any:
        """Values traced inside a ``lax.cond`` branch or loop body must not leak out: cache
        entries made inside the region are dropped when it ends."""
        saved = dict(self._memo)
        try:
            yield
        finally:
            self._memo = saved

    # ------------------------------------------------------------------ scalars & tables

    def layer_col(self, layer: Any, col: int) -> jax.Array:
        return self.ins["smem.layers"][layer * LAYER_COLS + col]

    def instance(self, ring: Ring, layer: Any) -> Any:
        """Index of ``layer``'s tensor in ``ring``'s HBM stack."""
        if ring.instances == 1:
            return 0
        if ring.name == "small":
            return layer
        if ring.name.startswith(("kda.", "mla.")):
            if isinstance(layer, int):
                return self.dims.kind_index(layer)
            return self.memo("kind_index", layer, lambda: self.layer_col(layer, COL_KIND_INDEX))
        return layer - 1  # MoE layers are 1..L-1

    def table(self, template: Any, n: Any, unit_index: int) -> jax.Array:
        """The planned issue code of unit ``unit_index`` in window row (template, n).

        The whole row is one VMEM load (a vector), cached per window; a unit's code is then
        extracted with a masked reduction (no further memory access)."""
        def load() -> jax.Array:
            row = template * (self.n_max + 1) + n
            return self.ins["vmem.issue"][pl.ds(row, 1), :]

        row = self.memo(f"issue_row/{id(template)}", n, load)
        lane = jax.lax.broadcasted_iota(jnp.int32, row.shape, 1)
        return jnp.sum(jnp.where(lane == unit_index, row, 0))

    # ------------------------------------------------------------------------- trace

    def event(self, *static: Any, dynamic: tuple[Any, ...] = ()) -> None:
        if self.recorder is None:
            return
        values = [jnp.asarray(v, jnp.int32) for v in dynamic]
        io_callback(functools.partial(self.recorder.callback, static), jax.ShapeDtypeStruct((), jnp.int32),
                    *values, ordered=True)

    def compute(self, op: str, layer: Any) -> None:
        self.event("compute", op, dynamic=(layer,))

    # ------------------------------------------------------------------------ rings

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

    def expert_view(self, j: Any) -> tuple[jax.Array, jax.Array]:
        """(gate_up words u16[gu_total, 128], down words u16[dn_total, 128]) of entry j."""
        ring = self.geo.rings["expert"]
        row = ring.offset + (ring.buffers - 1 - imod(j, ring.buffers)) * ring.slab_arena_rows
        es = self.geo.expert_slot
        words = self.scratch["arena"][ring.pool][pl.ds(row, es.total), :]
        return words[: es.gate_up_total], words[es.gate_up_total:]

    # --------------------------------------------------------------------- the plan

    def when(self, cond: Any, fn: Callable[[], None]) -> None:
        """``pl.when`` whose body is its own cache region (Python booleans run statically)."""
        if isinstance(cond, bool):
            if cond:
                fn()
            return

        def body() -> None:
            with self.region():
                fn()

        pl.when(cond)(body)

    def fori(self, lower: Any, upper: Any, body: Callable[[Any, Any], Any], init: Any) -> Any:
        """``lax.fori_loop`` whose body is its own cache region."""
        def wrapped(i: Any, carry: Any) -> Any:
            with self.region():
                return body(i, carry)

        return jax.lax.fori_loop(lower, upper, wrapped, init)

    def cond(self, pred: Any, true_fn: Callable[[], None], false_fn: Callable[[], None]) -> None:
        """``lax.cond`` over two side-effecting branches, each its own cache region."""
        def wrap(fn: Callable[[], None], name: str) -> Callable[[], None]:
            def branch() -> None:
                outer, self.branch = self.branch, name
                with self.region():
                    fn()
                self.branch = outer
            return branch

        jax.lax.cond(pred, wrap(true_fn, "true"), wrap(false_fn, "false"))


def layer_table(dims: ModelDims) -> np.ndarray:
    """int32[L * LAYER_COLS]: is_mla, index in its kind's stack, template of its window."""
    rows = np.zeros((dims.num_layers, LAYER_COLS), np.int32)
    for layer, kind in enumerate(dims.kinds):
        rows[layer, COL_IS_MLA] = kind == "mla"
        rows[layer, COL_KIND_INDEX] = dims.kind_index(layer)
        nxt = dims.kinds[layer + 1] if layer + 1 < dims.num_layers else "head"
        rows[layer, COL_TEMPLATE] = TEMPLATES.index(nxt)
    return rows.reshape(-1)


# SMEM scratch layout (int32): [n_current, n_next]; the expert list has its own SMEM scratch
# (``experts``: whole 128-word rows, the unit of its copy from VMEM)
N_CURRENT, N_NEXT = 0, 1
SMEM_WORDS = 2


