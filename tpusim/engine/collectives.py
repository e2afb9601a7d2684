"""Collectives as remote copies on link tracks: the engine side of
:mod:`tpusim.workload.collectives`.

Lowering (:func:`tpusim.engine.collective_messages.lower_messages`) turns one plan collective at one batch into a
:class:`MessageCollective`: per phase, the copies this device sends grouped by link kind
(:class:`MessageGroup`: how many copies, bytes each, the chip link they ride, that link's
per-copy and aggregate rates, its latency and the per-copy issue cost), plus the op that
consumes the result. The simulation (:class:`MessageFabric`) prices them:

1. **Issue.** The sender issues a phase's copies back to back, ``message_issue_s`` each
   (a remote DMA descriptor); a group starts moving bytes once its last copy is issued
   (groups in plan order: sibling, same-host, cross-host).
2. **Transfer.** Bytes flow as a fluid that shares each chip link among every copy in
   flight on it: each copy moves at ``min(per-copy rate, aggregate rate / copies in flight)``
   (ICI: 45 GB/s to one peer, 134 GB/s over the three links; the sibling link: one copy).
   Copies of different collectives in flight at once slow each other down.
3. **Landing.** A copy lands ``latency_s`` after its last byte left (the semaphore signal
   included). Every algorithm is symmetric, so what this device *receives* in a phase lands
   when what it sends lands: phase ``p + 1`` is issued when phase ``p`` has landed (its
   payload is the received sum; the small VPU sum is not charged), and the collective is
   complete when its last phase has landed.
4. **Chains.** A collective issued after another (``after`` naming a collective: the K3
   sibling gather of the reduced half) is issued when the stream has *waited* for that one
   (:meth:`MessageFabric.wait`): its payload is the parent's result, which a core knows only
   by waiting on the parent's semaphores in its instruction stream, as the kernel does. Were
   the parent consumed ops after it completes, issuing the child at the parent's landing
   would be optimistic.
5. **Consumer.** The compute stream waits only when it reaches the consuming op
   (``consumed_by``): :meth:`MessageFabric.complete_s` runs the fluid forward until the
   collective is complete. This is exact, not an approximation of the order of events: the
   stream is the only issuer and it is blocked while the fabric runs ahead, so no copy can
   join the links in that window.

Cost per event is a few list operations over the groups in flight (copies of one group
move in lockstep, so a group of 31 copies is one entry), which keeps a K3 step (93 layers,
≈ 20 message groups per layer) to a few milliseconds of engine time.

Trace: with a recorder each copy is one interval ``issue → landing`` on a track
``link <chip link> <lane>`` (lanes assigned greedily at the end so intervals in one
track never overlap), labelled ``<collective> p<phase> →r<dst>``.

Compiled (``setup.py``), ``Handle``, ``_Flow`` and ``MessageFabric`` take C fields from
``collectives.pxd``: a new attribute is declared there too.
"""

from __future__ import annotations

import heapq
import math

from hwmodels.schema import Chip
from tpusim.engine.collective_messages import (
    MessageCollective,
    MessageGroup,
    grouped_phases,
    groups_on,
)
from tpusim.engine.timeline import Recorder
from tpusim.workload.collectives import Topology

INF = float("inf")
heappush, heappop = heapq.heappush, heapq.heappop
DRAINED_BYTES = 1e-6  # float residue of a flow's byte count that counts as drained


class _Flow:
    """A group in flight: its copies move in lockstep."""

    __slots__ = ("group", "handle", "left_bytes", "phase", "start_s")

    def __init__(self, group: MessageGroup, handle: Handle, phase: int, start_s: float) -> None:
        self.group = group
        self.handle = handle
        self.phase = phase
        self.start_s = start_s
        self.left_bytes = group.bytes_float


class Handle:
    """One issued collective: its progress and, once known, its completion time."""

    __slots__ = ("children", "done_s", "groups_left", "layer", "parent", "phase", "phase_land_s", "plan", "waited")

    def __init__(self, plan: MessageCollective, parent: Handle | None = None, layer: int = 0) -> None:
        self.plan = plan
        self.phase = -1
        self.groups_left = 0
        self.phase_land_s = 0.0
        self.done_s: float | None = None
        self.children: tuple[Handle, ...] = ()  # chained collectives (few: a tuple made when one is)
        self.parent = parent
        self.waited = False  # the stream has waited for it (its chained children may issue)
        self.layer = layer  # the issuing op's layer (events)


class MessageFabric:
    """The links as shared fluid servers (see the module docstring)."""

    def __init__(self, recorder: Recorder | None = None, *, solo: bool = True) -> None:
        self.now_s = 0.0
        # a collective issued on idle links, its copies not yet queued, and its issue time
        # (solo pricing, :meth:`_solo`; not with a recorder, nor in the reference, solo=False)
        self.lazy = solo and recorder is None
        self.pending: Handle | None = None
        self.pending_s = 0.0
        self.active: dict[str, list[_Flow]] = {}
        self.flowing = 0  # flows in ``active``
        self.solo: _Flow | None = None  # the one flow in ``active`` when flowing == 1
        self.starts: list[tuple[float, int, _Flow]] = []  # heap of flows waiting to start
        self.sequence = 0
        self.busy_s: dict[str, float] = {}
        self.last_land_s = 0.0
        self.recorder = recorder
        self.spans: list[tuple[str, float, float, str]] = []  # (link, issue, land, label)
        self.unwaited_parents: list[Handle] = []  # parents of chains, for finish()

    # ----------------------------------------------------------------- issuing
    def issue(self, plan: MessageCollective, time_s: float, parent: Handle | None = None, layer: int = 0) -> Handle:
        """Issue ``plan`` at ``time_s``, or, chained behind ``parent``, when the stream has
        waited for the parent (:meth:`wait`); returns its handle."""
        handle = Handle(plan, parent, layer)
        if parent is not None:
            parent.children = (*parent.children, handle)
            if parent.waited:
                assert parent.done_s is not None
                self._first_phase(handle, max(time_s, parent.done_s))
            else:
                self.unwaited_parents.append(parent)
            return handle
        if self.pending is not None and not (self.now_s < time_s and self._solo(self.pending, time_s) is not None):
            self._materialize()  # (else the pending one ran its course before time_s: the links are idle)
        if self.lazy and not self.flowing and not self.starts and plan.solo:
            if time_s > self.now_s:  # advance_to on idle links
                self.now_s = time_s
            self.pending, self.pending_s = handle, time_s  # alone on idle links: priced when waited for
            return handle
        self.advance_to(time_s)
        self._start_phase(handle, 0, time_s)
        return handle

    def _first_phase(self, handle: Handle, time_s: float) -> None:
        """:meth:`_start_phase` of ``handle``'s first phase at ``time_s`` (a chain's, issued by
        the wait on its parent): held pending instead where the links are idle (:meth:`issue`)."""
        if self.pending is None and self.lazy and not self.flowing and not self.starts and handle.plan.solo:
            self.pending, self.pending_s = handle, time_s
        else:
            self._start_phase(handle, 0, time_s)

    def _materialize(self) -> None:
        """The pending collective's first phase queued, as :meth:`issue` would have queued it
        (nothing touched the links since: every other entry point comes here first)."""
        handle, self.pending = self.pending, None
        assert handle is not None
        self._start_phase(handle, 0, self.pending_s)

    def _solo(self, handle: Handle, before_s: float = INF) -> float | None:
        """:meth:`complete_s` of the pending collective alone on idle links from its issue to
        its completion (nothing was issued in between: that would have queued it first): the
        operations :meth:`complete_s`, :meth:`_start_flows`, :meth:`_drained` and
        :meth:`_start_phase` do, on the same floats in the same order (the same clock, busy
        time, landing times and sequence numbers), without flows, the start heap or a call per
        step (a K3 step issues ~740 collectives, one at a time). A phase whose groups' flows
        would move at once (the shared step) is left to those methods: None, nothing changed
        (the busy time and the links' entries are written only at the end).

        ``before_s`` (another collective issued then, the links' clock before it): priced only if
        every step ends before it, so that :meth:`advance_to` up to it would take the same steps
        (none cut at ``before_s``) and leave the links idle; else None, nothing changed."""
        busy_steps: list[tuple[str, float]] = []
        links: list[str] = []  # the links joined, in order (``active`` gains an entry at the first)
        ulp = math.ulp
        last_land_s = self.last_land_s
        now_s = self.now_s
        phase_start_s = phase_land_s = self.pending_s
        phases = handle.plan.phases
        for groups in phases:
            phase_land_s = phase_start_s  # _start_phase: a group starts once its last copy is issued
            starts: list[float] = []
            issued_s = phase_start_s
            for group in groups:
                issued_s += group.count * group.issue_s
                starts.append(issued_s)
            count = left = len(groups)  # groups in the phase; not yet drained
            ahead = 0  # the next group to start
            moving: MessageGroup | None = None  # the group whose flow moves (at most one)
            left_bytes = rate = 0.0
            while left:  # complete_s's loop over this phase
                if moving is None:  # nothing moving: to the next flow's start
                    now_s = starts[ahead]
                    if now_s >= before_s:
                        return None
                else:  # one flow moving: to its finish or the next start
                    next_s = starts[ahead] if ahead < count else INF
                    finish_s = now_s + left_bytes / rate
                    if finish_s < next_s:
                        next_s = finish_s
                    if next_s >= before_s:
                        return None
                    elapsed = next_s - now_s
                    if elapsed > 0.0:
                        left_bytes -= rate * elapsed
                        busy_steps.append((moving.link, elapsed))
                    now_s = next_s
                    drained_bytes = rate * ulp(next_s)
                    if not drained_bytes > DRAINED_BYTES:
                        drained_bytes = DRAINED_BYTES
                    if left_bytes <= drained_bytes:  # _drained
                        land_s = now_s + moving.latency_s
                        if land_s > last_land_s:
                            last_land_s = land_s
                        if land_s > phase_land_s:
                            phase_land_s = land_s
                        left -= 1
                        moving = None
                while ahead < count and starts[ahead] <= now_s:  # _start_flows
                    group = groups[ahead]
                    ahead += 1
                    if group.bytes <= 0:  # _drained at once
                        land_s = now_s + group.latency_s
                        if land_s > last_land_s:
                            last_land_s = land_s
                        if land_s > phase_land_s:
                            phase_land_s = land_s
                        left -= 1
                    elif moving is not None:
                        return None  # two flows at once: the shared step's, by the general path
                    else:
                        moving, left_bytes, rate = group, group.bytes_float, group.alone_bytes_per_s
                        if group.link not in links:
                            links.append(group.link)
            phase_start_s = phase_land_s
        self.pending = None
        active, busy = self.active, self.busy_s
        for link in links:
            if link not in active:
                active[link] = []  # (the list a drained flow leaves)
        for link, elapsed in busy_steps:
            busy[link] = busy.get(link, 0.0) + elapsed
        sequence = self.sequence
        for groups in phases:  # (a loop, not sum(generator): no closure when compiled)
            sequence += len(groups)
        self.sequence = sequence
        self.now_s = now_s
        self.last_land_s = last_land_s
        handle.phase = len(phases) - 1
        handle.groups_left = 0
        handle.phase_land_s = handle.done_s = phase_land_s
        return phase_land_s

    def _start_phase(self, handle: Handle, phase: int, time_s: float) -> None:
        if self.pending is not None:
            self._materialize()
        groups = handle.plan.phases[phase]
        handle.phase = phase
        handle.groups_left = len(groups)
        handle.phase_land_s = time_s
        issued_s, sequence, starts = time_s, self.sequence, self.starts
        for group in groups:
            issued_s += group.count * group.issue_s
            sequence += 1
            heappush(starts, (issued_s, sequence, _Flow(group, handle, phase, time_s)))
        self.sequence = sequence

    # ----------------------------------------------------------------- the fluid
    def _step(self, limit_s: float) -> bool:
        """Advance to the next event or ``limit_s``, whichever is first; False when idle.

        At most one flow moving (every step of a K3 step: one collective in flight at a
        time, one group at a time): :meth:`_step_shared`'s arithmetic on that flow alone,
        without the walk over the links."""
        if self.flowing > 1:
            return self._step_shared(limit_s)
        now_s = self.now_s
        starts = self.starts
        next_s = starts[0][0] if starts else INF
        flow = self.solo
        if flow is not None:
            rate = flow.group.alone_bytes_per_s
            finish_s = now_s + flow.left_bytes / rate
            if finish_s < next_s:
                next_s = finish_s
        elif next_s == INF:
            self.now_s = max(now_s, limit_s) if limit_s < INF else now_s
            return False
        target = limit_s if limit_s < next_s else next_s
        if flow is not None:
            elapsed = target - now_s
            if elapsed > 0.0:
                flow.left_bytes -= rate * elapsed
                busy, link = self.busy_s, flow.group.link
                busy[link] = busy.get(link, 0.0) + elapsed
        self.now_s = target
        if target < next_s:
            return True
        if flow is not None:
            drained_bytes = rate * math.ulp(target)  # as in _step_shared
            if not drained_bytes > DRAINED_BYTES:
                drained_bytes = DRAINED_BYTES
            if flow.left_bytes <= drained_bytes:
                self.active[flow.group.link] = []
                self.flowing, self.solo = 0, None
                self._drained(flow)
        if starts and starts[0][0] <= target:
            self._start_flows(target)
        return True

    def _step_shared(self, limit_s: float) -> bool:
        """:meth:`_step` with two or more flows moving (links shared, or several links)."""
        now_s = self.now_s
        starts = self.starts
        next_s = starts[0][0] if starts else INF
        moving: list[tuple[str, list[_Flow], float]] = []  # (link, its flows, per-copy rate)
        # min(a, b) written as ``b if b < a else a`` (the same value, ties and signed zeros
        # included) in this loop: it runs thousands of times per step
        for link, flows in self.active.items():
            if not flows:
                continue
            if len(flows) == 1:  # alone on its link (most steps): its group's rate, precomputed
                flow = flows[0]
                rate = flow.group.alone_bytes_per_s
                finish_s = now_s + flow.left_bytes / rate
            else:
                group = flows[0].group
                per_copy = group.per_copy_bytes_per_s
                shared = group.aggregate_bytes_per_s / sum(flow.group.count for flow in flows)
                rate = shared if shared < per_copy else per_copy
                finish_s = now_s + min(flow.left_bytes for flow in flows) / rate
            moving.append((link, flows, rate))
            if finish_s < next_s:
                next_s = finish_s
        if next_s == INF:
            self.now_s = max(now_s, limit_s) if limit_s < INF else now_s
            return False
        target = limit_s if limit_s < next_s else next_s
        elapsed = target - now_s
        if elapsed > 0.0:
            busy = self.busy_s
            for link, flows, rate in moving:
                moved = rate * elapsed
                for flow in flows:
                    flow.left_bytes -= moved
                busy[link] = busy.get(link, 0.0) + elapsed
        self.now_s = target
        if target < next_s:
            return True
        if moving:
            ulp = math.ulp(target)
            for link, flows, rate in moving:
                # Drained: a residue of float rounding, or one the link would move in less than one
                # tick of the clock (the float spacing at now). Such a flow cannot advance the clock:
                # left waiting, it would be stepped forever (a few µB at 663 GB/s at t = 16 ms).
                drained_bytes = rate * ulp
                if not drained_bytes > DRAINED_BYTES:  # max(DRAINED_BYTES, ...)
                    drained_bytes = DRAINED_BYTES
                if len(flows) == 1:
                    flow = flows[0]
                    if flow.left_bytes <= drained_bytes:
                        self.active[link] = []
                        self._left(1)
                        self._drained(flow)
                    continue
                done = [flow for flow in flows if flow.left_bytes <= drained_bytes]
                if done:
                    self.active[link] = [flow for flow in flows if flow.left_bytes > drained_bytes]
                    self._left(len(done))
                    for flow in done:
                        self._drained(flow)
        if starts and starts[0][0] <= target:
            self._start_flows(target)
        return True

    def _left(self, count: int) -> None:
        """``count`` flows left ``active``: the count, and the one flow left, if one is."""
        self.flowing -= count
        self.solo = next(flow for flows in self.active.values() for flow in flows) if self.flowing == 1 else None

    def _start_flows(self, time_s: float) -> None:
        """Flows whose copies are issued by ``time_s`` join their links."""
        starts = self.starts
        while starts and starts[0][0] <= time_s:
            flow = heappop(starts)[2]
            if flow.group.bytes <= 0:
                self._drained(flow)
            else:
                active = self.active.get(flow.group.link)
                if active is None:
                    self.active[flow.group.link] = [flow]
                else:
                    active.append(flow)
                self.flowing += 1
                self.solo = flow if self.flowing == 1 else None

    def _drained(self, flow: _Flow) -> None:
        handle, group = flow.handle, flow.group
        land_s = self.now_s + group.latency_s
        if land_s > self.last_land_s:  # max(), as in _step
            self.last_land_s = land_s
        if self.recorder is not None:
            for dst in group.destinations or (-1,) * group.count:
                self.spans.append((group.link, flow.start_s, land_s, f"{handle.plan.name} p{flow.phase} →r{dst}"))
        if land_s > handle.phase_land_s:
            handle.phase_land_s = land_s
        handle.groups_left -= 1
        if handle.groups_left:
            return
        if handle.phase + 1 < len(handle.plan.phases):
            self._start_phase(handle, handle.phase + 1, handle.phase_land_s)
            return
        handle.done_s = handle.phase_land_s

    def advance_to(self, time_s: float) -> None:
        """Run the fluid up to ``time_s`` (nothing new is issued before it)."""
        if self.pending is not None:
            self._materialize()
        if not self.flowing and not self.starts:  # idle (most issues): only the clock moves, as _step moves it
            if time_s > self.now_s:
                self.now_s = time_s
            return
        while self.now_s < time_s and self._step(time_s):
            pass
        self.now_s = max(self.now_s, time_s)

    def complete_s(self, handle: Handle) -> float:
        """When ``handle``'s collective completes (runs the fluid as far as needed).

        ``_step(INF)`` until done; with at most one flow moving (every step of a K3 step),
        its arithmetic is inlined here: the same operations on the same floats, in order;
        the pending collective alone on idle links is priced by :meth:`_solo`."""
        if handle.done_s is not None:  # (the loop below would not run: nothing to queue either)
            return handle.done_s
        if self.pending is not None:
            if self.pending is handle:
                done_s = self._solo(handle)
                if done_s is not None:
                    return done_s
            self._materialize()
        starts, busy = self.starts, self.busy_s
        while handle.done_s is None:
            if self.flowing > 1:
                if not self._step_shared(INF):
                    self._never(handle)
                continue
            now_s = self.now_s
            next_s = starts[0][0] if starts else INF
            flow = self.solo
            if flow is None:  # nothing moving: to the next flow's start
                if next_s == INF:
                    self._never(handle)
                self.now_s = next_s
                self._start_flows(next_s)
                continue
            group = flow.group
            rate = group.alone_bytes_per_s
            finish_s = now_s + flow.left_bytes / rate
            if finish_s < next_s:
                next_s = finish_s
            elapsed = next_s - now_s  # target = next_s (no limit)
            if elapsed > 0.0:
                flow.left_bytes -= rate * elapsed
                link = group.link
                busy[link] = busy.get(link, 0.0) + elapsed
            self.now_s = next_s
            drained_bytes = rate * math.ulp(next_s)  # as in _step
            if not drained_bytes > DRAINED_BYTES:
                drained_bytes = DRAINED_BYTES
            if flow.left_bytes <= drained_bytes:
                self.active[group.link] = []
                self.flowing, self.solo = 0, None
                self._drained(flow)
            if starts and starts[0][0] <= next_s:
                self._start_flows(next_s)
        return handle.done_s

    @staticmethod
    def _never(handle: Handle) -> None:
        waiting = " (a chain issues only after a wait on its parent)" if handle.phase < 0 else ""
        raise RuntimeError(f"collective {handle.plan.name} can never complete{waiting}")

    def wait(self, handle: Handle, at_s: float) -> tuple[float, list[Handle]]:
        """The stream waits for ``handle`` from ``at_s``: (its completion time, the chained
        collectives this wait issues, at ``max(at_s, completion)``). An unwaited parent is
        waited first (the kernel cannot issue the chain otherwise)."""
        issued: list[Handle] = []
        if handle.parent is not None and not handle.parent.waited:
            parent_done, issued = self.wait(handle.parent, at_s)
            at_s = max(at_s, parent_done)
        done_s = self.complete_s(handle)
        if not handle.waited:
            handle.waited = True
            for child in handle.children:
                if child.phase < 0:
                    self._first_phase(child, max(at_s, done_s))
                    issued.append(child)
        return done_s, issued

    def finish(self) -> float:
        """Run everything in flight to completion, chains whose parent nobody waited for
        issued at the parent's landing; returns the last landing time."""
        if self.pending is not None:
            self._materialize()
        pending = True
        while pending:
            while self._step(INF):
                pass
            pending = False
            for handle in self.unwaited_parents:
                if not handle.waited and handle.done_s is not None:
                    handle.waited = pending = True
                    for child in handle.children:
                        self._start_phase(child, 0, handle.done_s)
        if self.recorder is not None:
            self._record()
        return self.last_land_s

    def _record(self) -> None:
        """Each copy on a lane of its link's tracks (greedy interval colouring by issue time)."""
        assert self.recorder is not None
        lanes: dict[str, list[float]] = {}
        for link, start, end, label in sorted(self.spans, key=lambda span: (span[1], span[2], span[3])):
            free = lanes.setdefault(link, [])
            lane = next((i for i, until in enumerate(free) if until <= start), len(free))
            if lane == len(free):
                free.append(end)
            else:
                free[lane] = end
            self.recorder.interval(f"link {link} {lane}", start, end, label)


def isolated_time_s(chip: Chip, phases: list[list[tuple[str, int, int]]]) -> float:
    """Seconds from issue to landing of copies on idle links, as a microbenchmark times them:
    ``phases`` lists per phase ``(link kind, bytes per copy, copies)`` (e.g. one sibling copy
    of 256 KiB: ``[[("sibling", 262144, 1)]]``)."""
    lowered = tuple(groups_on(chip, tuple((kind, size, tuple(range(count))) for kind, size, count in phase))
                    for phase in phases)
    fabric = MessageFabric()
    return fabric.complete_s(fabric.issue(MessageCollective("isolated", lowered, 0), 0.0))


def collective_time_s(chip: Chip, algorithm: str, group: str, payload_bytes: int, topology: Topology,
                      rank: int = 0) -> float:
    """Seconds one collective takes on idle links (a collective microbenchmark)."""
    grouped = grouped_phases(algorithm, group, payload_bytes, rank, topology)
    if not grouped:
        return 0.0
    fabric = MessageFabric()
    plan = MessageCollective(algorithm, tuple(groups_on(chip, phase) for phase in grouped), 0)
    return fabric.complete_s(fabric.issue(plan, 0.0))
