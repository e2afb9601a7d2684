"""A lowered step kept and reset (:mod:`tpusim.engine.reuse`) runs exactly as a fresh lowering.

The engine keeps the last few lowered steps and, when the same step is simulated again, sets
their run state back instead of lowering again. That must change nothing simulated: the reset
state equals a fresh lowering's, attribute by attribute, and a reused step's results equal a
fresh one's with ``==`` on every built-in schedule, K3 and its mini, batch 1 and 8, TPU v7 and
v5e (a lowering of another step in between: the store looks steps up by their inputs). The
lowering's collectives (step 5), shared by every schedule of one program on one chip, too.
"""

from __future__ import annotations

import pytest
from engine_programs import program_on, results_of

from hwmodels.schema import Chip
from tpusim.engine import build, simulate
from tpusim.engine.build import Lowered
from tpusim.engine.policy import execution_policy
from tpusim.engine.reuse import _KEPT, forget_lowerings, lowered_step
from tpusim.schedule.schema import BUILTIN_SCHEDULES, load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program

# What a run may set and the next run must find clear. Flags hold the number of the run that set
# them (tpusim.engine.items), so they are compared as "set in the held run". A copy's ``stream``,
# ``lane``, ``issue_s`` and ``land_s`` are written in every run before they are read, so they are
# left as the last run wrote them (tpusim.engine.reuse).
DESC_FLAGS = ("landed",)
SLAB_FLAGS = ("released", "freed", "free_on_land")



def _state(lowered: Lowered) -> list[object]:
    """Everything a run may mutate that the next run reads, in a comparable form (flags: set in
    the run ``lowered.runs``, the held one)."""
    run = lowered.runs
    out: list[object] = []
    for pool in lowered.pools:
        out.append((pool.name, pool.ptr, pool.used_bytes))
        for slab in pool.order:
            out.append((slab.seq, slab.ring.used, *(getattr(slab, name) == run for name in SLAB_FLAGS),
                        slab.landed_in(run)))
            out.extend((desc.seq, desc.waiter, *(getattr(desc, name) == run for name in DESC_FLAGS))
                       for desc in slab.descs)
    for op in lowered.ops:
        out.extend((desc.seq, desc.waiter, *(getattr(desc, name) == run for name in DESC_FLAGS))
                   for piece in op.pieces for desc in piece.writes)
    return out


@pytest.mark.parametrize("schedule", BUILTIN_SCHEDULES)
def test_reset_state_equals_a_fresh_lowering(schedule: str) -> None:
    """After a run, the kept step's state is set back to exactly its state as lowered."""
    program, chip = program_on("kimi-k3-mini", "tpu-v5e", 8)
    effective = load_schedule(schedule)
    policy = execution_policy(chip)
    vmem = vmem_plan(effective, program.model, program.plan, program.resident_rows, program.kv_sequences)
    forget_lowerings()
    with lowered_step(program, effective, chip, policy, vmem) as lowered:
        fresh = _state(lowered)
    results_of(program, schedule, chip)  # runs the kept step: its state moves
    assert _state(_KEPT[-1].lowered) != fresh
    with lowered_step(program, effective, chip, policy, vmem) as again:
        assert again is _KEPT[-1].lowered  # reused, not lowered again
        assert _state(again) == fresh


def test_a_run_that_raised_leaves_no_waiter() -> None:
    """A copy's waiter is cleared when it lands; a run that raised before some landed leaves
    waiters, which the next reset clears."""
    program, chip = program_on("kimi-k3-mini", "tpu-v5e", 1)
    effective = load_schedule("published")
    policy = execution_policy(chip)
    vmem = vmem_plan(effective, program.model, program.plan, program.resident_rows, program.kv_sequences)
    forget_lowerings()
    with pytest.raises(RuntimeError, match="stopped"), lowered_step(program, effective, chip, policy, vmem) as held:
        fresh = _state(held)
        copy = next(desc for pool in held.pools for slab in pool.order for desc in slab.descs)
        copy.waiter = object()  # a run waiting on that copy when it stopped
        raise RuntimeError("stopped")
    with lowered_step(program, effective, chip, policy, vmem) as again:
        assert again is held and _state(again) == fresh


def test_a_held_step_is_not_shared() -> None:
    """A run holding a kept step (another thread) makes a second run lower its own copy."""
    program, chip = program_on("kimi-k3-mini", "tpu-v5e", 1)
    effective = load_schedule("published")
    policy = execution_policy(chip)
    vmem = vmem_plan(effective, program.model, program.plan, program.resident_rows, program.kv_sequences)
    forget_lowerings()
    with lowered_step(program, effective, chip, policy, vmem) as held:
        with lowered_step(program, effective, chip, policy, vmem) as other:
            assert other is not held and _state(other) == _state(held)
        assert len(_KEPT) == 1 and _KEPT[0].lowered is held  # the second copy is not kept
        expected = results_of(program, "published", chip)  # runs on a copy of its own, too
    assert results_of(program, "published", chip) == expected  # the kept one, reset


def test_reused_step_equals_fresh_mini() -> None:
    """The fast check (mini, tpu-v5e: copies in issue order, conversions), batch 1."""
    program, chip = program_on("kimi-k3-mini", "tpu-v5e", 1)
    for schedule in BUILTIN_SCHEDULES:
        forget_lowerings()
        fresh = results_of(program, schedule, chip)
        results_of(program, BUILTIN_SCHEDULES[0] if schedule != BUILTIN_SCHEDULES[0] else BUILTIN_SCHEDULES[1], chip)
        assert results_of(program, schedule, chip) == fresh, schedule


@pytest.mark.slow
@pytest.mark.parametrize("hardware", ["tpu-v7", "tpu-v5e"])
@pytest.mark.parametrize("model", ["kimi-k3", "kimi-k3-mini"])
@pytest.mark.parametrize("batch", [1, 8])
def test_reused_step_equals_fresh_exactly(model: str, hardware: str, batch: int) -> None:
    program, chip = program_on(model, hardware, batch)
    forget_lowerings()
    fresh = {schedule: results_of(program, schedule, chip) for schedule in BUILTIN_SCHEDULES}
    for schedule in BUILTIN_SCHEDULES:  # each step kept, then reset and run again
        assert results_of(program, schedule, chip) == fresh[schedule], (model, hardware, batch, schedule)


def test_collectives_shared_across_schedules_exactly() -> None:
    """Step 5 of the lowering is remembered per (program, chip, policy) and shared by every
    schedule: a schedule lowered with the plans another schedule's lowering made runs exactly as
    one lowered with plans of its own (K3 on tpu-v7: message collectives, chains)."""
    program, chip = program_on("kimi-k3", "tpu-v7", 1)
    forget_lowerings()
    build._COLLECTIVES.clear()
    own = results_of(program, "naive", chip)
    forget_lowerings()
    build._COLLECTIVES.clear()
    results_of(program, "published", chip)  # lowers step 5 for the program
    assert len(build._COLLECTIVES) == 1
    assert results_of(program, "naive", chip) == own  # naive lowered with published's plans
    assert len(build._COLLECTIVES) == 1


def _with_copy_engine(chip: Chip, bandwidth_scale: float, latency_s: float) -> Chip:
    """``chip`` with other HBM and DMA figures (what the tpu-v5e kernel fit moves)."""
    hbm = chip.hbm.model_copy(update={"sustained_bandwidth_bytes_per_s": chip.hbm.sustained_bandwidth_bytes_per_s.model_copy(
        update={"value": chip.hbm.sustained_bandwidth_bytes_per_s.value * bandwidth_scale})})
    dma = chip.dma.model_copy(update={"issue_latency_s": chip.dma.issue_latency_s.model_copy(update={"value": latency_s})})
    return chip.model_copy(update={"hbm": hbm, "dma": dma})


@pytest.mark.parametrize("hardware", ["tpu-v7", "tpu-v5e"])
def test_other_copy_engine_figures_reuse_the_step_exactly(hardware: str) -> None:
    """A step whose chip differs only in its HBM and DMA figures (read by the HBM server alone)
    runs on the kept lowering, reset, and its results equal a fresh lowering's with ``==``; a
    chip with other compute figures is the kept lowering priced again (:mod:`tpusim.engine.reprice`,
    ``tests/test_engine_reprice.py``), equal to its fresh lowering too."""
    program, chip = program_on("kimi-k3-mini", hardware, 1)
    other = _with_copy_engine(chip, 0.8, 2e-6)
    forget_lowerings()
    fresh = results_of(program, "published", other)
    assert len(_KEPT) == 1
    forget_lowerings()
    results_of(program, "published", chip)
    lowered = _KEPT[-1].lowered
    reused = results_of(program, "published", other)
    assert len(_KEPT) == 1 and _KEPT[-1].lowered is lowered  # the same lowering, reset
    assert reused == fresh
    assert reused != results_of(program, "published", chip)  # the figures do move the step
    vector = chip.vector_unit
    slower = chip.model_copy(update={"compute": [
        unit.model_copy(update={"peak_flops_per_s": {dtype: figure.model_copy(update={"value": figure.value / 2})
                                                   for dtype, figure in unit.peak_flops_per_s.items()}})
        if unit is vector else unit for unit in chip.compute]})
    forget_lowerings()
    fresh_slower = results_of(program, "layer-double-buffer", slower)
    forget_lowerings()
    results_of(program, "layer-double-buffer", chip)
    lowered = _KEPT[-1].lowered
    assert results_of(program, "layer-double-buffer", slower) == fresh_slower
    assert len(_KEPT) == 1 and _KEPT[-1].lowered is lowered  # compute figures only price it: repriced


def test_a_programs_lowering_facts_live_as_long_as_the_program() -> None:
    """Remembered by identity while the program lives, however many other programs are lowered in
    between (a calibration walks a dozen in turn), and dropped when it is collected."""
    import gc

    from tpusim.engine import lowering_facts as facts_module

    loaded = load_model("kimi-k3-mini")
    plan = plan_for(loaded, 16)
    first = build_program(loaded, plan, batch=1)
    facts = facts_module.lowering_facts(first)
    others = [build_program(loaded, plan, batch=batch) for batch in range(2, 2 + 2 * facts_module.KEPT_PROGRAMS)]
    for other in others:
        facts_module.lowering_facts(other)
    assert facts_module.lowering_facts(first) is facts  # not worked out again
    key = id(first)
    del first, facts
    gc.collect()
    assert key not in facts_module._FACTS


def test_a_step_not_kept_runs_the_same_and_leaves_the_store_alone() -> None:
    """Within :func:`~tpusim.engine.reuse.lowerings_not_kept` (a sweep worker's simulations) a
    new step is lowered, run and dismantled: the results equal a kept step's, the store is
    unchanged, and a step the store already holds is still reused."""
    from tpusim.engine.reuse import lowerings_not_kept

    program, chip = program_on("kimi-k3-mini", "tpu-v5e", 8)
    forget_lowerings()
    kept = results_of(program, "published", chip)
    store = list(_KEPT)
    with lowerings_not_kept():
        not_kept = results_of(program, "layer-double-buffer", chip)
        assert store == _KEPT
        assert results_of(program, "published", chip) == kept  # the kept step, reused
    assert store == _KEPT
    forget_lowerings()
    assert results_of(program, "layer-double-buffer", chip) == not_kept  # a fresh, kept lowering: the same


def test_steps_kept_for_a_walk_are_dropped_after_it() -> None:
    """:func:`~tpusim.engine.reuse.lowerings_kept` (a fit walking its points) keeps one step a
    point while it lasts; after it the limits and the store are back within them (the default
    limits here; a process's record predictor may have raised them: set back after)."""
    from tpusim.engine.reuse import _LIMITS, KEPT, KEPT_COPIES, keep_lowerings, lowerings_kept

    chip = program_on("kimi-k3-mini", "tpu-v5e", 1)[1]
    programs = [program_on("kimi-k3-mini", "tpu-v5e", batch)[0] for batch in range(1, KEPT + 3)]
    limits = dict(_LIMITS)
    keep_lowerings(KEPT, KEPT_COPIES)
    try:
        forget_lowerings()
        with lowerings_kept(len(programs)):
            for program in programs:
                simulate(program, load_schedule("naive"), chip)
            assert [kept.program for kept in _KEPT] == programs
        assert _LIMITS["steps"] == KEPT and [kept.program for kept in _KEPT] == programs[-KEPT:]
    finally:
        keep_lowerings(limits["steps"], limits["copies"])
