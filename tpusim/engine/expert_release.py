"""Routed experts' issue points: step 3 of :mod:`tpusim.engine.build` for the expert slots.

With an issue plan, each expert slab is attached to the op that issues it, by the schedule's
``expert_issue``: ``after_routing`` when the layer's ``moe.topk`` ends; ``during_selection``
one VPU piece of the top-k per local winner (its copy issued when that piece ends);
``speculative`` at the op ``expert_speculation_ops`` before the router, a mispredicted copy
dropped when ``moe.topk`` ends and the right expert refetched then. An expert whose slot
frees only later is issued at the start of the op the plan names (never mispredicted).
"""

from __future__ import annotations

from tpusim.engine.items import VPU, OpPlan, Piece, Slab
from tpusim.schedule.program_issue import ProgramIssuePlan
from tpusim.schedule.release import selection_fraction
from tpusim.schedule.schema import Schedule
from tpusim.workload.program import Op
from tpusim.workload.registry import ROUTING_OP


def place_expert_releases(plans: list[OpPlan], ops: list[Op], issue: ProgramIssuePlan,
                           layer_experts: dict[int, list[tuple[Slab, Slab | None]]],
                           schedule: Schedule) -> None:
    """Step 3 for routed experts: attach each expert slab to its issue point."""
    for layer, experts in layer_experts.items():
        routing = issue.routing_op.get(layer)
        at_routing: list[tuple[Slab, Slab | None]] = []
        for slab, wasted in experts:
            op_index, by_routing = issue.expert_issue(layer, ops[slab.op_index].expert_index or 0)
            if by_routing:
                at_routing.append((slab, wasted))
                continue
            plans[op_index].start_releases.append(slab)  # issued after routing: never mispredicted
        if not at_routing or routing is None:
            continue
        if schedule.expert_issue == "speculative":
            _speculative_releases(plans, ops, layer, routing, at_routing)
        elif schedule.expert_issue == "after_routing":
            plans[routing].end_releases.extend(slab for slab, _wasted in at_routing)
        else:
            _selection_releases(plans[routing], at_routing)


def _selection_releases(topk_plan: OpPlan, experts: list[tuple[Slab, Slab | None]]) -> None:
    """``during_selection``: the selection's own vector work, one piece per local winner."""
    plain = [piece for piece in topk_plan.pieces if piece.unit == VPU and not (
        piece.waits or piece.frees or piece.releases or piece.writes)]
    rest = [piece for piece in topk_plan.pieces if piece not in plain]
    total = sum(piece.duration_s for piece in plain)
    topk_plan.pieces = rest + [Piece(total * share, VPU, (), (), (slab,))
                               for share, (slab, _wasted) in zip(_shares(len(experts)), experts, strict=True)]


_SHARES: dict[int, tuple[float, ...]] = {}


def _shares(n: int) -> tuple[float, ...]:
    """Per winner ``k`` of ``n``, the share of the selection's work between winner ``k - 1``
    and winner ``k`` (:func:`~tpusim.schedule.release.selection_fraction`); the same ``n``
    recurs in every layer."""
    shares = _SHARES.get(n)
    if shares is None:
        shares = _SHARES[n] = tuple(selection_fraction(k, n) - (selection_fraction(k - 1, n) if k else 0.0)
                                    for k in range(n))
    return shares


def _speculative_releases(plans: list[OpPlan], ops: list[Op], layer: int, issue_index: int,
                          experts: list[tuple[Slab, Slab | None]]) -> None:
    """``speculative``: issued ahead of routing; a miss is refetched when ``moe.topk`` ends."""
    topk_plan = next(plans[i] for i in range(issue_index, len(ops)) if ops[i].layer == layer
                     and ops[i].role == ROUTING_OP)
    for slab, wasted in experts:
        if wasted is not None:
            plans[issue_index].start_releases.append(wasted)
            topk_plan.resolves.append(wasted)
            topk_plan.end_releases.append(slab)
        else:
            plans[issue_index].start_releases.append(slab)
