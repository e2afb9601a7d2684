"""The TPU compiler's own static schedule of a kernel, read from libtpu's dump (no TPU needed).

libtpu writes, for every program it compiles with ``--xla_jf_dump_to=DIR`` in
``LIBTPU_INIT_ARGS``, the final VLIW bundles (``*-final_bundles.txt``) and one row of per-unit
use per bundle (``*-final_hlo-static-per-bundle-utilization.txt``, after a ``CAPACITY`` row:
units per bundle). A Pallas kernel is the program whose name contains ``tpu_custom_call`` (one
``pallas_call``). See ``shared/reference/compiler-static-schedule.md``.

What this module reads from them:

- :func:`parse_bundles`: every bundle's address, loop marker (``LH`` header, ``LB`` first
  bundle of a body, ``LE`` exit, ...), nesting depth (the count of ``>``) and text;
- :func:`parse_utilization`: the capacity row and each bundle's units in use;
- :func:`loops`: the loop bodies — a body starts at an ``LB`` bundle of depth ``d`` and runs
  while the depth stays ``>= d`` — with their bundle counts, their own bundles (nested
  bodies excluded) and per-unit totals, nested as in the code.

A bundle is one machine cycle of issue when nothing stalls: a loop body's bundle count is the
cycles one iteration issues (memory, DMA and semaphore waits are not in it). Units: ``MXU``,
``XLU`` (cross-lane), ``VALU`` (vector ALU), ``VPOP`` (MXU result pops), ``EUP``
(transcendentals), ``VLOAD``, ``VSTORE``, ``SALU`` (scalar), with their ``:FILL``/``:SPILL``
variants for register spills.

``python -m calibration.sources.compiler_schedule DIR`` prints the loop table of the kernel in
a dump folder; ``--inner`` one line per innermost loop that pushes weights, with its pushes by
weight dtype (:meth:`KernelSchedule.pushes`: FP8 against bf16 tells the TPU7x kernel's expert
panel loops from its dense ones).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+(LH|LB|LE|PB|PF|CT)?\s*:\s*(>*)\s*\{(.*)")
MARKERS = ("LH", "LB", "LE", "PB", "PF", "CT")
_PUSH = re.compile(r"vmatpush\w*((?:\.\w+)+)")  # a push's opcode suffixes: .bf16.msra.mxu0, .xpose.msk.f32...
_DTYPE = re.compile(r"^(?:bf16|f\d+\w*|[su]\d+)$")  # bf16, f32, f8e4m3, f8e4m3b11, s8


@dataclass
class Bundle:
    index: int  # position in the program (the utilisation row)
    address: int
    marker: str | None
    depth: int  # loop nesting depth (number of '>')
    text: str
    units: dict[str, int] = field(default_factory=dict)

    def count(self, opcode_prefix: str) -> int:
        """Instructions in this bundle whose opcode starts with ``opcode_prefix`` (e.g.
        ``vmatpush``)."""
        return len(re.findall(r"=\s*" + re.escape(opcode_prefix) + r"[\w.]*\s", self.text)) + len(
            re.findall(r"(?:\{|;;)\s*" + re.escape(opcode_prefix) + r"[\w.]*\s", self.text))


@dataclass
class Loop:
    start: int  # index of the body's first bundle
    end: int  # index of its last bundle (inclusive)
    depth: int
    bundles: int  # every bundle of the body, nested bodies included
    own_bundles: int  # nested bodies excluded
    units: dict[str, int]  # per-unit totals over the body's own bundles
    children: list[Loop] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "depth": self.depth, "bundles": self.bundles,
                "own_bundles": self.own_bundles, "units": self.units,
                "children": [c.as_dict() for c in self.children]}


def parse_bundles(text: str) -> list[Bundle]:
    """Every bundle of a ``final_bundles.txt`` (a bundle's comment may span lines)."""
    bundles: list[Bundle] = []
    for line in text.splitlines():
        m = _BUNDLE.match(line)
        if m is None:
            if bundles and not line.startswith("="):
                bundles[-1].text += "\n" + line
            continue
        address = int(m.group(1), 16) if m.group(1).startswith("0x") else int(m.group(1))
        bundles.append(Bundle(len(bundles), address, m.group(2), len(m.group(3)), m.group(4)))
    if not bundles:
        raise ValueError("no bundles found: not a final_bundles dump")
    return bundles


def parse_utilization(text: str) -> tuple[dict[str, int], list[list[int]]]:
    """(capacity per unit, one row of units in use per bundle) of a utilisation dump."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    try:
        head = next(i for i, line in enumerate(lines) if line.startswith("== CAPAC"))
    except StopIteration as error:
        raise ValueError("no CAPACITY row: not a per-bundle utilisation dump") from error
    names = [n.strip() for n in lines[head + 1].split(",")]
    capacity = dict(zip(names, (int(v) for v in lines[head + 2].split()), strict=True))
    rows = [[int(v) for v in line.split()] for line in lines[head + 3:] if not line.startswith("==")]
    if any(len(r) != len(names) for r in rows):
        raise ValueError("a utilisation row does not match the capacity row")
    return capacity, rows


def attach_units(bundles: list[Bundle], names: list[str], rows: list[list[int]]) -> None:
    if len(rows) != len(bundles):
        raise ValueError(f"{len(rows)} utilisation rows for {len(bundles)} bundles")
    for bundle, row in zip(bundles, rows, strict=True):
        bundle.units = {n: v for n, v in zip(names, row, strict=True) if v}


def loops(bundles: list[Bundle]) -> list[Loop]:
    """The outermost loop bodies, each with its nested bodies as ``children``.

    A body at depth ``d`` is a maximal run of bundles of depth ``>= d``, split where a bundle
    of depth exactly ``d`` is marked ``LB`` (two loops back to back); markers alone do not
    bound a body (a loop the compiler inverted may start its body unmarked)."""
    def regions(lo: int, hi: int, depth: int) -> list[Loop]:
        out, i = [], lo
        while i < hi:
            if bundles[i].depth < depth:
                i += 1
                continue
            start = i
            i += 1
            while i < hi and bundles[i].depth >= depth and not (bundles[i].depth == depth and bundles[i].marker == "LB"):
                i += 1
            children = regions(start, i, depth + 1)
            nested = {j for c in children for j in range(c.start, c.end + 1)}
            own = [bundles[j] for j in range(start, i) if j not in nested]
            units: dict[str, int] = {}
            for b in own:
                for name, v in b.units.items():
                    units[name] = units.get(name, 0) + v
            out.append(Loop(start, i - 1, depth, i - start, len(own), units, children))
        return out

    return regions(0, len(bundles), 1)


@dataclass
class KernelSchedule:
    program: str
    capacity: dict[str, int]
    bundles: list[Bundle]
    loops: list[Loop]

    @property
    def total_bundles(self) -> int:
        return len(self.bundles)

    def innermost(self) -> list[Loop]:
        """Loop bodies with no nested body, in program order."""
        found: list[Loop] = []

        def walk(ls: list[Loop]) -> None:
            for loop in ls:
                if loop.children:
                    walk(loop.children)
                else:
                    found.append(loop)
        walk(self.loops)
        return found

    def as_dict(self) -> dict[str, object]:
        return {"program": self.program, "capacity": self.capacity, "total_bundles": self.total_bundles,
                "loops": [loop.as_dict() for loop in self.loops]}

    def pushes(self, loop: Loop) -> dict[str, int]:
        """MXU weight pushes in ``loop``'s body by weight dtype (``vmatpush3.f8e4m3.msra.mxu0``
        counts as ``f8e4m3``): which loops feed FP8 to the MXU and which bf16."""
        found: dict[str, int] = {}
        for bundle in self.bundles[loop.start: loop.end + 1]:
            for suffixes in _PUSH.findall(bundle.text):
                dtype = next((part for part in suffixes.split(".") if _DTYPE.match(part)), "other")
                found[dtype] = found.get(dtype, 0) + 1
        return found

    def inner_table(self) -> list[dict[str, object]]:
        """One row per innermost loop body that pushes weights: where it starts, its bundles,
        its pushes by dtype and its VALU operations (a panel loop's iteration: the kernel's
        expert parts and dense panels, told apart by their pushes and decode work)."""
        return [{"start": loop.start, "bundles": loop.bundles, "pushes": pushes, "VALU": loop.units.get("VALU", 0),
                 "MXU": loop.units.get("MXU", 0)}
                for loop in self.innermost() if (pushes := self.pushes(loop))]


def read_dump(folder: str | Path, program: str | None = None) -> KernelSchedule:
    """The schedule of the (last) program whose name contains ``program`` in a dump folder;
    without a name, the largest program that is not the runtime's own (``TLP``, ``<late-…>``):
    a ``pallas_call`` alone is ``tpu_custom_call``, the megakernel's step is ``step``."""
    folder = Path(folder)
    finals = sorted(p for p in folder.glob("*-final_bundles.txt")
                    if (program in p.name if program else not ("-TLP-" in p.name or "<late-" in p.name)))
    if not finals:
        raise FileNotFoundError(f"no *{program or ''}*-final_bundles.txt in {folder}")
    final = finals[-1] if program else max(finals, key=lambda p: p.stat().st_size)
    prefix = final.name.rsplit("-", 2)[0]
    utils = sorted(folder.glob(f"{prefix}-*-final_hlo-static-per-bundle-utilization.txt"))
    if not utils:
        raise FileNotFoundError(f"no utilisation dump beside {final.name}")
    bundles = parse_bundles(final.read_text())
    capacity, rows = parse_utilization(utils[-1].read_text())
    attach_units(bundles, list(capacity), rows)
    return KernelSchedule(prefix, capacity, bundles, loops(bundles))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.sources.compiler_schedule", allow_abbrev=False)
    parser.add_argument("folder", help="libtpu's dump folder (--xla_jf_dump_to)")
    parser.add_argument("--program", default=None, help="a program name part (default: the largest kernel)")
    parser.add_argument("--inner", action="store_true",
                        help="list the innermost loops that push weights (bundles, pushes by dtype, VALU)")
    args = parser.parse_args(argv)
    try:
        schedule = read_dump(args.folder, args.program)
    except (FileNotFoundError, ValueError) as error:
        sys.stderr.write(f"compiler_schedule: {error}\n")
        return 2
    if args.inner:
        sys.stdout.write("".join(json.dumps(row) + "\n" for row in schedule.inner_table()))
        return 0
    sys.stdout.write(json.dumps(schedule.as_dict(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
