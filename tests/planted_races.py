"""What a planted race must look like in a check tool's ``race_reports``
(:mod:`megakernel.race_reports`): shared by the tests that plant one, so each asserts *which*
race the detector reported, not only that it reported one.

An access's ``where`` is ``device, core, frame`` as the detector prints it (a copy's ``device``
is its DMA's own id, not a device index); a buffer is ``('vmem', allocation, device, core)``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Any

Access = dict[str, Any]


def frame(access: Access) -> str:
    """The kernel function that made ``access`` (its source frame's last word)."""
    return str(access["where"]).rsplit("(", 1)[-1].rstrip(")")


def issuer(access: Access) -> tuple[int, int]:
    """``(device, core)`` as the detector names them first (a copy: its DMA's ids)."""
    found = re.match(r"\s*(\d+),\s*(\d+)", str(access["where"]))
    assert found is not None, access
    return int(found.group(1)), int(found.group(2))


def buffer(access: Access) -> tuple[str, int, int, int]:
    """``(space, allocation, device, core)`` of the buffer ``access`` touched."""
    space, allocation, device, core = ast.literal_eval(str(access["buffer"]))
    return space, allocation, device, core


def assert_landing_buffer_race(result: dict[str, Any], reader: str, writer: str) -> Counter[int]:
    """Every report of ``result`` is a skipped wait's race: the kernel function ``reader`` on a
    device reads a landing buffer in that device's own VMEM while a copy issued by ``writer``
    may still be writing it, and every report names the same buffer allocation. Returns the
    reports per reading device."""
    reports = result["race_reports"]
    assert result["races"] and 0 < len(reports) <= result["race_count"], result
    readers: Counter[int] = Counter()
    for report in reports:
        read, write = sorted((report["first"], report["second"]), key=lambda access: access["kind"])
        assert (read["kind"], frame(read), write["kind"], frame(write)) == ("read", reader, "write", writer), report
        assert read["buffer"] == write["buffer"], report
        space, _, device, _ = buffer(read)
        assert (space, (device, 0)) == ("vmem", issuer(read)), report  # the reader's own VMEM, core 0
        assert issuer(write) != issuer(read), report  # written by a copy, not by the reader
        readers[device] += 1
    assert len({buffer(r["first"])[1] for r in reports}) == 1, reports  # one landing buffer
    return readers
