"""Collectives as the kernel runs them: remote copies (messages) between ranks, in phases.

A multi-device megakernel does not call a library collective: each core *copies* its piece
straight into a peer's VMEM (an asynchronous remote copy) and signals the peer's semaphore;
the peer waits on that semaphore before it reads the result. This module expands one
collective into those copies. It is pure (no SimPy, no JAX): the engine
(:mod:`tpusim.engine.collectives`) prices the messages on link tracks, and the
multi-device kernel issues the same copies.

Topology (:class:`Topology`, from the sharding plan): ``devices`` ranks, ``devices_per_host``
per host (host = ``rank // devices_per_host``), ``devices_per_chip`` per chip; on a
two-core chip (TPU v7) the sibling core of ``rank`` is ``rank ^ 1``. The link a message
uses (:meth:`Topology.link_kind`): ``sibling`` (the other core of the same chip),
``same_host`` (another chip of the same host) or ``cross_host``.

Groups (who takes part, seen from ``rank``): ``all`` (every rank), ``sibling`` (the pair
``{rank, rank ^ 1}``), ``same_parity`` (ranks with ``r % 2 == rank % 2``: K3's attention
halves), ``host`` (the ranks of ``rank``'s host).

Algorithms, for a payload of ``P`` bytes per rank (``bytes_per_token * batch``), in a group
of ``N`` ranks spread over ``K`` hosts with ``M`` group members per host:

| algorithm | phase 0 (sent by each rank) | phase 1 | messages per rank |
| --- | --- | --- | --- |
| ``pair_exchange`` | ``P`` to the partner (the other rank of a 2-group) | - | 1 |
| ``direct_all_gather`` | ``P`` (own piece) to each of the ``N - 1`` peers | - | ``N - 1`` |
| ``one_shot_two_level`` | ``P`` (own partial) to each same-host member (``M - 1``) | ``P`` (host sum) to the member at the same lane on each other host (``K - 1``) | ``M - 1 + K - 1`` |
| ``reduce_scatter_all_gather`` | ``ceil(P / N)`` (the peer's chunk of own partial) to each of ``N - 1`` | ``ceil(P / N)`` (own reduced chunk) to each of ``N - 1`` | ``2 (N - 1)`` |

``one_shot_two_level`` on one host is a single phase (no cross-host peers); it is the K3
kernel's reduction ("no ring anywhere": one-shot to 7 same-host lanes, then the host sums
across 3 hosts). ``reduce_scatter_all_gather`` is the Muse microbenchmark's all-reduce
(8 cores: 14 messages, 2 phases).

Semaphore rule (:func:`consumer_waits`): a phase's payload is built from what the previous
phase delivered, so phase ``p + 1`` is issued only once every phase-``p`` message *to this
rank* has landed; the consumer of the result waits on one semaphore per phase, for every
message of that phase addressed to it. Every algorithm here is symmetric (each rank sends
what it receives), so the incoming count of a phase equals the outgoing count.

Plan fields (``tpusim/models/plan-*.yaml``, per collective; see
:class:`tpusim.workload.sharding.CollectiveSpec`): ``algorithm``, ``group``, ``after`` (the
op role whose end issues it, or the name of another collective whose completion issues it),
``consumed_by`` (the op role that first reads the result: the compute stream waits only
there) and ``min_batch`` / ``max_batch`` (batch-dependent variants: several entries of one
name with disjoint batch ranges, the plan picks the one matching the batch).

Which algorithm may run which collective (:data:`KIND_ALGORITHMS`, :func:`cannot_run`; the
joint sweep's vocabulary, one rule): a reduction (``all_reduce``, ``reduce_scatter``) by
``one_shot_two_level``, ``reduce_scatter_all_gather`` or ``direct_all_gather`` (every rank
sends its whole partial to every peer and sums locally: a flat one-shot all-reduce; a
reduce-scatter is its result's own share); an ``all_gather`` only by ``direct_all_gather``
(a two-level gather would forward a host's concatenation, ``M`` times the payload, which
the phase-1 message size here does not price); an ``exchange`` by ``pair_exchange`` (a group
of exactly 2) or ``direct_all_gather``.

API (stable: add, do not rename): :class:`Topology`, :class:`Message`, :data:`ALGORITHMS`,
:data:`GROUPS`, :data:`KIND_ALGORITHMS`, :func:`group_ranks`, :func:`messages`,
:func:`incoming`, :func:`phase_count`, :func:`consumer_waits`, :func:`link_stages`,
:func:`buffer_bytes`, :func:`cannot_run`, :func:`same_messages`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

Algorithm = Literal["one_shot_two_level", "direct_all_gather", "pair_exchange", "reduce_scatter_all_gather"]
Group = Literal["all", "sibling", "same_parity", "host"]
LinkKind = Literal["sibling", "same_host", "cross_host"]

ALGORITHMS: tuple[str, ...] = ("one_shot_two_level", "direct_all_gather", "pair_exchange",
                               "reduce_scatter_all_gather")
GROUPS: tuple[str, ...] = ("all", "sibling", "same_parity", "host")
LINK_KINDS: tuple[str, ...] = ("sibling", "same_host", "cross_host")
_REDUCTION = ("one_shot_two_level", "reduce_scatter_all_gather", "direct_all_gather")
KIND_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": _REDUCTION, "reduce_scatter": _REDUCTION,
    "all_gather": ("direct_all_gather",), "exchange": ("pair_exchange", "direct_all_gather"),
}


@dataclass(frozen=True)
class Topology:
    """Where ranks sit: ``devices`` ranks, ``devices_per_host`` per host, ``devices_per_chip``
    per chip (2 on TPU v7: the sibling of ``r`` is ``r ^ 1``)."""

    devices: int
    devices_per_host: int = 8
    devices_per_chip: int = 1

    def __post_init__(self) -> None:
        if self.devices < 1 or self.devices_per_host < 1 or self.devices_per_chip < 1:
            raise ValueError("topology: devices, devices_per_host and devices_per_chip must be >= 1")

    def host(self, rank: int) -> int:
        return rank // self.devices_per_host

    def lane(self, rank: int) -> int:
        """Position of ``rank`` within its host."""
        return rank % self.devices_per_host

    def sibling(self, rank: int) -> int | None:
        """The other core of ``rank``'s chip (``rank ^ 1`` on a two-core chip), else None
        (also when the system uses only one core of the last chip)."""
        return rank ^ 1 if self.devices_per_chip == 2 and (rank ^ 1) < self.devices else None

    def link_kind(self, src: int, dst: int) -> LinkKind:
        """``sibling``, ``same_host`` or ``cross_host``: the link a copy src→dst uses."""
        if src == dst:
            raise ValueError(f"topology: a message from rank {src} to itself")
        if self.sibling(src) == dst:
            return "sibling"
        return "same_host" if self.host(src) == self.host(dst) else "cross_host"


@dataclass(frozen=True)
class Message:
    """One remote copy: ``bytes`` from ``src`` to ``dst`` over ``link``, in ``phase``."""

    src: int
    dst: int
    bytes: int
    link: LinkKind
    phase: int


def group_ranks(group: str, rank: int, topology: Topology) -> tuple[int, ...]:
    """The ranks (``rank`` included, ascending) of ``rank``'s ``group``."""
    _check_rank(rank, topology)
    every = range(topology.devices)
    if group == "all":
        return tuple(every)
    if group == "sibling":
        partner = topology.sibling(rank)
        if partner is None:  # one core per chip: the pair is (2k, 2k + 1) if it exists
            partner = rank ^ 1 if (rank ^ 1) < topology.devices else rank
        return tuple(sorted({rank, partner}))
    if group == "same_parity":
        return tuple(r for r in every if r % 2 == rank % 2)
    if group == "host":
        return tuple(r for r in every if topology.host(r) == topology.host(rank))
    raise ValueError(f"unknown collective group {group!r} (one of {', '.join(GROUPS)})")


def _check_rank(rank: int, topology: Topology) -> None:
    if not 0 <= rank < topology.devices:
        raise ValueError(f"rank {rank} outside 0..{topology.devices - 1}")


def _peers_by_phase(algorithm: str, group: str, rank: int, topology: Topology) -> list[list[int]]:
    """Destinations of ``rank``'s copies, per phase."""
    members = group_ranks(group, rank, topology)
    peers = [r for r in members if r != rank]
    if not peers:
        return []
    if algorithm == "pair_exchange":
        if len(peers) != 1:
            raise ValueError(f"pair_exchange needs a group of 2 ranks, got {len(members)} ({group})")
        return [peers]
    if algorithm == "direct_all_gather":
        return [peers]
    if algorithm == "reduce_scatter_all_gather":
        return [peers, peers]
    if algorithm == "one_shot_two_level":
        host = topology.host(rank)
        local = [r for r in peers if topology.host(r) == host]
        position = [r for r in members if topology.host(r) == host].index(rank)
        remote = []
        for other in sorted({topology.host(r) for r in members} - {host}):
            on_host = [r for r in members if topology.host(r) == other]
            if position < len(on_host):
                remote.append(on_host[position])
        return [phase for phase in (local, remote) if phase]
    raise ValueError(f"unknown collective algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})")


def _message_bytes(algorithm: str, payload_bytes: int, group_size: int) -> int:
    if algorithm == "reduce_scatter_all_gather":
        return -(-payload_bytes // group_size)
    return payload_bytes


@functools.lru_cache(maxsize=8192)  # pure, hashable arguments, immutable result: the engine and the VMEM
def messages(algorithm: str, group: str, payload_bytes: int, rank: int,  # check ask for the same ones often
             topology: Topology) -> tuple[Message, ...]:
    """The copies ``rank`` sends, in phase order (see the module table).

    ``payload_bytes`` is the rank's whole payload (per token bytes x batch). Empty when the
    group has no other member (a one-device system).
    """
    if payload_bytes < 0:
        raise ValueError(f"payload_bytes must be >= 0, got {payload_bytes}")
    phases = _peers_by_phase(algorithm, group, rank, topology)
    size = _message_bytes(algorithm, payload_bytes, len(group_ranks(group, rank, topology)))
    return tuple(Message(rank, dst, size, topology.link_kind(rank, dst), phase)
                 for phase, dsts in enumerate(phases) for dst in dsts)


@functools.lru_cache(maxsize=8192)
def incoming(algorithm: str, group: str, payload_bytes: int, rank: int,
             topology: Topology) -> tuple[Message, ...]:
    """The copies addressed to ``rank`` (every other rank's :func:`messages` with ``dst == rank``)."""
    _check_rank(rank, topology)
    members = group_ranks(group, rank, topology)
    found = []
    for src in members:
        if src == rank:
            continue
        found += [m for m in messages(algorithm, group, payload_bytes, src, topology) if m.dst == rank]
    return tuple(sorted(found, key=lambda m: (m.phase, m.src)))


def phase_count(algorithm: str, group: str, rank: int, topology: Topology) -> int:
    """Phases ``rank`` takes part in (0 when it has no peer)."""
    return len(_peers_by_phase(algorithm, group, rank, topology))


def consumer_waits(algorithm: str, group: str, payload_bytes: int, rank: int,
                   topology: Topology) -> tuple[int, ...]:
    """Semaphore waits of the consumer on ``rank``: per phase, the number of messages
    addressed to ``rank`` it waits for (the consumer may start once all have landed; phase
    ``p + 1`` is issued only after phase ``p``'s waits are met)."""
    counts = [0] * phase_count(algorithm, group, rank, topology)
    for message in incoming(algorithm, group, payload_bytes, rank, topology):
        counts[message.phase] += 1
    return tuple(counts)


def link_stages(algorithm: str, group: str, rank: int, topology: Topology) -> list[tuple[str, int]]:
    """The collective as ``(chip link, peers)`` stages for stage-level pricing (GPU pricers,
    analytic floors): one stage per phase, on ``ici`` unless every copy of the phase goes to
    the sibling core (then ``sibling``)."""
    stages = []
    for dsts in _peers_by_phase(algorithm, group, rank, topology):
        kinds = {topology.link_kind(rank, dst) for dst in dsts}
        stages.append(("sibling" if kinds == {"sibling"} else "ici", len(dsts)))
    return stages


def buffer_bytes(algorithm: str, group: str, payload_bytes: int, rank: int, topology: Topology, *,
                 copies: int) -> int:
    """VMEM (bytes) the kernel keeps on ``rank`` for one collective: its send and receive buffers.

    Layout rule (:class:`megakernel.kernel_collectives.KernelLink` allocates exactly this):
    a send buffer per phase holding the payload (a reduce-scatter's padded to whole chunks:
    group size x message), and per phase one receive slot per incoming message, ``copies``
    times (2 when the collective runs in more than one layer: receive slots double-buffered by
    layer parity, so a fast peer's next-layer copy never lands in a slot still being read).
    0 when the rank has no peer (one device)."""
    sent = messages(algorithm, group, payload_bytes, rank, topology)
    if not sent:
        return 0
    size = sent[0].bytes
    if algorithm == "reduce_scatter_all_gather":
        per_phase = size * len(group_ranks(group, rank, topology))
    else:
        per_phase = payload_bytes
    send = phase_count(algorithm, group, rank, topology) * per_phase
    return send + copies * len(incoming(algorithm, group, payload_bytes, rank, topology)) * size


def cannot_run(algorithm: str, kind: str, group: str, topology: Topology) -> str:
    """Why ``algorithm`` cannot run a ``kind`` collective over ``group`` on ``topology``
    ("" when it can): see the module docstring's vocabulary. Checked for every rank."""
    if algorithm not in ALGORITHMS:
        return f"unknown algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})"
    allowed = KIND_ALGORITHMS.get(kind, ())
    if algorithm not in allowed:
        return f"{algorithm} cannot run a {kind} (one of {', '.join(allowed) or 'none'})"
    for rank in range(topology.devices):
        size = len(group_ranks(group, rank, topology))
        if algorithm == "pair_exchange" and size not in (1, 2):
            return f"pair_exchange needs a group of 2 ranks, group {group} has {size}"
    return ""


def same_messages(first: str, second: str, group: str, topology: Topology) -> bool:
    """Whether two algorithms send the same copies over ``group`` (every rank, two payload
    sizes): ``direct_all_gather`` and ``pair_exchange`` over a pair, say. A search treats
    such choices as one."""
    if first == second:
        return True
    return all(messages(first, group, payload, rank, topology) == messages(second, group, payload, rank, topology)
               for payload in (4096, 4099) for rank in range(topology.devices))
