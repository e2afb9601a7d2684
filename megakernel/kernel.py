"""The K3 decode-step megakernel: one grid-less ``pallas_call`` over all 93 layers.

Weights stay in HBM (``memory_space=ANY``) and stream into per-pool VMEM arenas exactly as
the schedule says (:mod:`megakernel.dma_plan` turns the schedule into issue tables, kept in
SMEM). Pseudocode of the body (``begin(op)`` = issue the copies the plan starts at ``op``,
then record the op):

    blocks[0] = x0 (embedding rows, gathered by XLA before the call); partial = 0
    # prologue: layer 0 and layer 1 up to its shared expert (static issue points)
    kda_layer(0)                      # attn.mix_norm kda.qkvgb kda.decay kda.core kda.o
    dense_mlp(0)                      # mlp.mix_norm mlp.gate_up mlp.down
    attention(1); moe_pre_experts(1)  # ... moe.topk: expert list -> SMEM, slot copies start
    for i in 1 .. L-2:                # lax.fori_loop: one window per iteration
        n = number of distinct experts of layer i (SMEM)
        for j < n: expert[j]          # refill slot of j-1 with entry j+slots-1, wait j, dequant, FMA
        moe.combine; moe.latent_up    # back to hidden, residual, block snapshot
        lax.cond(layer i+1 is MLA, mla_layer, kda_layer)(i+1)
        moe_pre_experts(i+1)          # router, topk (expert DMAs), latent_down, shared expert
    experts(L-1); moe.combine; moe.latent_up; head.norm; head.lm_head
    wait for the last KDA state write-backs

Every op start checks the SMEM issue table ``[template, n, unit]`` of its window (and, in
the four ops after ``moe.topk``, of the next window), so the copy of any tensor starts
exactly where the plan put it, across layer boundaries. Scratch is a dict of named groups
(:meth:`Megakernel.scratch_shapes`), never a positional tuple.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel import dma_plan
from megakernel.dims import ModelDims
from megakernel.dma_plan import LEAD_IN, NEVER, Geometry, Unit, WindowPlan
from megakernel.expert_products import DECODE, ExpertProducts
from megakernel.hbm import hbm_shapes
from megakernel.kernel_attention import finish_kda_state, kda_layer, mla_layer
from megakernel.kernel_dma import (
    COL_IS_MLA,
    COL_TEMPLATE,
    N_CURRENT,
    N_NEXT,
    SMEM_WORDS,
    TEMPLATES,
    Ctx,
    Recorder,
    layer_table,
)
from megakernel.kernel_moe import (
    dense_mlp,
    expert_list_scratch,
    expert_loop,
    head,
    moe_post_experts,
    moe_pre_experts,
)
from megakernel.reference import DecodeState
from megakernel.residual import num_block_slots
from megakernel.ring_pool import bank_table
from megakernel.vmem_limit import PUBLISHED_KERNEL_CHIP, vmem_limit_for
from tpusim.schedule.kernel_layout import (
    EXPERT_PANEL_UNROLL,
    KV_WRITE_TOKENS,
    LANES,
    MATMUL_CHUNK_ROWS,
    PANEL_UNROLL,
    expert_scale_tile_rows,
    loop_rows,
    matmul_loops,
    matmul_stage_chunks,
)
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import matmul_stage_bytes
from tpusim.workload.registry.names import KdaTensor, MoeOp, StateFamily, expert_index

EXPERT_CODES = 1000  # codes below are expert[j]; op identities start here


def op_codes() -> dict[tuple[str, int], int]:
    """(op name, layer offset) -> table code, for every non-expert op of any window."""
    names = [(name, 0) for name in LEAD_IN] + [(op.name, 0) for op in dma_plan.moe_tail_ops(0)]
    for template in TEMPLATES[:-1]:
        names += [(op.name, 1) for op in dma_plan.attention_ops(template, 1) + dma_plan.moe_head_ops(1)]
    names += [(op.name, 1) for op in dma_plan.head_ops(1)]
    codes: dict[tuple[str, int], int] = {}
    for key in names:
        codes.setdefault(key, EXPERT_CODES + len(codes))
    return codes


@dataclass
class Tables:
    """The plan in table form: units (table columns), codes, [template, n, unit] -> code."""

    units: list[Unit]
    issue: np.ndarray  # int32[3, n_max + 1, U]
    prologue: WindowPlan
    codes: dict[tuple[str, int], int]
    plans: dict[tuple[int, int], WindowPlan]  # (template, n) -> window plan


def build_tables(dims: ModelDims, geo: Geometry, n_max: int, *, respect_buffers: bool = True) -> Tables:
    codes = op_codes()
    plans: dict[tuple[int, int], WindowPlan] = {}
    for t, template in enumerate(TEMPLATES):
        if geo.pools and template not in geo.window_layer:
            continue  # no window of this template: its (ring-pool) banks are unknown and never needed
        for n in range(1, n_max + 1):
            plans[t, n] = dma_plan.plan_iteration(geo, template, n, respect_buffers=respect_buffers)
    slots = geo.rings["expert"].buffers
    order: dict[Unit, tuple[int, int, int]] = {}
    for (t, _n), plan in sorted(plans.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        for unit, consumer in plan.consumer.items():
            if unit.ring == "expert" and unit.slab >= slots:
                continue  # entries past the slot count refill a slot in the expert loop (fixed rule)
            order.setdefault(unit, (consumer, dma_plan.RING_ORDER.index(unit.ring), unit.slab + 100 * t))
    units = sorted(order, key=lambda u: order[u])
    index = {u: i for i, u in enumerate(units)}
    table = np.full((len(TEMPLATES), n_max + 1, len(units)), NEVER, np.int32)
    for (t, n), plan in plans.items():
        for unit, pos in plan.issue.items():
            if unit not in index:
                continue
            op = plan.ops[pos - plan.first]
            entry = expert_index(op.name)
            table[t, n, index[unit]] = entry if entry is not None else codes[op.name, op.delta]
    for j in range(min(slots, n_max)):
        col = table[:, j + 1:, index[Unit("expert", 0, j)]]
        if (col != col[:, -1:]).any():
            raise dma_plan.UnsupportedSchedule(f"expert entry {j}'s issue point depends on the expert count")
    prologue = dma_plan.plan_prologue(geo, dims.kinds[0], dims.kinds[1], respect_buffers=respect_buffers)
    return Tables(units, table, prologue, codes, plans)


def prologue_order(plan: WindowPlan, index: dict[Unit, int], unit: Unit) -> tuple[int, int, int]:
    """Order of the prologue's starts at one op: by consumer, then table order."""
    return plan.consumer[unit], index.get(unit, -1), unit.slab


class Megakernel:
    """The decode-step kernel for one (model dims, schedule, batch, KV capacity)."""

    def __init__(self, dims: ModelDims, schedule: Schedule, batch: int, max_context: int, *,
                 trace: bool = False, interpret: Any = None, unsafe_ignore_buffer_reuse: bool = False,
                 vmem_limit_bytes: int | None = None, expert_cap: int | None = None, panel_unroll: int = PANEL_UNROLL,
                 expert_panel_unroll: int = EXPERT_PANEL_UNROLL, expert_products: ExpertProducts = DECODE) -> None:
        """``trace`` records ordered events (interpret mode only: ``io_callback`` does not lower
        for TPU); ``interpret`` is ``pltpu.InterpretParams`` or None (compile for TPU);
        ``unsafe_ignore_buffer_reuse`` breaks the plan on purpose (race-detector test);
        ``vmem_limit_bytes``: the VMEM Mosaic may use, scratch and its own temporaries (the
        target chip's catalog capacity, :func:`megakernel.vmem_limit.vmem_limit_for`; None: the published kernel's chip's);
        ``expert_cap``: at most this many experts a layer (a fixed-cost probe, not a decode);
        ``panel_unroll``/``expert_panel_unroll``: panels per panel-loop iteration (streamed
        tensors, routed experts' parts; :data:`tpusim.schedule.kernel_layout.PANEL_UNROLL`); ``expert_products``:
        the target chip's (:func:`megakernel.expert_products.expert_products_for`)."""
        if trace and interpret is None:
            raise ValueError("trace=True needs interpret mode: io_callback does not lower for TPU")
        if dims.kinds[0] != "kda" or dims.num_layers < 3:
            raise dma_plan.UnsupportedSchedule("the kernel expects layer 0 to be KDA and at least 3 layers")
        self.dims, self.schedule, self.batch = dims, schedule, batch
        self.vmem_limit_bytes = vmem_limit_for(PUBLISHED_KERNEL_CHIP) if vmem_limit_bytes is None else vmem_limit_bytes
        self.geo = dma_plan.geometry(dims, schedule)
        dma_plan.check_expert_cap(schedule, expert_cap)
        self.expert_cap = expert_cap
        if panel_unroll < 1 or expert_panel_unroll < 1:
            raise ValueError(f"panel unroll {panel_unroll}/{expert_panel_unroll}: must be >= 1")
        self.panel_unroll, self.expert_panel_unroll, self.expert_products = panel_unroll, expert_panel_unroll, expert_products
        tile = schedule.kv_tile_tokens
        self.max_context = -(-max_context // tile) * tile
        # distinct experts a window can load: this device's experts the batch can pick
        self.n_max = min(dims.moe.scored_experts, dims.moe.local_experts, batch * dims.moe.top_k)
        self.tables = build_tables(dims, self.geo, self.n_max, respect_buffers=not unsafe_ignore_buffer_reuse)
        self.trace, self.interpret = trace, interpret
        self.recorder = Recorder() if trace else None

    # ------------------------------------------------------------------------ shapes

    @cached_property
    def rows(self) -> int:
        """Activation rows: the batch padded to the 8-row sublane tile (as VMEM stores it)."""
        return max(self.batch, 8)

    def scratch_shapes(self) -> dict[str, Any]:
        d, g, b = self.dims, self.geo, self.batch
        wmax = max(d.hidden, d.moe.latent)
        return {
            "arena": {pool: pltpu.VMEM((rows, LANES), jnp.uint16) for pool, rows in g.arenas.items()},
            "sem": {ring.sem_key: pltpu.SemaphoreType.DMA((ring.buffers,)) for ring in g.rings.values()},
            "blocks": pltpu.VMEM((num_block_slots(d.num_layers, d.block_layers), self.rows, d.hidden), jnp.float32),
            "partial": pltpu.VMEM((self.rows, d.hidden), jnp.float32),
            "work": pltpu.VMEM((4, self.rows, wmax), jnp.float32),
            "route": pltpu.VMEM((2 * d.moe.top_k, self.rows, LANES), jnp.float32),
            "kv_tiles": pltpu.VMEM((g.kv_buffers, b, g.kv_tile_tokens, d.mla.kv_cols), jnp.bfloat16),
            "kv_sem": pltpu.SemaphoreType.DMA((g.kv_buffers,)),
            "kv_entry": pltpu.VMEM((b, KV_WRITE_TOKENS, d.mla.kv_cols), jnp.bfloat16),
            "kv_write_sem": pltpu.SemaphoreType.DMA((2,)),
            StateFamily.KDA_STATE: pltpu.VMEM((b, d.kda.heads, d.kda.head_dim, d.kda.head_dim), jnp.float32),
            "conv": pltpu.VMEM((b, d.kda.conv_kernel - 1, 3 * d.kda.width), jnp.float32),
            "state_sem": pltpu.SemaphoreType.DMA((4,)),
            "smem": pltpu.SMEM((SMEM_WORDS,), jnp.int32),
            **expert_list_scratch(self.n_max),
            **({"xstage": pltpu.VMEM((self.stage_chunks, loop_rows(b), MATMUL_CHUNK_ROWS), jnp.float32)}
               if self.stage_chunks else {}),
            "panel_out": pltpu.VMEM((self.max_panels, loop_rows(b), LANES), jnp.float32),
            "panel_scales": pltpu.VMEM((self.expert_panels, expert_scale_tile_rows(d.model, d.plan), LANES),
                                       jnp.uint16),
        }

    @cached_property
    def max_panels(self) -> int:
        """128-column panels of the widest tensor (streamed or a routed expert's part)."""
        rings = [r.panels for n, r in self.geo.rings.items() if n not in ("small", "expert")]
        return max([*rings, self.expert_panels])

    @cached_property
    def expert_panels(self) -> int:
        e = self.dims.moe
        return max(2 * e.slice_width // LANES, e.latent // LANES)

    @cached_property
    def stage_chunks(self) -> int:
        """Input chunks the largest looped matmul stages (0: none loops)."""
        rings = [r for n, r in self.geo.rings.items() if n not in ("small", "expert")]
        need = max((matmul_stage_chunks(r.num_slabs, r.slab_rows) for r in rings
                    if matmul_loops(r.num_slabs, r.slab_rows, r.panels)), default=0)
        d = self.dims
        if d.model is None or d.plan is None:
            return need
        # allocate what the accounting counts (one owner); it sizes slabs by the model's own
        # formats, which can give more chunks than the kernel's bf16 slabs need, never fewer
        counted = matmul_stage_bytes(self.schedule, d.model, d.plan, self.batch) // (
            loop_rows(self.batch) * MATMUL_CHUNK_ROWS * 4)
        return max(need, counted)

    def scratch_bytes(self) -> dict[str, int]:
        """VMEM bytes of every scratch group (semaphores and SMEM excluded)."""
        return {key: int(np.prod(shape)) * itemsize for key, shape, itemsize in self.vmem_scratch()}

    def vmem_scratch(self) -> list[tuple[str, tuple[int, ...], int]]:
        """(group key, shape, element bytes) of every VMEM scratch buffer."""
        leaves = jax.tree_util.tree_leaves_with_path(self.scratch_shapes(), is_leaf=lambda x: isinstance(x, pl.MemoryRef))
        return [(".".join(str(getattr(p, "key", p)) for p in name), tuple(spec.shape), jnp.dtype(spec.dtype).itemsize)
                for name, spec in leaves if isinstance(spec, pl.MemoryRef) and str(spec.memory_space) == "vmem"]

    def hbm_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.dims
        return hbm_shapes(self.geo, d, d.moe.local_experts)

    def state_shapes(self) -> dict[str, jax.ShapeDtypeStruct]:
        d, b = self.dims, self.batch
        return {
            "state.kda": jax.ShapeDtypeStruct((len(d.kda_layers), b, d.kda.heads, d.kda.head_dim, d.kda.head_dim), jnp.float32),
            "state.conv": jax.ShapeDtypeStruct((len(d.kda_layers), b, d.kda.conv_kernel - 1, 3 * d.kda.width), jnp.float32),
            "state.kv": jax.ShapeDtypeStruct((len(d.mla_layers), b, self.max_context, d.mla.kv_cols), jnp.bfloat16),
        }

    # ------------------------------------------------------------------------- call

    def pallas_fn(self) -> Any:
        """The raw ``pallas_call``: ``f(inputs dict) -> (logits, kda, conv, kv)``."""
        keys = sorted(self.input_specs())
        aliases = {keys.index(name): 1 + i for i, name in enumerate(("state.kda", "state.conv", "state.kv"))}
        states = self.state_shapes()
        return pl.pallas_call(
            self._body,
            out_shape=(jax.ShapeDtypeStruct((self.batch, self.dims.vocab_rows), jnp.float32),
                       states["state.kda"], states["state.conv"], states["state.kv"]),
            in_specs=(self.input_specs(),),
            out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM),) + (pl.BlockSpec(memory_space=pl.ANY),) * 3,
            scratch_shapes=self.scratch_shapes(),
            input_output_aliases=aliases,
            compiler_params=self.compiler_params(),
            interpret=self.interpret if self.interpret is not None else False,
        )

    def compiler_params(self) -> Any:
        return pltpu.CompilerParams(vmem_limit_bytes=self.vmem_limit_bytes)

    def input_specs(self) -> dict[str, Any]:
        specs: dict[str, Any] = {name: pl.BlockSpec(memory_space=pl.ANY) for name in self.hbm_shapes()}
        specs = {f"hbm.{k}": v for k, v in specs.items()}
        specs.update({"smem.layers": pl.BlockSpec(memory_space=pltpu.SMEM),
                      "smem.banks": pl.BlockSpec(memory_space=pltpu.SMEM),
                      "vmem.issue": pl.BlockSpec(memory_space=pltpu.VMEM),
                      "smem.scalars": pl.BlockSpec(memory_space=pltpu.SMEM),
                      "x0": pl.BlockSpec(memory_space=pltpu.VMEM)})
        specs.update({name: pl.BlockSpec(memory_space=pl.ANY) for name in self.state_shapes()})
        return specs

    def inputs(self, hbm: dict[str, jax.Array], state: DecodeState, x0: jax.Array) -> dict[str, jax.Array]:
        """Assemble the kernel's input dict (``x0`` f32[B, H] embedding rows)."""
        out = {f"hbm.{k}": v for k, v in hbm.items()}
        out.update({"smem.layers": jnp.asarray(layer_table(self.dims)),
                    "smem.banks": jnp.asarray(bank_table(self.dims.num_layers, self.geo.pools)),
                    "vmem.issue": jnp.asarray(self.issue_rows()),
                    "smem.scalars": jnp.reshape(state.position, (1,)).astype(jnp.int32),
                    "x0": x0, "state.kda": state.kda_state, "state.conv": state.conv_state,
                    "state.kv": state.kv_cache})
        return out

    def issue_rows(self) -> np.ndarray:
        """The issue table as int32[3 * (n_max + 1), U padded to 128 lanes] (one row per
        (template, n): a window loads its row with one vector load)."""
        t, n, u = self.tables.issue.shape
        rows = np.full((t * n, -(-u // LANES) * LANES), NEVER, np.int32)
        rows[:, :u] = self.tables.issue.reshape(t * n, u)
        return rows

    @cached_property
    def jitted_step(self) -> Any:
        """``jax.jit(self.step)``, built once per kernel (an un-jitted call re-traces and
        re-compiles the whole interpreter program every time)."""
        return jax.jit(self.step)

    def step(self, hbm: dict[str, jax.Array], embedding: jax.Array, state: DecodeState,
             tokens: jax.Array) -> tuple[jax.Array, DecodeState]:
        """One decode step: ``tokens`` i32[B] -> (logits f32[B, V], next state)."""
        x0 = embedding[tokens].astype(jnp.float32)
        logits, kda, conv, kv = self.pallas_fn()(self.inputs(hbm, state, x0))
        return logits, DecodeState(kda, conv, kv, state.position + 1)

    # ------------------------------------------------------------------------- body

    def _body(self, ins: dict[str, Any], *outs: Any, **scratch: Any) -> None:
        d, b = self.dims, self.batch
        named_outs = dict(zip(("logits", "state.kda", "state.conv", "state.kv"), outs, strict=True))
        ctx = Ctx(d, self.geo, b, ins, named_outs, scratch, self.tables.units, self.n_max, self.recorder,
                  expert_cap=self.expert_cap, panel_unroll=self.panel_unroll,
                  expert_panel_unroll=self.expert_panel_unroll, expert_products=self.expert_products)
        self.enter(ctx)
        scratch["blocks"][...] = jnp.zeros(scratch["blocks"].shape, jnp.float32)
        scratch["partial"][...] = jnp.zeros(scratch["partial"].shape, jnp.float32)
        scratch["work"][...] = jnp.zeros(scratch["work"].shape, jnp.float32)
        scratch["blocks"][0, :b, :] = ins["x0"][...]
        smem = scratch["smem"]
        for i in range(smem.shape[0]):
            smem[i] = 0
        self._prologue(ctx)
        ctx.fori(1, d.num_layers - 1, lambda i, c: (self._window(ctx, i), c)[1], 0)
        self._window(ctx, d.num_layers - 1, last=True)
        finish_kda_state(ctx, d.kda_layers[-1])

    def enter(self, ctx: Ctx) -> None:
        """Kernel entry hook (the multi-device kernel binds its collectives and meets its peers)."""

    # --------------------------------------------------------------- issue emission

    @cached_property
    def _unit_codes(self) -> list[list[dict[int, int]]]:
        """[template][unit] -> {n: code} for every (template, n) where the unit exists."""
        table = self.tables.issue
        return [[{n: int(table[t, n, u]) for n in range(1, self.n_max + 1) if table[t, n, u] != NEVER}
                 for u in range(len(self.tables.units))] for t in range(len(TEMPLATES))]

    def _issue_at(self, ctx: Ctx, code: Any, templates: list[int], template: Any, n: Any,
                  layers: tuple[Any, Any], *, expert_op: bool = False, skip_experts: bool = False,
                  actual_template: Any = None) -> None:
        """Emit the starts the plan puts at the op with ``code``.

        ``templates``: the templates this code can run under (``template`` is the traced
        value, or an int when static). A unit whose code does not depend on ``n`` under a
        template is started unconditionally (or under ``template == t``); only the others
        read the window's issue-table row. For an expert op (``expert_op``), ``code`` is the
        traced entry j and a unit's static code compares with it."""
        codes = self._unit_codes
        actual_template = template if actual_template is None else actual_template
        for u, unit in enumerate(self.tables.units):
            if skip_experts and unit.ring == "expert":
                continue
            static_ts, dynamic_ts = [], []
            for t in templates:
                values = set(codes[t][u].values())
                if not values:
                    continue
                if len(values) == 1:
                    (only,) = values
                    if (not expert_op and only == code) or (expert_op and only < EXPERT_CODES):
                        static_ts.append((t, only))
                elif (not expert_op and code in values) or (expert_op and min(values) < EXPERT_CODES):
                    dynamic_ts.append(t)
            if not static_ts and not dynamic_ts:
                continue

            def start(unit: Unit = unit) -> None:
                if unit.ring == "expert":
                    ctx.start_expert(layers[0], unit.slab)
                else:
                    ctx.start(unit.ring, layers[unit.delta], unit.slab)

            conds = []
            for t, only in static_ts:
                hit = code == only if expert_op else True
                if len(templates) > 1 or not isinstance(template, int):
                    hit = (template == t) if hit is True else (hit & (template == t))
                conds.append(hit)
            for t in dynamic_ts:
                conds.append((template == t) & (ctx.table(actual_template, n, u) == code))
            cond = conds[0]
            for c in conds[1:]:
                cond = cond | c
            if unit.ring == "expert":
                cond = (unit.slab < n) if cond is True else (cond & (unit.slab < n))
            ctx.when(cond, start)

    def _next_window_begin(self, ctx: Ctx, op: str, layer: Any, templates: list[int]) -> None:
        """Lead-in: copies of the window of ``layer`` planned at this op (after topk)."""
        if op not in LEAD_IN or op == MoeOp.TOPK:
            return
        template = ctx.memo("template", layer, lambda: ctx.layer_col(layer, COL_TEMPLATE))
        if len(templates) == 1:
            template = templates[0]
        n_next = ctx.memo("n_next", layer, lambda: ctx.scratch["smem"][N_NEXT])
        self._issue_at(ctx, self.tables.codes[op, 0], templates, template, n_next, (layer, layer + 1))

    def _issue_at_topk(self, ctx: Ctx, layer: Any, j: Any, templates: list[int]) -> None:
        """Expert entry ``j`` (traced) was just appended: start it if the plan issues it at
        ``moe.topk`` (one ``pl.when`` whatever the slot count)."""
        code = self.tables.codes[MoeOp.TOPK, 0]
        template = ctx.memo("template", layer, lambda: ctx.layer_col(layer, COL_TEMPLATE))
        index = {u: i for i, u in enumerate(self.tables.units)}
        hit: Any = False
        for jj in range(min(self.geo.rings["expert"].buffers, self.n_max)):
            u = index[Unit("expert", 0, jj)]
            ts = [t for t in templates if set(self._unit_codes[t][u].values()) == {code}]
            if not ts:
                continue
            this = j == jj
            if len(ts) < len(templates):
                match = template == ts[0]
                for t in ts[1:]:
                    match = match | (template == t)
                this = this & match
            hit = this if hit is False else hit | this
        if hit is not False:
            ctx.when(hit, lambda: ctx.start_expert(layer, j))

    def _prologue(self, ctx: Ctx) -> None:
        plan, ops = self.tables.prologue, self.tables.prologue.ops
        index = {u: i for i, u in enumerate(self.tables.units)}
        by_position: dict[int, list[Unit]] = {}
        for unit, pos in plan.issue.items():
            by_position.setdefault(pos, []).append(unit)
        counter = iter(range(len(ops)))

        def begin(name: str) -> None:
            pos = next(counter)
            assert ops[pos].name == name, (ops[pos].name, name)
            layer = ops[pos].delta
            for unit in sorted(by_position.get(pos, []), key=lambda u: prologue_order(plan, index, u)):
                ctx.start(unit.ring, unit.delta, unit.slab)
            if layer == 1:
                self._next_window_begin(ctx, name, 1, [window1])
            ctx.compute(name, layer)

        window1 = TEMPLATES.index(self.dims.kinds[2] if self.dims.num_layers > 3 else "head")
        kda_layer(ctx, 0, begin, first_kda=True)
        dense_mlp(ctx, begin)
        if self.dims.kinds[1] == "kda":
            kda_layer(ctx, 1, begin, first_kda=False)
        else:
            mla_layer(ctx, 1, begin)
        moe_pre_experts(ctx, 1, begin, lambda j: self._issue_at_topk(ctx, 1, j, [window1]))
        ctx.scratch["smem"][N_CURRENT] = ctx.scratch["smem"][N_NEXT]

    def _window(self, ctx: Ctx, i: Any, last: bool = False) -> None:
        smem, codes = ctx.scratch["smem"], self.tables.codes
        templates = [TEMPLATES.index("head")] if last else [0, 1]
        template: Any = templates[0] if last else ctx.memo("template", i, lambda: ctx.layer_col(i, COL_TEMPLATE))
        n = smem[N_CURRENT]
        slots = self.geo.rings["expert"].buffers
        nxt = i + 1
        if not last:
            ctx.instance(self.geo.rings[KdaTensor.QKVGB], nxt)  # the next layer's stack index, read once
        next_templates = [0, 1, 2] if not isinstance(i, int) else [TEMPLATES.index(
            self.dims.kinds[i + 2] if i + 2 < self.dims.num_layers else "head")]
        ctx.table(template, n, 0)  # load this window's issue row once, outside any branch

        def begin_expert(j: Any) -> None:
            self._issue_at(ctx, j, templates, template, n, (i, nxt), expert_op=True)
            ctx.when((j >= 1) & (j + slots - 1 < n), lambda: ctx.start_expert(i, j + slots - 1))
            ctx.event("compute_expert", dynamic=(i, j))

        def begin(name: str, delta: int, ts: list[int], t: Any) -> None:
            self._issue_at(ctx, codes[name, delta], ts, t, n, (i, nxt), skip_experts=True,
                           actual_template=template)
            if delta == 1:
                self._next_window_begin(ctx, name, nxt, next_templates)
            ctx.compute(name, nxt if delta else i)

        expert_loop(ctx, i, n, begin_expert)
        moe_post_experts(ctx, i, lambda name: begin(name, 0, templates, template))
        if last:
            head(ctx, lambda name: begin(name, 1, templates, template))
            return
        ctx.cond(ctx.layer_col(nxt, COL_IS_MLA) == 1,
                 lambda: mla_layer(ctx, nxt, lambda name: begin(name, 1, [1], 1)),
                 lambda: kda_layer(ctx, nxt, lambda name: begin(name, 1, [0], 0), first_kda=False))
        moe_pre_experts(ctx, nxt, lambda name: begin(name, 1, templates, template),
                        lambda j: self._issue_at_topk(ctx, nxt, j, next_templates))
        smem[N_CURRENT] = smem[N_NEXT]
