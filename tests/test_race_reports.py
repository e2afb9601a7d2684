"""megakernel.race_reports: the detector's printed reports parsed into the two accesses, and
captured without losing other output. The sample is the detector's own format (jax 0.10.2,
``race_detection_state.check_read`` / ``check_write``), written out here by hand."""

from __future__ import annotations

import sys

from megakernel.race_reports import Access, Race, capturing_races, parse_races

READ_RACE = """RACE DETECTED
  read of (0, 7)[(slice(0, 16, None), slice(0, 128, None))] from 0, 0, megakernel/kernel_ctx.py:212 (panel_products)
  clock: [ 0  0  0  3  0  0  0  0  0  0  0  0  4  0  0  0  0  0  0  0  0  0  0  0  0
  0  0  0  3  0  0  0]
  write of (0, 7)[(slice(0, 32, None), slice(0, 128, None))] from 9, 0 pallas_call
  clock: [2, 1, 0]
"""
WRITE_RACE = """RACE DETECTED
  write of (3, 12)[(slice(0, 8, None),)] from 3, 0, megakernel/kernel_collectives.py:88 (partial_reduce)
  clock: [1, 4]
  read of (3, 12)[(slice(0, 8, None),)] from 3, 0, megakernel/kernel_collectives.py:97 (partial_reduce)
  clock: [2, 3]
"""


def test_each_report_gives_both_accesses_their_buffer_and_source_line() -> None:
    races = parse_races("unrelated line\n" + READ_RACE + "more\n" + WRITE_RACE)
    assert len(races) == 2
    read, write = races
    assert (read.first.kind, read.second.kind) == ("read", "write")
    assert read.first.buffer == read.second.buffer == "(0, 7)"
    assert "kernel_ctx.py:212 (panel_products)" in read.first.where
    assert read.second.where.endswith("pallas_call")  # the DMA's write: no user frame
    assert (write.first.kind, write.second.kind) == ("write", "read")
    assert write.mentions("partial_reduce") and not read.mentions("partial_reduce")


def test_a_header_without_its_accesses_is_not_a_race() -> None:
    assert parse_races("RACE DETECTED\n  clock: [1]\n") == []


def test_capturing_keeps_reports_out_of_stdout_and_passes_the_rest_to_stderr(capsys: object) -> None:
    with capturing_races() as found:
        print(READ_RACE, end="")
        print("a line of the kernel's own")
    # exactly the one report printed, both accesses parsed (written out here, not by parse_races)
    assert found == [Race(Access("read", "(0, 7)", "0, 0, megakernel/kernel_ctx.py:212 (panel_products)"),
                          Access("write", "(0, 7)", "9, 0 pallas_call"))]
    out, err = capsys.readouterr()  # type: ignore[attr-defined]
    assert "RACE DETECTED" not in out and "RACE DETECTED" not in err
    assert "a line of the kernel's own" in err and sys.stdout is not None
