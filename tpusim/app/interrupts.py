"""Interrupted runs lose nothing: SIGTERM behaves like Ctrl-C, and output sets commit whole.

Two mechanisms, both for the application layer:

- :func:`terminate_as_interrupt` turns SIGTERM into :class:`Terminated`, a
  ``KeyboardInterrupt``, for the duration of a command. Python's default SIGTERM action
  kills the process on the spot, skipping every ``finally``; as an exception it unwinds like
  Ctrl-C, so atomic writers remove their temporary files and the sweep saves its rows.
  It also records which signal arrived (:class:`Received`): a library may turn the
  interrupt into an exception of its own (pydantic building a model's schema while the
  signal lands raises ``SchemaError: ... Terminated: signal SIGTERM``; a real case, a sweep
  killed while it imported its modules), and the command must still exit as interrupted,
  not with a traceback.
- :func:`deferred_interrupts` holds SIGINT and SIGTERM back while a command writes a set of
  files that belong together (a calibration's report, fit, points and overlay). Each file is
  written atomically already; deferring makes the *set* atomic from the user's view: a
  signal during the computation leaves the previous set untouched, a signal during the
  writes (milliseconds) takes effect right after the last one.

Signal handlers can only be installed from the main thread; elsewhere both are no-ops.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process was so it unwinds like Ctrl-C."""


class Received:
    """The first SIGINT or SIGTERM that reached a command (``None``: none did)."""

    def __init__(self) -> None:
        self.first: signal.Signals | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """Record the signal, then raise it: SIGTERM as :class:`Terminated`, SIGINT as Python does."""
        if self.first is None:
            self.first = signal.Signals(signum)
        if signum == signal.SIGTERM:
            raise Terminated(f"signal {signal.Signals(signum).name}")
        signal.default_int_handler(signum, frame)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[Received]:
    """SIGTERM raises :class:`Terminated` and SIGINT ``KeyboardInterrupt`` inside the ``with``
    body, and either is recorded in the :class:`Received` it yields; the old handlers after."""
    received = Received()
    if not _main_thread():
        yield received
        return
    previous: dict[int, Any] = {sig: signal.signal(sig, received.handle) for sig in HELD_SIGNALS}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT/SIGTERM during the body; re-deliver the first one received afterwards."""
    if not _main_thread():
        yield
        return
    received: list[int] = []

    def remember(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous: dict[int, Any] = {sig: signal.signal(sig, remember) for sig in HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        signal.raise_signal(received[0])
