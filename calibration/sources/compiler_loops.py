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
- a **forward branch** skips the bundles up to its target (a region that starts there, often
  ``Start/End empty region N``); two of them back to back make an if/else — the first skips
  the first arm, the second (reached at the end of the first arm) skips the second: the
  megakernel's ``lax.cond`` between an MLA layer and a KDA layer;
- the **bundles issued** by a stretch of code: each bundle once, times the trip count of
  every loop inside the stretch that holds it; bundles of a data-dependent loop are left out
  and reported apart.

A bundle is one cycle of issue when nothing stalls; memory, DMA and semaphore waits and the
latency of a vector-to-scalar pop are not in it, so bundles issued / clock is a floor of the
code's time. Short conditional stretches other than the if/else arms (a skipped loop, a
``pl.when``) are counted as issued: an upper bound on them.

:func:`layer_loop` applies this to the megakernel: its outermost loop (the longest backward
branch), the bundles one iteration issues outside its data-dependent loops and outside the
arms of its if/else, each arm's own, and the data-dependent loops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from calibration.sources.compiler_schedule import Bundle, KernelSchedule

_REGION_START = re.compile(r"(?:Start region|Start/End empty region) (\d+)\b")
_BRANCH = re.compile(r"sbr\.rel \((!?)(%p\w+)\) target = \$region(\d+)\b")
ADJACENT_ARMS = 4  # bundles at most between the end of an if's first arm and the branch over its second
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
class Arm:
    start: int  # first bundle of an if/else arm
    end: int  # its last bundle (inclusive)
    issued_bundles: int  # one pass, its data-dependent loops left out
    data_dependent: tuple[BranchLoop, ...]


@dataclass(frozen=True)
class LayerLoop:
    """The megakernel's loop over layers, one iteration (bundle indices of the final dump)."""

    loop: BranchLoop
    issued_bundles: int  # one iteration outside the if/else arms, data-dependent loops left out
    arms: tuple[Arm, ...]  # the if/else's two arms (none when the body has no if/else)
    data_dependent: tuple[BranchLoop, ...]  # inner loops without a static count (the expert loop)
    inner: tuple[BranchLoop, ...]  # every inner loop with a static count

    def issue_s(self, clock_hz: float, arm: int | None = None) -> float:
        """Seconds one iteration issues at ``clock_hz`` (no stall counted), through ``arm``."""
        return (self.issued_bundles + (self.arms[arm].issued_bundles if arm is not None else 0)) / clock_hz


def _region_starts(bundles: list[Bundle]) -> dict[int, int]:
    found: dict[int, int] = {}
    for bundle in bundles:
        for m in _REGION_START.finditer(bundle.text):
            found.setdefault(int(m.group(1)), bundle.index)
    return found


def _branches(bundles: list[Bundle]) -> list[tuple[int, int, str]]:
    """(branch bundle, target bundle, predicate) of every relative branch with a known target."""
    starts = _region_starts(bundles)
    return [(bundle.index, starts[int(m.group(3))], m.group(2))
            for bundle in bundles for m in _BRANCH.finditer(bundle.text) if int(m.group(3)) in starts]


def branch_loops(bundles: list[Bundle]) -> list[BranchLoop]:
    """Every loop of the program, outermost first where two start together (module docstring)."""
    found = [BranchLoop(target, branch, _trips(bundles, target, branch, predicate))
             for branch, target, predicate in _branches(bundles) if target <= branch]
    return sorted(found, key=lambda loop: (loop.start, -loop.end))


def forward_branches(bundles: list[Bundle]) -> list[tuple[int, int]]:
    """(branch bundle, target bundle) of every forward branch, in program order."""
    return sorted((branch, target) for branch, target, _ in _branches(bundles) if target > branch)


def _trips(bundles: list[Bundle], start: int, end: int, predicate: str) -> int | None:
    for bundle in bundles[start: end + 1]:
        for m in _EXIT_TEST.finditer(bundle.text):
            if m.group(1) == predicate:
                return int(m.group(2))
    return None


def issued_bundles(loops: list[BranchLoop], start: int, end: int, skip: tuple[tuple[int, int], ...] = (),
                   iteration_of: BranchLoop | None = None) -> tuple[int, list[BranchLoop]]:
    """(bundles issued by one pass over ``start..end`` outside the ``skip`` ranges, the
    data-dependent loops inside it left out): each bundle times the trip counts of the loops
    within the stretch that hold it, but ``iteration_of`` (one iteration of that loop)."""
    inside = [loop for loop in loops if start <= loop.start and loop.end <= end and loop != iteration_of]
    dependent = [loop for loop in inside if loop.trips is None]
    # outermost data-dependent loops only: what they hold is theirs
    dependent = [d for d in dependent if not any(o is not d and o.start <= d.start and d.end <= o.end for o in dependent)]
    issued = 0
    for index in range(start, end + 1):
        if any(d.holds(index) for d in dependent) or any(lo <= index <= hi for lo, hi in skip):
            continue
        weight = 1
        for loop in inside:
            if loop.trips is not None and loop.holds(index):
                weight *= loop.trips
        issued += weight
    return issued, [d for d in dependent if not any(lo <= d.start <= hi for lo, hi in skip)]


def if_else_arms(bundles: list[Bundle], start: int, end: int) -> tuple[tuple[int, int], ...]:
    """The two arms of the largest if/else inside ``start..end`` (module docstring), or none."""
    forward = [(b, t) for b, t in forward_branches(bundles) if start <= b and t <= end]
    pairs = [((b1 + 1, t1 - 1), (b2 + 1, t2 - 1)) for b1, t1 in forward for b2, t2 in forward
             if t1 <= b2 <= t1 + ADJACENT_ARMS]
    if not pairs:
        return ()
    return max(pairs, key=lambda arms: arms[1][1] - arms[0][0])


def layer_loop(schedule: KernelSchedule) -> LayerLoop:
    """The outermost loop of a megakernel's schedule (the longest backward branch: the loop over
    layers) and what one iteration issues. Raises ValueError for a program without a loop."""
    bundles = schedule.bundles
    loops = branch_loops(bundles)
    if not loops:
        raise ValueError(f"{schedule.program}: no backward branch, no loop")
    outer = max(loops, key=lambda loop: loop.bundles)
    spans = if_else_arms(bundles, outer.start, outer.end)
    issued, dependent = issued_bundles(loops, outer.start, outer.end, spans, iteration_of=outer)
    arms = []
    for lo, hi in spans:
        arm_issued, arm_dependent = issued_bundles(loops, lo, hi, iteration_of=outer)
        arms.append(Arm(lo, hi, arm_issued, tuple(arm_dependent)))
    inner = tuple(loop for loop in loops if outer.start <= loop.start and loop.end <= outer.end
                  and loop != outer and loop.trips is not None)
    return LayerLoop(outer, issued, tuple(arms), tuple(dependent), inner)
