"""Progress notes: long work says where it has got to; whoever listens shows the latest.

Long steps (a sweep's phases, a comparison's batches, a replay's records) call :func:`note`
with a short line ("simulate 12/32, best 3.610 ms"). Nothing listens by default, so a note
costs one context-variable lookup. ``tpusim demo`` listens (:func:`listening`) and prints
the latest note of a step every few seconds while the step runs (its heartbeat), so every
step longer than that shows where it is without each command owning a display.

A context variable, not a global: a listener set in one thread (the demo's step) is not
heard by another (a test running beside it), and leaving the ``with`` block restores the
previous listener.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_LISTENER: ContextVar[Callable[[str], None] | None] = ContextVar("tpusim_progress_listener", default=None)


def note(text: str) -> None:
    """Tell the listener, if any, where the work stands now (one short line)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(text)


@contextmanager
def listening(callback: Callable[[str], None]) -> Iterator[None]:
    """Hear every :func:`note` made in this context until the block ends."""
    token = _LISTENER.set(callback)
    try:
        yield
    finally:
        _LISTENER.reset(token)
