"""Shrink a schedule, knob by knob, until it fits on-chip memory at a given row count.

Why: a speculative verify step runs ``draft_tokens + 1`` rows per sequence. At 64 rows
(batch 8, 7 draft tokens) Kimi K3's activations alone take 24 MiB of tpu-v7's 58 MiB usable
VMEM, and no built-in schedule fits; at 32 rows only ``naive`` does, which streams a layer at
a time and is several times slower than a schedule that keeps prefetching. A user comparing
speculative decoding across systems needs the TPU row priced with a schedule that fits, not
with the worst one or none.

How (:func:`shrink_to_fit`), a greedy descent from the given schedule over the sweep space's
one-knob moves (:func:`tpusim.sweep.candidates.neighbour_candidates`: a family's buffers,
prefetch distance or chunk; pool patterns; DMAs in flight; expert issue; KV tiles):

1. keep the moves that lower the static VMEM (:func:`tpusim.schedule.vmem.vmem_plan`, the
   one accounting the engine and the kernel share);
2. if some of them fit, take the one with the smallest analytic estimate
   (:mod:`tpusim.sweep.estimate`, on the very program) and stop;
3. otherwise take the move that buys VMEM cheapest: the least estimated slowdown per byte
   saved (ties: the larger saving), and repeat, at most ``max_rounds`` times.

Every move is recorded, so the caller can say what it changed. The result is a candidate a
sweep could also have found; it is not claimed optimal (greedy, estimate-ranked), and the
caller simulates it with the engine like any other schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwmodels.errors import InputError
from hwmodels.schema import Chip
from hwmodels.units import MIB
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import VmemPlan, vmem_plan
from tpusim.sweep.candidates import neighbour_candidates
from tpusim.sweep.estimate import EstimateContext, estimate
from tpusim.sweep.space import SweepSpace, default_space
from tpusim.workload.program import Program

MAX_ROUNDS = 12


@dataclass(frozen=True)
class FittedSchedule:
    """A schedule that fits, the one-knob moves that led there, and its estimate (s)."""

    schedule: Schedule
    moves: tuple[str, ...]
    estimate_s: float
    static_bytes: int

    def describe(self) -> str:
        """``shrunk to fit in 2 one-knob moves (router.buffers=1, latent_proj.prefetch_distance_ops=1)``."""
        if not self.moves:
            return "fits as given"
        moves = f"{len(self.moves)} one-knob move{'s' if len(self.moves) > 1 else ''}"
        return f"shrunk to fit in {moves}, estimate-guided ({', '.join(self.moves)})"


def shrink_to_fit(schedule: Schedule, program: Program, chip: Chip, *,
                  space: SweepSpace | None = None, max_rounds: int = MAX_ROUNDS) -> FittedSchedule:
    """The descent of the module docstring on ``program`` (its rows and sequences set the
    activation and KV sizes) against ``chip``'s usable on-chip memory; raises
    :class:`InputError` when no move lowers VMEM any more or ``max_rounds`` moves do not fit."""
    space = space or default_space()
    model, plan = program.model, program.plan
    capacity_bytes = chip.staging_memory.usable_bytes
    families = list(schedule.families)
    context = EstimateContext(program, chip)
    plans: dict[str, VmemPlan] = {}
    cost: dict[str, float] = {}

    def vmem(candidate: Schedule) -> VmemPlan:  # each candidate's accounting once (size, then estimate)
        digest = candidate.content_hash()
        if digest not in plans:
            plans[digest] = vmem_plan(candidate, model, plan, program.batch, program.kv_sequences)
        return plans[digest]

    def static(candidate: Schedule) -> int:
        return vmem(candidate).total_bytes

    def estimate_s(candidate: Schedule) -> float:
        digest = candidate.content_hash()
        if digest not in cost:
            cost[digest] = estimate(context, candidate, vmem(candidate)).step_s
        return cost[digest]

    current, moves, size = schedule, [], static(schedule)
    for _ in range(max_rounds + 1):
        if size <= capacity_bytes:
            return FittedSchedule(current, tuple(moves), estimate_s(current), size)
        if len(moves) == max_rounds:
            break
        options = [(c, static(c.schedule)) for c in neighbour_candidates(current, space, families)
                   if not c.rejected]
        options = [(c, s) for c, s in options if s < size]
        if not options:
            break
        fitting = [(c, s) for c, s in options if s <= capacity_bytes]
        if fitting:
            chosen, chosen_size = min(fitting, key=lambda cs: (estimate_s(cs[0].schedule), cs[1]))
        else:
            base = estimate_s(current)
            chosen, chosen_size = min(options, key=lambda cs: (
                max(estimate_s(cs[0].schedule) - base, 0.0) / (size - cs[1]), cs[1]))
        moves.append(chosen.schedule.name.rpartition("~")[2])
        current, size = chosen.schedule, chosen_size
    raise InputError(f"{schedule.name} cannot be shrunk to fit {capacity_bytes / MIB:.1f} MiB of on-chip memory "
                     f"at {program.batch} rows ({size / MIB:.1f} MiB after {len(moves)} one-knob moves)")
