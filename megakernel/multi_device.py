"""The plan's in-kernel collectives on N devices: remote copies and semaphore waits in Pallas.

One ``pallas_call`` per device under ``jax.shard_map`` runs a whole decode step's collective
program (all layers, the head's waits) exactly as the plan places it
(:mod:`megakernel.collective_plan`: issue at the end of the issuing op, wait at the start
of the consumer), every message a ``pltpu.make_async_remote_copy`` into the destination's
VMEM receive slot, every wait a semaphore wait:

- one barrier at kernel entry (each device signals every peer, then waits for all);
- **issue** of collective ``c`` in layer ``l``: the payload goes into ``send[c]``; one remote
  copy per phase-0 message into ``recv[c][l % 2, 0, slot]`` of its destination;
- **wait**: per phase, one receive wait per incoming message; ``one_shot_two_level`` with two
  phases sums the same-host arrivals, issues the host sum to the cross-host peers (phase 1)
  and waits for theirs; then the device waits for its own sends (the send buffer is free).

Receive buffers are double-buffered by the issuing layer's parity: a peer can only issue
layer ``l + 2``'s copy after it has waited for this device's layer ``l + 1`` copy, which this
device issues after consuming layer ``l``'s result, so no copy lands in a slot still being
read. (A single buffer is the planted race of the tests.)

**What runs between the collectives** is not the model's math: each device keeps an
integer-valued f32 accumulator; a payload is ``(acc + 3c + rank + layer) mod 9 - 4`` (bf16,
exact) and a result folds back into ``acc`` modulo 251. Every value is an exact integer, so
:func:`expected_accumulators` (numpy, all ranks in lockstep) predicts the outcome bit for bit
and any lost, duplicated, misrouted or stale message changes it. The event log (an SMEM
output) records each remote copy's issue and each receive wait of the first
``trace_layers`` layers and the head, in program order.
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

from megakernel.collective_plan import (
    SUPPORTED,
    Event,
    kernel_collectives,
    layer_events,
    loop_range,
)
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.sharding import ShardingPlan

ISSUE, WAIT = 0, 1  # event kinds in the log
EVENT_WORDS = 5  # kind, collective index, phase, peer rank (issue) or slot (wait), layer
MOD_PAYLOAD, MOD_ACC = 9, 251


@dataclass(frozen=True)
class Bugs:
    """Deliberate mistakes for the race-detector tests (all off in real runs)."""

    skip_wait: str | None = None  # collective whose receive waits are all skipped (a missing wait)
    single_buffer: bool = False  # receive slots not double-buffered by layer parity

    @classmethod
    def parse(cls, text: str) -> Bugs:
        """The checkers' ``--bug`` value: ``skip_wait:COLLECTIVE``, ``single_buffer`` or ``""``."""
        return cls(skip_wait=text.split(":", 1)[1] if text.startswith("skip_wait:") else None,
                   single_buffer=text == "single_buffer")


def device_mesh(devices: int) -> Any:
    """A 1-D mesh ``("x",)`` over the first ``devices`` JAX devices (virtual ones on a CPU)."""
    from jax.sharding import Mesh

    if len(jax.devices()) < devices:
        raise ValueError(f"{devices} devices needed, JAX sees {len(jax.devices())} "
                         f"(XLA_FLAGS=--xla_force_host_platform_device_count={devices} before JAX starts)")
    return Mesh(np.array(jax.devices()[:devices]), ("x",))


class CollectiveKernel:
    """The collective program of (model, plan, batch) on ``plan.devices`` mesh devices."""

    ALGORITHMS: tuple[str, ...] = SUPPORTED

    def __init__(self, model: ModelConfig, plan: ShardingPlan, batch: int, *, interpret: Any,
                 trace_layers: int = 3, bugs: Bugs = Bugs()) -> None:
        self.model, self.plan, self.batch, self.interpret, self.bugs = model, plan, batch, interpret, bugs
        self.colls = kernel_collectives(plan, batch, self.ALGORITHMS)
        self.index = {c.name: i for i, c in enumerate(self.colls)}
        self.layers, self.head = layer_events(model, plan, batch)
        self.loop = loop_range(self.layers)
        self.trace_layers = trace_layers
        self.width = max(c.elems for c in self.colls)
        self.max_events = EVENT_WORDS * self.events_per_trace()

    def events_per_trace(self) -> int:
        count = sum(self._event_count(e) for layer in self.layers[: self.trace_layers] for e in layer)
        return count + sum(self._event_count(e) for e in self.head)

    def _event_count(self, event: Event) -> int:
        c = self.colls[self.index[event[1]]]
        if event[0] == "issue":
            return c.counts[0]  # one log line per message sent
        return sum(c.counts) + sum(c.counts[1:])  # per message received, and later phases' sends

    # ----------------------------------------------------------------------- the call

    def scratch_shapes(self) -> dict[str, Any]:
        parity = 1 if self.bugs.single_buffer else 2
        return {
            "send": [pltpu.VMEM((c.phases, c.elems), jnp.bfloat16) for c in self.colls],
            "recv": [pltpu.VMEM((parity, c.phases, c.max_count, c.elems), jnp.bfloat16) for c in self.colls],
            "send_sem": [pltpu.SemaphoreType.DMA((c.phases,)) for c in self.colls],
            "recv_sem": [pltpu.SemaphoreType.DMA((parity, c.phases)) for c in self.colls],
            "count": pltpu.SMEM((1,), jnp.int32),
        }

    def tables(self) -> dict[str, np.ndarray]:
        """Per-collective (dst, slot) tables, flattened to int32[ranks, words] for SMEM."""
        rows = [np.concatenate([c.dst.reshape(self.plan.devices, -1), c.slot.reshape(self.plan.devices, -1)], 1)
                for c in self.colls]
        return {"routes": np.concatenate(rows, axis=1).astype(np.int32)}

    def route(self, c: int, phase: int, i: int, field: str) -> int:
        """Column of (collective, phase, message, dst|slot) in the routes table."""
        base = sum(2 * k.phases * k.max_count for k in self.colls[:c])
        coll = self.colls[c]
        return base + (coll.phases * coll.max_count if field == "slot" else 0) + phase * coll.max_count + i

    def call(self) -> Any:
        """``f(routes i32[1, words], acc f32[1, W]) -> (acc, event log)`` per device."""
        return pl.pallas_call(
            self._body,
            out_shape=(jax.ShapeDtypeStruct((1, self.width), jnp.float32),
                       jax.ShapeDtypeStruct((self.max_events,), jnp.int32)),
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pltpu.VMEM)],
            out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.SMEM)),
            scratch_shapes=self.scratch_shapes(),
            compiler_params=pltpu.CompilerParams(collective_id=0),
            interpret=self.interpret,
        )

    @cached_property
    def mesh_fn(self) -> tuple[Any, Any]:
        """(mesh, jitted shard_map of :meth:`call`), built once per kernel."""
        from jax.sharding import PartitionSpec as P

        mesh = device_mesh(self.plan.devices)
        fn = jax.jit(jax.shard_map(lambda r, a: self.call()(r.reshape(-1), a), mesh=mesh,
                                   in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x")), check_vma=False))
        return mesh, fn

    def run(self, acc0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run on ``plan.devices`` devices: ``acc0`` f32[ranks, W] -> (acc f32[ranks, W],
        event log int32[ranks, events, 5])."""
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh, fn = self.mesh_fn
        routes = jax.device_put(jnp.asarray(self.tables()["routes"]), NamedSharding(mesh, P("x")))
        acc = jax.device_put(jnp.asarray(acc0, jnp.float32), NamedSharding(mesh, P("x")))
        out, log = fn(routes, acc)
        return np.asarray(out), np.asarray(log).reshape(self.plan.devices, -1, EVENT_WORDS)

    # ----------------------------------------------------------------------- the body

    def _body(self, routes: Any, acc_in: Any, acc: Any, log: Any, *, send: list, recv: list,
              send_sem: list, recv_sem: list, count: Any) -> None:
        ctx = _Ctx(self, routes, acc, log, send, recv, send_sem, recv_sem, count)
        acc[...] = acc_in[...]
        count[0] = 0
        for i in range(self.max_events):
            log[i] = -1
        self._barrier(ctx)
        first, stop = self.loop
        for layer in range(first):
            self._run_layer(ctx, layer, self.layers[layer])
        jax.lax.fori_loop(first, stop, lambda layer, c: (self._run_layer(ctx, layer, self.layers[first]), c)[1], 0)
        for layer in range(stop, self.model.num_layers):
            self._run_layer(ctx, layer, self.layers[layer])
        self._run_layer(ctx, self.model.num_layers, self.head)

    def _barrier(self, ctx: _Ctx) -> None:
        """Every device signals every peer, then waits for all of them: nobody's remote copy
        lands in a device that has not entered the kernel."""
        n = self.plan.devices
        barrier = pltpu.get_barrier_semaphore()
        for k in range(1, n):
            peer = jax.lax.rem(ctx.rank + k, n)
            pltpu.semaphore_signal(barrier, 1, device_id=(peer,), device_id_type=pltpu.DeviceIdType.MESH)
        pltpu.semaphore_wait(barrier, n - 1)

    def _run_layer(self, ctx: _Ctx, layer: Any, events: list[Event]) -> None:
        ctx.current = layer  # the layer (or head) whose events are running: decides tracing
        for kind, name, delta in events:
            c = self.index[name]
            if kind == "issue":
                self._issue(ctx, c, layer - delta)
            else:
                self._wait(ctx, c, layer - delta)

    def _parity(self, layer: Any) -> Any:
        return 0 if self.bugs.single_buffer else jax.lax.rem(layer, 2)

    def _copy(self, ctx: _Ctx, c: int, phase: int, i: int, layer: Any) -> Any:
        """Descriptor of message ``i`` of ``phase``: ``send[c][phase]`` -> the destination's slot."""
        dst = ctx.routes[self.route(c, phase, i, "dst")]
        slot = ctx.routes[self.route(c, phase, i, "slot")]
        par = self._parity(layer)
        return pltpu.make_async_remote_copy(
            ctx.send[c].at[pl.ds(phase, 1)], ctx.recv[c].at[par, pl.ds(phase, 1), slot],
            ctx.send_sem[c].at[phase], ctx.recv_sem[c].at[par, phase],
            device_id=(dst,), device_id_type=pltpu.DeviceIdType.MESH), dst

    def _issue(self, ctx: _Ctx, c: int, layer: Any, phase: int = 0) -> None:
        coll = self.colls[c]
        if phase == 0:
            n = coll.elems
            payload = jnp.mod(ctx.acc[:, :n] + (3 * c) + ctx.rank.astype(jnp.float32)
                              + jnp.asarray(layer, jnp.float32), MOD_PAYLOAD) - (MOD_PAYLOAD // 2)
            ctx.send[c][pl.ds(0, 1), :] = payload.astype(jnp.bfloat16)
        for i in range(coll.counts[phase]):
            copy, dst = self._copy(ctx, c, phase, i, layer)
            copy.start()
            ctx.record(ISSUE, c, phase, dst, layer)

    def _wait(self, ctx: _Ctx, c: int, layer: Any) -> None:
        coll = self.colls[c]
        par = self._parity(layer)
        own = ctx.send[c][pl.ds(0, 1), :].astype(jnp.float32)
        total = own
        for phase in range(coll.phases):
            count = coll.counts[phase]
            for i in range(count):
                copy, _ = self._copy(ctx, c, phase, i, layer)
                if self.bugs.skip_wait != coll.name:
                    copy.wait_recv()
                ctx.record(WAIT, c, phase, i, layer)
            arrived = ctx.recv[c][par, phase, :count].astype(jnp.float32)  # [count, n]
            if coll.algorithm == "one_shot_two_level":
                total = total + jnp.sum(arrived, axis=0, keepdims=True)
                if phase + 1 < coll.phases:  # the host sum goes to the cross-host peers
                    for i in range(count):
                        self._copy(ctx, c, phase, i, layer)[0].wait_send()
                    ctx.send[c][pl.ds(phase + 1, 1), :] = total.astype(jnp.bfloat16)
                    self._issue(ctx, c, layer, phase + 1)
        for i in range(coll.counts[-1]):
            self._copy(ctx, c, coll.phases - 1, i, layer)[0].wait_send()
        n = coll.elems
        if coll.algorithm == "pair_exchange":
            fold = 2.0 * arrived[0:1] + c
        elif coll.algorithm == "direct_all_gather":
            weights = (jax.lax.broadcasted_iota(jnp.int32, (coll.counts[0], 1), 0) + 1).astype(jnp.float32)
            fold = jnp.sum(weights * arrived, axis=0, keepdims=True) + 11.0 * own
        else:
            fold = 3.0 * total
        ctx.acc[:, :n] = jnp.mod(ctx.acc[:, :n] + fold, MOD_ACC)


@dataclass
class _Ctx:
    """The refs of one kernel invocation and its event recorder."""

    kernel: CollectiveKernel
    routes: Any
    acc: Any
    log: Any
    send: list
    recv: list
    send_sem: list
    recv_sem: list
    count: Any
    current: Any = 0

    @property
    def rank(self) -> Any:
        return jax.lax.axis_index("x")

    def record(self, kind: int, c: int, phase: int, peer: Any, layer: Any) -> None:
        """Append one event of the issuing ``layer`` if it runs in a traced layer (the first
        ``trace_layers`` and the head)."""
        traced = (self.current < self.kernel.trace_layers) | (self.current == self.kernel.model.num_layers)

        def write() -> None:
            base = self.count[0] * EVENT_WORDS
            for k, value in enumerate((kind, c, phase, peer, layer)):
                self.log[base + k] = jnp.asarray(value, jnp.int32)
            self.count[0] = self.count[0] + 1

        if isinstance(traced, bool):
            if traced:
                write()
        else:
            pl.when(traced)(write)


def expected_accumulators(kernel: CollectiveKernel, acc0: np.ndarray) -> np.ndarray:
    """What every rank's accumulator must hold after the step (numpy, all ranks in lockstep:
    results depend only on payloads, never on timing)."""
    acc = np.array(acc0, np.float64)
    ranks = np.arange(kernel.plan.devices)
    payloads: dict[tuple[int, int], np.ndarray] = {}
    sequence = [(layer, events) for layer, events in enumerate(kernel.layers)]
    for layer, events in [*sequence, (kernel.model.num_layers, kernel.head)]:
        for kind, name, delta in events:
            c, coll = kernel.index[name], kernel.colls[kernel.index[name]]
            issued = layer - delta
            if kind == "issue":
                n = coll.elems
                payloads[c, issued] = np.mod(acc[:, :n] + 3 * c + ranks[:, None] + issued, MOD_PAYLOAD) - MOD_PAYLOAD // 2
                continue
            sent = payloads[c, issued]
            folds = []
            for r in ranks:
                peers = [int(m) for m in coll.members[r] if m != r]
                if coll.algorithm == "pair_exchange":
                    folds.append(2.0 * sent[peers[0]] + c)
                elif coll.algorithm == "direct_all_gather":
                    folds.append(sum((i + 1) * sent[p] for i, p in enumerate(peers)) + 11.0 * sent[r])
                else:
                    folds.append(3.0 * sent[coll.members[r]].sum(axis=0))
            acc[:, : coll.elems] = np.mod(acc[:, : coll.elems] + np.stack(folds), MOD_ACC)
    return acc.astype(np.float32)


def planned_log(kernel: CollectiveKernel, rank: int) -> list[tuple[int, int, int, int, int]]:
    """The event log ``rank`` must record, from the plan's message lists
    (:mod:`tpusim.workload.collectives`, what the simulator prices) and the program's
    issue/consume points: per issue one line per message (destination), per wait one line
    per incoming message (and the phase-1 issues of a two-level reduction)."""
    out = []
    traced = [(layer, kernel.layers[layer]) for layer in range(min(kernel.trace_layers, len(kernel.layers)))]
    for layer, events in [*traced, (kernel.model.num_layers, kernel.head)]:
        for kind, name, delta in events:
            c, coll = kernel.index[name], kernel.colls[kernel.index[name]]
            if kind == "issue":
                out += [(ISSUE, c, 0, int(d), layer - delta) for d in coll.dst[rank, 0, : coll.counts[0]]]
                continue
            for phase in range(coll.phases):
                out += [(WAIT, c, phase, i, layer - delta) for i in range(coll.counts[phase])]
                if phase + 1 < coll.phases:
                    sent = coll.dst[rank, phase + 1, : coll.counts[phase + 1]]
                    out += [(ISSUE, c, phase + 1, int(d), layer - delta) for d in sent]
    return out
