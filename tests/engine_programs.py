"""A built-in model's program on 16 chips of a catalog system, built once per process: the engine
tests' common input (reuse, run-ahead, repricing, the compiled engine); and a run's whole result in
a comparable form."""

from __future__ import annotations

import dataclasses
from functools import cache

from hwmodels.catalog import make_system
from hwmodels.schema import Chip
from tpusim.engine import InfeasibleSchedule, simulate
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import Program, build_program


@cache
def program_on(model: str, hardware: str, batch: int) -> tuple[Program, Chip]:
    """``model``'s program at ``batch`` on 16 ``hardware`` chips (uncalibrated), and the chip."""
    system = make_system(hardware, 16, calibrated=False)
    loaded = load_model(model)
    plan = plan_for(loaded, system.devices, devices_per_chip=system.chip.devices_per_chip)
    return build_program(loaded, plan, batch=batch), system.chip


def results_of(program: Program, schedule: str, chip: Chip) -> object:
    """Everything a run returns (events included; the event count apart), or what made it infeasible."""
    try:
        result = simulate(program, load_schedule(schedule), chip, record_events=True)
    except InfeasibleSchedule as error:
        return f"infeasible: {error}"
    return dataclasses.asdict(dataclasses.replace(result, event_count=0)), result.event_count
