"""Where the kernel issues and waits each in-kernel collective: read off the simulator's program.

The simulator's per-device program (:func:`tpusim.workload.program.build_program`) lists each
op with the collectives it issues at its end, and :func:`tpusim.engine.collective_messages.consumer_index`
names the op whose start waits for each one (the plan's ``consumed_by``). This module turns
that into the kernel's event sequence, so the kernel and the simulator issue and wait at the
same points by construction of one source, and the test of the recorded trace checks that
the kernel really ran them there:

- ``("issue", name, delta)`` at the end of the op that issues ``name``, or, for a collective
  the plan issues ``after`` another one (``attn.half_gather`` after ``attn.partial_reduce``),
  right after that one's wait: its payload is the other's result;
- ``("wait", name, delta)`` at the start of its consumer (``delta`` = layers back to the
  issuing layer: a consumer in the next layer waits for the previous layer's copy).

Messages (who sends what to whom, per phase) come from :mod:`tpusim.workload.collectives`,
the one owner of the message list the engine also prices. :func:`rank_tables` lays them out
as int tables indexed by rank (the kernel reads its row with its own mesh index).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tpusim.engine.collective_messages import consumer_index
from tpusim.workload.collectives import group_ranks, incoming, messages, phase_count
from tpusim.workload.kernel_support import KERNEL_ALGORITHMS
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import build_program
from tpusim.workload.routing import RoutingModel
from tpusim.workload.sharding import ShardingPlan

# the algorithms the decode and collective megakernels run: one owner, tpusim.workload.kernel_support
DECODE_SUPPORTED = KERNEL_ALGORITHMS
# the transport-only CollectiveKernel (megakernel.multi_device) runs all but the reduce-scatter
SUPPORTED = tuple(a for a in KERNEL_ALGORITHMS if a != "reduce_scatter_all_gather")
Event = tuple[str, str, int]  # (issue | wait, collective name, layers back to the issuing layer)


class UnsupportedPlan(ValueError):
    """The plan uses something the multi-device kernel does not run (message says what)."""


@dataclass(frozen=True)
class KernelCollective:
    """One collective as the kernel runs it, for every rank of the plan."""

    name: str
    algorithm: str
    group: str
    kind: str  # all_reduce | reduce_scatter | all_gather | exchange (tpusim.workload.collectives)
    elems: int  # bf16 payload elements each rank contributes (bytes per token x batch / 2)
    phases: int
    counts: tuple[int, ...]  # messages each rank sends (and receives) per phase, the same for every rank
    dst: np.ndarray  # int32[ranks, phases, max count]: destination rank of each message
    slot: np.ndarray  # int32[ranks, phases, max count]: receive slot of the message at its destination
    members: np.ndarray  # int32[ranks, group size]: each rank's group, ascending

    @property
    def reduces(self) -> bool:
        """A reduction: its result is the members' payloads summed (by any algorithm)."""
        return self.kind in ("all_reduce", "reduce_scatter")

    @property
    def max_count(self) -> int:
        return max(self.counts)


def kernel_collectives(plan: ShardingPlan, batch: int,
                       supported: tuple[str, ...] = SUPPORTED) -> list[KernelCollective]:
    """The plan's collectives at ``batch`` in plan order, expanded for every rank."""
    topo = plan.topology
    out = []
    for spec in plan.collectives_at(batch):
        algorithm, group = spec.algorithm, spec.group
        if algorithm not in supported:
            raise UnsupportedPlan(f"collective {spec.name}: algorithm {algorithm} is not run in the kernel "
                                  f"(supported: {', '.join(supported)})")
        payload = spec.bytes_per_token * batch
        if payload % 2:
            raise UnsupportedPlan(f"collective {spec.name}: {payload} B is not a whole number of bf16 values")
        ranks = range(plan.devices)
        phases = {phase_count(algorithm, group, r, topo) for r in ranks}
        sent = {(r, p): [m for m in messages(algorithm, group, payload, r, topo) if m.phase == p]
                for r in ranks for p in range(max(phases))}
        n_phases = max(phases)
        counts = tuple(len(sent[0, p]) for p in range(n_phases))
        if len(phases) != 1 or any(len(sent[r, p]) != counts[p] for r in ranks for p in range(n_phases)):
            raise UnsupportedPlan(f"collective {spec.name}: ranks send different message counts")
        dst = np.zeros((plan.devices, n_phases, max(counts)), np.int32)
        slot = np.zeros_like(dst)
        arrivals = {r: incoming(algorithm, group, payload, r, topo) for r in ranks}  # once per rank: 32^2 messages
        for r in ranks:
            for p in range(n_phases):
                for i, m in enumerate(sent[r, p]):
                    sources = [a.src for a in arrivals[m.dst] if a.phase == p]
                    dst[r, p, i], slot[r, p, i] = m.dst, sources.index(r)
        members = np.array([group_ranks(group, r, topo) for r in ranks], np.int32)
        out.append(KernelCollective(spec.name, algorithm, group, spec.kind, payload // 2, n_phases, counts,
                                    dst, slot, members))
    return out


def layer_events(model: ModelConfig, plan: ShardingPlan, batch: int) -> tuple[list[list[Event]], list[Event]]:
    """-> (events of each layer, events of the head), from the simulator's program of rank 0."""
    layers, head = layer_steps(model, plan, batch)
    return [[e for e in steps if e[0] != "op"] for steps in layers], [e for e in head if e[0] != "op"]


def layer_steps(model: ModelConfig, plan: ShardingPlan, batch: int) -> tuple[list[list[Event]], list[Event]]:
    """-> (steps of each layer, steps of the head): the program's ops as ``("op", name, 0)``
    with every layer's collective events between them (waits before the consumer op, issues
    after the issuing op), in program order: what the decode kernel walks."""
    with tempfile.TemporaryDirectory() as folder:
        # every row picks experts 0, 2, 4, ...: rank 0 loads one expert in every MoE layer,
        # so all MoE layers have one event sequence (the kernel's loop body)
        trace = Path(folder) / "routing.json"
        trace.write_text(json.dumps({"layers": [[list(range(0, 2 * model.moe.top_k, 2))]]}))
        program = build_program(model, plan, batch=batch, context_tokens=16, device_view=0,
                                routing=RoutingModel("trace", trace_path=trace))
    ops = program.ops
    at: dict[int, list[Event]] = {}
    names = {spec.name for spec in plan.collectives_at(batch)}
    for i, op in enumerate(ops):
        for call in op.collectives:  # plan order: a collective follows the one it is issued after
            consumer = consumer_index(ops, i, call.spec.consumed_by)
            wait = ("wait", call.spec.name, op.layer)
            if call.spec.after in names:  # issued when that collective completes: right after its wait
                parent = at[2 * consumer_index(ops, i, _spec_of(op, call.spec.after).consumed_by)]
                parent.insert(parent.index(("wait", call.spec.after, op.layer)) + 1,
                              ("issue", call.spec.name, op.layer))
            else:
                at.setdefault(2 * i + 1, []).append(("issue", call.spec.name, op.layer))
            at.setdefault(2 * consumer, []).append(wait)
    for i, op in enumerate(ops):
        at.setdefault(2 * i, []).append(("op", op.name, op.layer))  # after the waits at its start
    layers: list[list[Event]] = [[] for _ in range(model.num_layers)]
    head: list[Event] = []
    for point in sorted(at):
        index = point // 2
        layer = ops[index].layer if index < len(ops) else -1
        for kind, name, issued in at[point]:
            if kind == "op":
                (head if layer < 0 else layers[layer]).append((kind, name, 0))
            elif layer < 0:
                head.append((kind, name, model.num_layers - issued))
            else:
                layers[layer].append((kind, name, layer - issued))
    return layers, head


def _spec_of(op: object, name: str) -> object:
    """The collective spec ``name`` among the ones ``op`` issues."""
    return next(call.spec for call in op.collectives if call.spec.name == name)  # type: ignore[attr-defined]


def loop_range(layers: list[list[Event]]) -> tuple[int, int]:
    """The longest run ``[a, b)`` of layers with the same event sequence (the kernel's loop)."""
    best = (0, 1)
    start = 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or layers[i] != layers[start]:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = i
    return best
