"""The loops of a compiled kernel as its branches run them: trip counts and bundles issued.

:mod:`calibration.sources.compiler_schedule` reads libtpu's final bundles and nests loop
bodies by the dump's depth marks. Those marks do not bound the megakernel's outermost loop
(the ``lax.fori_loop`` over layers): its body is printed at depth 1 with single bundles at
depth 0 between its parts. This module reads the control flow itself:

- a loop is a **backward branch** (``sbr.rel (!%p) target = $regionN`` whose region starts at
  or before the branch): its body runs from the region's first bundle to the branch;
- its **trip count** is the immediate of the compare that defines the branch's predicate and
  that libtpu marks ``/* loop exit test */`` (``scmp.ge.s32.totalorder %s, 28``: 28 trips for an
  induction from 0 in steps of 1, which is how Pallas and ``lax.fori_loop`` lower a static
  range); a predicate compared with a register has no static count: the loop is
  **data-dependent** (the megakernel's expert loop, ``n`` experts read from SMEM);
- the **bundles issued** by a stretch of code: each bundle once, times the trip count of
  every loop inside the stretch that holds it; bundles of a data-dependent loop are left out
  and reported apart.

A bundle is one cycle of issue when nothing stalls; memory, DMA and semaphore waits and the
latency of a vector-to-scalar pop are not in it, so bundles issued / clock is a floor of the
code's time. The megakernel's conditionals (``lax.cond`` between an MLA and a KDA layer,
``pl.when`` per pick of the expert list) are if-converted: the K3 program has one forward
branch, so every layer issues both attention kinds' code, the one not taken predicated off.

:func:`layer_loop` applies this to the megakernel: its outermost loop (the longest backward
branch), the bundles one iteration issues outside its data-dependent loops, and those loops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from calibration.sources.compiler_schedule import Bundle, KernelSchedule

_REGION_START = re.compile(r"Start region (\d+)\b")
_BACK_EDGE = re.compile(r"sbr\.rel \((!?)(%p\w+)\) target = \$region(\d+)\b")
_EXIT_TEST = re.compile(r"(%p\w+) = scmp\.\w+\.s32\.totalorder (?:\(!?%p\w+\),? )?%s\w+, (\d+) /\* loop exit test \*/")


@dataclass(frozen=True)
class BranchLoop:
    start: int  # index of the body's first bundle (the back-edge's target)
    end: int  # index of the back-edge bundle (inclusive)
    trips: int | None  # the exit test's bound; None: data-dependent (the bound is a register)

    @property
    def bundles(self) -> int:
        return self.end - self.start + 1

    def holds(self, index: int) -> bool:
        return self.start <= index <= self.end


@dataclass(frozen=True)
class LayerLoop:
    """The megakernel's loop over layers, one iteration (bundle indices of the final dump)."""

    loop: BranchLoop
    issued_bundles: int  # one iteration, data-dependent loops left out
    data_dependent: tuple[BranchLoop, ...]  # inner loops without a static count (the expert loop)
    inner: tuple[BranchLoop, ...]  # every inner loop with a static count

    def issue_s(self, clock_hz: float) -> float:
        """Seconds one iteration issues at ``clock_hz`` (no stall counted)."""
        return self.issued_bundles / clock_hz


def branch_loops(bundles: list[Bundle]) -> list[BranchLoop]:
    """Every loop of the program, outermost first where two start together (module docstring)."""
    region_start: dict[int, int] = {}
    for bundle in bundles:
        for m in _REGION_START.finditer(bundle.text):
            region_start.setdefault(int(m.group(1)), bundle.index)
    found = []
    for bundle in bundles:
        for m in _BACK_EDGE.finditer(bundle.text):
            start = region_start.get(int(m.group(3)))
            if start is None or start > bundle.index:
                continue  # a forward branch (the program's few skips), not a loop
            found.append(BranchLoop(start, bundle.index, _trips(bundles, start, bundle.index, m.group(2))))
    return sorted(found, key=lambda loop: (loop.start, -loop.end))


def _trips(bundles: list[Bundle], start: int, end: int, predicate: str) -> int | None:
    for bundle in bundles[start: end + 1]:
        for m in _EXIT_TEST.finditer(bundle.text):
            if m.group(1) == predicate:
                return int(m.group(2))
    return None


def issued_bundles(loops: list[BranchLoop], start: int, end: int) -> tuple[int, list[BranchLoop]]:
    """(bundles issued by one pass over ``start..end``, the data-dependent loops inside it left
    out): each bundle times the trip counts of the loops strictly inside the stretch that hold it."""
    inside = [loop for loop in loops if start <= loop.start and loop.end <= end and (loop.start, loop.end) != (start, end)]
    dependent = [loop for loop in inside if loop.trips is None]
    # outermost data-dependent loops only: what they hold is theirs
    dependent = [d for d in dependent if not any(o is not d and o.start <= d.start and d.end <= o.end for o in dependent)]
    issued = 0
    for index in range(start, end + 1):
        if any(d.holds(index) for d in dependent):
            continue
        weight = 1
        for loop in inside:
            if loop.trips is not None and loop.holds(index):
                weight *= loop.trips
        issued += weight
    return issued, dependent


def layer_loop(schedule: KernelSchedule) -> LayerLoop:
    """The outermost loop of a megakernel's schedule (the longest backward branch: the loop over
    layers) and what one iteration issues. Raises ValueError for a program without a loop."""
    loops = branch_loops(schedule.bundles)
    if not loops:
        raise ValueError(f"{schedule.program}: no backward branch, no loop")
    outer = max(loops, key=lambda loop: loop.bundles)
    issued, dependent = issued_bundles(loops, outer.start, outer.end)
    inner = tuple(loop for loop in loops if outer.start <= loop.start and loop.end <= outer.end
                  and loop != outer and loop.trips is not None)
    return LayerLoop(outer, issued, tuple(dependent), inner)
