"""The K3 decode step on N devices: sharded weights, the plan's collectives carrying real data.

One ``pallas_call`` per device under ``jax.shard_map``. The body walks the simulator's
program (:func:`megakernel.collective_plan.layer_steps`: each layer's ops with the plan's
issue and wait points between them) and runs, per op, the single-device kernel's op bodies
(:mod:`megakernel.layer_ops`, over :mod:`megakernel.math_kda`, :mod:`~megakernel.math_mla`,
:mod:`~megakernel.math_moe`, :mod:`~megakernel.residual`, :mod:`~megakernel.quant`) on this device's shard
(:mod:`megakernel.decode_shards`). Every collective is the remote-copy machinery of
:class:`megakernel.multi_device.CollectiveKernel`; what each one carries (K3's TP pattern):

| collective | payload of device r | result |
| --- | --- | --- |
| ``attn.head_exchange`` | its heads' gated attention output | the pair's heads, in head order |
| ``attn.partial_reduce`` | pair heads @ ``W_o`` rows, hidden half ``r % 2`` | that half summed over all heads |
| ``attn.half_gather`` | the summed half (issued when the reduce completes) | the whole attention output |
| ``moe.router_exchange`` | sigmoid scores of its half of the experts (f32) | every expert's score |
| ``moe.latent_allgather`` | its ``latent_down`` columns | the whole latent (then the latent RMSNorm) |
| ``moe.shared_reduce`` | its shared-expert channels' output (whole hidden) | the shared experts' output |
| ``moe.routed_reduce`` | routing-weighted outputs of its group's experts, or of its part of each when expert TP splits them (latent) | the routed sum |
| ``moe.output_allgather`` | its lane's ``latent_up`` columns | the routed MoE output (whole hidden) |
| ``moe.fused_reduce`` (``expert_reduce=fused``) | its shared-expert output then its routed partial, one row per token | both sums (``moe.latent_up`` splits them) |
| ``mlp.allreduce`` | layer 0's dense MLP over its channels | the dense MLP output |

A deferred shared wait (``shared_wait=deferred``) is waited where the plan says (the next
layer's ``attn.mix_norm``); the shared output is added to the residual there.

Payloads travel in the dtype the plan's bytes imply (``bytes_per_token / width``: bf16,
f32 for the router scores, as in K3). Reductions and gathers place every contribution by
its source rank (the ``pos`` table) and sum in rank order, so every device computes the
replicated values (residual stream, routing, norms) bit-identically. ``mla.gate`` gates
the device's own head before the exchange (its weights hold only its heads' columns), so
its math runs at the end of ``mla.core``. Routing is computed on every device from the
exchanged scores; each device runs its group's experts with the routing weight (0 when not
chosen). With expert TP (nano TP32) each rank runs its part of every group expert's width
and the routed reduce, which spans every part (checked against the cut), sums the partial
outputs; heads the plan replicates (more head slots than heads) project a part of their
pair's output-projection rows each (:mod:`megakernel.decode_shards`). Operands are per layer (the multi-device interpreter hangs on operands of
64–128 KiB), column-chunked to at most :data:`OPERAND_LIMIT_BYTES`.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.collective_messages import CollectiveMessages
from megakernel.collective_plan import DECODE_SUPPORTED, UnsupportedPlan, layer_steps
from megakernel.decode_shards import Cut, cut_of, state_shard, weight_shard
from megakernel.dims import ModelDims, model_dims
from megakernel.multi_device import EVENT_WORDS, Bugs, CollectiveKernel, device_mesh
from tpusim.workload.collectives import incoming
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import (
    Collective,
    HeadTensor,
    KdaTensor,
    MlaTensor,
    MlpTensor,
    MoeTensor,
    StateFamily,
)
from tpusim.workload.sharding import ShardingPlan

OPERAND_LIMIT_BYTES = 48 * 1024
ATTN = (KdaTensor.QKVGB, KdaTensor.DECAY_A, KdaTensor.DECAY_B, KdaTensor.OUT)
MLA = (MlaTensor.Q_A, MlaTensor.KV_A, MlaTensor.Q_B, MlaTensor.KV_B, MlaTensor.GATE, MlaTensor.OUT)
MOE = (MoeTensor.ROUTER, MoeTensor.LATENT_DOWN, MoeTensor.LATENT_UP, MoeTensor.SHARED_GATE_UP, MoeTensor.SHARED_DOWN)
EXPERT = ("expert.gate_up.values", "expert.gate_up.scales", "expert.down.values", "expert.down.scales")


def chunks(cols: int, bytes_per_col: int) -> list[tuple[int, int]]:
    """Column ranges splitting a matrix into operands of at most OPERAND_LIMIT_BYTES."""
    parts = -(-cols * bytes_per_col // OPERAND_LIMIT_BYTES)
    step = -(-cols // parts)
    return [(a, min(a + step, cols)) for a in range(0, cols, step)]


class DecodeKernel(CollectiveMessages, CollectiveKernel):
    """The decode step of (model, plan, batch, KV capacity) on ``plan.devices`` devices."""

    ALGORITHMS = DECODE_SUPPORTED

    def __init__(self, model: ModelConfig, plan: ShardingPlan, batch: int, max_context: int, *,
                 interpret: Any, trace_layers: int = 3, bugs: Bugs | None = None, f32_payloads: bool = False) -> None:
        """``f32_payloads``: every payload in f32 (twice the plan's bf16 bytes): a numerics check
        that isolates the sharded math from the bf16 rounding of K3's partials."""
        super().__init__(model, plan, batch, interpret=interpret, trace_layers=trace_layers, bugs=bugs or Bugs())
        self.dims: ModelDims = model_dims(model, plan, routes_all_experts=True)
        self.one: ModelDims = model_dims(model, _one_device(model))
        self.max_context = max_context
        self.steps, self.head_steps = layer_steps(model, plan, batch)
        d = self.dims
        widths = {Collective.ATTN_HEAD_EXCHANGE: d.kda.width, Collective.ATTN_PARTIAL_REDUCE: d.hidden // 2,
                  Collective.ATTN_HALF_GATHER: d.hidden // 2, Collective.MOE_ROUTER_EXCHANGE: d.moe.router_cols,
                  Collective.MOE_LATENT_ALLGATHER: d.moe.latent_down_cols, Collective.MOE_SHARED_REDUCE: d.hidden,
                  Collective.MOE_ROUTED_REDUCE: d.moe.latent, Collective.MOE_OUTPUT_ALLGATHER: d.moe.latent_up_cols,
                  Collective.MLP_ALLREDUCE: d.hidden, Collective.MOE_FUSED_REDUCE: d.hidden + d.moe.latent}
        self.after = {spec.name: spec.after for spec in plan.collectives_at(batch)}
        self.payload: dict[int, tuple[int, Any]] = {}  # collective -> (width per row, dtype)
        for c, coll in enumerate(self.colls):
            if coll.name not in widths:
                raise UnsupportedPlan(f"collective {coll.name}: the decode kernel does not know what it carries")
            width = widths[coll.name]
            size = 2 * coll.elems // batch // width if (2 * coll.elems) % (batch * width) == 0 else 0
            if size not in (2, 4):
                raise UnsupportedPlan(f"collective {coll.name}: {2 * coll.elems // batch} B per token is not "
                                      f"{width} bf16 or f32 values")
            self.payload[c] = (width, jnp.bfloat16 if size == 2 and not f32_payloads else jnp.float32)
        cuts = [cut_of(model, plan, r) for r in range(plan.devices)]
        self.head_slots = cuts[0].head_slots  # the attention cut's period (replica = rank // slots)
        self._check_groups(cuts)

    def _check_groups(self, cuts: list[Cut]) -> None:
        """The reductions that combine partial shards must span them: the attention partial
        reduce sums each (pair, replica) part of its parity once, and the routed reduce spans
        every expert-TP part of every expert group (its partial expert outputs)."""
        for coll in self.colls:
            if coll.name not in (Collective.ATTN_PARTIAL_REDUCE, Collective.MOE_ROUTED_REDUCE,
                                 Collective.MOE_FUSED_REDUCE):
                continue
            for r, cut in enumerate(cuts):
                members = [cuts[int(m)] for m in coll.members[r]]
                if coll.name == Collective.ATTN_PARTIAL_REDUCE:
                    parts = sorted((m.pair_first_head, m.replica) for m in members if m.parity == cut.parity)
                    want = sorted({(k.pair_first_head, k.replica) for k in cuts})
                else:
                    parts = sorted((m.group, m.expert_part) for m in members)
                    want = sorted({(k.group, k.expert_part) for k in cuts})
                if parts != want:
                    raise UnsupportedPlan(f"collective {coll.name}: rank {r}'s group does not hold each "
                                          f"partial shard exactly once")

    # ------------------------------------------------------------------ tables and shapes

    def own_table(self) -> np.ndarray:
        """int32[ranks, words]: per collective and phase, the device's own position among the
        phase's participants in rank order (arrival slots hold the others in rank order:
        :func:`megakernel.collective_plan.kernel_collectives` numbers them by source)."""
        rows = []
        for coll in self.colls:
            block = np.zeros((self.plan.devices, coll.phases), np.int32)
            for r in range(self.plan.devices):
                arrivals = incoming(coll.algorithm, coll.group, 2 * coll.elems, r, self.plan.topology)
                for p in range(coll.phases):
                    src = [m.src for m in arrivals if m.phase == p]
                    if src != sorted(src):
                        raise UnsupportedPlan(f"collective {coll.name}: arrival slots not in rank order")
                    block[r, p] = sorted([*src, r]).index(r)
            rows.append(block)
        return np.concatenate(rows, axis=1)

    def own_word(self, c: int, phase: int) -> int:
        """Column of (collective, phase) in the own-position part of the routes table."""
        return self._route_words + sum(k.phases for k in self.colls[:c]) + phase

    def chunk_table(self) -> np.ndarray:
        """int32[ranks, words]: per collective, the chunk each phase-0 message carries (its
        destination's place in the group: a reduce-scatter sends each peer its own chunk)."""
        rows = []
        for coll in self.colls:
            block = np.zeros((self.plan.devices, coll.max_count), np.int32)
            for r in range(self.plan.devices):
                members = list(coll.members[r])
                block[r, : coll.counts[0]] = [members.index(int(d)) for d in coll.dst[r, 0, : coll.counts[0]]]
            rows.append(block)
        return np.concatenate(rows, axis=1)

    def chunk_word(self, c: int, i: int) -> int:
        base = self._route_words + sum(k.phases for k in self.colls)
        return base + sum(k.max_count for k in self.colls[:c]) + i

    @cached_property
    def _route_words(self) -> int:
        return sum(2 * k.phases * k.max_count for k in self.colls)

    def routes(self) -> np.ndarray:
        return np.concatenate([self.tables()["routes"], self.own_table(), self.chunk_table()], axis=1)

    def scratch_shapes(self) -> dict[str, Any]:
        parity = 1 if self.bugs.single_buffer else 2
        dtypes = [self.payload[c][1] for c in range(len(self.colls))]
        return {
            "send": [pltpu.VMEM(self.send_shape(c), t) for c, t in enumerate(dtypes)],
            "recv": [[pltpu.VMEM(self.recv_shape(c, p, parity), t) for p in range(coll.phases)]
                     for c, (coll, t) in enumerate(zip(self.colls, dtypes, strict=True))],
            "send_sem": [pltpu.SemaphoreType.DMA((c.phases,)) for c in self.colls],
            "recv_sem": [pltpu.SemaphoreType.DMA((parity, c.phases)) for c in self.colls],
        }

    def operand_names(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Per-device operand name -> (shape, dtype); weights per layer, column-chunked."""
        d, b, m = self.dims, self.batch, self.dims.mla
        shapes: dict[str, tuple[tuple[int, ...], Any]] = {
            "x0": ((b, d.hidden), jnp.float32), "position": ((1,), jnp.int32)}
        ref = self.sample_shard()
        for layer, kind in enumerate(d.kinds):
            shapes[f"L{layer}.small"] = ((1, d.small_cols), jnp.float32)
            names = ATTN if kind == "kda" else MLA
            names += MOE if layer > 0 else (MlpTensor.GATE_UP, MlpTensor.DOWN)
            for name in names:
                value = ref[name][0] if name in ATTN + MLA + MOE else ref[name]
                for k, (a, z) in enumerate(chunks(value.shape[-1], value.shape[-2] * value.dtype.itemsize)):
                    shapes[f"L{layer}.{name}.{k}"] = ((*value.shape[:-1], z - a), value.dtype)
            if layer > 0:
                for j in range(d.moe.local_experts):
                    for name in EXPERT:
                        shapes[f"L{layer}.{name}.{j}"] = (ref[name].shape[2:], ref[name].dtype)
            if kind == "kda":
                shapes[f"L{layer}.kda_state"] = ((b, d.kda.heads, d.kda.head_dim, d.kda.head_dim), jnp.float32)
                shapes[f"L{layer}.conv"] = ((b, d.kda.conv_kernel - 1, 3 * d.kda.width), jnp.float32)
            else:
                shapes[f"L{layer}.kv"] = ((b, self.max_context, m.kv_cols), jnp.bfloat16)
        value = ref[HeadTensor.LM_HEAD]
        for k, (a, z) in enumerate(chunks(value.shape[-1], value.shape[-2] * 2)):
            shapes[f"head.lm_head.{k}"] = ((value.shape[0], z - a), value.dtype)
        return shapes

    def state_names(self) -> list[str]:
        return [f"L{layer}.{s}" for layer, kind in enumerate(self.dims.kinds)
                for s in ((StateFamily.KDA_STATE, "conv") if kind == "kda" else ("kv",))]

    @cached_property
    def _zero_full(self) -> dict[str, np.ndarray]:
        from megakernel.layout import array_specs

        return {name: np.zeros(shape, dtype) for name, (shape, dtype) in array_specs(self.one).items()}

    def sample_shard(self) -> dict[str, np.ndarray]:
        """Rank 0's shard of all-zero weights (shapes and dtypes only)."""
        return weight_shard(self._zero_full, self.one, self.dims, cut_of(self.model, self.plan, 0))

    # ------------------------------------------------------------------ host side

    def device_inputs(self, full: dict[str, np.ndarray], state: tuple[np.ndarray, np.ndarray, np.ndarray],
                      x0: np.ndarray, position: int) -> dict[str, np.ndarray]:
        """Every operand stacked over devices ([ranks, ...]) from the full weights and state."""
        d = self.dims
        per: list[dict[str, np.ndarray]] = []
        for r in range(self.plan.devices):
            cut = cut_of(self.model, self.plan, r)
            w = weight_shard(full, self.one, d, cut)
            kda, conv, kv = state_shard(*state, self.one, d, cut)
            out = {"x0": np.asarray(x0, np.float32), "position": np.array([position], np.int32)}
            for layer, kind in enumerate(d.kinds):
                i = d.kind_index(layer)
                out[f"L{layer}.small"] = w["small"][layer][None]
                names = (ATTN if kind == "kda" else MLA) + (MOE if layer > 0 else (MlpTensor.GATE_UP, MlpTensor.DOWN))
                for name in names:
                    value = w[name][i if name in ATTN + MLA else layer - 1] if name in ATTN + MLA + MOE else w[name]
                    for k, (a, z) in enumerate(chunks(value.shape[-1], value.shape[-2] * value.dtype.itemsize)):
                        out[f"L{layer}.{name}.{k}"] = value[..., a:z]
                if layer > 0:
                    for j in range(d.moe.local_experts):
                        for name in EXPERT:
                            out[f"L{layer}.{name}.{j}"] = w[name][layer - 1, j]
                if kind == "kda":
                    out[f"L{layer}.kda_state"], out[f"L{layer}.conv"] = kda[i], conv[i]
                else:
                    out[f"L{layer}.kv"] = kv[i]
            value = w[HeadTensor.LM_HEAD]
            for k, (a, z) in enumerate(chunks(value.shape[-1], value.shape[-2] * 2)):
                out[f"head.lm_head.{k}"] = value[..., a:z]
            per.append(out)
        return {name: np.stack([np.ascontiguousarray(p[name]) for p in per]) for name in per[0]}

    # ------------------------------------------------------------------ the call

    def call(self) -> Any:
        """``f(routes, inputs dict) -> (logits shard, states dict, event log)`` on one device."""
        specs = self.operand_names()
        states = {name: jax.ShapeDtypeStruct(*specs[name]) for name in self.state_names()}
        for layer in range(1, self.dims.num_layers):  # the routing each device computed, and its keys
            states[f"L{layer}.route"] = jax.ShapeDtypeStruct((self.batch, self.dims.moe.top_k), jnp.int32)
            states[f"L{layer}.router_keys"] = jax.ShapeDtypeStruct((self.batch, self.dims.moe.num_experts),
                                                                   jnp.float32)
        smem = {"position"}
        return pl.pallas_call(
            self._body,
            out_shape=(jax.ShapeDtypeStruct((self.batch, self.dims.vocab_rows), jnp.float32), states,
                       jax.ShapeDtypeStruct((1, self.max_events), jnp.int32)),
            in_specs=(pl.BlockSpec(memory_space=pltpu.SMEM),
                      {n: pl.BlockSpec(memory_space=pltpu.SMEM if n in smem else pltpu.VMEM) for n in specs}),
            out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM), {n: pl.BlockSpec(memory_space=pltpu.VMEM) for n in states},
                       pl.BlockSpec(memory_space=pltpu.VMEM)),
            scratch_shapes=self.scratch_shapes(),
            compiler_params=pltpu.CompilerParams(collective_id=0),
            interpret=self.interpret,
        )

    @cached_property
    def mesh_fn(self) -> tuple[Any, Any]:
        from jax.sharding import PartitionSpec as P

        mesh = device_mesh(self.plan.devices)

        def per_device(routes: Any, ins: dict[str, Any]) -> Any:
            logits, states, log = self.call()(routes.reshape(-1), {k: v[0] for k, v in ins.items()})
            return logits[None], {k: v[None] for k, v in states.items()}, log[None]

        fn = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P("x"), P("x")),
                                   out_specs=(P("x"), P("x"), P("x")), check_vma=False))
        return mesh, fn

    def run(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray,
                                                          np.ndarray]:
        """-> (logits f32[B, V] gathered, new state operands [ranks, ...], logs [ranks, events, 5],
        routing i32[ranks, MoE layers, B, k] (expert ids in selection order, every device's),
        router keys f32[ranks, MoE layers, B, E] (the sigmoid scores + bias the top-k ranked))."""
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh, fn = self.mesh_fn
        put = lambda a: jax.device_put(jnp.asarray(a), NamedSharding(mesh, P("x")))  # noqa: E731
        logits, states, log = fn(put(self.routes()), {k: put(v) for k, v in inputs.items()})
        logits = np.asarray(logits)  # [ranks, B, vocab rows]
        gathered = np.concatenate(list(logits), axis=1)
        layers = range(1, self.dims.num_layers)
        routing = np.stack([np.asarray(states.pop(f"L{layer}.route")) for layer in layers], axis=1)
        keys = np.stack([np.asarray(states.pop(f"L{layer}.router_keys")) for layer in layers], axis=1)
        return gathered, {k: np.asarray(v) for k, v in states.items()}, np.asarray(log).reshape(
            self.plan.devices, -1, EVENT_WORDS), routing, keys

    # ------------------------------------------------------------------ the body

    def _body(self, routes: Any, ins: dict[str, Any], logits: Any, states: dict[str, Any], log: Any,
              **scratch: Any) -> None:
        from megakernel.decode_ops import DecodeOps

        ctx = DecodeCtx(self, _Words(routes), scratch["send"], scratch["recv"], scratch["send_sem"],
                        scratch["recv_sem"])
        ops = DecodeOps(self, ctx, ins, states, logits)
        self._barrier(ctx)  # type: ignore[arg-type]
        for layer, steps in [*enumerate(self.steps), (self.model.num_layers, self.head_steps)]:
            ctx.current = layer
            for kind, name, delta in steps:
                if kind == "op":
                    ops.run(name, layer)
                elif kind == "issue":  # the payload an op left, or the result it is issued after
                    payload = ops.values.pop(name) if name in ops.values else ops.values[self.after[name]]
                    self.issue(ctx, self.index[name], layer - delta, payload)
                else:
                    ops.values[name] = self.wait(ctx, self.index[name], layer - delta)
        log[...] = ctx.log_row(self.max_events)

class _Words:
    """The routes table in SMEM, each word loaded once per kernel (loads are callbacks)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.cache: dict[int, Any] = {}

    def __getitem__(self, i: int) -> Any:
        if i not in self.cache:
            self.cache[i] = self.ref[i]
        return self.cache[i]


class DecodeCtx:
    """Refs of one decode-kernel invocation; the event log is kept as traced values and
    stored once at the end (one store instead of six SMEM accesses per event)."""

    def __init__(self, kernel: DecodeKernel, routes: _Words, send: list, recv: list, send_sem: list,
                 recv_sem: list) -> None:
        self.kernel, self.routes, self.send, self.recv = kernel, routes, send, recv
        self.send_sem, self.recv_sem = send_sem, recv_sem
        self.current = 0
        self.events: list[tuple[Any, ...]] = []

    @property
    def rank(self) -> Any:
        return jax.lax.axis_index("x")

    def record(self, kind: int, c: int, phase: int, peer: Any, layer: int) -> None:
        """Log one event if it runs in a traced layer (the first ``trace_layers``, the head)."""
        if self.current < self.kernel.trace_layers or self.current == self.kernel.model.num_layers:
            self.events.append((kind, c, phase, peer, layer))

    def log_row(self, words: int) -> jax.Array:
        """int32[1, words]: the events in order, then -1."""
        flat = [jnp.asarray(v, jnp.int32) for event in self.events for v in event]
        flat += [jnp.asarray(-1, jnp.int32)] * (words - len(flat))
        return jnp.stack(flat).reshape(1, words)


def _one_device(model: ModelConfig) -> ShardingPlan:
    from tpusim.workload.model_catalog import plan_for

    return plan_for(model, 1)

