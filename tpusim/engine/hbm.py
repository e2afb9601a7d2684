"""The HBM and its copy engine: a bandwidth shared by the copies in flight.

Picture a single pipe out of HBM with a fixed capacity, ``B`` bytes/s (the chip's sustained
bandwidth; per-op launch execution scales it by ``per_op_efficiency``). Copies (descriptors)
wait in a queue, most urgent first (consumption order), and are *issued* while fewer than
``max_dmas_in_flight`` are outstanding. An issued copy spends ``dma.issue_latency_s`` before
its first byte moves, then *streams*. While ``n`` copies stream, the engine serves them
round-robin, so each moves at::

    rate(n) = B * dma.efficiency(k) / n          (efficiency: 1 up to efficient_in_flight,
                                                  then 1 / (1 + penalty * (k - efficient)))

where ``k`` counts the contenders the chip declares (``dma.contention_unit``): every copy
streaming (``copy``: ``k = n``), or every distinct address stream among them (``stream``:
:func:`stream_of`, one per buffer ring, one per occupied expert slot), kept as a count of
streaming copies per stream. Either way the engine shares the aggregate equally among the
``n`` streaming copies (it round-robins among outstanding transfers), so they all advance
at one rate. Where the aggregate is the same float for every count of contenders up to
``max_in_flight`` (no loss: TPU v7's published figures), the server keeps no stream count
(:func:`_streams_moot`): the rate is ``rate_by_n`` either way.

This is a fluid processor-sharing server. It is simulated exactly, without a SimPy process
per copy, by a *virtual clock*: ``S(t) = ∫ rate dt`` is the number of bytes every streaming
copy has received since time 0. A copy that starts streaming at ``S0`` with ``b`` bytes
finishes when ``S`` reaches ``S0 + b``; since all streaming copies advance at the same rate,
they finish in order of that target (``Descriptor.target``), kept sorted (then by sequence
number: :func:`insert_streaming`). Whenever the set
changes (a copy starts or finishes) the rate is recomputed and one wake-up is scheduled for the
next start or finish (or, when nothing else is due before it, taken at once: the loop's
running ahead, :mod:`tpusim.engine.loop`). A wake-up made stale by a later change is recognised
by its token and ignored.

**In order** (``dma.service: in_order``, measured on TPU v5e by the ``dma_order`` probe: a
64 KiB copy issued behind eight 1 MiB copies lands after all eight): copies are queued in
the order they are issued, not by urgency; each spends its issue latency while the copies
ahead of it transfer, then waits in a ready queue until the one copy streaming lands, and
streams alone at ``B * dma.efficiency(1)``.

A landing marks its copy landed in this run (``Descriptor.landed``, a run number: see
:mod:`tpusim.engine.items`), wakes the compute stream if it waits on the copy, and frees what a
landing frees (a mispredicted speculative copy's slot once routing is known and its copies
have landed, a KDA state buffer once written back) through the staging memory's ``free``.

The server counts its busy time (any copy in flight, latency included), the bytes it moved,
and, when asked, records each copy on a lane track (lane = the lowest free in-flight slot)
and emits the kernel's ``dma_start`` events (when a copy is queued: issued).

Compiled (``setup.py``), the server's fields and its turn's locals are typed in ``hbm.pxd``:
a new attribute is declared there too.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from heapq import heappush
from typing import Any

from hwmodels.schema import DmaSpec
from tpusim.engine.items import Descriptor, Slab
from tpusim.engine.loop import NORMAL, EventLoop
from tpusim.engine.timeline import Recorder
from tpusim.schedule.program_issue import ROUTED

# A copy is complete when the virtual clock is within this many bytes of its target: float
# slack of the running sum (absolute, plus relative to the sum); a byte takes ~3e-13 s at
# TPU v7 rates, so the slack never moves a completion by a visible amount.
BYTE_TOLERANCE = 0.5
RELATIVE_TOLERANCE = 1e-9
RELATIVE_SLACK = 1.0 + RELATIVE_TOLERANCE  # (the same float as computed in place)
INF = float("inf")
COMPACT_AT = 32  # landed (started) entries kept at the front of ``streaming`` (``starting``) before they are dropped


def stream_of(desc: Descriptor) -> object:
    """The address stream a copy belongs to (``dma.contention_unit: stream``).

    A buffer ring's slabs are refilled in order from one weight stream (the banks of a
    dense ring, the row slabs of one tensor kind, the KV tiles): one stream per ring. An
    expert slot holds one expert's weights, a region of its own, so each expert slab is a
    stream. A copy without a slab (a state or KV write-back) is a stream of its family.
    """
    slab = desc.slab
    if slab is None:
        return desc.family
    return slab if slab.family == ROUTED else slab.ring


def insert_streaming(streaming: list[Descriptor], desc: Descriptor, target: float, first: int = 0) -> None:
    """Put ``desc``, landing at virtual clock ``target``, into ``streaming[first:]`` (sorted by
    (target, seq): the first lands first; (target, seq) is unique, so the order is total;
    the entries before ``first`` have landed: :attr:`HbmServer.first`).

    The order ``bisect.insort`` of ``(target, seq, desc)`` tuples gives, found from the end: a
    copy starting now usually lands after those already streaming (it starts at a later ``S``).
    Compiled (``hbm.pxd``), the comparisons are of C doubles and ints: no tuple or float made.
    """
    desc.target = target
    seq = desc.seq
    at = len(streaming)
    while at > first:
        other = streaming[at - 1]
        if other.target < target or (other.target == target and other.seq < seq):
            break
        at -= 1
    streaming.insert(at, desc)


def _streams_moot(aggregate_by_k: list[float], rate_by_n: list[float]) -> bool:
    """Whether counting streams cannot change a rate: the aggregate is the same float for any
    number of streams that can be in flight, and that aggregate shared by ``n`` copies is
    exactly ``rate_by_n[n]`` (e.g. no loss up to ``max_in_flight``: TPU v7's published
    figures). Then the per-copy rate is ``rate_by_n`` whichever streams the copies belong to,
    and the server skips keeping the count (the same floats, less work per copy)."""
    aggregate = aggregate_by_k[1] if len(aggregate_by_k) > 1 else 0.0
    return (all(value == aggregate for value in aggregate_by_k[1:])
            and all(rate_by_n[n] == aggregate / n for n in range(1, len(rate_by_n))))


class HbmServer:
    """Processor-sharing HBM bandwidth with an issue queue (see the module docstring)."""

    def __init__(self, env: EventLoop, bandwidth_bytes_per_s: float, dma: DmaSpec,
                 max_in_flight: int, on_free: Callable[[Slab], None],
                 recorder: Recorder | None, events: list[tuple[Any, ...]] | None, run: int = 1) -> None:
        self.env = env
        self.run = run  # this run's number: what a landing writes in Descriptor.landed
        self.bandwidth = bandwidth_bytes_per_s
        self.latency_s = dma.issue_latency_s.value
        self.max_in_flight = max_in_flight
        # per-copy rate with n streaming, n = 0..max_in_flight
        self.rate_by_n = [0.0] + [
            bandwidth_bytes_per_s * dma.efficiency(n) / n for n in range(1, max_in_flight + 1)
        ]
        # by stream: streaming copies per address stream; the aggregate rate by streams
        self.aggregate_by_k = [bandwidth_bytes_per_s * dma.efficiency(k) for k in range(max_in_flight + 1)]
        self.by_stream = (dma.contention_unit == "stream" and dma.service != "in_order"
                          and not _streams_moot(self.aggregate_by_k, self.rate_by_n))
        self.streams: dict[object, int] = {}
        self.on_free = on_free  # a landing frees a slab: a mispredicted copy's slot, a written-back state
        self.recorder = recorder
        self.events = events
        self.queue: list[tuple[int, Descriptor]] = []  # (seq, copy) waiting to be issued
        # issued, in issue latency: (start time, the copies issued then, in issue order), oldest
        # first from ``starting[start_at]`` (the entries before it have started; see ``first``)
        self.starting: list[tuple[float, list[Descriptor]]] = []
        self.start_at = 0
        # in order: one copy streams at a time, the others wait (latency spent) in issue order
        self.in_order = dma.service == "in_order"
        self.ready: deque[Descriptor] = deque()
        self.issue_count = 0
        # the copies streaming, sorted by (desc.target, desc.seq) (insert_streaming; the first
        # lands first): at most max_in_flight long, so an insertion's few comparisons and a list
        # shift cost less than a heap's push and pop. They are ``streaming[first:]``: a landing
        # moves ``first`` on rather than taking the copy off the front of the list (a shift and,
        # as the list empties and fills, a reallocation per landing); the landed entries before
        # it are dropped together once there are COMPACT_AT of them (the same for ``starting``
        # and ``start_at``)
        self.streaming: list[Descriptor] = []
        self.first = 0
        self.in_flight = 0
        self.virtual_bytes = 0.0  # S(t)
        self.rate = 0.0
        self.last_s = 0.0
        self.busy_s = 0.0
        self.bytes_moved = 0
        self.issued = 0
        self.last_land_s = 0.0
        self.wake_token = 0
        self.turns_ahead = 0  # turns taken at once (loop docstring: running ahead); core adds them to env.ran_ahead
        self.wake_at = INF
        self.wake_fn = self._wake  # the bound turn queued with each wake-up (made once, not per entry)
        self.free_lanes = list(range(max_in_flight))
        # copies admitted into an empty queue with slots for all of them may be issued at once
        # by the staging memory (StagingMemory._fill): _issue's common case, copies by urgency,
        # each spending its issue latency, nothing recorded; not in the event-by-event
        # reference (it queues and pumps every copy)
        self.direct = (self.latency_s > 0.0 and recorder is None and events is None and not self.in_order
                       and env.run_ahead)

    # ----------------------------------------------------------------- clock

    def _advance(self, now: float) -> None:
        elapsed = now - self.last_s
        if elapsed > 0.0:
            if len(self.streaming) > self.first:
                self.virtual_bytes += self.rate * elapsed
            if self.in_flight:
                self.busy_s += elapsed
            self.last_s = now

    def _reschedule(self, now: float) -> None:
        # when the next copy starts streaming or lands (INF: nothing in flight); ``now`` is the
        # loop's clock (every caller passes env.now)
        starting, start_at = self.starting, self.start_at
        next_s = INF
        if len(starting) > start_at:
            entry = starting[start_at]  # (typed when compiled: a tuple read in C)
            next_s = entry[0]
        streaming, at = self.streaming, self.first
        if len(streaming) > at:
            first = streaming[at]
            head = first.target  # (typed when compiled: the same subtraction, unboxed)
            left = head - self.virtual_bytes
            finish = now + left / self.rate if left > 0.0 else now
            if finish < next_s:
                next_s = finish
        if next_s < self.wake_at:
            token = self.wake_token = self.wake_token + 1
            self.wake_at = next_s
            env = self.env  # env.call_later(delay, self.wake_fn, token), inlined
            count = env.scheduled
            env.scheduled = count + 1
            heappush(env._queue, (now + (next_s - now if next_s > now else 0.0), NORMAL, count, self.wake_fn, token))

    # ----------------------------------------------------------------- issue

    def enqueue(self, desc: Descriptor) -> None:
        """Queue a copy; :meth:`pump` starts it when a slot is free.

        Queuing is what the kernel calls issuing (its ``dma_start``): a TPU queues
        descriptors in hardware, so the ``dma_start`` event is recorded here, not when an
        in-flight slot frees."""
        heapq.heappush(self.queue, (self._queue_key(desc), desc))
        if self.events is not None:
            self.events.append(("dma_start", desc.family, desc.tensor, desc.layer, desc.chunk))

    def _queue_key(self, desc: Descriptor) -> int:
        """Most urgent first (consumption order), or, in order, the order of issue."""
        if not self.in_order:
            return desc.seq
        self.issue_count += 1
        return self.issue_count

    def enqueue_many(self, descs: list[Descriptor]) -> None:
        """:meth:`enqueue` each of ``descs`` in turn (a slab's copies: one call per slab)."""
        queue, events, heappush = self.queue, self.events, heapq.heappush
        if self.in_order:  # _queue_key, inlined: the order of issue
            count = self.issue_count
            for desc in descs:
                count += 1
                heappush(queue, (count, desc))
                if events is not None:
                    events.append(("dma_start", desc.family, desc.tensor, desc.layer, desc.chunk))
            self.issue_count = count
            return
        for desc in descs:
            heappush(queue, (desc.seq, desc))
            if events is not None:
                events.append(("dma_start", desc.family, desc.tensor, desc.layer, desc.chunk))

    def pump(self) -> None:
        """Issue queued copies, most urgent first, while slots are free."""
        if self._issue():
            self._reschedule(self.env.now)

    def _issue(self) -> bool:
        """:meth:`pump` without the wake-up (the caller schedules it); True if it issued."""
        queue = self.queue
        in_flight, max_in_flight = self.in_flight, self.max_in_flight
        if not queue or in_flight >= max_in_flight:
            return False
        now = self.env.now
        elapsed = now - self.last_s  # _advance, inlined
        if elapsed > 0.0:
            if len(self.streaming) > self.first:
                self.virtual_bytes += self.rate * elapsed
            if in_flight:
                self.busy_s += elapsed
            self.last_s = now
        recorder, latency_s = self.recorder, self.latency_s
        if latency_s > 0.0 and recorder is None:  # the common case: each spends its latency first
            start_s, heappop = now + latency_s, heapq.heappop
            issued = in_flight
            group = []  # one entry for the copies issued now (they start together)
            while queue and in_flight < max_in_flight:  # (issue_s is read only by the recorder: not kept here)
                desc = heappop(queue)[1]
                in_flight += 1
                group.append(desc)
            self.starting.append((start_s, group))
            self.issued += in_flight - issued
            self.in_flight = in_flight
            return True
        while queue and self.in_flight < max_in_flight:
            desc = heapq.heappop(queue)[1]
            self.in_flight += 1
            self.issued += 1
            desc.issue_s = now
            if recorder is not None:
                desc.lane = heapq.heappop(self.free_lanes)
            if latency_s > 0.0:
                self.starting.append((now + latency_s, [desc]))
            elif self.in_order and len(self.streaming) > self.first:
                self.ready.append(desc)
            else:
                self._start_streaming(desc)
        return True

    def _start_streaming(self, desc: Descriptor) -> None:
        insert_streaming(self.streaming, desc, self.virtual_bytes + desc.nbytes, self.first)
        if self.by_stream:
            streams = self.streams
            key = desc.stream = stream_of(desc)
            streams[key] = streams.get(key, 0) + 1
            self.rate = self.aggregate_by_k[len(streams)] / (len(self.streaming) - self.first)
        else:
            self.rate = self.rate_by_n[len(self.streaming) - self.first]

    # ----------------------------------------------------------------- wake-ups

    def _wake(self, token: int) -> None:
        """A wake-up: serve the server's turn at ``now`` (land what has arrived, start what has
        spent its issue latency, issue into freed slots), then queue the next turn, or take it
        at once while nothing else is due before it (:mod:`tpusim.engine.loop`, running ahead).
        One function per turn (the turn is the engine's most frequent event)."""
        if token != self.wake_token:
            return  # superseded by an earlier wake-up
        env = self.env
        queue, run_ahead = env._queue, env.run_ahead
        streaming, starting, streams = self.streaming, self.starting, self.streams
        by_stream, in_order = self.by_stream, self.in_order  # (heappush: a module name, no lookup per turn)
        run = self.run
        slack, tolerance, inf = RELATIVE_SLACK, BYTE_TOLERANCE, INF  # (C doubles when compiled: read once)
        compact_at = COMPACT_AT  # (a C int when compiled)
        now = env.now
        resumed = None  # the compute stream's resumption, taken at the turn's end without an entry (below)
        while True:  # one turn per wake-up; the next taken at once while nothing is due before it
            self.wake_at = inf
            # _advance, inlined
            first = self.first  # the copies streaming are streaming[first:] (__init__)
            elapsed = now - self.last_s
            if elapsed > 0.0:
                if len(streaming) > first:
                    self.virtual_bytes += self.rate * elapsed
                if self.in_flight:
                    self.busy_s += elapsed
                self.last_s = now
            landed = first  # streaming[landed:first] land in this turn (none yet)
            size = len(streaming)
            if size > first:
                limit = self.virtual_bytes * slack + tolerance
                desc = streaming[first]
                head = desc.target  # (typed when compiled: compared unboxed)
                if head <= limit:
                    while True:  # the copies from the first on land: passed over together below
                        first += 1
                        if by_stream:
                            key = desc.stream
                            left = streams[key] - 1
                            if left:
                                streams[key] = left
                            else:
                                del streams[key]
                        if first == size:
                            break
                        desc = streaming[first]
                        head = desc.target
                        if not head <= limit:
                            break
                    self.first = first
            if in_order:
                ready = self.ready
                start_at = self.start_at
                while len(starting) > start_at:
                    entry = starting[start_at]
                    start_s = entry[0]
                    if not start_s <= now:
                        break
                    ready.extend(entry[1])
                    start_at += 1
                if start_at >= compact_at:  # the started entries, dropped together
                    del starting[:start_at]
                    start_at = 0
                self.start_at = start_at
                if ready and len(streaming) == first:  # the next in issue order streams alone
                    desc = ready.popleft()
                    insert_streaming(streaming, desc, self.virtual_bytes + desc.nbytes, first)
            else:
                start_at = self.start_at
                if len(starting) > start_at:
                    entry = starting[start_at]  # (typed when compiled: a tuple read in C)
                    start_s = entry[0]  # (typed when compiled: compared unboxed)
                    if start_s <= now:
                        # _start_streaming without its rate (set once below)
                        virtual_bytes = self.virtual_bytes
                        while True:
                            group = entry[1]  # the copies issued together, in issue order
                            start_at += 1
                            for desc in group:
                                insert_streaming(streaming, desc, virtual_bytes + desc.nbytes, first)
                                if by_stream:  # stream_of, inlined
                                    slab = desc.slab
                                    key = desc.stream = desc.family if slab is None else (
                                        slab if slab.family == ROUTED else slab.ring)
                                    streams[key] = streams.get(key, 0) + 1
                            if len(starting) == start_at:
                                break
                            entry = starting[start_at]
                            start_s = entry[0]
                            if not start_s <= now:
                                break
                        if start_at >= compact_at:  # the started entries, dropped together
                            del starting[:start_at]
                            start_at = 0
                        self.start_at = start_at
            size = len(streaming) - first  # the copies streaming now
            if by_stream and size:
                self.rate = self.aggregate_by_k[len(streams)] / size
            else:
                self.rate = self.rate_by_n[size]
            if landed < first:
                self.last_land_s = now
                recorder, on_free = self.recorder, self.on_free
                # (what a landing frees may issue copies: they are inserted after streaming[first])
                for at in range(landed, first):  # _land
                    desc = streaming[at]
                    self.in_flight -= 1  # per copy: a slab it frees may issue into the freed slot
                    self.bytes_moved += desc.nbytes
                    desc.landed = run
                    desc.land_s = now
                    if recorder is not None:
                        recorder.dma(desc)
                        heappush(self.free_lanes, desc.lane)
                    waiter = desc.waiter
                    if waiter is not None:  # the compute stream waits on this copy: Driver.wake, inlined
                        desc.waiter = None  # (waiter: the driver's bound resume)
                        if run_ahead and resumed is None:
                            ahead = not queue
                            if not ahead:
                                entry = queue[0]  # (typed when compiled: a tuple read in C)
                                head = entry[0]  # (typed when compiled: compared unboxed)
                                ahead = head > now
                        else:
                            ahead = False
                        if ahead:
                            # its entry would be the next served (every queued entry is later; what
                            # this turn queues after it comes after it): called at the turn's end
                            resumed = waiter
                        else:
                            count = env.scheduled
                            env.scheduled = count + 1
                            heappush(queue, (now + 0.0, NORMAL, count, waiter, None))
                    slab = desc.slab
                    if slab is not None and slab.free_on_land == run and slab.landed_in(run):
                        on_free(slab)  # StagingMemory.resolve: its last copy landed, drop it now
                    if desc.frees_slab is not None:
                        on_free(desc.frees_slab)
                if first >= compact_at:  # the landed entries, dropped together
                    del streaming[:first]
                    first = self.first = 0
            if self.queue and self.in_flight < self.max_in_flight:
                self._issue()
            # when the next copy starts streaming or lands (INF: nothing in flight)
            start_at = self.start_at
            next_s = inf
            if len(starting) > start_at:
                entry = starting[start_at]
                next_s = entry[0]
            if len(streaming) > first:
                desc = streaming[first]
                head = desc.target
                left_bytes = head - self.virtual_bytes
                finish = now + left_bytes / self.rate if left_bytes > 0.0 else now
                if finish < next_s:
                    next_s = finish
            if not next_s < self.wake_at:  # a wake-up at or before it is queued already
                if resumed is not None:
                    self.turns_ahead += 1
                    resumed(None)  # (the loop's call of its entry: the clock is at it already)
                return
            time_s = now + (next_s - now if next_s > now else 0.0)  # as call_later computes it
            ahead = run_ahead and resumed is None  # EventLoop.is_next, inlined: every queued entry is later
            if ahead and queue:  # (a resumption taken at this turn's end is due before it: not ahead)
                entry = queue[0]
                head = entry[0]
                ahead = head > time_s
            if not ahead:
                token = self.wake_token = self.wake_token + 1
                self.wake_at = next_s
                count = env.scheduled  # call_later(time_s - now, self._wake, token), inlined
                env.scheduled = count + 1
                heappush(queue, (now + (time_s - now), NORMAL, count, self.wake_fn, token))
                if resumed is not None:
                    self.turns_ahead += 1
                    resumed(None)
                return
            # the entry would be the next served (tpusim.engine.loop, running ahead): take it now
            self.wake_token += 1  # an entry queued for a later wake-up is superseded, as by a new one
            env.now = now = time_s
            self.turns_ahead += 1
