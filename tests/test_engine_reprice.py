"""A kept step priced again for other compute figures (:mod:`tpusim.engine.reprice`) is a fresh lowering.

A calibration's next point moves figures that price the pieces (the end-to-end TPU fit: the
MXU's weight push and the per-layer cost) and not the step's structure; the engine then
takes the kept step of the same structure and writes the new times into it instead of
lowering again. That must change nothing simulated: the repriced step equals a fresh
lowering on the new chip op by op (every piece's time, unit, copies waited for, slabs freed
and released, write-backs; launches, kernels' fixed time, collectives), and its results
equal a fresh one's with ``==`` — on every built-in schedule (``during_selection`` is
lowered afresh: its top-k is cut after lowering), on tpu-v5e (conversions on the VPU) and
tpu-v7 (weight pushes, message collectives), for each kind of figure, and back again to the
first chip. A figure that changes the pieces themselves (a conversion whose cost becomes
zero) is lowered afresh, the kept step untouched.
"""

from __future__ import annotations

import pytest
from engine_programs import program_on, results_of

from calibration.core.parameters import chip_with, figure_value
from hwmodels.schema import Chip
from tpusim.engine import simulate
from tpusim.engine.build import Lowered, lower
from tpusim.engine.policy import execution_policy
from tpusim.engine.reuse import _KEPT, forget_lowerings
from tpusim.schedule.schema import BUILTIN_SCHEDULES, load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.workload.program import Program

# figure path -> factor, per chip: each kind a calibration moves (tpusim.engine.reuse.structure_inputs)
MOVES = {
    "tpu-v7": {
        "compute.mxu.weight_push_s_per_tile": 1.3,  # the end-to-end fit's three
        "compute.mxu.weight_push_s_per_tile_by_dtype.int8": 0.8,
        "execution.per_layer_overhead_s": 4.0,
        "compute.mxu.peak_flops_per_s.bf16": 0.5,
        "compute.vpu.peak_flops_per_s.f32": 0.7,
        "links.ici.bandwidth_bytes_per_s_per_direction": 0.6,  # the links stage's
        "links.sibling.latency_s": 2.0,
        "execution.per_step_overhead_s": 3.0,  # the host stage's
    },
    "tpu-v5e": {
        "compute.mxu.peak_flops_per_s.bf16": 0.5,
        "compute.vpu.peak_flops_per_s.f32": 0.7,
        "compute.vpu.dequant_s_per_element.fp8_e4m3_b256": 1.5,
        "compute.vpu.dequant_s_per_element.mxfp4": 0.6,
        "links.ici.latency_s": 2.0,
        "execution.per_layer_overhead_s": 4.0,
    },
}



def moved(chip: Chip, paths: dict[str, float]) -> Chip:
    return chip_with(chip, {path: figure_value(chip, path) * factor for path, factor in paths.items()})


def _seqs(items: object) -> tuple[int, ...]:
    return tuple(item.seq for item in items)


def _view(lowered: Lowered) -> list[object]:
    """Every op's prices and structure in a comparable form (copies and slabs by number)."""
    return [(op.index, op.launches, op.launch_s, op.kernel_fixed_s, op.collectives,
             [(piece.duration_s.hex(), piece.unit, _seqs(piece.waits), _seqs(piece.frees), _seqs(piece.releases),
               _seqs(piece.writes)) for piece in op.pieces])
            for op in lowered.ops]


def _fresh(program: Program, schedule: str, chip: Chip) -> list[object]:
    effective = load_schedule(schedule)
    vmem = vmem_plan(effective, program.model, program.plan, program.resident_rows, program.kv_sequences)
    return _view(lower(program, effective, chip, execution_policy(chip), vmem))


def _repriced_against_fresh(program: Program, schedule: str, chip: Chip, other: Chip) -> None:
    forget_lowerings()
    fresh = results_of(program, schedule, other)
    forget_lowerings()
    first = results_of(program, schedule, chip)
    kept = _KEPT[-1].lowered
    repriced = results_of(program, schedule, other)
    during_selection = load_schedule(schedule).expert_issue == "during_selection"
    assert (len(_KEPT) == 1 and _KEPT[-1].lowered is kept) != during_selection
    assert repriced == fresh
    assert _view(_KEPT[-1].lowered) == _fresh(program, schedule, other)
    assert results_of(program, schedule, chip) == first  # and back
    assert _view(_KEPT[-1].lowered) == _fresh(program, schedule, chip)


@pytest.mark.parametrize(("hardware", "batch"), [("tpu-v5e", 1), ("tpu-v7", 8)])
def test_a_repriced_step_is_the_fresh_lowering_exactly(hardware: str, batch: int) -> None:
    """Every built-in schedule, every figure of :data:`MOVES` moved at once."""
    program, chip = program_on("kimi-k3-mini", hardware, batch)
    other = moved(chip, MOVES[hardware])
    for schedule in BUILTIN_SCHEDULES:
        _repriced_against_fresh(program, schedule, chip, other)


@pytest.mark.parametrize("hardware", ["tpu-v5e", "tpu-v7"])
def test_each_figure_alone_reprices_exactly(hardware: str) -> None:
    """Each figure of :data:`MOVES` alone (a finite difference's column), batch 1, one after
    another on the one kept step."""
    program, chip = program_on("kimi-k3-mini", hardware, 1)
    schedule = load_schedule("naive")
    forget_lowerings()
    simulate(program, schedule, chip)
    kept = _KEPT[-1].lowered
    for path, factor in MOVES[hardware].items():
        trial = moved(chip, {path: factor})
        simulate(program, schedule, trial)
        assert len(_KEPT) == 1 and _KEPT[-1].lowered is kept, path
        assert _view(kept) == _fresh(program, "naive", trial), path


def test_every_figure_at_once_and_the_fit_walking_its_points() -> None:
    """All of tpu-v7's moves together, then the steps of two batches in turn over three chips
    (a residual's walk: each point's kept step repriced each time), against fresh results."""
    programs = [program_on("kimi-k3-mini", "tpu-v7", batch)[0] for batch in (1, 8)]
    chip = program_on("kimi-k3-mini", "tpu-v7", 1)[1]
    chips = [chip, moved(chip, MOVES["tpu-v7"]),
             moved(chip, {"compute.mxu.weight_push_s_per_tile_by_dtype.int8": 1.1})]
    fresh = {}
    for number, trial in enumerate(chips):
        for position, program in enumerate(programs):
            forget_lowerings()
            fresh[number, position] = results_of(program, "layer-double-buffer", trial)
    forget_lowerings()
    for _round in range(2):
        for number, trial in enumerate(chips):
            for position, program in enumerate(programs):
                assert results_of(program, "layer-double-buffer", trial) == fresh[number, position], (number, position)
    assert len(_KEPT) == len(programs)  # one kept step a point, repriced in turn


def test_a_figure_that_changes_the_pieces_is_lowered_afresh() -> None:
    """A conversion that costs nothing has no piece: tpu-v5e without its FP8 and MXFP4
    conversion costs is lowered afresh; the kept step keeps its pieces and prices."""
    program, chip = program_on("kimi-k3-mini", "tpu-v5e", 1)
    vector = chip.vector_unit
    free = chip.model_copy(update={"compute": [
        unit.model_copy(update={"dequant_s_per_element": {}}) if unit is vector else unit for unit in chip.compute]})
    forget_lowerings()
    fresh = results_of(program, "naive", free)
    forget_lowerings()
    first = results_of(program, "naive", chip)
    kept = _KEPT[-1].lowered
    before = _view(kept)
    assert results_of(program, "naive", free) == fresh != first
    assert len(_KEPT) == 2 and _KEPT[0].lowered is kept and _view(kept) == before
    assert results_of(program, "naive", chip) == first
