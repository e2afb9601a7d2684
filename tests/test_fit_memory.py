"""Schedules shrunk to fit on-chip memory at a speculative verify step's row count
(tpusim.sweep.fit_memory) and the compare rows that use them (tpusim.compare.schedule_choice)."""

from __future__ import annotations

from functools import cache

import pytest

from hwmodels.catalog import make_system
from hwmodels.errors import InputError
from tpusim.compare.schedule_choice import schedule_for
from tpusim.engine import simulate
from tpusim.schedule.schema import load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.sweep.fit_memory import shrink_to_fit
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program


@cache
def k3(rows: int, sequences: int) -> tuple:
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    plan = plan_for(model, system.devices, devices_per_chip=2)
    return model, plan, system, build_program(model, plan, batch=rows, sequences=sequences, context_tokens=1024)


def static_bytes(schedule, model, plan, rows: int, sequences: int) -> int:
    return vmem_plan(schedule, model, plan, rows, sequences).total_bytes


# 32 rows and more no longer fit at all: their collective buffers (vmem rule 6) alone take ~14 MiB;
# 24 rows stopped fitting with the kernel's loop scratch and 16-token KV write tile (59.2 MiB after
# every shrink move, 2026-12-05)
@pytest.mark.parametrize(("rows", "sequences"), [(16, 4), pytest.param(16, 8, marks=pytest.mark.slow)])
def test_published_shrinks_to_a_fitting_schedule_faster_than_naive(rows: int, sequences: int) -> None:
    model, plan, system, program = k3(rows, sequences)
    capacity = system.chip.staging_memory.usable_bytes
    published = load_schedule("published")
    assert static_bytes(published, model, plan, rows, sequences) > capacity  # the case this is for
    fitted = shrink_to_fit(published, program, system.chip)
    assert static_bytes(fitted.schedule, model, plan, rows, sequences) == fitted.static_bytes <= capacity
    assert 1 <= len(fitted.moves) <= 12 and fitted.schedule.name.count("~") == len(fitted.moves)
    step_s = simulate(program, fitted.schedule, system.chip).step_s
    naive = load_schedule("naive")
    if static_bytes(naive, model, plan, rows, sequences) <= capacity:  # 32 rows: the old fallback
        assert step_s < 0.75 * simulate(program, naive, system.chip).step_s


@pytest.mark.slow  # shrinks published through every candidate at 256 rows before refusing (~26 s, loaded machine)
def test_a_row_count_whose_activations_alone_overflow_is_refused_in_one_line() -> None:
    _, _, system, program = k3(256, 8)
    with pytest.raises(InputError, match=r"cannot be shrunk to fit .* MiB of on-chip memory at 256 rows"):
        shrink_to_fit(load_schedule("published"), program, system.chip)


@pytest.mark.slow  # a whole compare run with a shrink (~15 s, loaded machine)
def test_a_compare_row_that_does_not_fit_says_it_was_shrunk() -> None:
    model, plan, system, program = k3(16, 8)
    built = []
    chosen, how = schedule_for(model, plan, system, system.chip, batch=16, schedule="published", choose=None,
                               program_of=lambda: built.append(1) or program, sequences=8)
    assert how.startswith("given `published` does not fit on-chip memory at 16 rows; `published` shrunk to fit")
    assert chosen.name == "published-fitted-16rows" and built == [1]
    # a row that fits never builds the program
    chosen, how = schedule_for(model, plan, system, system.chip, batch=8, schedule="published", choose=None,
                               program_of=lambda: built.append(2) or program, sequences=8)
    assert how == "given (`published`)" and built == [1]
