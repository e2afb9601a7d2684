"""The estimate's two resources in closed form: a fluid HBM server and in-order admission pools.

Used by :mod:`tpusim.sweep.estimate` (its module docstring states the model): the HBM moves
bytes at ``bandwidth x DMA efficiency(copies outstanding)`` with backfill of idle gaps and
an in-flight limit; a pool admits slabs strictly in order while their bytes fit. A chip
whose DMA contention counts address streams (``dma.contention_unit: stream``) is priced
without contention here: the estimate does not track streams, and at a chip's declared
stream count the rate is the sustained one (the engine prices the rest).
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque

from hwmodels.schema import DmaSpec


class FluidHbm:
    """A fluid bandwidth server with backfill and an in-flight limit (see the module docstring)."""

    __slots__ = ("bandwidth", "busy_s", "efficiency", "end", "full_rate", "gap_ends", "gap_starts", "lands",
                 "last_land", "latency", "max_in_flight", "may_contend")

    def __init__(self, bandwidth_bytes_per_s: float, issue_latency_s: float, dma: DmaSpec, max_in_flight: int) -> None:
        self.end = 0.0
        self.gap_starts: list[float] = []
        self.gap_ends: list[float] = []
        self.busy_s = 0.0
        self.last_land = 0.0
        self.bandwidth = bandwidth_bytes_per_s
        self.latency = issue_latency_s
        self.max_in_flight = max_in_flight
        self.efficiency = [dma.efficiency(n) for n in range(max_in_flight + 1)]
        self.full_rate = self.bandwidth * self.efficiency[1]
        self.may_contend = dma.contention_unit == "copy" and max_in_flight > dma.efficient_in_flight
        self.lands: deque[float] = deque(maxlen=max_in_flight)

    def copy(self, ready: float, nbytes: float) -> float:
        """Issue a copy of ``nbytes`` admitted at ``ready``; return when it has landed."""
        lands = self.lands
        if len(lands) == self.max_in_flight:
            earliest = min(lands)
            if earliest > ready:  # all slots busy: wait for the first to land
                ready = earliest
        rate = self.full_rate
        if self.may_contend:  # more copies may be out than the DMA engine serves at full rate
            outstanding = 1
            for land in lands:
                if land > ready:
                    outstanding += 1
            rate = self.bandwidth * self.efficiency[min(outstanding, self.max_in_flight)]
        land = self._transfer(ready + self.latency, nbytes / rate)
        lands.append(land)
        if land > self.last_land:
            self.last_land = land
        return land

    def _transfer(self, ready: float, duration: float) -> float:
        self.busy_s += duration
        starts, ends = self.gap_starts, self.gap_ends
        if ends and ends[-1] > ready:
            i = bisect.bisect_right(ends, ready)
            while i < len(ends):
                a = starts[i] if starts[i] > ready else ready
                available = ends[i] - a
                if available >= duration:
                    land = a + duration
                    if starts[i] < a:  # keep [start, a) idle, and [land, end) if any is left
                        if ends[i] - land > 1e-12:
                            starts.insert(i + 1, land)
                            ends.insert(i + 1, ends[i])
                        ends[i] = a
                    elif ends[i] - land > 1e-12:
                        starts[i] = land
                    else:
                        del starts[i], ends[i]
                    return land
                duration -= available
                if starts[i] < a:
                    ends[i] = a
                    i += 1
                else:
                    del starts[i], ends[i]
        start = ready if ready > self.end else self.end
        if start - self.end > 1e-12:
            starts.append(self.end)
            ends.append(start)
        self.end = start + duration
        return self.end

    def forget_before(self, horizon: float) -> None:
        """Drop idle gaps ending before ``horizon`` (no copy can be admitted that early)."""
        cut = bisect.bisect_left(self.gap_ends, horizon)
        if cut:
            del self.gap_starts[:cut], self.gap_ends[:cut]


class AdmissionPool:
    """An arena: in-order admission while the held bytes fit (free times are known in order)."""

    __slots__ = ("capacity", "held", "last_admit", "used")

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.last_admit = 0.0
        self.held: list[tuple[float, int]] = []  # heap of (free time, bytes) of admitted slabs
        self.used = 0

    def admit(self, ready: float, nbytes: int) -> float:
        t = ready if ready > self.last_admit else self.last_admit
        held = self.held
        while held and held[0][0] <= t:
            self.used -= heapq.heappop(held)[1]
        while held and self.used + nbytes > self.capacity:
            free_s, size = heapq.heappop(held)
            self.used -= size
            if free_s > t:
                t = free_s
        self.last_admit = t
        return t

    def hold(self, free_s: float, nbytes: int) -> None:
        heapq.heappush(self.held, (free_s, nbytes))
        self.used += nbytes
