"""The sweep's progress display: one rich bar per phase, with ETA and the best so far.

Shown on stderr only when it is a terminal and the sweep is not ``quiet``; otherwise the bars
are off, so tests and pipes see no control characters. Either way each phase and advance is
also a :func:`tpusim.progress_notes.note` ("simulate 12/32, best 3.610 ms"), which costs
nothing unless someone listens (``tpusim demo`` prints the latest every few seconds).
"""

from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tpusim.progress_notes import note


class SweepProgress:
    """Phase bars (prune, estimate, screen, simulate) and a running "best so far"."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.best_ms: float | None = None
        self.best_name = ""
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._label = ""
        self._done = 0
        self._total = 0
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[best]}"),
                console=Console(stderr=True), transient=False,
            )

    def __enter__(self) -> SweepProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def phase(self, label: str, total: int, *, completed: int = 0) -> TaskID | None:
        """Start a new bar (the previous one stays, complete)."""
        self._label, self._done, self._total = label, completed, total
        self._note()
        if self._progress is None:
            return None
        self._task = self._progress.add_task(label, total=max(total, 1) if total else 0,
                                             completed=completed, best=self._best_text())
        return self._task

    def advance(self, task: TaskID | None, steps: int = 1) -> None:
        self._done += steps
        self._note()
        if self._progress is not None and task is not None:
            self._progress.update(task, advance=steps, best=self._best_text())

    def offer_best(self, step_ms: float | None, name: str) -> None:
        """Record a simulated result; the bar shows the fastest so far."""
        if step_ms is not None and (self.best_ms is None or step_ms < self.best_ms):
            self.best_ms, self.best_name = step_ms, name
            if self._progress is not None and self._task is not None:
                self._progress.update(self._task, best=self._best_text())

    def _note(self) -> None:
        best = self._best_text()
        note(f"{self._label} {self._done}/{self._total}" + (f", {best}" if best else ""))

    def _best_text(self) -> str:
        if self.best_ms is None:
            return ""
        return f"best {self.best_ms:.3f} ms (simulated) {self.best_name}"
