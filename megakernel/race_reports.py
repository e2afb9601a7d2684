"""What Pallas' TPU-interpret race detector reported, not only whether it did.

The detector (``jax._src.pallas.mosaic.interpret.race_detection_state``, jax 0.10.2) sets one
flag and prints each race it finds::

    RACE DETECTED
      read of BUFFER[RANGE] from DEVICE, CORE, FRAME
      clock: ...
      write of BUFFER[RANGE] from DEVICE, CORE[,] FRAME
      clock: ...

:func:`capturing_races` keeps those prints (and lets every other line through) and parses each
into a :class:`Race`: the two accesses, their buffers and the source frames (``file:line
(function)`` of the kernel code that made them), so a test of a planted race can assert
*which* race was found. The check tools (``race_check``, ``collective_check``,
``multi_device_check``, ``decode_check``) put them in their JSON as ``race_reports``.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass

HEADER = "RACE DETECTED"
ACCESS = re.compile(r"^\s*(read|write) of (.*?)\[(.*)\] from (.*)$")
CLOCK_TAIL = re.compile(r"^[\s\d\[\],.]+$")  # a vector clock wrapped onto the next lines


@dataclass(frozen=True)
class Access:
    kind: str  # "read" or "write"
    buffer: str  # the detector's buffer key
    where: str  # "device, core, frame" as printed: the frame names the kernel source line


@dataclass(frozen=True)
class Race:
    first: Access  # the access that found the race
    second: Access  # the earlier, unordered access it conflicts with

    def mentions(self, text: str) -> bool:
        """Whether either access's buffer or source frame contains ``text``."""
        return any(text in f"{a.buffer} {a.where}" for a in (self.first, self.second))


def parse_races(text: str) -> list[Race]:
    """Every race report in the detector's printed ``text`` (its vector clocks may wrap over
    several lines: a report runs from its header over every line of report content)."""
    races, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() != HEADER:
            i += 1
            continue
        j, accesses = i + 1, []
        while j < len(lines) and lines[j].strip() != HEADER and _report_content(lines[j]):
            if m := ACCESS.match(lines[j]):
                accesses.append(Access(m.group(1), m.group(2).strip(), m.group(4).strip()))
            j += 1
        if len(accesses) >= 2:
            races.append(Race(accesses[0], accesses[1]))
        i = j
    return races


def _report_content(line: str) -> bool:
    """An access line, a ``clock:`` line or a wrapped clock's continuation."""
    return bool(ACCESS.match(line)) or line.strip().startswith("clock:") or bool(CLOCK_TAIL.match(line))


class _Tee(io.TextIOBase):
    """Keeps what is written and passes every line that is not part of a race report on."""

    def __init__(self, out: io.TextIOBase) -> None:
        self.out, self.kept = out, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return len(text)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def capturing_races() -> Iterator[list[Race]]:
    """Within the block, the detector's reports are captured (not printed); on exit the list
    yielded holds them parsed, and any other captured text goes to standard error (the check
    tools' standard output is their JSON)."""
    found: list[Race] = []
    tee = _Tee(sys.stderr)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(tee):  # type: ignore[type-var]
        try:
            yield found
        finally:
            text = tee.kept.getvalue()
            found.extend(parse_races(text))
            other = _outside_reports(text)
            if other:
                sys.stderr.write(other + "\n")


def _outside_reports(text: str) -> str:
    kept, inside = [], False
    for line in text.splitlines():
        if line.strip() == HEADER:
            inside = True
        elif not (inside and _report_content(line)):
            inside = False
            if line.strip():
                kept.append(line)
    return "\n".join(kept)


def as_json(races: list[Race]) -> list[dict[str, object]]:
    return [asdict(r) for r in races]
