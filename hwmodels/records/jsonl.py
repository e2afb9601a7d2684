"""The one JSON-lines writer: every record file of the house is written here.

Kernel runs, XLA baselines, numerics, probes, static counts, predictions, measurement
files, the GPU harness's records and the joint search's Optuna journal all go through
:func:`append_lines` (or :func:`write_lines` for a whole file); ``tests/test_single_source.py``
checks that no other module appends to a file or writes JSON lines.

- The line format (:func:`record_line`): ``json.dumps`` with ``", "`` and ``": "``
  separators, one record a line; every committed ``calibration/data/*.jsonl`` is in it.
- Appending: all the lines of one call in **one** ``O_APPEND`` write, then ``fsync``
  (:func:`hwmodels.atomic.append_bytes`), so a run stopped mid-way keeps every record it
  finished, a reader sees a line whole or not at all, and concurrent appenders never
  interleave within a line. A file whose last line is already partial (an interrupted
  write) is refused rather than extended: the new line would be glued onto the broken one.
- Replacing a whole file: temporary file + rename (:func:`hwmodels.atomic.write_text_atomic`).

Standard library and :mod:`hwmodels.atomic` only, so the device harnesses import it with
nothing else of the house installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hwmodels.atomic import append_bytes, check_output_file, open_for_append, write_text_atomic
from hwmodels.errors import InputError

SEPARATORS = (", ", ": ")  # the records' format (readable, and what every committed file has)
COMPACT = (",", ":")  # files another program owns the format of (Optuna's journal)


def record_line(record: Any, *, sort_keys: bool = False, ensure_ascii: bool = True,
                separators: tuple[str, str] = SEPARATORS) -> str:
    """``record`` as one JSON line (no newline), in the records' one format."""
    return json.dumps(record, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _refuse_partial_last_line(target: Path, shown: str) -> None:
    """Raise InputError if ``target`` ends in a line without its newline."""
    try:
        size = target.stat().st_size
    except FileNotFoundError:
        return
    if not size:
        return
    with open(target, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
    count = target.read_bytes().count(b"\n") + 1
    raise InputError(f"{shown}: line {count}: the last line has no newline (a partial write?); "
                     "fix or remove it before appending")


def append_lines(path: Path | str, lines: Iterable[str], *, shown: str | None = None, sync: bool = True) -> Path:
    """Append ``lines`` (JSON text, no newlines) to ``path`` in one ``O_APPEND`` write, then
    ``fsync`` unless ``sync`` is False (module docstring); creates the file and its folder.
    ``shown`` names the file in the error for a partial last line (default: the path)."""
    path = Path(path)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    target = check_output_file(path)  # a FIFO or device is refused before the last line is read
    _refuse_partial_last_line(target, str(path) if shown is None else shown)
    if data:
        append_bytes(path, data, sync=sync)
    return path


class LineAppender:
    """:func:`append_lines` for one file a process appends to many times (Optuna's journal:
    thousands of small records per sweep): the path's checks and the partial-last-line refusal
    run once, at :meth:`open`; each :meth:`append` is then one ``O_APPEND`` write on the file
    descriptor kept open, without ``fsync`` (the record survives the process being killed,
    not a power cut). For a file that only this process writes while it is open (measured:
    opening and checking the journal for every record took 10 of 168 s of a profiled
    300-simulation K3 sweep)."""

    def __init__(self, path: Path | str, *, shown: str | None = None) -> None:
        self.path = Path(path)
        self._shown = shown
        self._fd: int | None = None

    def open(self) -> None:
        """Check the path and its last line (as :func:`append_lines` does) and open it."""
        if self._fd is None:
            target = check_output_file(self.path)
            _refuse_partial_last_line(target, str(self.path) if self._shown is None else self._shown)
            self._fd = open_for_append(self.path)

    def append(self, lines: Iterable[str]) -> None:
        """Append ``lines`` (JSON text, no newlines) in one write (opening the file first if needed)."""
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        if not data:
            return
        self.open()
        assert self._fd is not None
        written = os.write(self._fd, data)
        if written != len(data):  # pragma: no cover - short writes on local files are rare
            raise OSError(f"short write to {self.path} ({written} of {len(data)} bytes)")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def append_record(path: Path | str, record: Any, *, sort_keys: bool = False, ensure_ascii: bool = True) -> Path:
    """Append ``record`` to ``path`` as one JSON line (:func:`append_lines`)."""
    return append_lines(path, [record_line(record, sort_keys=sort_keys, ensure_ascii=ensure_ascii)])


def write_lines(path: Path | str, lines: Iterable[str]) -> Path:
    """Replace ``path`` with ``lines`` (JSON text, no newlines) atomically: the old file or
    the new one, never half."""
    return write_text_atomic(path, "".join(line + "\n" for line in lines))
