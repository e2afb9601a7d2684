"""Tables for terminals and for files: one mechanism behind every table command's ``--format``.

A command builds its table as a :class:`TableData` (title, columns, rows of strings, plus the
machine-readable records for JSON) and hands it to :func:`emit`, which writes it as

- ``table``: a rich table. On a terminal it fits the window; piped into a file or another
  program it keeps its natural width instead of being squeezed to rich's default 80 columns
  (:func:`console`);
- ``markdown``: a GitHub-flavoured pipe table (title as a heading line);
- ``csv``: RFC 4180 via the standard :mod:`csv` module (title omitted);
- ``json``: the records, indented.

:func:`add_format_option` adds ``--format`` (and keeps a command's historical ``--json``
flag meaning ``--format json``).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

FORMATS = ("table", "markdown", "csv", "json")
PIPE_WIDTH = 1_000  # columns a table may use when the output is not a terminal


def add_format_option(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    """``--format table|markdown|csv|json`` (and ``--json`` = ``--format json``)."""
    parser.add_argument("--format", choices=FORMATS, default=None, dest="output_format",
                        help="table (rich, full width when piped), markdown, csv or json (default: table)")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="the same as --format json")


def output_format(args: argparse.Namespace) -> str:
    """The chosen format: ``--json`` (kept for scripts written before ``--format``) or
    ``--format`` (default ``table``); both naming different formats is an InputError."""
    chosen = getattr(args, "output_format", None)
    if getattr(args, "json", False):
        if chosen not in (None, "json"):
            from hwmodels.errors import InputError

            raise InputError(f"--json and --format {chosen} ask for different outputs; give one of them")
        return "json"
    return chosen or "table"


def console(stream: TextIO | None = None) -> Console:
    """A rich console on ``stream`` (default stdout) that does not wrap when piped."""
    stream = stream or sys.stdout
    if stream.isatty():
        return Console(file=stream)
    return Console(file=stream, width=PIPE_WIDTH, soft_wrap=True)


@dataclass
class TableData:
    """One table: display strings for table/markdown/csv, records for JSON."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    records: Any = None  # what --format json prints (default: rows as dicts)
    right_aligned: Sequence[str] = ()

    def add(self, *cells: Any) -> None:
        self.rows.append(["" if cell is None else str(cell) for cell in cells])

    def json_records(self) -> Any:
        if self.records is not None:
            return self.records
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def _markdown(table: TableData) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [f"**{table.title}**", ""] if table.title else []
    lines.append("| " + " | ".join(cell(c) for c in table.columns) + " |")
    lines.append("| " + " | ".join("---:" if c in table.right_aligned else "---" for c in table.columns) + " |")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines) + "\n"


def _rich(table: TableData) -> Table:
    """The table for rich, every string escaped (``[hash]`` is data, not a style tag)."""
    rich_table = Table(title=escape(table.title) if table.title else None)
    for column in table.columns:
        rich_table.add_column(escape(column), justify="right" if column in table.right_aligned else "left")
    for row in table.rows:
        rich_table.add_row(*(escape(cell) for cell in row))
    return rich_table


def emit(tables: TableData | Sequence[TableData], fmt: str, stream: TextIO | None = None,
         *, notes: Sequence[str] = ()) -> None:
    """Write ``tables`` (one or several) in format ``fmt``; ``notes`` follow as plain lines
    (as ``#`` comments in CSV, a ``notes`` key in JSON)."""
    stream = stream or sys.stdout
    group = [tables] if isinstance(tables, TableData) else list(tables)
    if fmt == "json":
        data: Any = group[0].json_records() if len(group) == 1 else {t.title: t.json_records() for t in group}
        if notes:
            data = {"rows" if len(group) == 1 else "tables": data, "notes": list(notes)}
        json.dump(data, stream, indent=2, default=float)
        stream.write("\n")
        return
    if fmt == "csv":
        writer = csv.writer(stream, lineterminator="\n")
        for index, table in enumerate(group):
            if index:
                stream.write("\n")
            writer.writerow(table.columns)
            writer.writerows(table.rows)
        for note in notes:
            stream.write(f"# {note}\n")
        return
    if fmt == "markdown":
        stream.write("\n".join(_markdown(table) for table in group))
        for note in notes:
            stream.write(f"\n{note}\n")
        return
    out = console(stream)
    for table in group:
        out.print(_rich(table))
    for note in notes:
        out.print(note, highlight=False, markup=False)
