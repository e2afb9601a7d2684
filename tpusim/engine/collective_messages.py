"""Collectives lowered to remote copies: the messages :class:`~tpusim.engine.collectives.MessageFabric`
prices (the engine side of :mod:`tpusim.workload.collectives`).

:func:`lower_messages` turns one plan collective at one batch into a :class:`MessageCollective`:
per phase, the copies this device sends grouped by link kind (:class:`MessageGroup`: how many
copies, bytes each, the chip link they ride, that link's per-copy and aggregate rates, its latency
and the per-copy issue cost), plus the op that consumes the result
(:func:`consumer_index`). How they are priced: :mod:`tpusim.engine.collectives`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from hwmodels.schema import Chip, LinkSpec
from tpusim.engine.costs import resolve_link
from tpusim.workload.collectives import LINK_KINDS, Topology, messages
from tpusim.workload.program import CollectiveCall, Op
from tpusim.workload.sharding import ShardingPlan

INF = float("inf")
CHIP_LINK_OF = {"sibling": "sibling", "same_host": "ici", "cross_host": "ici"}


@dataclass(frozen=True)
class MessageGroup:
    """``count`` identical copies of ``bytes`` each over chip link ``link``."""

    link: str
    count: int
    bytes: int
    per_copy_bytes_per_s: float
    aggregate_bytes_per_s: float
    latency_s: float
    issue_s: float
    destinations: tuple[int, ...] = ()
    # per-copy rate while this group is alone on its link: min(aggregate / count, per copy),
    # computed as MessageFabric._step computes it (the same float)
    alone_bytes_per_s: float = field(init=False, repr=False, compare=False)
    bytes_float: float = field(init=False, repr=False, compare=False)  # float(bytes): a flow's start

    def __post_init__(self) -> None:
        shared = self.aggregate_bytes_per_s / self.count if self.count else INF
        object.__setattr__(self, "alone_bytes_per_s",
                           shared if shared < self.per_copy_bytes_per_s else self.per_copy_bytes_per_s)
        object.__setattr__(self, "bytes_float", float(self.bytes))


@dataclass(frozen=True)
class MessageCollective:
    """One collective of one op, lowered: its phases of message groups and its consumer."""

    name: str
    phases: tuple[tuple[MessageGroup, ...], ...]
    consumer_index: int  # the op whose start waits for it (len(ops): only the step's end)
    parent: str | None = None  # issued when this collective completes (a chain), else at op end
    # every phase has a group and every group moves at a positive finite rate (or has no
    # bytes): alone on idle links, it is priced by MessageFabric._solo
    solo: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "solo", bool(self.phases) and all(
            phase and all(group.bytes <= 0 or 0.0 < group.alone_bytes_per_s < INF for group in phase)
            for phase in self.phases))


def link_rates(link: LinkSpec) -> tuple[float, float]:
    """(per-copy, aggregate) bytes/s of a chip link: the aggregate is the link's per-device
    figure; one copy rides one of its ``links_per_device`` links."""
    aggregate = link.bandwidth_bytes_per_s_per_direction.value
    return aggregate / link.links_per_device, aggregate


def message_issue_s(link: LinkSpec) -> float:
    """Sender-side cost of issuing one remote copy on ``link`` (0 when not published)."""
    return link.message_issue_s.value if link.message_issue_s is not None else 0.0


def lower_messages(chip: Chip, plan: ShardingPlan, call: CollectiveCall, consumer_index: int,
                   rank: int = 0, cache: dict[Any, Any] | None = None,
                   topology: Topology | None = None) -> MessageCollective | None:
    """``call`` as rank ``rank``'s copies on ``chip``'s links (None: nothing to send or a
    link kind the chip lacks, for which the stage-level pricing is kept). ``cache`` (one
    dict per lowering, i.e. per chip) reuses the priced phases of repeated collectives;
    ``topology`` is ``plan.topology``, passed in by a caller that lowers many calls."""
    spec = call.spec
    assert spec.algorithm is not None
    key = (spec.name, spec.algorithm, spec.group, call.payload_bytes_per_peer, rank, topology or plan.topology)
    if cache is not None and key in cache:
        phases = cache[key]
        return None if phases is None else MessageCollective(spec.name, phases, consumer_index)
    lowered = _lower_phases(chip, plan, call, rank)
    if cache is not None:
        cache[key] = lowered
    return None if lowered is None else MessageCollective(spec.name, lowered, consumer_index)


def _lower_phases(chip: Chip, plan: ShardingPlan, call: CollectiveCall,
                  rank: int) -> tuple[tuple[MessageGroup, ...], ...] | None:
    spec = call.spec
    assert spec.algorithm is not None
    grouped = grouped_phases(spec.algorithm, spec.group, call.payload_bytes_per_peer, rank, plan.topology)
    if not grouped:
        return None
    phases: list[tuple[MessageGroup, ...]] = []
    for phase in grouped:
        groups = []
        for kind, size, destinations in phase:
            link = resolve_link(chip, CHIP_LINK_OF[kind])
            if link is None:
                return None
            per_copy, aggregate = link_rates(link)
            groups.append(MessageGroup(link.name, len(destinations), size, per_copy, aggregate,
                                       link.latency_s.value, message_issue_s(link), destinations))
        phases.append(tuple(groups))
    return tuple(phases)


@lru_cache(maxsize=4096)
def grouped_phases(algorithm: str, group: str, payload_bytes: int, rank: int,
             topology: Topology) -> tuple[tuple[tuple[str, int, tuple[int, ...]], ...], ...]:
    """Rank's copies per phase as ``(link kind, bytes, destinations)`` groups (memoised: a
    program repeats the same few collectives in every layer)."""
    sent = messages(algorithm, group, payload_bytes, rank, topology)
    if not sent:
        return ()
    phases = []
    for phase in range(max(m.phase for m in sent) + 1):
        groups = []
        for kind in LINK_KINDS:
            chosen = [m for m in sent if m.phase == phase and m.link == kind]
            if chosen:
                groups.append((kind, chosen[0].bytes, tuple(m.dst for m in chosen)))
        phases.append(tuple(groups))
    return tuple(phases)


def consumer_index(ops: list[Op], index: int, role: str | None) -> int:
    """The op that consumes a collective issued at op ``index``: the first later op with
    ``role`` (None: the next op); if none, the first op of the next layer (the residual
    stream carries the result); if none, ``len(ops)`` (only the end of the step waits)."""
    if role is None:
        return index + 1
    layer = ops[index].layer
    for later in range(index + 1, len(ops)):
        # the search stops at the next layer's first op: a layer without the consumer (a
        # device that loads no routed expert there) waits at the next layer's start, not at
        # a consumer layers later (which would keep the copy's buffer busy across layers)
        if ops[later].role == role or ops[later].layer != layer:
            return later
    return len(ops)


def groups_on(chip: Chip, phase: tuple[tuple[str, int, tuple[int, ...]], ...]) -> tuple[MessageGroup, ...]:
    groups = []
    for kind, size, destinations in phase:
        link = resolve_link(chip, CHIP_LINK_OF[kind])
        if link is None:
            raise ValueError(f"chip {chip.name} has no link for {kind} copies")
        per_copy, aggregate = link_rates(link)
        groups.append(MessageGroup(link.name, len(destinations), size, per_copy, aggregate,
                                   link.latency_s.value, message_issue_s(link), destinations))
    return tuple(groups)
