"""Sweep output files: the append-only ``sweep.csv`` and atomic writes for the rest.

``sweep.csv`` holds one row per candidate, written the moment its final status is known
(pruned rows first, then simulated rows as the engine finishes them, estimated-only rows at
the end) and flushed row by row, so an interrupted sweep keeps every finished row. Columns:

==================  =====================================================================
column              meaning
==================  =====================================================================
hash                :meth:`Schedule.content_hash` (the resume key)
name, source        candidate name; builtin / neighbour / sample
status              ``simulated`` | ``estimated`` (estimate only) | ``pruned``
reason              why it was pruned (``vmem: ...``, ``dmas: ...``, ``vmem (simulated): ...``,
                    ``schema: ...`` for settings the schedule schema rejects)
predicted_ms        the step time this row reports, labelled by ``predicted_by``
predicted_by        ``simulated`` (engine, full step) or ``estimate``
tokens_per_s        ``batch / predicted step`` (same label)
exposed_dma_ms      un-overlapped copy time (same label)
vmem_peak_mib       engine's VMEM peak (simulated rows)
vmem_static_mib     static scratch from :func:`tpusim.schedule.vmem.vmem_plan`
est_ms, screen_ms   the analytic estimate; the engine on the first N layers (ranking only)
sim_ms              the engine's full step time
overlap_fraction    share of copy time hidden under compute (simulated)
busy                busy fraction per resource (simulated), ``name=value;...``
<knobs>             ``<family>.distance|chunk_mib|buffers``, pools, max_dmas_in_flight, ...
==================  =====================================================================

Floats are written with ``repr`` precision so a resumed sweep reads back exactly the
numbers it wrote. A torn last line (no newline: the process died mid-write) is dropped
when the file is reopened.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from hwmodels.atomic import (  # noqa: F401 - the writers re-exported for sweep modules
    check_output_file,
    write_bytes_atomic,
    write_text_atomic,
)
from hwmodels.errors import InputError

BASE_COLUMNS = (
    "hash", "name", "source", "status", "reason", "predicted_ms", "predicted_by", "tokens_per_s",
    "exposed_dma_ms", "vmem_peak_mib", "vmem_static_mib", "est_ms", "screen_ms", "sim_ms",
    "overlap_fraction", "busy",
)
FLOAT_COLUMNS = ("predicted_ms", "tokens_per_s", "exposed_dma_ms", "vmem_peak_mib", "vmem_static_mib",
                 "est_ms", "screen_ms", "sim_ms", "overlap_fraction")
STATUSES = ("simulated", "estimated", "pruned")


def csv_cell(value: Any) -> str:
    """A value as ``sweep.csv`` holds it ('' for none; floats by ``repr``, so they read back exactly)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def parse_row(row: dict[str, str]) -> dict[str, Any]:
    """A CSV row with its float columns parsed (``None`` where empty)."""
    out: dict[str, Any] = dict(row)
    for column in FLOAT_COLUMNS:
        text = row.get(column, "")
        out[column] = float(text) if text not in ("", None) else None
    return out


class SweepCsv:
    """The append-only results table (see the module docstring)."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns
        self._handle: TextIO | None = None
        self._writer: csv.DictWriter[str] | None = None

    def read(self) -> list[dict[str, Any]]:
        """Every complete row already in the file (a torn last line is dropped)."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        text = data[: data.rfind(b"\n") + 1].decode()  # drop a torn last line
        if not text:
            return []
        reader = csv.DictReader(io.StringIO(text))
        if list(reader.fieldnames or []) != self.columns:
            raise InputError(
                f"{self.path}: columns differ from this sweep's (another model or space?); "
                "use a new --out folder or delete the file")
        return [parse_row(row) for row in reader]

    def open(self, *, resume: bool) -> None:
        """Open for appending (``resume``) or start a fresh file with the header."""
        fresh = True
        check_output_file(self.path)  # a FIFO, device or folder named sweep.csv is refused
        if resume and self.path.exists():
            data = self.path.read_bytes()
            keep = data[: data.rfind(b"\n") + 1]
            if len(keep) != len(data):  # torn last line: cut it off before appending
                with self.path.open("r+b") as handle:
                    handle.truncate(len(keep))
            fresh = not keep.strip()
            self._handle = self.path.open("a", newline="")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("w", newline="")
        self._writer = csv.DictWriter(self._handle, fieldnames=self.columns, extrasaction="ignore",
                                      lineterminator="\n")
        if fresh:
            self._writer.writeheader()
        self._handle.flush()

    def append(self, row: dict[str, Any]) -> None:
        """Write one row and flush it to the OS (it survives the process being killed)."""
        assert self._writer is not None and self._handle is not None, "call open() first"
        self._writer.writerow({column: csv_cell(row.get(column)) for column in self.columns})
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            self._writer = None


def csv_columns(knobs: Iterable[str]) -> list[str]:
    return [*BASE_COLUMNS, *knobs]
