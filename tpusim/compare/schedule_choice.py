"""How a compare row's megakernel schedule is chosen (one owner for every row kind).

In order (:func:`schedule_for`):

1. a chip that launches one kernel per op has no prefetch schedule (``naive`` stands for
   its kernels streaming their own weights);
2. a given schedule (``--schedule NAME|PATH``; on a GPU adapted to the L2 first) when it
   fits the on-chip memory at the row count;
3. with a chooser (``--schedule best``, the CLI's default), a reduced sweep per system, plan,
   rows and sequences (:func:`sweep_chooser`; when it prunes everything, rule 4 from
   ``published``);
4. otherwise ``published`` (on a GPU the first built-in that fits its L2); when that, or
   the given schedule, does not fit (a speculative verify step runs
   ``draft_tokens + 1`` rows per sequence), :func:`fit_fallback`: on a TPU the given
   schedule (or ``published``) shrunk knob by knob until it fits
   (:func:`tpusim.sweep.fit_memory.shrink_to_fit`) set against the first built-in that
   fits, the faster by the sweep's analytic estimate on the row's program; on a GPU the
   first built-in that fits its L2 (:func:`fitting_schedule`).

Every choice comes with a sentence saying which rule picked it (``schedule_choice``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from hwmodels.errors import InputError
from hwmodels.schema import Chip, System
from tpusim.schedule.schema import Schedule, load_schedule
from tpusim.schedule.vmem import InfeasibleSchedule, check_fits, vmem_plan
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import Program
from tpusim.workload.routing import RoutingModel
from tpusim.workload.sharding import ShardingPlan

# (model, plan, system, rows, sequences or None) -> the schedule to run and how it was chosen
ScheduleChooser = Callable[[ModelConfig, ShardingPlan, System, int, int | None], tuple[Schedule, str]]


def fitting_schedule(model: ModelConfig, plan: ShardingPlan, chip: Chip, batch: int,
                     names: tuple[str, ...] = ("published", "layer-double-buffer", "naive"),
                     sequences: int | None = None) -> tuple[Schedule, str]:
    """The first built-in schedule whose buffers fit the chip's on-chip memory (on a GPU,
    each adapted to the L2 with :func:`tpusim.engine.gpu.l2_schedule` first)."""
    from tpusim.engine.gpu import l2_schedule

    candidates: list[tuple[str, Schedule]] = []
    for name in names:
        if chip.kind == "gpu":
            candidates.append((f"{name} adapted to L2", l2_schedule(load_schedule(name))))
        candidates.append((name, load_schedule(name)))
    for name, schedule in candidates:
        if _fits(schedule, model, plan, chip, batch, sequences):
            return schedule, f"built-in `{name}` (first built-in that fits)"
    raise InputError(f"no built-in schedule fits {chip.name}'s on-chip memory for {model.name} at batch {batch}")


def sweep_chooser(*, budget: int, jobs: int, seed: int, out_dir: Path | None, context_tokens: int,
                  routing: RoutingModel, samples: int = 100, screen_factor: int = 4) -> ScheduleChooser:
    """Choose each megakernel row's schedule with a small sweep, cached per system, plan and row count.

    The sweep is a reduced one (the built-ins and their one-knob neighbours plus ``samples``
    random draws; ``budget`` full simulations) so a comparison of many rows stays quick; run
    ``tpusim sweep`` for a full search. Outputs go to ``out_dir/sweep-...`` when given.
    """
    from tpusim.sweep.space import default_space

    space = default_space().model_copy(update={"samples": samples})
    cache: dict[tuple[str, int, int | None, str, str], tuple[Schedule, str]] = {}

    def choose(model: ModelConfig, plan: ShardingPlan, system: System, batch: int,
               sequences: int | None) -> tuple[Schedule, str]:
        from tpusim.sweep import run_sweep

        key = (system.name + system.chip.execution.mode, batch, sequences, model.name, plan.name)
        if key not in cache:
            folder = (out_dir / f"sweep-{system.chip.name}x{system.chips}-{system.chip.execution.mode}-{plan.name}-b{batch}"
                      f"{f'-s{sequences}' if sequences and sequences != batch else ''}"
                      if out_dir else Path(tempfile.mkdtemp(prefix="tpusim-sweep-")))
            result = run_sweep(model, plan, system, batch=batch, out_dir=folder, budget=budget, jobs=jobs,
                               seed=seed, context_tokens=context_tokens, routing=routing, quiet=True,
                               space=space, screen_factor=screen_factor, sequences=sequences)
            best_ms = result.best_row.get("predicted_ms")
            cache[key] = (result.best, f"sweep best of {result.considered} candidates "
                          f"({result.simulated} simulated, {result.pruned} pruned; {best_ms:.3f} ms simulated)")
        return cache[key]

    return choose


def schedule_for(model: ModelConfig, plan: ShardingPlan, system: System, chip: Chip, *, batch: int,
                 schedule: str | None, choose: ScheduleChooser | None, program_of: Callable[[], Program],
                 sequences: int | None = None) -> tuple[Schedule, str]:
    """The row's schedule and how it was chosen (module docstring); ``program_of`` returns
    the row's program (``batch`` rows over ``sequences``), built only if a fallback needs it."""
    if chip.execution.mode != "megakernel":
        return load_schedule("naive"), "none: a conventional stack's kernels stream their own weights"
    if schedule not in (None, "best"):
        chosen = load_schedule(schedule)
        if chip.kind == "gpu":
            from tpusim.engine.gpu import l2_schedule

            chosen = l2_schedule(chosen)
        if not _fits(chosen, model, plan, chip, batch, sequences):
            fallback, how = fit_fallback(chosen, model, plan, chip, batch, sequences, program_of)
            return fallback, f"given `{schedule}` does not fit on-chip memory at {batch} rows; {how}"
        return chosen, f"given (`{chosen.name}`)"
    if choose is not None:
        try:
            return choose(model, plan, system, batch, sequences)
        except InputError as error:  # every candidate pruned
            if chip.kind == "gpu":
                raise
            fallback, how = fit_fallback(load_schedule("published"), model, plan, chip, batch, sequences, program_of)
            return fallback, f"the reduced sweep found none ({error}); {how}"
    first, how = fitting_schedule(model, plan, chip, batch, sequences=sequences) if chip.kind == "gpu" else (
        load_schedule("published"), "built-in `published` (first built-in that fits)")
    if chip.kind == "gpu" or _fits(first, model, plan, chip, batch, sequences):
        return first, how
    fallback, how = fit_fallback(first, model, plan, chip, batch, sequences, program_of)
    return fallback, f"`published` does not fit on-chip memory at {batch} rows; {how}"


def _fits(schedule: Schedule, model: ModelConfig, plan: ShardingPlan, chip: Chip, batch: int,
          sequences: int | None) -> bool:
    try:
        check_fits(vmem_plan(schedule, model, plan, batch, sequences), chip.staging_memory.usable_bytes)
    except InfeasibleSchedule:
        return False
    return True


def fit_fallback(schedule: Schedule, model: ModelConfig, plan: ShardingPlan, chip: Chip, batch: int,
                 sequences: int | None, program_of: Callable[[], Program]) -> tuple[Schedule, str]:
    """Rule 4 of the module docstring: ``schedule`` shrunk to fit, or the first built-in that
    fits, whichever the analytic estimate finds faster (a GPU: the built-in)."""
    try:
        builtin: tuple[Schedule, str] | None = fitting_schedule(model, plan, chip, batch, sequences=sequences)
    except InputError as error:
        builtin, why_none = None, str(error)
    if chip.kind == "gpu":
        if builtin is None:
            raise InputError(why_none)
        return builtin
    from tpusim.sweep.estimate import EstimateContext, estimate
    from tpusim.sweep.fit_memory import shrink_to_fit

    program = program_of()
    try:
        shrunk = shrink_to_fit(schedule, program, chip)
    except InputError:
        if builtin is None:
            raise
        return builtin
    if builtin is not None:
        vmem = vmem_plan(builtin[0], model, plan, batch, sequences)
        builtin_s = estimate(EstimateContext(program, chip), builtin[0], vmem).step_s
        if builtin_s < shrunk.estimate_s:
            return builtin[0], (f"{builtin[1]}; analytic estimate {builtin_s * 1e3:.2f} ms against "
                                f"{shrunk.estimate_s * 1e3:.2f} ms for `{schedule.name}` {shrunk.describe()}")
    fitted = shrunk.schedule.model_copy(update={"name": f"{schedule.name}-fitted-{batch}rows"})
    return fitted, f"`{schedule.name}` {shrunk.describe()} (analytic estimate {shrunk.estimate_s * 1e3:.2f} ms)"
