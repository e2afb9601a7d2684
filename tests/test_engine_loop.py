"""The engine's event loop (tpusim.engine.loop): SimPy's order, without SimPy's objects."""

from __future__ import annotations

from tpusim.engine.loop import Driver, EventLoop


def test_callbacks_and_events_share_simpys_order() -> None:
    """Equal times go by priority, then insertion, whether queued as a callback or an event."""
    loop = EventLoop()
    seen: list[str] = []
    loop.timeout(2.0).callbacks.append(lambda _event: seen.append("timeout 2"))
    loop.call_later(1.0, seen.append, "call 1")
    loop.call_later(2.0, seen.append, "call 2")
    loop.call_later(2.0, seen.append, "urgent 2", priority=0)
    loop.timeout(1.0).callbacks.append(lambda _event: seen.append("timeout 1"))
    loop.run()
    assert seen == ["call 1", "timeout 1", "urgent 2", "timeout 2", "call 2"]
    assert loop.now == 2.0
    assert loop.scheduled == 5


def test_driver_sleeps_and_waits_like_a_process() -> None:
    """A yielded delay sleeps; None waits for wake(), queued behind what is already due."""
    loop = EventLoop()
    trace: list[tuple[str, float]] = []
    driver = Driver(loop)

    def body():  # type: ignore[no-untyped-def]
        trace.append(("start", loop.now))
        yield 0.5
        trace.append(("slept", loop.now))
        loop.call_later(0.25, lambda _arg: driver.wake())
        loop.call_later(0.25, lambda _arg: trace.append(("other", loop.now)))
        yield None
        trace.append(("woken", loop.now))

    driver.start(body())
    assert driver.alive
    loop.run()
    assert trace == [("start", 0.0), ("slept", 0.5), ("other", 0.75), ("woken", 0.75)]
    assert not driver.alive


def test_driver_runs_ahead_only_past_nothing_due() -> None:
    """Running ahead, a sleep with nothing queued before its end makes no entry; one that ends
    at the time of a queued entry does (that entry, inserted first, goes first), as it would
    event by event. The trace is the same either way."""
    traces, counts = [], []
    for run_ahead in (True, False):
        loop = EventLoop(run_ahead=run_ahead)
        trace: list[tuple[str, float]] = []
        driver = Driver(loop)
        loop.call_later(1.0, lambda _arg, trace=trace, loop=loop: trace.append(("other", loop.now)))

        def body(trace=trace, loop=loop):  # type: ignore[no-untyped-def]
            yield 0.25
            yield 0.25
            trace.append(("half", loop.now))
            yield 0.5  # ends at 1.0, where "other" is queued: an entry, served after it
            trace.append(("one", loop.now))
            yield 0.5
            trace.append(("end", loop.now))

        driver.start(body())
        loop.run()
        traces.append(trace)
        counts.append((loop.scheduled, loop.ran_ahead))
    assert traces[0] == traces[1] == [("half", 0.5), ("other", 1.0), ("one", 1.0), ("end", 1.5)]
    assert counts == [(3, 3), (6, 0)]  # start, other, the sleep to 1.0 / every sleep an entry


def test_driver_resumes_steps_handed_over() -> None:
    """Steps the generator hands over (yields, not done) are resumed by the driver, not the
    generator, until done; then the generator goes on. Their sleeps are queued as the
    generator's own would be: the same trace and the same entries as yielding each sleep
    (event by event: running ahead is the steps' own, and these do not)."""
    from tpusim.engine.loop import Steps

    class Sleeps(Steps):
        """Sleeps 0.25 s three times, recording the clock each time it goes on."""

        def __init__(self, loop: EventLoop, trace: list[tuple[str, float]]) -> None:
            super().__init__()
            self.loop, self.trace, self.left = loop, trace, 3

        def proceed(self) -> int:
            self.trace.append(("step", self.loop.now))
            if not self.left:
                return 0
            self.left -= 1
            self.delay, self.waiting = 0.25, False
            return 1

    traces, counts = [], []
    for handed in (True, False):
        loop = EventLoop(run_ahead=False)
        trace: list[tuple[str, float]] = []
        driver = Driver(loop)
        loop.call_later(0.5, lambda _arg, trace=trace, loop=loop: trace.append(("other", loop.now)))

        def body(trace=trace, loop=loop, handed=handed):  # type: ignore[no-untyped-def]
            if handed:
                steps = Sleeps(loop, trace)
                if steps.proceed():
                    now = yield steps
                    trace.append(("back", now))
            else:
                for _ in range(3):
                    trace.append(("step", loop.now))
                    yield 0.25
                trace.append(("step", loop.now))
                trace.append(("back", loop.now))
            yield 0.5
            trace.append(("end", loop.now))

        driver.start(body())
        loop.run()
        traces.append(trace)
        counts.append(loop.scheduled)
    assert traces[0] == traces[1] == [("step", 0.0), ("step", 0.25), ("other", 0.5), ("step", 0.5),
                                      ("step", 0.75), ("back", 0.75), ("end", 1.25)]
    assert counts[0] == counts[1]
