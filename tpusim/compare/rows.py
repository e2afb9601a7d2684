"""Side-by-side systems: the same model, batch sizes and acceptance lengths on TPUs and GPUs.

A *system spec* is ``chip:chips[:execution]``: ``tpu-v7:16``, ``gb200:16`` (a conventional
GPU serving stack: one kernel launch per op, NCCL collectives), ``gb200:16:graphs`` (the
same with CUDA graphs: cheaper launches), ``gb200:16:megakernel`` (one persistent kernel per
step with TMA-style async copies into shared memory / L2, driven by a prefetch schedule like
the TPU kernel). TPU systems always run the megakernel.

For each (system, batch, acceptance length) :func:`compare_rows` checks that weights + KV
cache fit HBM (a row that does not fit says so instead of giving a time), picks a schedule
(TPU and GPU megakernel rows: the sweep's best for that system and batch, or ``published``;
per-kernel GPU rows: their execution model), simulates the plain decode step — or, with
speculative decoding, the drafter's steps plus the verify step — and returns rows with
stable keys: ``system, chips, batch, acceptance_length, step_ms, tokens_per_s, label,
breakdown`` (+ ``execution, schedule, fits, note``) and the 90 % interval keys
``step_ms_low, step_ms_high, tokens_per_s_low, tokens_per_s_high, interval``
(:mod:`tpusim.report.intervals`: a calibrated chip's row is re-simulated once per stored
parameter set — the drafter too for a speculative row; an uncalibrated row has ``None``
there and says so in ``interval``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hwmodels.catalog import make_system
from hwmodels.errors import InputError
from hwmodels.schema import Chip, System
from tpusim.report.intervals import interval_fields, no_interval, sample_chips
from tpusim.workload.capacity import capacity_report, check_capacity
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.sharding import ShardingPlan
from tpusim.workload.program import build_program
from tpusim.workload.routing import RoutingModel
from tpusim.schedule.schema import Schedule, load_schedule
from tpusim.workload.speculative import SpeculativeConfig, SpeculativeStep
from tpusim.schedule.vmem import InfeasibleSchedule, check_fits, vmem_plan

MS_PER_S = 1000.0
EXECUTIONS = ("default", "per-kernel", "graphs", "megakernel")

# (model, plan, system, batch) -> the schedule to run and how it was chosen
ScheduleChooser = Callable[[ModelConfig, ShardingPlan, System, int], tuple[Schedule, str]]


@dataclass(frozen=True)
class SystemSpec:
    chip: str
    chips: int
    execution: str = "default"

    @property
    def label(self) -> str:
        suffix = "" if self.execution == "default" else f":{self.execution}"
        return f"{self.chip}:{self.chips}{suffix}"


def parse_systems(text: str) -> list[SystemSpec]:
    specs = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        parts = item.split(":")
        if len(parts) not in (2, 3):
            raise InputError(f"--systems {item!r}: expected chip:chips[:execution], e.g. gb200:16:megakernel")
        try:
            chips = int(parts[1])
        except ValueError:
            raise InputError(f"--systems {item!r}: chip count {parts[1]!r} is not a number") from None
        if chips < 1:
            raise InputError(f"--systems {item!r}: chip count must be >= 1")
        execution = parts[2] if len(parts) == 3 else "default"
        if execution not in EXECUTIONS:
            raise InputError(f"--systems {item!r}: execution {execution!r} not one of {', '.join(EXECUTIONS)}")
        specs.append(SystemSpec(parts[0], chips, execution))
    if not specs:
        raise InputError("--systems: no system given")
    return specs


def with_execution(chip: Chip, execution: str) -> Chip:
    """The chip with its execution model switched (GPU per-kernel / graphs / megakernel).

    ``default`` and TPU chips are returned unchanged (a TPU always runs the megakernel). A
    GPU variant is a chip whose switched figures carry their own sources
    (:func:`tpusim.engine.gpu.gpu_variant`): ``graphs`` replaces ``launch_overhead_s`` with
    ``graph_launch_overhead_s``; ``megakernel`` sets the per-layer grid barrier and the
    in-kernel collective latency priors (labelled assumed). A CPU host only switches mode.
    """
    if execution == "default" or chip.kind == "tpu":
        return chip
    if chip.kind == "gpu":
        from tpusim.engine.gpu import gpu_variant

        return gpu_variant(chip, execution)
    if execution == "megakernel":
        mode = "megakernel"
    elif execution in ("per-kernel", "graphs"):
        mode = "per_op_launch"
    else:
        raise InputError(f"unknown execution {execution!r}")
    updates: dict[str, Any] = {"mode": mode}
    if execution == "graphs" and chip.execution.graph_launch_overhead_s is not None:
        updates["launch_overhead_s"] = chip.execution.graph_launch_overhead_s
    execution_model = chip.execution.model_copy(update=updates)
    return chip.model_copy(update={"execution": execution_model})


def execution_label(chip: Chip, spec: SystemSpec) -> str:
    if chip.execution.mode == "megakernel":
        return "megakernel"
    return "per-kernel (CUDA graphs)" if spec.execution == "graphs" else "per-kernel launches"


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
        try:
            check_fits(vmem_plan(schedule, model, plan, batch, sequences), chip.staging_memory.usable_bytes)
        except InfeasibleSchedule:
            continue
        return schedule, f"built-in `{name}` (first built-in that fits)"
    raise InputError(f"no built-in schedule fits {chip.name}'s on-chip memory for {model.name} at batch {batch}")


def _simulate_s(model: ModelConfig, plan: ShardingPlan, chip: Chip, schedule: Schedule, *, rows: int,
                context_tokens: int, routing: RoutingModel, seed: int,
                sequences: int | None = None) -> tuple[float, dict[str, Any]]:
    from tpusim.engine import simulate
    from tpusim.engine.gpu import gpu_breakdown

    program = build_program(model, plan, batch=rows, context_tokens=context_tokens, routing=routing, seed=seed,
                            sequences=sequences)
    result = simulate(program, schedule, chip)
    breakdown: dict[str, Any] = {f"{key}_ms": value * MS_PER_S for key, value in result.breakdown_s.items()}
    breakdown["launch_count"] = result.launch_count
    breakdown["where_ms"] = {key: value * MS_PER_S for key, value in gpu_breakdown(result).items()}
    breakdown["exposed_dma_ms"] = result.exposed_dma_s * MS_PER_S
    breakdown["hbm_busy_fraction"] = result.busy_fraction.get("hbm", 0.0)
    return result.step_s, breakdown


def _step_s(chip: Chip, *, model: ModelConfig, plan: ShardingPlan, schedule: Schedule, rows: int,
            context_tokens: int, routing: RoutingModel, seed: int, sequences: int | None) -> float:
    """Step seconds of one simulation (a re-simulation on an interval's sampled chip)."""
    return _simulate_s(model, plan, chip, schedule, rows=rows, context_tokens=context_tokens, routing=routing,
                       seed=seed, sequences=sequences)[0]


def _speculative_step_s(chip: Chip, *, verify: Callable[[Chip], float], draft: Callable[[Chip], float],
                        batch: int, config: SpeculativeConfig) -> float:
    return SpeculativeStep(batch, draft(chip), verify(chip), config).step_s


def _system_and_plan(model: ModelConfig, spec: SystemSpec, calibrated: bool) -> tuple[System, Chip, ShardingPlan]:
    system = make_system(spec.chip, spec.chips, calibrated=calibrated)
    chip = with_execution(system.chip, spec.execution)
    intra = "nvlink" if chip.kind == "gpu" else "ici"
    plan = plan_for(model, system.devices, devices_per_chip=chip.devices_per_chip, intra_link=intra)
    return system.model_copy(update={"chip": chip}), chip, plan


def compare_rows(
    model_name: str,
    systems: list[SystemSpec],
    batches: list[int],
    *,
    acceptance_lengths: list[float] | None = None,
    schedule: str | None = None,
    choose_schedule: ScheduleChooser | None = None,
    context_tokens: int = 1024,
    routing: RoutingModel | None = None,
    seed: int = 0,
    calibrated: bool = True,
    draft_tokens: int = 7,
) -> list[dict[str, Any]]:
    """Rows of the comparison (see the module docstring for keys)."""
    routing = routing or RoutingModel("uniform")
    model = load_model(model_name)
    rows: list[dict[str, Any]] = []
    speculation: list[float | None] = [None, *(acceptance_lengths or [])]
    for spec in systems:
        system, chip, plan = _system_and_plan(model, spec, calibrated)
        label = "calibrated" if _is_calibrated(chip) else "simulated"
        samples = [with_execution(sample, spec.execution) for sample in sample_chips(chip)]
        for batch in batches:
            for acceptance in speculation:
                row: dict[str, Any] = {
                    "system": spec.label, "chips": spec.chips, "batch": batch,
                    "acceptance_length": acceptance, "execution": execution_label(chip, spec),
                    "plan": plan.name, "label": label,
                }
                rows.append(row)
                verify_rows = batch * (draft_tokens + 1) if acceptance is not None else batch
                try:
                    check_capacity(model, plan, chip, chips=spec.chips, batch=verify_rows,
                                   context_tokens=context_tokens + draft_tokens + 1)
                except InputError as error:
                    report = capacity_report(model, plan, chip, batch=verify_rows,
                                             context_tokens=context_tokens + draft_tokens + 1)
                    row.update(no_interval("does not fit"))
                    row.update(fits=False, step_ms=None, tokens_per_s=None, schedule=None, breakdown={},
                               note=str(error),
                               short_note=f"needs {report.total_bytes / 1e9:.0f} GB/device > "
                                          f"{report.capacity_bytes / 1e9:.0f} GB HBM")
                    continue
                try:
                    chosen, how = _schedule_for(model, plan, system, chip, batch=verify_rows,
                                                schedule=schedule, choose=choose_schedule, sequences=batch)
                except InputError as error:
                    row.update(no_interval("no schedule fits"))
                    row.update(fits=False, step_ms=None, tokens_per_s=None, schedule=None,
                               breakdown={}, note=str(error), short_note="no schedule fits on-chip memory")
                    continue
                step_s, breakdown = _simulate_s(model, plan, chip, chosen, rows=verify_rows,
                                                context_tokens=context_tokens, routing=routing, seed=seed,
                                                sequences=batch)
                row.update(fits=True, schedule=chosen.name, schedule_hash=chosen.content_hash(),
                           schedule_choice=how)
                if acceptance is None:
                    row.update(step_ms=step_s * MS_PER_S, tokens_per_s=batch / step_s, breakdown=breakdown)
                    verify = partial(_step_s, model=model, plan=plan, schedule=chosen, rows=verify_rows,
                                     context_tokens=context_tokens, routing=routing, seed=seed, sequences=batch)
                    row.update(interval_fields(chip, verify, step_s, batch, chips=samples))
                    continue
                config = SpeculativeConfig(draft_tokens=draft_tokens, acceptance_length=acceptance)
                draft_model = load_model(config.draft_model)
                draft_plan = plan_for(draft_model, system.devices, devices_per_chip=chip.devices_per_chip,
                                      intra_link="nvlink" if chip.kind == "gpu" else "ici")
                draft_schedule, _ = fitting_schedule(draft_model, draft_plan, chip, batch)
                draft_s, _ = _simulate_s(draft_model, draft_plan, chip, draft_schedule, rows=batch,
                                         context_tokens=context_tokens, routing=routing, seed=seed)
                step = SpeculativeStep(batch, draft_s, step_s, config)
                verify = partial(_step_s, model=model, plan=plan, schedule=chosen, rows=verify_rows,
                                 context_tokens=context_tokens, routing=routing, seed=seed, sequences=batch)
                draft = partial(_step_s, model=draft_model, plan=draft_plan, schedule=draft_schedule, rows=batch,
                                context_tokens=context_tokens, routing=routing, seed=seed, sequences=None)
                speculative_s = partial(_speculative_step_s, verify=verify, draft=draft, batch=batch, config=config)
                row.update(interval_fields(chip, speculative_s, step.step_s, batch, chips=samples))
                if row.get("step_ms_low") is not None:  # accepted tokens, not rows, per step
                    row["tokens_per_s_low"] = step.accepted_tokens_per_s * step.step_s * 1e3 / row["step_ms_high"]
                    row["tokens_per_s_high"] = step.accepted_tokens_per_s * step.step_s * 1e3 / row["step_ms_low"]
                row.update(step_ms=step.step_s * MS_PER_S, tokens_per_s=step.accepted_tokens_per_s,
                           breakdown={"verify_ms": step_s * MS_PER_S, "draft_ms_per_token": draft_s * MS_PER_S,
                                      "draft_tokens": draft_tokens, "draft_share": step.draft_share,
                                      "verify_breakdown": breakdown})
    return rows


def sweep_chooser(*, budget: int, jobs: int, seed: int, out_dir: Path | None, context_tokens: int,
                  routing: RoutingModel, samples: int = 100, screen_factor: int = 4) -> ScheduleChooser:
    """Choose each megakernel row's schedule with a small sweep, cached per system and row count.

    The sweep is a reduced one (the built-ins and their one-knob neighbours plus ``samples``
    random draws; ``budget`` full simulations) so a comparison of many rows stays quick; run
    ``tpusim sweep`` for a full search. Outputs go to ``out_dir/sweep-...`` when given.
    """
    from tpusim.sweep.space import default_space

    space = default_space().model_copy(update={"samples": samples})
    cache: dict[tuple[str, int, str], tuple[Schedule, str]] = {}

    def choose(model: ModelConfig, plan: ShardingPlan, system: System, batch: int) -> tuple[Schedule, str]:
        from tpusim.sweep import run_sweep

        key = (system.name + system.chip.execution.mode, batch, model.name)
        if key not in cache:
            folder = (out_dir / f"sweep-{system.chip.name}x{system.chips}-{system.chip.execution.mode}-b{batch}"
                      if out_dir else Path(tempfile.mkdtemp(prefix="tpusim-sweep-")))
            result = run_sweep(model, plan, system, batch=batch, out_dir=folder, budget=budget, jobs=jobs,
                               seed=seed, context_tokens=context_tokens, routing=routing, quiet=True,
                               space=space, screen_factor=screen_factor)
            best_ms = result.best_row.get("predicted_ms")
            cache[key] = (result.best, f"sweep best of {result.considered} candidates "
                          f"({result.simulated} simulated, {result.pruned} pruned; {best_ms:.3f} ms simulated)")
        return cache[key]

    return choose


def _is_calibrated(chip: Chip) -> bool:
    from hwmodels.overlay import iter_figures

    return any(figure.label == "calibrated" for _, figure in iter_figures(chip))


def _schedule_for(model: ModelConfig, plan: ShardingPlan, system: System, chip: Chip, *, batch: int,
                  schedule: str | None, choose: ScheduleChooser | None,
                  sequences: int | None = None) -> tuple[Schedule, str]:
    if chip.execution.mode == "per_op_launch":
        return load_schedule("naive"), "none: one kernel per op (the schedule does not apply)"
    if schedule not in (None, "best"):
        chosen = load_schedule(schedule)
        if chip.kind == "gpu":
            from tpusim.engine.gpu import l2_schedule

            chosen = l2_schedule(chosen)
        try:
            check_fits(vmem_plan(chosen, model, plan, batch, sequences), chip.staging_memory.usable_bytes)
        except InfeasibleSchedule:
            fallback, how = fitting_schedule(model, plan, chip, batch, sequences=sequences)
            return fallback, f"given `{schedule}` does not fit on-chip memory at {batch} rows; {how}"
        return chosen, f"given (`{chosen.name}`)"
    if choose is not None:
        return choose(model, plan, system, batch)
    return fitting_schedule(model, plan, chip, batch, sequences=sequences)
