"""The schedule-driven megakernel on N devices, with the plan's collectives inside it.

:class:`CollectiveMegakernel` is :class:`megakernel.kernel.Megakernel` (weights streamed from
HBM into the schedule's VMEM arenas by the one issue plan, layers in a ``fori`` loop of
windows) built at one device's widths of the plan (:func:`megakernel.dims.model_dims` with
routing over every expert) and run under ``jax.shard_map`` over the plan's mesh
(:func:`megakernel.multi_device.device_mesh`). Every collective of
``plan.collectives_at(batch)`` is a set of remote copies into the destination's VMEM plus
semaphore waits, issued at the end of its issuing op and waited at the start of its consumer
(:func:`megakernel.collective_plan.layer_steps`), carrying the kernel's values. The copy and
combine logic is :class:`megakernel.collective_messages.CollectiveMessages`' (one owner, through
:class:`megakernel.multi_device_decode.DecodeKernel`):
:class:`KernelLink` only lays its buffers out for this kernel. What each one carries:

| collective | payload (issued at the end of) | result (consumed at the start of) |
| --- | --- | --- |
| ``attn.head_exchange`` | this device's gated heads (``kda.core``; MLA: ``mla.gate``) | the pair's heads (``*.o``) |
| ``attn.partial_reduce`` | pair heads @ ``W_o``: hidden half ``rank % 2`` | the half summed over all heads |
| ``attn.half_gather`` | the summed half (when the reduce completes) | the attention output (residual add) |
| ``moe.router_exchange`` | sigmoid scores of its router columns | every expert's score (``moe.topk``) |
| ``moe.latent_allgather`` | its ``latent_down`` columns | the latent, RMS-normed (before ``expert[0]``) |
| ``moe.shared_reduce`` | its shared-expert channels' output | the shared experts' output (``moe.combine``) |
| ``moe.routed_reduce`` | its experts' weighted outputs (latent) | the routed sum (``moe.latent_up``) |
| ``moe.output_allgather`` | its ``latent_up`` columns | the MoE output (next ``attn.mix_norm``) |
| ``moe.fused_reduce`` | its shared-expert output then its experts' outputs (``moe.combine``) | both sums (``moe.latent_up``) |
| ``mlp.allreduce`` | layer 0's dense MLP over its channels | the dense output (layer 1's ``attn.mix_norm``) |

With collectives, the stand-ins of :mod:`megakernel.dims` are gone: routing runs over all
experts from the exchanged scores and lists only this device's group's experts (local ids);
the latent and the MoE output are the gathered ones. Two placements follow from the
per-device weights, not from the plan: MLA's exchange is issued after ``mla.gate`` (not
after ``mla.core``: the gate's columns cover this device's heads only, so the sibling's heads
must arrive gated), which leaves the order of collective events unchanged; and the output
projection is stored as :mod:`tpusim.workload.shapes` sizes it (own heads x hidden, the same
bytes as K3's pair heads x hidden half): panel ``2p + a`` of the stored matrix holds the rows
of pair member ``a`` (rank order) of the half's panel ``p`` (:func:`pair_matmul`).

Receive buffers: per collective and phase one slot per incoming message (the payload's [B, w],
folded into the two rows a bf16 sublane packs where that fills whole tiles:
:meth:`DecodeKernel.message_shape`), double-buffered by
layer parity when the collective runs in more than one layer (exactly
:func:`tpusim.workload.collectives.buffer_bytes`, which :func:`tpusim.schedule.vmem.vmem_plan`
counts). With the schedule's ``receive_slots: shared`` (the default), a collective that
:func:`tpusim.schedule.vmem.buffer_hosts` assigns a host (K3: ``mlp.allreduce`` in
``moe.shared_reduce``'s) uses the host's send buffer and parity-0 receive slots and keeps
only its own semaphores. The kernel's trace-time log (:attr:`CollectiveMegakernel.link_log`) lists every
issue and wait in trace order, for the event-order test against the plan.

A device none of whose experts the batch chose still runs one expert op (local expert 0,
routing weight 0): the schedule starts copies inside the expert loop, so a window needs at
least one. Lowering: :meth:`CollectiveMegakernel.lower_for_tpu` (32 virtual devices at K3
TP32 sizes, :mod:`megakernel.commands.lower_check`); interpret-mode runs against the one-device
reference: :mod:`megakernel.commands.collective_check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.collective_plan import UnsupportedPlan
from megakernel.dims import UnsupportedModel, model_dims
from megakernel.expert_products import DECODE, ExpertProducts
from megakernel.kernel import Megakernel
from megakernel.kernel_attention import add_to_residual
from megakernel.kernel_dma import Ctx
from megakernel.kernel_moe import WORK_ACC, WORK_LATENT, WORK_NORM, WORK_SHARED, end_of_layer
from megakernel.math_common import rmsnorm
from megakernel.multi_device import ISSUE, Bugs, device_mesh
from megakernel.multi_device_decode import DecodeKernel
from megakernel.reference import DecodeState
from tpusim.schedule.kernel_layout import LANES
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import buffer_hosts
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.plan_variants import is_deferred
from tpusim.workload.registry.names import Collective, MoeOp, MoeTensor
from tpusim.workload.sharding import ShardingPlan


def pair_matmul(ctx: Ctx, ring: str, layer: Any, pair: jax.Array) -> jax.Array:
    """``pair`` f32[B, 2w] (the sibling pair's heads, rank order) @ this device's output
    projection -> f32[B, C/2]: the stored bf16[w, C] matrix holds the pair-heads x hidden-half
    matrix with panel ``2p + a`` = rows ``a*w .. (a+1)*w`` of panel ``p``. One streamed matmul
    of both halves of ``pair`` as rows, then each output panel from its member's rows."""
    b, w = pair.shape[0], pair.shape[1] // 2
    y = ctx.matmul(ring, layer, jnp.concatenate([pair[:, :w], pair[:, w:]], axis=0))  # [2B, C]
    panels = y.shape[1] // LANES
    y = y.reshape(2 * b, panels // 2, 2, LANES)
    return (y[:b, :, 0, :] + y[b:, :, 1, :]).reshape(b, y.shape[1] * LANES)


class _Fresh:
    """The routes table in SMEM, read on every use (a cached load would leak out of the
    ``fori``/``cond`` region it was traced in)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def __getitem__(self, i: int) -> Any:
        return self.ref[i]


class KernelLink(DecodeKernel):
    """DecodeKernel's remote copies and combines, with this kernel's buffer layout."""

    def __init__(self, model: ModelConfig, plan: ShardingPlan, batch: int, *, bugs: Bugs,
                 f32_payloads: bool = False, receive_slots: str = "shared") -> None:
        super().__init__(model, plan, batch, 1, interpret=None, bugs=bugs, f32_payloads=f32_payloads)
        runs = {name: sum(("issue", name, 0) in events for events in self.layers) for name in self.index}
        self.copies = {c: 1 if bugs.single_buffer or runs[coll.name] <= 1 else 2 for c, coll in enumerate(self.colls)}
        # collective -> the collective whose buffers it uses (itself unless the layout shares them)
        self.owner = {c: c for c in range(len(self.colls))}
        for guest, host in buffer_hosts(model, plan, batch, receive_slots).items():
            g, h = self.index[guest], self.index[host]
            if self._buffers(g, 1) != self._buffers(h, 1) or self.copies[g] != 1:
                raise UnsupportedPlan(f"collective {guest}: its buffers differ from {host}'s; it cannot share them")
            self.owner[g] = h
        self.owners = sorted(set(self.owner.values()))

    def _buffers(self, c: int, copies: int) -> tuple[Any, ...]:
        """(send shape, receive shape per phase, dtype) of collective ``c`` with ``copies`` slot sets."""
        return (self.send_shape(c), tuple(self.recv_shape(c, p, copies) for p in range(self.colls[c].phases)),
                self.payload[c][1])

    def scratch_shapes(self) -> dict[str, Any]:
        """Send and receive buffers of the collectives that own theirs (:attr:`owners`, in
        order; rule 6 of :mod:`tpusim.schedule.vmem`), semaphores of every collective."""
        shapes = [self._buffers(c, self.copies[c]) for c in self.owners]
        return {
            "send": [pltpu.VMEM(send, dtype) for send, _, dtype in shapes],
            "recv": [[pltpu.VMEM(phase, dtype) for phase in recv] for _, recv, dtype in shapes],
            "send_sem": [pltpu.SemaphoreType.DMA((coll.phases,)) for coll in self.colls],
            "recv_sem": [pltpu.SemaphoreType.DMA((self.copies[c], coll.phases)) for c, coll in enumerate(self.colls)],
        }

    def _slot_parity(self, c: int, layer: Any) -> Any:
        """A collective with one copy of its slots always uses copy 0 (also when it uses a
        double-buffered host's buffers)."""
        return self._parity(layer) if self.copies[c] > 1 else 0

    def _parity(self, layer: Any) -> Any:
        if self.bugs.single_buffer:
            return 0
        return layer % 2 if isinstance(layer, int) else jax.lax.rem(layer, 2)


@dataclass
class LinkRun:
    """One kernel trace's collectives: the refs DecodeKernel's issue/wait read (``routes``,
    ``send``, ``recv``, semaphores, ``record``) and the hooks the ops call (``ctx.link``)."""

    link: KernelLink
    routes: Any
    send: list
    recv: list
    send_sem: list
    recv_sem: list
    # (event, collective, issuing layer if static else None, layers back from the op's layer, cond branch)
    log: list = field(default_factory=list)
    ctx: Any = None

    @property
    def rank(self) -> Any:
        return jax.lax.axis_index("x")

    @property
    def fused_experts(self) -> bool:
        """The plan reduces the shared and routed expert outputs in one ``moe.fused_reduce``."""
        return Collective.MOE_FUSED_REDUCE in self.link.index

    @property
    def deferred_shared(self) -> bool:
        """The plan waits ``moe.shared_reduce`` at the next layer's first op."""
        return any(is_deferred(spec) for spec in self.link.plan.collectives_at(self.link.batch))

    def record(self, kind: int, c: int, phase: int, peer: Any, layer: Any) -> None:
        if kind == ISSUE:
            self._log("copy", self.link.colls[c].name, layer)

    def _log(self, kind: str, name: str, layer: Any, back: int = 0) -> None:
        self.log.append((kind, name, layer if isinstance(layer, int) else None, back, self.ctx.branch))

    # ------------------------------------------------------------------ hooks of the ops

    def issue(self, ctx: Ctx, name: str, layer: Any, payload: jax.Array) -> None:
        self._log("issue", name, layer)
        self.link.issue(self, self.link.index[name], layer, payload[: ctx.batch])  # type: ignore[arg-type]

    def wait(self, ctx: Ctx, name: str, layer: Any, back: int = 0) -> jax.Array:
        """The combined result of ``name`` issued by ``layer`` (``back`` layers before the op's)."""
        self._log("wait", name, layer, back)
        return self.link.wait(self, self.link.index[name], layer)  # type: ignore[arg-type]

    def group_first(self, ctx: Ctx) -> Any:
        """First global expert id of this device's expert group (traced)."""
        return jax.lax.div(self.rank, jnp.int32(self.link.plan.expert_tp)) * ctx.dims.moe.local_experts

    def attention_output(self, ctx: Ctx, ring: str, layer: Any) -> None:
        """``*.o`` and the attention's reduction: pair heads -> hidden half -> all heads ->
        whole hidden, added to the residual."""
        pair = self.wait(ctx, Collective.ATTN_HEAD_EXCHANGE, layer)
        self.issue(ctx, Collective.ATTN_PARTIAL_REDUCE, layer, pair_matmul(ctx, ring, layer, pair))
        half = self.wait(ctx, Collective.ATTN_PARTIAL_REDUCE, layer)
        self.issue(ctx, Collective.ATTN_HALF_GATHER, layer, half)
        add_to_residual(ctx, self.wait(ctx, Collective.ATTN_HALF_GATHER, layer))

    def finish_mlp(self, ctx: Ctx, layer: Any) -> None:
        """At ``layer``'s first op: the previous layer's MLP output (dense all-reduce, or the
        MoE output all-gather plus the shared experts), into the residual; close its block."""
        d, b = ctx.dims, ctx.batch
        if isinstance(layer, int) and layer == 1:
            out = self.wait(ctx, Collective.MLP_ALLREDUCE, 0)
        else:
            # a deferred shared wait is here, before the output gather's (the plan's order)
            shared = (self.wait(ctx, Collective.MOE_SHARED_REDUCE, layer - 1, back=1) if self.deferred_shared
                      else ctx.scratch["work"][WORK_SHARED, :b, : d.hidden])
            gathered = self.wait(ctx, Collective.MOE_OUTPUT_ALLGATHER, layer - 1, back=1)
            out = gathered[:, : d.hidden] + shared
        add_to_residual(ctx, out)
        end_of_layer(ctx, layer - 1)

    def keep_latent_norm(self, ctx: Ctx, norm: jax.Array) -> None:
        """The latent RMSNorm weights, kept until the gathered latent arrives (the small
        parameters' buffer is refilled after ``moe.topk``)."""
        ctx.scratch["work"][WORK_NORM, :1, : ctx.dims.moe.latent] = norm

    def gather_latent(self, ctx: Ctx, layer: Any) -> None:
        d, b = ctx.dims, ctx.batch
        lat = self.wait(ctx, Collective.MOE_LATENT_ALLGATHER, layer)[:, : d.moe.latent]
        norm = ctx.scratch["work"][WORK_NORM, :1, : d.moe.latent]
        ctx.scratch["work"][WORK_LATENT, :b, : d.moe.latent] = rmsnorm(lat, norm, d.eps)

    def moe_output(self, ctx: Ctx, layer: Any, begin: Any) -> None:
        """``moe.combine`` and ``moe.latent_up`` with the shared and routed reductions; the
        output all-gather is consumed at the next layer's first op."""
        d, b = ctx.dims, ctx.batch
        work = ctx.scratch["work"]
        if self.fused_experts:  # one payload [shared partial | routed partial], summed once
            self.issue(ctx, Collective.MOE_FUSED_REDUCE, layer, jnp.concatenate(
                [work[WORK_SHARED, :b, : d.hidden], work[WORK_ACC, :b, : d.moe.latent]], axis=1))
            begin(MoeOp.LATENT_UP)
            both = self.wait(ctx, Collective.MOE_FUSED_REDUCE, layer)
            work[WORK_SHARED, :b, : d.hidden] = both[:, : d.hidden]
            routed = both[:, d.hidden: d.hidden + d.moe.latent]
            self.issue(ctx, Collective.MOE_OUTPUT_ALLGATHER, layer, ctx.matmul(MoeTensor.LATENT_UP, layer, routed))
            return
        if not self.deferred_shared:  # else waited at the next layer's first op (finish_mlp)
            work[WORK_SHARED, :b, : d.hidden] = self.wait(ctx, Collective.MOE_SHARED_REDUCE, layer)
        self.issue(ctx, Collective.MOE_ROUTED_REDUCE, layer, work[WORK_ACC, :b, : d.moe.latent])
        begin(MoeOp.LATENT_UP)
        routed = self.wait(ctx, Collective.MOE_ROUTED_REDUCE, layer)
        self.issue(ctx, Collective.MOE_OUTPUT_ALLGATHER, layer, ctx.matmul(MoeTensor.LATENT_UP, layer, routed))


class CollectiveMegakernel(Megakernel):
    """The decode-step kernel of (model, plan, schedule, batch, KV capacity) on the plan's
    ``devices`` mesh devices, one ``pallas_call`` each, collectives inside."""

    def __init__(self, model: ModelConfig, plan: ShardingPlan, schedule: Schedule, batch: int, max_context: int, *,
                 interpret: Any = None, bugs: Bugs | None = None, f32_payloads: bool = False,
                 expert_products: ExpertProducts = DECODE) -> None:
        """``f32_payloads``: every payload in f32, twice the plan's bytes (a numerics check of the
        sharded math alone; the VMEM accounting then no longer applies); ``expert_products``: as
        :class:`~megakernel.kernel.Megakernel`'s (the target chip's)."""
        dims = model_dims(model, plan, routes_all_experts=True)
        if (dims.hidden // LANES) % 2:
            raise UnsupportedModel(f"model {model.name}: the hidden size must be an even number of 128-lane panels")
        super().__init__(dims, schedule, batch, max_context, interpret=interpret, expert_products=expert_products)
        self.model, self.plan = model, plan
        self.link = KernelLink(model, plan, batch, bugs=bugs or Bugs(), f32_payloads=f32_payloads,
                               receive_slots=schedule.receive_slots)
        self.link_log: list[tuple[str, str, int | None, int, str | None]] = []

    def scratch_shapes(self) -> dict[str, Any]:
        return {**super().scratch_shapes(), "coll": self.link.scratch_shapes()}

    def compiler_params(self) -> Any:
        return pltpu.CompilerParams(vmem_limit_bytes=self.vmem_limit_bytes, collective_id=0)

    def input_specs(self) -> dict[str, Any]:
        return {**super().input_specs(), "smem.routes": pl.BlockSpec(memory_space=pltpu.SMEM)}

    def inputs(self, hbm: dict[str, jax.Array], state: DecodeState, x0: jax.Array,
               routes: jax.Array | None = None) -> dict[str, jax.Array]:
        """As :meth:`Megakernel.inputs`, plus this device's row of the routes table."""
        if routes is None:
            raise ValueError("the multi-device kernel needs its routes row")
        return {**super().inputs(hbm, state, x0), "smem.routes": routes}

    def enter(self, ctx: Ctx) -> None:
        coll = ctx.scratch["coll"]
        link = self.link
        at = {c: link.owners.index(link.owner[c]) for c in range(len(link.colls))}
        run = LinkRun(link, _Fresh(ctx.ins["smem.routes"]), [coll["send"][at[c]] for c in range(len(link.colls))],
                      [coll["recv"][at[c]] for c in range(len(link.colls))], coll["send_sem"], coll["recv_sem"],
                      ctx=ctx)
        self.link_log = run.log
        ctx.link = run
        self.link._barrier(run)  # type: ignore[arg-type]  # nobody's copy lands before its peer started

    # ------------------------------------------------------------------ the mesh

    def routes(self) -> np.ndarray:
        """int32[devices, words]: every rank's row of the routes table."""
        return self.link.routes()

    def device_step(self, hbm: dict[str, jax.Array], embedding: jax.Array, state: DecodeState,
                    tokens: jax.Array, routes: jax.Array) -> tuple[jax.Array, DecodeState]:
        """One device's step (inside ``shard_map``): its logits columns and next state."""
        x0 = embedding[tokens].astype(jnp.float32)
        logits, kda, conv, kv = self.pallas_fn()(self.inputs(hbm, state, x0, routes))
        return logits, DecodeState(kda, conv, kv, state.position + 1)

    @cached_property
    def mesh(self) -> Any:
        return device_mesh(self.plan.devices)

    def sharded_step(self) -> Any:
        """``f(hbm, embedding, state, tokens, routes)`` over the mesh: per-device operands
        stacked on a leading device axis; embedding and tokens replicated; logits gathered
        along the vocabulary."""
        from jax.sharding import PartitionSpec as P

        def per_device(hbm: Any, embedding: Any, state: Any, tokens: Any, routes: Any) -> Any:
            local = DecodeState(state.kda_state[0], state.conv_state[0], state.kv_cache[0], state.position)
            logits, new = self.device_step({k: v[0] for k, v in hbm.items()}, embedding, local, tokens,
                                           routes.reshape(-1))
            return logits, DecodeState(new.kda_state[None], new.conv_state[None], new.kv_cache[None], new.position)

        state_spec = DecodeState(P("x"), P("x"), P("x"), P())
        return jax.shard_map(per_device, mesh=self.mesh, in_specs=(P("x"), P(), state_spec, P(), P("x")),
                             out_specs=(P(None, "x"), state_spec), check_vma=False)

    def global_shapes(self) -> tuple[Any, ...]:
        """ShapeDtypeStructs of :meth:`sharded_step`'s arguments (nothing allocated)."""
        sds, n = jax.ShapeDtypeStruct, self.plan.devices
        hbm = {name: sds((n, *shape), jnp.uint16) for name, shape in self.hbm_shapes().items()}
        states = {k: sds((n, *v.shape), v.dtype) for k, v in self.state_shapes().items()}
        state = DecodeState(states["state.kda"], states["state.conv"], states["state.kv"], sds((), jnp.int32))
        embedding = sds((self.model.vocab_size, self.dims.hidden), jnp.bfloat16)
        tokens = sds((self.batch,), jnp.int32)
        routes = sds(self.routes().shape, jnp.int32)
        return hbm, embedding, state, tokens, routes

    def lower_for_tpu(self) -> str:
        """The StableHLO text of one step over the mesh lowered for TPU (shapes only)."""
        lowered = jax.jit(self.sharded_step()).trace(*self.global_shapes()).lower(lowering_platforms=("tpu",))
        return lowered.as_text()

    def remote_copies_per_layer(self) -> int:
        """Remote copies one MoE layer issues (from the trace-time log of the loop body: the
        window's MoE part, one attention branch, the next layer's routing part)."""
        return sum(1 for kind, _, layer, _, branch in self.link_log
                   if kind == "copy" and layer is None and branch in (None, "false"))

    def unrolled_log(self) -> list[tuple[str, str, int]]:
        """The trace-time log of issues and waits as the step runs them: ``(issue|wait,
        collective, issuing layer)`` for every layer and the head, in order.

        The log holds the prologue and the last window with static layers, and the loop body
        once, traced with a symbolic layer: the window of layer ``i`` runs ``i``'s experts and
        MoE output, then (one ``lax.cond`` branch per attention kind) layer ``i + 1``'s
        attention, then ``i + 1``'s routing and shared experts (:mod:`megakernel.kernel`).
        Unrolled here for ``i = 1 .. L-2`` with the branch of layer ``i + 1``'s kind."""
        log = [e for e in self.link_log if e[0] != "copy"]
        first = next(k for k, e in enumerate(log) if e[2] is None)
        stop = max(k for k, e in enumerate(log) if e[2] is None) + 1
        body = log[first:stop]
        split = next(k for k, e in enumerate(body) if e[4] is not None)
        tail = body[:split]
        branches = {name: [e for e in body if e[4] == name] for name in ("true", "false")}
        after = [e for e in body[split:] if e[4] is None]
        out = [(kind, name, layer) for kind, name, layer, _, _ in log[:first]]
        for i in range(1, self.dims.num_layers - 1):
            out += [(kind, name, i - back) for kind, name, _, back, _ in tail]
            branch = branches["true" if self.dims.kinds[i + 1] == "mla" else "false"]
            out += [(kind, name, i + 1 - back) for kind, name, _, back, _ in branch + after]
        return out + [(kind, name, layer) for kind, name, layer, _, _ in log[stop:]]
