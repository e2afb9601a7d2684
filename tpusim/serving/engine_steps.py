"""The engine as the serving simulator's step pricer, for one system.

:func:`engine_pricer` resolves a system as `tpusim compare` does
(:func:`tpusim.compare.rows._system_and_plans`: the chip in its execution, the plans a row
tries), keeps the plans whose weights plus one request's KV cache fit HBM, and picks the
fastest decode step at a reference batch (:func:`tpusim.compare.gpu_plans.pick_plan`). Then:

- **decode** at ``(batch, context)``: the decode program under the schedule `compare` would
  choose at that batch (:func:`tpusim.compare.schedule_choice.schedule_for`: TPUs the
  published schedule, shrunk to fit VMEM where it does not; GPU stacks their built-in), one
  engine run through :class:`tpusim.compare.resimulate.SimulationCache`; with speculative
  decoding the drafter forward(s) plus the verify step of ``draft_tokens + 1`` rows per
  sequence (:class:`tpusim.workload.speculative.SpeculativeStep`), as `compare` prices them;
- **prefill** at ``(tokens, prefix)``: the prefill program (:mod:`tpusim.workload.prefill`)
  under the schedule chosen for its resident row tile. **Assumption** (how the TPU
  megakernel prefills is not published): a prefill chunk runs as its own step that
  interrupts decoding, under the decode plan and a schedule of the same family; a GPU stack
  runs its prefill kernels under the same plan, without a CUDA graph: a chip with
  ``execution.gpu.eager_host_op_s`` takes at least its kernels x that figure
  (:func:`tpusim.engine.gpu_batch.prefill_step_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from hwmodels.errors import InputError
from hwmodels.schema import Chip, System
from tpusim.compare.gpu_plans import PlanOutcome, pick_plan
from tpusim.compare.resimulate import SimulationCache
from tpusim.compare.rows import SystemSpec, _Drafter, _system_and_plans
from tpusim.compare.schedule_choice import fitting_schedule, schedule_for
from tpusim.schedule.schema import Schedule, load_schedule
from tpusim.workload.capacity import cache_bytes, capacity_report
from tpusim.workload.model_catalog import plan_for_system
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.prefill import PREFILL_ROW_TILE, build_prefill_program
from tpusim.workload.program import build_program
from tpusim.workload.routing import RoutingModel
from tpusim.workload.sharding import ShardingPlan
from tpusim.workload.speculative import SpeculativeConfig, SpeculativeStep


@dataclass
class EnginePricer:
    """Exact engine step times of one model on one system and plan (module docstring)."""

    model: ModelConfig
    plan: ShardingPlan
    system: System
    chip: Chip
    routing: RoutingModel
    seed: int = 0
    speculative: SpeculativeConfig | None = None
    drafter: _Drafter | None = None
    cache: SimulationCache = field(default_factory=SimulationCache)
    _schedules: dict[tuple[int, int], Schedule | InputError] = field(default_factory=dict)
    _kv_bytes: dict[int, int] = field(default_factory=dict)

    def _schedule(self, rows: int, sequences: int, context_tokens: int) -> Schedule:
        """`compare`'s schedule choice at ``rows`` (cached, a failure too: InputError)."""
        key = (rows, sequences)
        if key not in self._schedules:
            program_of = partial(build_program, self.model, self.plan, batch=rows, context_tokens=context_tokens,
                                 routing=self.routing, seed=self.seed, sequences=sequences)
            try:
                self._schedules[key] = schedule_for(self.model, self.plan, self.system, self.chip, batch=rows,
                                                    schedule=None, choose=None, sequences=sequences,
                                                    program_of=program_of)[0]
            except InputError as error:
                self._schedules[key] = error
        known = self._schedules[key]
        if isinstance(known, InputError):
            raise known
        return known

    def max_batch(self, up_to: int, context_tokens: int) -> int:
        """The largest power of two <= ``up_to`` whose decode step has a schedule that fits
        on-chip memory (a TPU megakernel keeps the batch's activations in VMEM: large batches
        do not fit); 0 when not even batch 1 fits."""
        found, batch = 0, 1
        rows_per = self.speculative.verify_rows_per_sequence if self.speculative else 1
        while batch <= up_to:
            try:
                self._schedule(batch * rows_per, batch, context_tokens)
            except InputError:
                break
            found, batch = batch, batch * 2
        return found

    def verify_s(self, batch: int, context_tokens: int) -> float:
        """The target's step: ``batch`` rows, or ``batch x (draft_tokens + 1)`` when speculating."""
        rows = batch * self.speculative.verify_rows_per_sequence if self.speculative else batch
        schedule = self._schedule(rows, batch, context_tokens)
        return self.cache.step(self.model, self.plan, self.chip, schedule, rows=rows, context_tokens=context_tokens,
                               routing=self.routing, seed=self.seed, sequences=batch)[0]

    def decode_breakdown_ms(self, batch: int, context_tokens: int) -> dict[str, float]:
        """Where a plain decode step of ``batch`` sequences goes, ms (``gpu_breakdown``'s keys:
        on a GPU serving stack the batch-growth terms are named)."""
        schedule = self._schedule(batch, batch, context_tokens)
        return dict(self.cache.step(self.model, self.plan, self.chip, schedule, rows=batch,
                                    context_tokens=context_tokens, routing=self.routing, seed=self.seed,
                                    sequences=batch)[1]["where_ms"])

    def decode_s(self, batch: int, context_tokens: int) -> float:
        verify = self.verify_s(batch, context_tokens)
        if self.speculative is None or self.drafter is None:
            return verify
        config, drafter = self.speculative, self.drafter
        draft_plan = plan_for_system(drafter.model, self.chip, self.system.chips)
        rows = batch * config.draft_rows_per_sequence
        if self.chip.execution.mode == "megakernel":
            draft_schedule, _ = fitting_schedule(drafter.model, draft_plan, self.chip, rows, sequences=batch)
        else:
            draft_schedule = load_schedule("naive")
        forward = self.cache.step(drafter.model, draft_plan, self.chip, draft_schedule, rows=rows,
                                  context_tokens=context_tokens, routing=self.routing, seed=self.seed,
                                  sequences=batch)[0]
        return SpeculativeStep(batch, forward, verify, config).step_s

    def prefill_s(self, tokens: int, prefix_tokens: int) -> float:
        from tpusim.engine import simulate
        from tpusim.engine.gpu_batch import prefill_step_s

        context = prefix_tokens + tokens
        tile = PREFILL_ROW_TILE
        while True:  # the widest row tile (32, 16, ... rows) whose schedule fits on chip
            for sequences in (tile, 1):  # a tile of sequences' schedule fits one sequence's a fortiori
                try:
                    schedule = self._schedule(tile, sequences, context)
                except InputError:
                    if tile == 1 and sequences == 1:
                        raise
                    continue
                program = build_prefill_program(self.model, self.plan, tokens=tokens, prefix_tokens=prefix_tokens,
                                                routing=self.routing, seed=self.seed, row_tile=tile)
                return prefill_step_s(self.chip, simulate(program, schedule, self.chip))
            tile //= 2

    def kv_request_bytes(self, context_tokens: int) -> int:
        """KV cache + recurrent state one request of ``context_tokens`` holds per device."""
        if context_tokens not in self._kv_bytes:
            self._kv_bytes[context_tokens] = cache_bytes(self.model, self.plan, batch=1, context_tokens=context_tokens)
        return self._kv_bytes[context_tokens]

    def kv_pool_bytes(self) -> float:
        """HBM left for KV per device after the resident weights (the capacity check's rule),
        times the attention data-parallel ranks (each caches different sequences)."""
        report = capacity_report(self.model, self.plan, self.chip, batch=1, context_tokens=0)
        return (report.capacity_bytes - report.weight_bytes) * self.plan.attention_dp


def engine_pricer(model: ModelConfig, spec: SystemSpec, *, context_tokens: int, reference_batch: int,
                  routing: RoutingModel | None = None, seed: int = 0, calibrated: bool = True,
                  speculative: SpeculativeConfig | None = None, drafter: _Drafter | None = None,
                  plan_choice: str | None = None) -> tuple[EnginePricer, str]:
    """The pricer of the plan chosen for ``spec`` and how it was chosen: of the plans
    `compare` tries, those where weights + one request of ``context_tokens`` fit HBM, the
    one with the least decode time per sequence at ``reference_batch`` or the largest batch
    below it whose schedule fits on-chip memory (InputError when none fits)."""
    routing = routing or RoutingModel("uniform")
    system, chip, plans = _system_and_plans(model, spec, calibrated, plan_choice)
    cache = SimulationCache()
    outcomes: list[tuple[PlanOutcome, EnginePricer]] = []
    for label, plan in plans:
        pricer = EnginePricer(model, plan, system, chip, routing, seed, speculative, drafter, cache)
        need = pricer.kv_request_bytes(context_tokens)
        if pricer.kv_pool_bytes() < need:
            outcomes.append((PlanOutcome(label, plan, None, "weights + one request's KV do not fit HBM"), pricer))
            continue
        batch = pricer.max_batch(reference_batch, context_tokens)
        if not batch:
            outcomes.append((PlanOutcome(label, plan, None, "no schedule fits on-chip memory at batch 1"), pricer))
            continue
        outcomes.append((PlanOutcome(label, plan, pricer.decode_s(batch, context_tokens) / batch), pricer))
    best = pick_plan([outcome for outcome, _ in outcomes])
    if best is None:
        raise InputError(f"{model.name} on {spec.label}: no plan fits weights plus one request of {context_tokens} "
                         f"tokens in HBM ({'; '.join(f'{o.label}: {o.why_not}' for o, _ in outcomes)})")
    pricer = next(p for outcome, p in outcomes if outcome is best)
    fitting = sum(outcome.step_s is not None for outcome, _ in outcomes)
    how = best.label if len(outcomes) == 1 else (
        f"{best.label} (least decode time per sequence near batch {reference_batch} of {fitting} that fit, {len(outcomes)} tried)")
    return pricer, how
