"""The engine's event loop: a SimPy environment with lean callbacks and a tight ``run``.

A K3 step is ~10,000-25,000 events event by event (published schedule, batch 1 and 8; 4,800
and 7,800 running ahead, below), nearly all of them of two kinds: the HBM server's
wake-ups and the compute stream's resumptions (a piece's compute time elapsed, a copy it
waits on landed). SimPy spends more on each of those (an :class:`~simpy.events.Timeout` or
:class:`~simpy.events.Event` object, a :class:`~simpy.events.Process` resume, a ``step``
call with its exception handling) than the engine spends on the event itself. This loop
keeps SimPy's queue and its order and drops that overhead:

- :meth:`EventLoop.call_later` queues a plain callback ``fn(arg)`` at ``now + delay`` —
  the entry ``(time, priority, sequence, fn, arg)`` sits in SimPy's own heap next to
  ordinary events, queued as ``(time, priority, sequence, process, event)``, so both are
  served in one order and every entry is called the same way;
- :meth:`EventLoop.run` (no ``until``) pops entries and calls them directly; an ordinary
  SimPy event is processed exactly as :meth:`simpy.core.Environment.step` does;
- :class:`Driver` runs a generator as the compute stream: it ``yield``\\ s a delay (seconds,
  a float) to sleep, or ``None`` after handing :meth:`Driver.resume` to something that calls
  it later (a copy's landing). This replaces a SimPy process: a resumption is queued at the
  same moment (a timeout when the generator yields it, a landing when the copy lands) with
  the same priority, so events at equal times keep SimPy's order (time, priority, insertion).

Times are computed as SimPy computes them (``now + delay``), so every simulated time is the
same float it was with SimPy timeouts. ``scheduled`` counts the queue entries made (a
diagnostic: the SimPy process's own start and end events are gone).

**Running ahead** (``EventLoop(run_ahead=True)``, the default; issue 49). Most of a step's
entries are one party's next move with nothing else due before it: the compute stream's next
piece while no copy lands in between, the HBM server's next landing while the stream
computes. Queued, such an entry would be the very next one popped, so its owner may instead
take the turn at once: set the clock to its time and go on, with no entry made. The test is
strict — the owner runs ahead only if every queued entry is *later* (an entry at the same
time was inserted earlier and goes first, SimPy's order) — so the entries served, their
order and every clock value are exactly those of the event-by-event loop, in fewer entries.
This prices a run of pieces, or of landings, in one event where the loop had one per item.
``run_ahead=False`` keeps the event-by-event loop as the reference
(``simulate(..., event_by_event=True)``; ``tests/test_engine_run_ahead.py`` compares the
two on every built-in schedule). ``ran_ahead`` counts the turns taken without an entry (the
compute stream and the HBM server keep their own counts and add them when the step ends).

Compiled (``setup.py``), :class:`Clock` (the clock and the queue, under :class:`EventLoop`),
:class:`Steps` and :class:`Driver` take their fields from ``loop.pxd``: a new attribute is
declared there too.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import EmptySchedule
from simpy.events import NORMAL, URGENT, Event, EventPriority

__all__ = ["NORMAL", "Clock", "Driver", "EventLoop", "Steps"]


class Clock:
    """The loop's clock and queue: the fields the engine reads and writes per event.

    Compiled (``loop.pxd``), a C extension type: ``now`` a C double, ``scheduled`` and
    ``ran_ahead`` C ints, ``_queue`` a list, so the HBM server, the staging memory and the
    driver (which hold it typed) read and set the clock without the object protocol (a
    SimPy-derived class's attribute is a type lookup and a descriptor call, ~60 instructions).
    :class:`EventLoop` adds SimPy's environment on top."""

    __slots__ = ("_queue", "now", "ran_ahead", "run_ahead", "scheduled")
    now: float

    def run_queue(self) -> None:
        """Pop entries and call them until none is left (:meth:`EventLoop.run` without ``until``)."""
        queue: list[Any] = self._queue
        while queue:
            entry = heappop(queue)
            self.now = entry[0]
            entry[3](entry[4])


class EventLoop(Clock, simpy.Environment):
    """SimPy's environment with :meth:`call_later` and a direct :meth:`run` (module docstring).

    ``now`` is a plain field of :class:`Clock` (SimPy's is a property over ``_now``, which
    becomes the alias): the engine reads the clock at every event. It and the other fields the
    engine reads per event are :class:`Clock`'s (SimPy's own attributes stay in the instance
    dict)."""

    def __init__(self, *, run_ahead: bool = True) -> None:
        super().__init__()
        self.scheduled = 0  # queue entries made; also each entry's insertion number
        self.run_ahead = run_ahead  # owners may take their next turn without an entry (module docstring)
        self.ran_ahead = 0  # turns taken that way

    def is_next(self, time_s: float) -> bool:
        """Whether an entry queued now for ``time_s`` would be the very next one served: every
        queued entry is strictly later (module docstring, running ahead)."""
        queue = self._queue
        return self.run_ahead and (not queue or queue[0][0] > time_s)

    @property  # type: ignore[override]
    def _now(self) -> float:
        return self.now

    @_now.setter
    def _now(self, value: float) -> None:
        self.now = value

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: float = 0) -> None:
        count = self.scheduled
        self.scheduled = count + 1
        heappush(self._queue, (self.now + delay, priority, count, self._process, event))  # type: ignore[arg-type]

    def call_later(self, delay: float, fn: Callable[[Any], None], arg: Any = None,
                   priority: int = NORMAL) -> None:
        """Call ``fn(arg)`` at ``now + delay``, in SimPy's order among events at that time."""
        count = self.scheduled
        self.scheduled = count + 1
        heappush(self._queue, (self.now + delay, priority, count, fn, arg))  # type: ignore[arg-type]

    def run(self, until: Any = None) -> Any:
        """Run until no entry is left (with ``until``: SimPy's own loop)."""
        if until is not None:
            return super().run(until)
        self.run_queue()
        return None

    def step(self) -> None:
        """One entry (SimPy's ``step``; raises :class:`~simpy.core.EmptySchedule` when none is left)."""
        queue: list[Any] = self._queue
        if not queue:
            raise EmptySchedule()
        entry = heappop(queue)
        self.now = entry[0]
        entry[3](entry[4])

    @staticmethod
    def _process(event: Event) -> None:
        """An ordinary SimPy event's turn: its callbacks, then its failure raised, as
        :meth:`simpy.core.Environment.step` does."""
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:  # type: ignore[union-attr]
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


class Steps:
    """Work the generator hands to its driver, to be run in C until it is done (a base class:
    :class:`tpusim.engine.stream.PieceRun`, an op's pieces). :meth:`proceed` returns 0 when
    done, 1 to sleep :attr:`delay` seconds, or 2 to wait (something calls the driver's
    resumption later); :attr:`waiting` says which of 1 and 2 the last return was."""

    __slots__ = ("delay", "waiting")

    def __init__(self) -> None:
        self.delay = 0.0
        self.waiting = False

    def proceed(self) -> int:
        raise NotImplementedError


class Driver:
    """Runs a generator on an :class:`EventLoop` as a SimPy process would (module docstring).

    The generator yields a float (sleep that long; queued at once, as a SimPy timeout is
    when created) or ``None`` (asleep until something calls :meth:`wake`, which queues the
    resumption at the current time, as a succeeded SimPy event is). Each resumption sends the
    clock (``now = yield delay``: the same float as ``loop.now``), so the generator need not
    read it back; the first, which starts the generator, sends ``None``.

    It may also yield a :class:`Steps` it has started and that is not done (asleep or waiting
    as its last return said): the driver then resumes the steps (:meth:`Steps.proceed`), not
    the generator, until they are done, and then the generator. Their sleeps are queued as the
    generator's are (running ahead is the steps' own); no generator frame per step."""

    __slots__ = ("alive", "fresh", "loop", "resume_fn", "send", "steps")

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self.send: Callable[[float | None], Any] | None = None
        self.alive = False
        self.fresh = False  # not started yet: the first send is None (a generator's rule)
        self.steps: Steps | None = None  # handed over by the generator, not done yet
        self.resume_fn = self.resume  # the bound resumption queued per piece (made once)

    def start(self, generator: Generator[Any, float | None, None]) -> None:
        """Run ``generator`` from the current time (queued as a SimPy process's start is)."""
        self.send = generator.send
        self.alive = True
        self.fresh = True
        self.loop.call_later(0.0, self.resume, None, URGENT)

    def wake(self) -> None:
        """Resume the generator at the current time (after what is queued for it already)."""
        self.loop.call_later(0.0, self.resume, None)

    def resume(self, _arg: Any = None) -> None:
        loop = self.loop
        steps = self.steps
        if steps is not None:  # the steps the generator handed over, not the generator
            if steps.proceed():
                if not steps.waiting:  # asleep: its resumption queued (call_later, inlined)
                    count = loop.scheduled
                    loop.scheduled = count + 1
                    heappush(loop._queue, (loop.now + steps.delay, NORMAL, count, self.resume_fn, None))
                return
            self.steps = None  # done: the generator goes on
        send = self.send
        try:
            if self.fresh:
                self.fresh = False
                delay = send(None)  # type: ignore[misc]
            else:
                delay = send(loop.now)  # type: ignore[misc]
            while delay is not None:
                if isinstance(delay, Steps):  # handed over (asleep or waiting, as it last said)
                    steps = self.steps = delay
                    if steps.waiting:
                        return
                    delay = steps.delay
                    break
                if not loop.run_ahead:
                    break
                time_s = loop.now + delay  # the next piece with nothing due before it: no entry (loop docstring)
                queue = loop._queue
                if queue:
                    entry = queue[0]  # (typed when compiled: a tuple read in C)
                    head = entry[0]  # (typed when compiled: compared unboxed)
                    if head <= time_s:
                        break
                loop.now = time_s
                loop.ran_ahead += 1
                delay = send(time_s)  # type: ignore[misc]
        except StopIteration:
            self.alive = False
            return
        if delay is not None:  # call_later, inlined (once per compute piece)
            count = loop.scheduled
            loop.scheduled = count + 1
            heappush(loop._queue, (loop.now + delay, NORMAL, count, self.resume_fn, None))  # type: ignore[arg-type]
