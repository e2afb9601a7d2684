"""Side-by-side systems: the same model, batch sizes and acceptance lengths on TPUs and GPUs.

A *system spec* is ``chip:chips[:execution]``: ``tpu-v7:16``, ``gb200:16`` (the GPU serving
stack a team deploys for decode: CUDA graphs, fused kernels, one-shot all-reduce —
:mod:`tpusim.engine.gpu_stack`), ``gb200:16:eager`` (the same kernels launched one by one
from the host, NCCL), ``gb200:16:megakernel`` (one persistent kernel per step with TMA-style
async copies into L2, driven by a prefetch schedule like the TPU kernel). TPU systems always
run the megakernel. GPU rows try the plans of :mod:`tpusim.compare.gpu_plans` and keep the
fastest that fits.

For each (system, batch, acceptance length) :func:`compare_rows` checks that weights + KV
cache fit HBM (a row that does not fit says so instead of giving a time), picks a schedule
(TPU and GPU megakernel rows: the sweep's best for that system and batch, or ``published``;
conventional GPU rows: their stack), simulates the plain decode step — or, with
speculative decoding, the drafter's forward(s) plus the verify step — and returns rows with
stable keys: ``system, chips, batch, acceptance_length, step_ms, tokens_per_s, label,
breakdown`` (+ ``execution, plan, plan_choice, schedule, fits, note``; speculative rows
``draft_ms, verify_ms, drafter, drafter_kind, draft_tokens`` and ``slower_than_plain``, with a
``warning`` when speculation yields fewer tokens/s than plain decode at that batch) and the 90 % interval keys
``step_ms_low, step_ms_high, tokens_per_s_low, tokens_per_s_high, interval``
(:mod:`tpusim.report.intervals`: a calibrated chip's row is re-simulated once per stored
parameter set — the drafter too for a speculative row — on the plan the row chose; an
uncalibrated row has ``None`` there and says so in ``interval``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from hwmodels import values
from hwmodels.catalog import load_chip, make_system
from hwmodels.errors import InputError
from hwmodels.schema import Chip, System
from hwmodels.units import MIB
from tpusim.compare.gpu_plans import PlanOutcome, gpu_plan_candidates, pick_plan
from tpusim.compare.resimulate import MS_PER_S, SimulationCache
from tpusim.compare.schedule_choice import ScheduleChooser, fitting_schedule, schedule_for
from tpusim.report.intervals import Terms, interval_fields, interval_terms, no_interval
from tpusim.schedule.schema import Schedule, load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.workload.capacity import capacity_report, check_capacity
from tpusim.workload.format_choice import apply_formats, formats_for_chip
from tpusim.workload.model_catalog import load_model, plan_for_system
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.routing import RoutingModel
from tpusim.workload.sharding import ShardingPlan
from tpusim.workload.speculative import (
    TARGET_MTP,
    DrafterSpec,
    SpeculativeConfig,
    SpeculativeStep,
    default_drafter,
    load_drafter,
    mtp_layers,
    mtp_model,
)

EXECUTIONS = ("default", "stack", "eager", "megakernel")
RENAMED = {"graphs": "the default (no suffix)", "per-kernel": "eager"}

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
    for item in values.items(text, "--systems"):
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
        if execution in RENAMED:
            raise InputError(f"--systems {item!r}: `:{execution}` is now {RENAMED[execution]}")
        if execution not in EXECUTIONS:
            raise InputError(f"--systems {item!r}: execution {execution!r} not one of {', '.join(EXECUTIONS)}")
        specs.append(SystemSpec(parts[0], chips, execution))
    if not specs:
        raise InputError("--systems: no system given")
    return specs


def with_execution(chip: Chip, execution: str) -> Chip:
    """The chip with its execution model switched (GPU ``stack`` / ``eager`` / ``megakernel``).

    ``default`` (and ``megakernel`` on a TPU) return the chip unchanged (a TPU always runs
    the megakernel, so any other execution on a TPU is refused; a GPU's catalog default is
    its serving stack). A GPU variant is a chip whose switched
    figures carry their own sources (:func:`tpusim.engine.gpu.gpu_variant`). A CPU host only
    switches mode (``eager``: per-op launch).
    """
    if execution == "default" or (chip.kind == "tpu" and execution == "megakernel"):
        return chip
    if chip.kind == "tpu":  # accepted and ignored before: the row ran the megakernel under an eager label
        raise InputError(f"{chip.name}:{execution}: a TPU runs only the megakernel here; "
                         f"`:{execution}` applies to GPUs and CPU hosts")
    if chip.kind == "gpu":
        from tpusim.engine.gpu import gpu_variant

        return gpu_variant(chip, execution)
    modes = {"megakernel": "megakernel", "eager": "per_op_launch"}
    if execution not in modes:
        raise InputError(f"execution {execution!r} applies to GPUs only; a CPU host takes eager or megakernel")
    return chip.model_copy(update={"execution": chip.execution.model_copy(update={"mode": modes[execution]})})


def execution_label(chip: Chip) -> str:
    """Which stack a row assumes, in words."""
    if chip.kind == "gpu":
        from tpusim.engine.gpu import STACK_LABELS

        return STACK_LABELS[chip.execution.mode]
    return "megakernel" if chip.execution.mode == "megakernel" else "per-op launches"


def _step_s(chip: Chip, *, cache: SimulationCache, model: ModelConfig, plan: ShardingPlan, schedule: Schedule,
            rows: int, context_tokens: int, routing: RoutingModel, seed: int, sequences: int | None) -> float:
    """Step seconds of one simulation (a re-simulation on an interval's sampled chip)."""
    return cache.step(model, plan, chip, schedule, rows=rows, context_tokens=context_tokens, routing=routing,
                      seed=seed, sequences=sequences)[0]


# A row's re-simulation on a sampled chip: chip -> step seconds (speculative rows: the drafter too).
Resimulate = Callable[[Chip], float]


def _speculative_step_s(chip: Chip, *, verify: Resimulate, draft: Resimulate, batch: int,
                        config: SpeculativeConfig) -> float:
    return SpeculativeStep(batch, draft(chip), verify(chip), config).step_s


def _row_interval(chip: Chip, terms: Terms, outcome: _Outcome, batch: int, outside: list[str]) -> dict[str, Any]:
    """The interval keys of the chosen plan's row, re-simulated on every sampled chip, with
    the model error (extrapolated when ``outside`` says why); a speculative row's tokens/s
    bounds count accepted tokens, not rows."""
    if outcome.step is None:
        return interval_fields(chip, outcome.verify, outcome.verify_s, batch, terms=terms, outside=outside)
    step = outcome.step
    run = partial(_speculative_step_s, verify=outcome.verify, draft=outcome.draft, batch=step.batch,
                  config=step.config)
    fields = interval_fields(chip, run, step.step_s, step.batch, terms=terms, outside=outside)
    if fields.get("step_ms_low") is not None:
        tokens_per_step = step.accepted_tokens_per_s * step.step_s
        fields["tokens_per_s_low"] = tokens_per_step * MS_PER_S / fields["step_ms_high"]
        fields["tokens_per_s_high"] = tokens_per_step * MS_PER_S / fields["step_ms_low"]
    return fields


def _system_and_plans(model: ModelConfig, spec: SystemSpec, calibrated: bool,
                      plan_choice: str | None = None) -> tuple[System, Chip, list[tuple[str, ShardingPlan]]]:
    """The system, its chip in the spec's execution, and the plans a row tries: ``--plan`` or
    the system rule (:func:`~tpusim.workload.model_catalog.plan_for_system`) on TPUs and when
    a plan is given; on GPUs otherwise the rule's plan and the GPU candidates
    (:func:`~tpusim.compare.gpu_plans.gpu_plan_candidates`), each once."""
    system = make_system(spec.chip, spec.chips, calibrated=calibrated)
    chip = with_execution(system.chip, spec.execution)
    rule = plan_for_system(model, chip, spec.chips, plan_choice)
    plans = [(f"{rule.name} ({'--plan' if plan_choice not in (None, 'auto') else 'the system rule'})", rule)]
    if chip.kind == "gpu" and plan_choice in (None, "auto"):
        candidates = gpu_plan_candidates(model, system.devices, devices_per_chip=chip.devices_per_chip)
        plans = [(label, plan) for label, plan in candidates if plan.name != rule.name]
        if len(plans) == len(candidates):  # the rule's plan is not a GPU candidate: try it too
            plans.insert(0, (f"{rule.name} (the system rule)", rule))
        else:
            plans = candidates
    return system.model_copy(update={"chip": chip}), chip, plans


@dataclass(frozen=True)
class _Drafter:
    spec: DrafterSpec
    model: ModelConfig
    draft_tokens: int


def _drafter(model: ModelConfig, model_argument: str, name: str | None, draft_tokens: int | None) -> _Drafter:
    layers = mtp_layers(model_argument)
    spec = load_drafter(name or default_drafter(model, layers))
    draft_model = mtp_model(model, layers) if spec.model == TARGET_MTP else load_model(spec.model)
    return _Drafter(spec, draft_model, draft_tokens or spec.draft_tokens)


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
    draft_tokens: int | None = None,
    drafter: str | None = None,
    formats: str | None = None,
    plan_choice: str | None = None,
) -> list[dict[str, Any]]:
    """Rows of the comparison (see the module docstring for keys). ``formats`` and
    ``plan_choice`` are the ``--formats`` and ``--plan`` texts (applied to every system)."""
    routing = routing or RoutingModel("uniform")
    model = load_model(model_name)
    if formats:
        model = apply_formats(model, formats)  # refused before any row when a family is wrong
    if schedule not in (None, "best"):
        load_schedule(schedule)  # a missing or invalid file is an input error, not a row that "does not fit"
    rows: list[dict[str, Any]] = []
    speculation: list[float | None] = [None, *(acceptance_lengths or [])]
    chosen_drafter = _drafter(model, model_name, drafter, draft_tokens) if acceptance_lengths else None
    cache = SimulationCache()  # rows and interval samples that repeat a simulation share it
    for spec in systems:
        system_model, formats_how = formats_for_chip(load_model(model_name), formats,
                                                     load_chip(spec.chip, calibrated=False).kind)
        system, chip, plans = _system_and_plans(system_model, spec, calibrated, plan_choice)
        label = "calibrated" if chip.is_calibrated else "simulated"
        if chip.kind == "gpu" and not chip.is_calibrated:
            from tpusim.engine.gpu import derived_origin

            label = f"simulated, {derived_origin(chip)}" if derived_origin(chip) else label
        loaded = interval_terms(chip)
        terms = Terms([with_execution(sample, spec.execution) for sample in loaded.chips], loaded.model_error)
        calibration = chip.calibration
        source = f"{label} (tpusim engine, {chip.execution.mode} execution on {chip.name})"
        if chip.kind == "gpu":
            from tpusim.engine.gpu import stack_source

            source += f"; {stack_source(chip)}"
        source += f"; weight formats: {formats_how}"
        for batch in batches:
            for acceptance in speculation:
                row: dict[str, Any] = {
                    "system": spec.label, "chips": spec.chips, "batch": batch,
                    "acceptance_length": acceptance, "execution": execution_label(chip), "label": label,
                    "source": source,
                }
                if calibration is not None:
                    row["calibrated_on"] = calibration.note()
                    row["calibration_warnings"] = calibration.warnings(model_name, spec.chips, batch)
                rows.append(row)
                job = _RowJob(system_model, system, chip, batch, acceptance, chosen_drafter, schedule, choose_schedule,
                              context_tokens, routing, seed, cache)
                outcomes = [_plan_outcome(job, plan_label, plan) for plan_label, plan in plans]
                best = pick_plan([outcome.plan for outcome in outcomes])
                if best is None:
                    first = outcomes[0]
                    row.update(plan=first.plan.plan.name, fits=False, step_ms=None, tokens_per_s=None,
                               schedule=None, breakdown={}, **first.fields, **no_interval(first.plan.why_not))
                    continue
                chosen = next(outcome for outcome in outcomes if outcome.plan is best)
                fitting = sum(outcome.plan.step_s is not None for outcome in outcomes)
                choice = best.label if len(outcomes) == 1 else (
                    f"{best.label} (fastest of {fitting} that fit, {len(outcomes)} tried)")
                row.update(plan=best.plan.name, plan_choice=choice, fits=True, **chosen.fields)
                row.update(_row_interval(chip, terms, chosen, batch, row.get("calibration_warnings", [])))
                rejected = [f"{o.plan.label}: {o.plan.why_not}" for o in outcomes if o.plan.step_s is None]
                if rejected:
                    row["plans_rejected"] = rejected
                row["note"] = f"{row['execution']}; plan: {row['plan_choice']}"
            flag_slow_speculation(rows[-len(speculation):])
    return rows


def flag_slow_speculation(twins: list[dict[str, Any]]) -> None:
    """Mark each speculative row of one system and batch (``twins[0]`` is the plain row) whose
    accepted tokens/s fall below plain decode's: ``slower_than_plain`` (True/False on
    speculative rows that ran) and a ``warning`` sentence."""
    plain = twins[0].get("tokens_per_s")
    for row in twins[1:]:
        if plain is None or row.get("tokens_per_s") is None:
            continue
        row["slower_than_plain"] = row["tokens_per_s"] < plain
        if row["slower_than_plain"]:
            row["warning"] = (f"speculation slower than plain decode: {row['tokens_per_s']:.1f} accepted tokens/s "
                              f"against {plain:.1f} at acceptance {row['acceptance_length']:g}")


@dataclass(frozen=True)
class _RowJob:
    model: ModelConfig
    system: System
    chip: Chip
    batch: int
    acceptance: float | None
    drafter: _Drafter | None
    schedule: str | None
    choose: ScheduleChooser | None
    context_tokens: int
    routing: RoutingModel
    seed: int
    cache: SimulationCache


@dataclass(frozen=True)
class _Outcome:
    """One plan of one row: fit and speed, the row's fields when chosen, and how to
    re-simulate it on a sampled chip (for the interval)."""

    plan: PlanOutcome
    fields: dict[str, Any]
    verify: Resimulate | None = None
    verify_s: float = 0.0
    draft: Resimulate | None = None
    step: SpeculativeStep | None = None


def _plan_outcome(job: _RowJob, plan_label: str, plan: ShardingPlan) -> _Outcome:
    """One plan of one row: does it fit, and how fast (the row's fields when chosen)."""
    model, chip, batch = job.model, job.chip, job.batch
    drafter = job.drafter if job.acceptance is not None else None
    extra = drafter.draft_tokens + 1 if drafter else 0
    verify_rows = batch * (drafter.draft_tokens + 1) if drafter else batch
    try:
        check_capacity(model, plan, chip, chips=job.system.chips, batch=verify_rows,
                       context_tokens=job.context_tokens + extra,
                       plan_for_chips=partial(plan_for_system, model, chip))
    except InputError as error:
        report = capacity_report(model, plan, chip, batch=verify_rows, context_tokens=job.context_tokens + extra)
        return _Outcome(PlanOutcome(plan_label, plan, None, str(error)), {
            "note": str(error), "short_note": f"needs {report.total_bytes / 1e9:.0f} GB/device > "
                                              f"{report.capacity_bytes / 1e9:.0f} GB HBM"})
    try:
        chosen, how = schedule_for(model, plan, job.system, chip, batch=verify_rows, schedule=job.schedule,
                                   choose=job.choose, sequences=batch,
                                   program_of=lambda: job.cache.program(
                                       model, plan, rows=verify_rows, context_tokens=job.context_tokens,
                                       routing=job.routing, seed=job.seed, sequences=batch)[1])
    except InputError as error:
        return _Outcome(PlanOutcome(plan_label, plan, None, str(error)), {
            "note": str(error), "short_note": "no schedule fits on-chip memory"})
    step_s, breakdown = job.cache.step(model, plan, chip, chosen, rows=verify_rows, context_tokens=job.context_tokens,
                                       routing=job.routing, seed=job.seed, sequences=batch)
    fields: dict[str, Any] = {"schedule": chosen.name, "schedule_hash": chosen.content_hash(), "schedule_choice": how}
    if chip.kind == "tpu" and chip.execution.mode == "megakernel":  # the one VMEM figure (tpusim.schedule.vmem total_bytes)
        fields["vmem_static_mib"] = vmem_plan(chosen, model, plan, verify_rows, batch).total_bytes / MIB
    common: dict[str, Any] = {"context_tokens": job.context_tokens, "routing": job.routing, "seed": job.seed,
                              "cache": job.cache}
    verify = partial(_step_s, model=model, plan=plan, schedule=chosen, rows=verify_rows, sequences=batch, **common)
    if drafter is None or job.acceptance is None:
        fields.update(step_ms=step_s * MS_PER_S, tokens_per_s=batch / step_s, breakdown=breakdown)
        return _Outcome(PlanOutcome(plan_label, plan, step_s), fields, verify, step_s)
    config = SpeculativeConfig(kind=drafter.spec.kind, draft_tokens=drafter.draft_tokens,
                               acceptance_length=job.acceptance)
    draft_plan = plan_for_system(drafter.model, chip, job.system.chips)
    draft_rows = batch * config.draft_rows_per_sequence
    if chip.execution.mode == "megakernel":
        draft_schedule, _ = fitting_schedule(drafter.model, draft_plan, chip, draft_rows, sequences=batch)
    else:
        draft_schedule = load_schedule("naive")
    forward_s, _ = job.cache.step(drafter.model, draft_plan, chip, draft_schedule, rows=draft_rows,
                                  context_tokens=job.context_tokens, routing=job.routing, seed=job.seed,
                                  sequences=batch)
    step = SpeculativeStep(batch, forward_s, step_s, config)
    draft = partial(_step_s, model=drafter.model, plan=draft_plan, schedule=draft_schedule, rows=draft_rows,
                    sequences=batch, **common)
    fields.update(step_ms=step.step_s * MS_PER_S, tokens_per_s=step.accepted_tokens_per_s,
                  draft_ms=step.draft_s * MS_PER_S, verify_ms=step_s * MS_PER_S, drafter=drafter.spec.name,
                  drafter_kind=config.kind, draft_tokens=config.draft_tokens,
                  breakdown={"verify_ms": step_s * MS_PER_S, "draft_ms": step.draft_s * MS_PER_S,
                             "draft_forwards": config.draft_forwards, "draft_share": step.draft_share,
                             "verify_breakdown": breakdown})
    return _Outcome(PlanOutcome(plan_label, plan, step.step_s), fields, verify, step_s, draft, step)
