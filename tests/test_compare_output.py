"""`compare` shows where the time goes (table columns, stacked bars) and its piped output
keeps its width; `--format` gives markdown, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tpusim.app.cli import main
from tpusim.app.tables import TableData, emit
from tpusim.compare.breakdown import PARTS, where_ms

ARGS = ["compare", "--model", "kimi-k3-mini", "--systems", "tpu-v7:1,gb200:1", "--batch", "1",
        "--schedule", "published"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    import contextlib

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main([*ARGS, "--format", "json", "--spec-acceptance", "3", "--drafter", "kimi-k3-eagle"]) == 0
    return json.loads(buffer.getvalue())


def test_parts_sum_to_the_step(rows) -> None:
    assert len(rows) == 4
    for row in rows:
        parts = where_ms(row)
        assert parts is not None and set(parts) == set(PARTS)
        assert sum(parts.values()) == pytest.approx(row["step_ms"], rel=1e-6)
        assert (parts["drafting"] > 0) == (row["acceptance_length"] is not None)
    gpu = next(r for r in rows if r["system"].startswith("gb200") and r["acceptance_length"] is None)
    assert where_ms(gpu)["launches"] > 0  # a per-kernel GPU stack pays for launches


def test_piped_table_is_not_wrapped(capsys) -> None:
    assert main(ARGS) == 0  # capsys's stdout is not a terminal
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "system" in line and "compute ms" in line)
    assert "exposed copies ms" in header and "schedule / note" in header
    assert max(len(line) for line in lines) > 80
    assert sum(line.startswith("│") for line in lines) == 2  # one line per row: nothing folded


def test_markdown_and_csv(capsys) -> None:
    assert main([*ARGS, "--format", "csv"]) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert table[0][:2] == ["system", "execution"] and "collectives ms" in table[0]
    assert len(table) == 3
    assert main([*ARGS, "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| system | execution |" in out and "| ---: |" in out


def test_emit_keeps_width_on_a_non_tty_stream() -> None:
    stream = io.StringIO()
    table = TableData(title="t", columns=["a", "b"])
    table.add("x" * 150, "y")
    emit(table, "table", stream)
    assert any("x" * 150 in line for line in stream.getvalue().splitlines())
