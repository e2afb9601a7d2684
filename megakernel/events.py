"""Ordered event traces of the megakernel: recorded from the kernel, and predicted from its plan.

Vocabulary (the simulator's): ``("dma_start" | "dma_wait", family, tensor, layer, chunk)`` and
``("compute", op, layer)``. ``tensor`` is a ring name (``kda.qkvgb``, ``small`` for a layer's
small parameters, ``expert.gate_up`` / ``expert.down``), ``chunk`` the slab index (for an
expert: its entry ``j`` in the layer's distinct-expert list), ``layer`` the model layer
(``num_layers`` for the head). Per op the kernel emits, in this order:

1. the copies the plan starts at this op (table order), then, in the three ops after a
   ``moe.topk``, the next window's copies planned there;
2. ``("compute", op, layer)``;
3. for ``moe.topk``: the expert copies planned at topk, in entry order;
4. the op's own waits, slab by slab, each followed by the refill of its buffer with slab
   ``k + buffers`` (for ``expert[j]``: the refill of entry ``j + slots - 1`` comes in step 1).

:func:`kernel_event_order` records the real order (interpret mode, ``io_callback``,
``ordered=True``). :func:`planned_event_order` derives the same list from the plan and a
routing, so a test can show the kernel issues exactly what the plan says, and the simulator
can compare its own event order against either. State traffic (families ``kda_state`` and
``kv``) appears only in the recorded trace; :func:`weight_events` drops it.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from megakernel.dma_plan import LEAD_IN, Unit, WindowPlan
from megakernel.kernel import Megakernel, prologue_order
from megakernel.kernel_dma import TEMPLATES
from megakernel.math_moe import distinct_experts
from megakernel.reference import DecodeState
from tpusim.schedule.issue_plan import SMALL_RING
from tpusim.workload import registry
from tpusim.workload.registry.names import (
    AttnOp,
    ExpertTensor,
    Family,
    MoeOp,
    StateFamily,
    is_expert_op,
)

Event = tuple[Any, ...]

def _op_waits() -> dict[str, tuple[str, ...]]:
    """Op -> the weight rings it waits for, in read order: the registry's tensors of every
    non-expert op, and the small-parameter row at ``attn.mix_norm`` (its first reader; the
    later readers of a layer's row find it landed)."""
    waits: dict[str, tuple[str, ...]] = {AttnOp.MIX_NORM: (SMALL_RING,)}
    for block in registry.BLOCKS.values():
        waits.update({op.name: op.tensors for op in block.ops if op.tensors and not op.repeated})
    return waits


# Weight rings each op waits for, in the order the op reads them.
OP_READS = _op_waits()


def weight_events(events: list[Event]) -> list[Event]:
    """Drop KDA-state and KV-cache traffic, keeping weight copies and compute events."""
    return [e for e in events if e[0] == "compute" or e[1] not in (StateFamily.KDA_STATE, "kv")]


def kernel_event_order(kernel: Megakernel, hbm: dict[str, jax.Array], embedding: jax.Array,
                       state: DecodeState, tokens: jax.Array) -> list[Event]:
    """Run one step of a kernel built with ``trace=True`` (interpret mode) and return its
    ordered events."""
    if kernel.recorder is None:
        raise ValueError("build the Megakernel with trace=True (and interpret=InterpretParams(...))")
    kernel.recorder.events.clear()
    logits, _ = kernel.jitted_step(hbm, embedding, state, tokens)
    jax.block_until_ready(logits)
    return list(kernel.recorder.events)


def planned_event_order(kernel: Megakernel, routing: np.ndarray) -> list[Event]:
    """The weight events the plan predicts for ``routing`` (int[MoE layers, B, top_k], ids in
    selection order, e.g. from :func:`megakernel.reference.decode_step_with_routing`)."""
    dims, tables, geo = kernel.dims, kernel.tables, kernel.geo
    index = {u: i for i, u in enumerate(tables.units)}
    slots = geo.rings["expert"].buffers
    n = {layer: len(distinct_experts(routing[layer - 1])) for layer in dims.moe_layers}
    out: list[Event] = []

    def template(i: int) -> int:
        return TEMPLATES.index(dims.kinds[i + 1] if i + 1 < dims.num_layers else "head")

    def start(unit: Unit, layers: tuple[int, int]) -> None:
        if unit.ring == "expert":
            for part in (ExpertTensor.GATE_UP, ExpertTensor.DOWN):
                out.append(("dma_start", Family.ROUTED_EXPERT, part, layers[0], unit.slab))
        else:
            out.append(("dma_start", geo.rings[unit.ring].family, unit.ring, layers[unit.delta], unit.slab))

    def planned(plan: WindowPlan, pos: int, layers: tuple[int, int]) -> None:
        due = [u for u, p in plan.issue.items() if p == pos and u in index]  # not refills
        for unit in sorted(due, key=index.__getitem__):
            start(unit, layers)

    def waits(op: str, layer: int) -> None:
        for ring_name in OP_READS.get(op, ()):
            ring = geo.rings[ring_name]
            for k in range(ring.num_slabs):
                out.append(("dma_wait", ring.family, ring_name, layer, k))
                if k + ring.buffers < ring.num_slabs:
                    out.append(("dma_start", ring.family, ring_name, layer, k + ring.buffers))

    def experts_at_topk(i: int) -> None:
        plan = tables.plans[template(i), n[i]]
        for j in range(min(slots, n[i])):
            if plan.issue[Unit("expert", 0, j)] == -len(LEAD_IN):
                start(Unit("expert", 0, j), (i, i + 1))

    def lead_in(op: str, i: int) -> None:
        """Copies of window ``i`` planned in its lead-in op ``op`` (after layer i's topk)."""
        if op in LEAD_IN and op != MoeOp.TOPK:
            planned(tables.plans[template(i), n[i]], LEAD_IN.index(op) - len(LEAD_IN), (i, i + 1))

    prologue = tables.prologue
    for pos, op in enumerate(prologue.ops):
        layer = op.delta
        for unit in sorted((u for u, p in prologue.issue.items() if p == pos),
                           key=lambda u: prologue_order(prologue, index, u)):
            start(unit, (0, 1))
        if layer == 1:
            lead_in(op.name, 1)
        out.append(("compute", op.name, layer))
        if op.name == MoeOp.TOPK:
            experts_at_topk(1)
        waits(op.name, layer)
    for i in range(1, dims.num_layers):
        plan = tables.plans[template(i), n[i]]
        for pos, op in enumerate(plan.ops[len(LEAD_IN):]):
            layer = i + op.delta
            if is_expert_op(op.name):
                planned(plan, pos, (i, i + 1))
                if pos >= 1 and pos + slots - 1 < n[i]:
                    start(Unit("expert", 0, pos + slots - 1), (i, i + 1))
                out.append(("compute", op.name, i))
                for part in (ExpertTensor.GATE_UP, ExpertTensor.DOWN):
                    out.append(("dma_wait", Family.ROUTED_EXPERT, part, i, pos))
                continue
            planned(plan, pos, (i, i + 1))
            if op.delta == 1 and layer < dims.num_layers:
                lead_in(op.name, layer)
            out.append(("compute", op.name, layer))
            if op.name == MoeOp.TOPK and op.delta == 1:
                experts_at_topk(layer)
            waits(op.name, layer)
    return out


def save_routing_trace(routing: np.ndarray, path: Any) -> None:
    """Write a routing as a ``tpusim.workload.routing`` trace file (``{"layers": [[[e, ...], ...], ...]}``)."""
    import json
    from pathlib import Path

    Path(path).write_text(json.dumps({"layers": np.asarray(routing).tolist()}))
