"""VMEM over time: buffers reserved when their copies are issued, freed after use.

A SimPy analogy: each :class:`~tpusim.engine.items.Pool` is a ``Container`` of bytes and
each :class:`~tpusim.engine.items.Ring` a ``Resource`` with ``depth`` slots, except that
requests are served strictly in consumption order and are made by the engine rather than by
waiting processes, which keeps the event count per copy at a constant.

A slab is *admitted* (its ring slot and pool bytes reserved, its copies queued at the HBM
server) when all of these hold, checked whenever something changes:

1. it has been released (its issue point in the compute stream has passed);
2. every earlier slab of its pool has been admitted (in-order admission);
3. its ring has a free slot: ``ring.used < ring.depth``;
4. its pool has room: ``pool.used + slab.nbytes <= pool.capacity``.

Occupancy = always-resident scratch (activations) + the bytes of every admitted, not yet
freed slab. Because rings and pools are never over-filled, occupancy never exceeds the
static plan of :func:`tpusim.schedule.vmem.vmem_plan`, hence never the chip's usable VMEM for a
schedule that passed :func:`tpusim.schedule.vmem.check_fits`. The peak, its time and the compute
layer at that moment are tracked always; a *watch* threshold (used to diagnose infeasible
schedules, run with the capacity check off) records the first moment occupancy crosses it
and the buffers held then.

Compiled (``setup.py``), the fields and admission's locals are typed in ``staging.pxd``: a
new attribute is declared there too.
"""

from __future__ import annotations

from heapq import heappush

import simpy

from tpusim.engine.hbm import HbmServer
from tpusim.engine.items import Pool, Slab
from tpusim.engine.timeline import Recorder


class StagingMemory:
    """Dynamic VMEM: admission into pools/rings and the occupancy curve."""

    def __init__(self, env: simpy.Environment, base_bytes: int, hbm: HbmServer,
                 recorder: Recorder | None, watch_bytes: float | None = None, run: int = 1) -> None:
        self.env = env
        self.run = run  # this run's number: a slab's flags hold the run that set them (items)
        self.hbm = hbm
        self.recorder = recorder
        self.used_bytes = base_bytes
        self.peak_bytes = base_bytes
        self.peak_s = 0.0
        self.peak_layer: int | None = None
        self.current_layer = 0
        self.current_op = ""
        self.watch_bytes = watch_bytes
        self.crossing: tuple[float, int, str, dict[str, list[str]]] | None = None
        self.peak_op = ""
        self.peak_holdings: dict[str, list[str]] = {}
        self.resident: dict[int, Slab] | None = {} if watch_bytes is not None else None
        # nothing recorded or watched (a sweep's run): _fill and free keep the occupancy inline
        self.plain = recorder is None and self.resident is None
        if recorder is not None:
            recorder.vmem(0.0, base_bytes)

    # ----------------------------------------------------------------- admission

    def release_many(self, slabs: list[Slab] | tuple[Slab, ...]) -> None:
        """Mark ``slabs`` issuable and admit what fits."""
        run = self.run
        if len(slabs) == 1:  # (most releases: one slab, its pool alone to fill)
            slab = slabs[0]
            slab.released = run
            self._fill(slab.pool)
            return
        touched: list[Pool] = []
        for slab in slabs:
            slab.released = run
            if slab.pool not in touched:
                touched.append(slab.pool)
        for pool in touched:
            self._fill(pool)

    def _fill(self, pool: Pool) -> None:
        order, first = pool.order, pool.ptr
        ptr = first
        plain, run = self.plain, self.run
        while ptr < len(order):
            slab = order[ptr]
            if slab.released != run:
                break
            ring = slab.ring
            if ring.used >= ring.depth or pool.used_bytes + slab.nbytes > pool.capacity_bytes:
                break
            ring.used += 1
            pool.used_bytes += slab.nbytes
            if plain:  # _occupy, inlined
                used = self.used_bytes = self.used_bytes + slab.nbytes
                if used > self.peak_bytes:
                    self.peak_bytes, self.peak_s, self.peak_layer = used, self.env.now, self.current_layer
            else:
                self._occupy(slab, slab.nbytes)
            ptr += 1
        if ptr == first:
            return
        pool.ptr = ptr
        hbm = self.hbm
        if hbm.direct and not hbm.queue:
            # HbmServer.enqueue_many then pump, where every copy admitted here is issued at once:
            # nothing was queued and there are slots for all of them (K3 on TPU v7: every
            # admission). They are issued now with one start time, so the order pump would issue
            # them in (by urgency) changes nothing: each starts streaming at the same moment and
            # the streaming heap orders them by (target, seq).
            in_flight = hbm.in_flight
            copies = 0
            for at in range(first, ptr):  # (a loop, not sum(generator): no closure when compiled)
                slab = order[at]  # (typed when compiled: its descs read in C)
                copies += len(slab.descs)
            if in_flight + copies <= hbm.max_in_flight:
                if copies:
                    now = self.env.now
                    elapsed = now - hbm.last_s  # HbmServer._advance, inlined
                    if elapsed > 0.0:
                        if len(hbm.streaming) > hbm.first:
                            hbm.virtual_bytes += hbm.rate * elapsed
                        if in_flight:
                            hbm.busy_s += elapsed
                        hbm.last_s = now
                    start_s = now + hbm.latency_s
                    if ptr == first + 1:  # one slab: its own list of copies (not changed while it runs)
                        slab = order[first]
                        group = slab.descs
                    else:
                        group = []
                        for at in range(first, ptr):
                            slab = order[at]
                            group.extend(slab.descs)
                    hbm.starting.append((start_s, group))  # one entry: they start together
                    hbm.in_flight = in_flight + copies
                    hbm.issued += copies
                    hbm._reschedule(now)
                return
        # HbmServer.enqueue_many, inlined where copies queue by urgency and no events are kept
        queue = hbm.queue if not hbm.in_order and hbm.events is None else None
        for at in range(first, ptr):
            if queue is not None:
                for desc in order[at].descs:
                    heappush(queue, (desc.seq, desc))
            else:
                hbm.enqueue_many(order[at].descs)
        if hbm._issue():  # HbmServer.pump, inlined
            hbm._reschedule(self.env.now)

    def free(self, slab: Slab) -> None:
        """The consumer is done with ``slab``: its slot and bytes go back to the pool."""
        run = self.run
        if slab.freed == run:
            return
        slab.freed = run
        slab.ring.used -= 1
        slab.pool.used_bytes -= slab.nbytes
        if self.plain:  # _occupy, inlined: a release never raises the peak
            self.used_bytes -= slab.nbytes
        else:
            self._occupy(slab, -slab.nbytes)
        pool = slab.pool
        ptr = pool.ptr
        if ptr < len(pool.order):
            waiting = pool.order[ptr]  # (typed when compiled: its flag read in C)
            if waiting.released == run:  # (else _fill would admit nothing)
                self._fill(pool)

    def resolve(self, slab: Slab) -> None:
        """Routing is known and ``slab`` was mispredicted: drop it (once it has landed)."""
        if slab.landed_in(self.run):
            self.free(slab)
        else:
            slab.free_on_land = self.run

    # ----------------------------------------------------------------- occupancy

    def _occupy(self, slab: Slab, delta: int) -> None:
        self.used_bytes += delta
        now = self.env.now
        if self.recorder is not None:
            self.recorder.vmem(now, self.used_bytes)
        if self.resident is not None:
            if delta > 0:
                self.resident[slab.seq] = slab
            else:
                self.resident.pop(slab.seq, None)
            if self.crossing is None and self.watch_bytes is not None and self.used_bytes > self.watch_bytes:
                self.crossing = (now, self.current_layer, self.current_op, self.holdings())
        if self.used_bytes > self.peak_bytes:
            self.peak_bytes = self.used_bytes
            self.peak_s = now
            self.peak_layer = self.current_layer
            if self.resident is not None:
                self.peak_op = self.current_op
                self.peak_holdings = self.holdings()

    def holdings(self) -> dict[str, list[str]]:
        """Pool -> ``label Lk nbytes`` of each resident slab (diagnosis runs only)."""
        out: dict[str, list[str]] = {}
        for slab in (self.resident or {}).values():
            out.setdefault(slab.pool.name, []).append(f"{slab.label}@L{slab.layer}:{slab.nbytes}")
        return out
