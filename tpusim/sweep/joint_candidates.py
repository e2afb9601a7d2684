"""The joint sweep's candidates: the space, the workload, validation, proposals and the worker task.

:mod:`tpusim.sweep.joint` runs the search (the study, rounds, outputs); this module holds what
one candidate is and how it is checked and evaluated, step by step as that module's docstring
numbers them: :class:`JointSpace` and :func:`plan_choices` (what is searched),
:class:`JointWorkload` (what fixes a candidate's program), :func:`evaluate_task` (step 4-5 on a
worker: estimate or full simulation, with per-process caches), :class:`Proposal`,
:class:`_Validator` (step 3: every rule before anything runs) and :func:`_suggest` (step 2:
a trial's parameters, define-by-run).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hwmodels.errors import InputError
from hwmodels.schema import System
from hwmodels.units import MIB
from hwmodels.validation import describe_validation_error
from tpusim.schedule.schema import (
    Deployment,
    FamilySchedule,
    Schedule,
)
from tpusim.schedule.vmem import InfeasibleSchedule
from tpusim.sweep.prune import VmemAccountant, check_candidate
from tpusim.sweep.space import SweepSpace, default_space
from tpusim.workload.capacity import capacity_report
from tpusim.workload.collectives import KIND_ALGORITHMS, cannot_run, same_messages
from tpusim.workload.kernel_support import kernel_cannot_run
from tpusim.workload.model_catalog import (
    PUBLISHED_PLANS,
    deployment_plan,
    load_plan,
    plan_for_system,
)
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import Program, build_program, with_collectives
from tpusim.workload.registry.names import Family
from tpusim.workload.routing import RoutingModel
from tpusim.workload.sharding import ShardingPlan

ASK_BATCH = 16  # trials proposed per round (fixed: the study must not depend on the worker count)
MS_PER_S = 1000.0
KEEP_PLAN = "plan"  # an algorithm choice: the collective as the plan writes it
AUTO_PLAN = "auto"
COLUMNS = ("trial", "hash", "name", "source", "status", "reason", "plan", "collectives", "predicted_ms",
           "predicted_by", "tokens_per_s", "exposed_dma_ms", "vmem_static_mib", "vmem_peak_mib", "est_ms")
FLOATS = ("predicted_ms", "tokens_per_s", "exposed_dma_ms", "vmem_static_mib", "vmem_peak_mib", "est_ms")


class JointSpace(BaseModel):
    """What a joint sweep searches (saved in ``space.json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plans: list[str] = Field(min_length=1, description="--plan choices: auto or SPECs")
    schedule: SweepSpace = Field(description="the schedule knobs' choices and the VMEM/DMA constraints")
    screen_percentile: float | None = Field(default=None, gt=0.0, lt=100.0, description="a trial whose "
                                            "estimate is worse than this percentile of the completed trials' is "
                                            "not simulated; None: no estimate, every valid trial is simulated")
    startup_trials: int = Field(default=16, ge=0, description="trials simulated before the pruner prunes")
    polish_share: float = Field(default=0.5, ge=0.0, lt=1.0, description="share of the budget spent on "
                                "coordinate descent around the best trial (tpusim.sweep.joint_polish) after "
                                "TPE has explored the rest; 0: TPE only")
    explore_max_simulations: int | None = Field(default=500, ge=0, description="TPE's simulations before the "
                                                "polish starts, at most (None: (1 - polish_share) of the budget)")
    kernel_runs_winner: bool = Field(default=True, description="when the multi-device megakernel runs the "
                                     "model's auto plan, a candidate it cannot run (tpusim.workload."
                                     "kernel_support.kernel_cannot_run) gets a row with the reason, not a "
                                     "simulation; off: the simulator alone decides")


def plan_choices(model: ModelConfig, devices: int) -> list[str]:
    """``auto`` and every SPEC splitting ``model`` over ``devices``: expert groups x expert TP
    (both dividing), attention TP or DP, on the generic structure; and when the model has a
    published plan for ``devices``, that structure with each expert split (``base=published``:
    the collectives the multi-device kernel runs) and, for a latent MoE with shared experts,
    with the fused expert reduction or the deferred shared wait
    (:mod:`tpusim.workload.plan_variants`). Whether each builds and fits is checked per trial."""
    out = [AUTO_PLAN]
    if model.moe is None:
        return [*out, "attention=tp", "attention=dp"]
    splits = [(groups, devices // groups) for groups in range(1, devices + 1) if devices % groups == 0
              and not model.moe.num_experts % groups and not model.moe.expert_intermediate_size % (devices // groups)]
    for groups, tp in splits:
        for attention in ("tp", "dp"):
            out.append(f"expert_groups={groups},expert_tp={tp},attention={attention}")
    stem = PUBLISHED_PLANS.get((model.name.partition("@")[0], devices))
    if stem is None:
        return out
    published = load_plan(stem)
    options = [""]
    if model.moe.latent_size and model.moe.shared_intermediate_size:
        options += [",expert_reduce=fused", ",shared_wait=deferred"]
    for groups, tp in splits:
        for option in options:
            if (groups, tp) == (published.expert_groups, published.expert_tp) and not option:
                continue  # that is auto
            out.append(f"base=published,expert_groups={groups},expert_tp={tp}{option}")
    return out


def default_joint_space(model: ModelConfig, devices: int) -> JointSpace:
    return JointSpace(plans=plan_choices(model, devices), schedule=default_space())


@dataclass(frozen=True)
class JointWorkload:
    """Everything but the deployment that fixes a candidate's program (picklable)."""

    model: ModelConfig
    system: System
    batch: int
    context_tokens: int = 1024
    routing: RoutingModel = field(default_factory=lambda: RoutingModel("uniform"))
    seed: int = 0
    sequences: int | None = None

    def plan(self, deployment: Deployment) -> ShardingPlan:
        return deployment_plan(self.model, self.system.chip, self.system.chips, deployment.plan,
                               deployment.collectives)

    def program(self, plan: ShardingPlan) -> Program:
        return build_program(self.model, plan, batch=self.batch, context_tokens=self.context_tokens,
                             routing=self.routing, seed=self.seed, sequences=self.sequences)

    def describe(self) -> dict[str, Any]:
        return {"model": self.model.name, "formats": self.model.formats, "hardware": self.system.chip.name,
                "chips": self.system.chips, "devices": self.system.devices, "batch": self.batch,
                "context_tokens": self.context_tokens, "routing": self.routing.label, "seed": self.seed,
                **({"sequences": self.sequences} if self.sequences else {})}


# ------------------------------------------------------------------------------------------
# Worker side: pure functions of (workload, deployment, schedule); caches per process
# ------------------------------------------------------------------------------------------

_CACHE: OrderedDict[tuple[int, str], Any] = OrderedDict()
CACHE_ENTRIES = 256  # per worker: a deployment's plan, program, estimate context and VMEM accountant


def _cached(workload: JointWorkload, deployment: Deployment, what: str) -> Any:
    """The deployment's ``plan`` | ``program`` | ``vmem`` accountant | issue ``planner`` |
    ``estimate`` context, least recently used out first (a sweep meets a new plan x algorithms
    about every third estimate, and TPE keeps coming back to the good ones: measured on
    budget-200 K3 sweeps).

    A deployment with collective algorithms of its own shares the program-independent work of
    its plan as written (the deployment without them): its program is that program with the
    collectives swapped (:func:`tpusim.workload.program.with_collectives`) and its estimate
    context that context with only the collectives priced again
    (:meth:`~tpusim.sweep.estimate.EstimateContext.for_program`), its VMEM accountant that
    accountant with its own collective buffers (:meth:`VmemAccountant.for_plan`), its issue
    planner that planner (plans never read a collective); each equals a fresh build
    (``tests/test_program_variants.py``)."""
    key = (hash(json.dumps(workload.describe(), sort_keys=True)),
           f"{what}|{deployment.plan}|{sorted(deployment.collectives.items())}")
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    base = Deployment(plan=deployment.plan) if deployment.collectives else None
    if what == "plan":
        value: Any = (workload.plan(deployment) if base is None else
                      _cached(workload, base, "plan").with_algorithms(deployment.collectives))
    elif what == "program":
        plan = _cached(workload, deployment, "plan")
        value = (workload.program(plan) if base is None else
                 with_collectives(_cached(workload, base, "program"), plan))
    elif what == "vmem":
        plan = _cached(workload, deployment, "plan")
        value = (VmemAccountant(workload.model, plan, workload.batch, workload.sequences) if base is None else
                 _cached(workload, base, "vmem").for_plan(plan))
    elif what == "planner":  # issue plans: one planner for a plan and all its algorithm variants
        from tpusim.sweep.estimate import IssuePlanner

        value = IssuePlanner(_cached(workload, deployment, "program")) if base is None else \
            _cached(workload, base, "planner")
    else:
        from tpusim.sweep.estimate import EstimateContext

        program = _cached(workload, deployment, "program")
        value = (EstimateContext(program, workload.system.chip, _cached(workload, deployment, "planner"))
                 if base is None else _cached(workload, base, "estimate").for_program(program))
    while len(_CACHE) >= CACHE_ENTRIES:
        _CACHE.popitem(last=False)
    _CACHE[key] = value
    return value


def evaluate_task(workload: JointWorkload, stage: str, schedule_data: dict[str, Any]) -> dict[str, Any]:
    """One candidate at ``stage`` (``estimate`` | ``simulate``) as a flat row (times in ms)."""
    from tpusim.engine import simulate
    from tpusim.engine.reuse import lowerings_not_kept
    from tpusim.schedule.issue_plan import UnsupportedIssuePlan
    from tpusim.schedule.program_issue import remember_issue_plan
    from tpusim.sweep.estimate import estimate

    schedule = Schedule.model_validate(schedule_data)
    assert schedule.deployment is not None
    try:
        if stage == "estimate":
            vmem = _cached(workload, schedule.deployment, "vmem").plan_for(schedule)
            est = estimate(_cached(workload, schedule.deployment, "estimate"), schedule, vmem)
            return {"feasible": True, "est_ms": est.step_s * MS_PER_S}
        program = _cached(workload, schedule.deployment, "program")
        # the planner's issue plan (memoised per pool: cheap for a sweep's many schedules) is the
        # one the engine would compute; hand it over instead of planning again. No estimate
        # context: a simulation needs none of its per-op costs (measured: building them for
        # each plan and pricing each algorithm variant's collectives took ~15 % of a worker's
        # CPU in a budget-600 K3 sweep, profiled)
        remember_issue_plan(program, schedule, _cached(workload, schedule.deployment, "planner").issue_plan(schedule))
        with lowerings_not_kept():  # a sweep simulates each candidate once: its lowered step is not kept
            result = simulate(program, schedule, workload.system.chip)
    except (InfeasibleSchedule, UnsupportedIssuePlan) as error:
        return {"feasible": False, "reason": f"{stage}: {error}"}
    return {"feasible": True, "predicted_ms": result.step_s * MS_PER_S, "tokens_per_s": result.tokens_per_s,
            "exposed_dma_ms": result.exposed_dma_s * MS_PER_S, "vmem_peak_mib": result.vmem_peak_bytes / MIB}


# ------------------------------------------------------------------------------------------
# Client side: proposals, validation, the study
# ------------------------------------------------------------------------------------------

@dataclass
class Proposal:
    """A trial's choices: the deployment, the schedule (or its unvalidated knobs and why not)."""

    trial: int
    source: str
    plan_choice: str
    algorithms: dict[str, str]
    schedule: Schedule | None
    reason: str = ""
    hash: str = ""
    static_mib: float | None = None
    knobs: dict[str, Any] = field(default_factory=dict)


class _Validator:
    """Step 3 of the module docstring, memoised per plan."""

    def __init__(self, workload: JointWorkload, space: JointSpace) -> None:
        self.workload, self.space = workload, space
        self._plans: dict[str, ShardingPlan | str] = {}
        self._accountants: dict[str, VmemAccountant] = {}
        self._capacity: dict[str, str] = {}
        self._kernel_gate: bool | None = None  # does the kernel run the model's auto plan (kernel_reason)
        self._runnable: list[str] | None = None
        self._same_copies: dict[tuple[str, str, str], bool] = {}
        self._triples: dict[str, list[str]] = {}
        self._deployments: dict[tuple[str, tuple[tuple[str, str], ...]], ShardingPlan | str] = {}

    def base_plan(self, choice: str) -> ShardingPlan | str:
        """The plan a choice builds, or why it does not (divisibility, a plan for other devices)."""
        if choice not in self._plans:
            try:
                self._plans[choice] = plan_for_system(self.workload.model, self.workload.system.chip,
                                                      self.workload.system.chips, choice)
            except (InputError, ValueError) as error:
                self._plans[choice] = f"plan: {error}"
        return self._plans[choice]

    def check(self, proposal: Proposal) -> str:
        """'' when the proposal may run, else the reason (first failing rule)."""
        base = self.base_plan(proposal.plan_choice)
        if isinstance(base, str):
            return base
        plan = self._deployed(proposal.plan_choice, proposal.algorithms, base)
        if isinstance(plan, str):
            return plan
        if proposal.plan_choice not in self._capacity:
            w = self.workload
            report = capacity_report(w.model, base, w.system.chip, batch=w.batch, context_tokens=w.context_tokens)
            self._capacity[proposal.plan_choice] = "" if report.fits else (
                f"capacity: weights + KV {report.total_bytes / 1e9:.1f} GB per device exceed HBM "
                f"{report.capacity_bytes / 1e9:.1f} GB")
        if self._capacity[proposal.plan_choice]:
            return self._capacity[proposal.plan_choice]
        if proposal.reason:
            return proposal.reason
        assert proposal.schedule is not None
        # the candidate's own total (its algorithms' send/receive buffers included, rule 6 of
        # tpusim.schedule.vmem) is what fits or not, and what the reason quotes: one accountant
        # per plan and algorithms, sharing all it learnt but the collective buffers (for_plan);
        # the kernel allocates exactly these (tpusim lower shows the same total)
        verdict = check_candidate(proposal.schedule, self.space.schedule,
                                  self._accountant(proposal.plan_choice, proposal.algorithms, base, plan))
        proposal.static_mib = verdict.vmem_static_bytes / MIB
        return verdict.reason

    def _deployed(self, choice: str, algorithms: dict[str, str], base: ShardingPlan) -> ShardingPlan | str:
        """Plan ``choice`` run with ``algorithms``, or why not (the algorithm cannot run its
        collective; the kernel cannot run the result): memoised, a pure function of the plan
        and the names (TPE's candidates ask it a few thousand times a sweep)."""
        key = (choice, tuple(sorted(algorithms.items())))
        known = self._deployments.get(key)
        if known is None:
            try:
                plan = base.with_algorithms(algorithms)
            except ValueError as error:
                known = f"collective: {error}"
            else:
                why = self.kernel_reason(plan)
                known = f"kernel: {why}" if why else plan
            self._deployments[key] = known
        return known

    def _accountant(self, choice: str, algorithms: dict[str, str], base: ShardingPlan,
                    plan: ShardingPlan) -> VmemAccountant:
        """The VMEM accountant of plan ``choice`` run with ``algorithms`` (``plan``), memoised."""
        key = f"{choice}|{sorted(algorithms.items())}"
        if key not in self._accountants:
            if choice not in self._accountants:
                self._accountants[choice] = VmemAccountant(self.workload.model, base, self.workload.batch,
                                                           self.workload.sequences)
            self._accountants[key] = self._accountants[choice].for_plan(plan) if algorithms \
                else self._accountants[choice]
        return self._accountants[key]

    def kernel_reason(self, plan: ShardingPlan) -> str:
        """Why the megakernel cannot run ``plan`` ('' when it can, or when the gate is off: the
        space says so, or the kernel does not run the model's auto plan either)."""
        if not self.space.kernel_runs_winner:
            return ""
        if self._kernel_gate is None:
            auto = self.base_plan(AUTO_PLAN)
            self._kernel_gate = not isinstance(auto, str) and not kernel_cannot_run(
                self.workload.model, auto, self.workload.batch)
        return kernel_cannot_run(self.workload.model, plan, self.workload.batch) if self._kernel_gate else ""

    def plan_copies(self, choice: str, name: str, picked: str) -> bool:
        """Whether ``picked`` runs collective ``name`` of plan ``choice`` with the plan's own
        copies: it is the plan's algorithm, or it sends the same messages (direct_all_gather over
        a pair): one candidate, not two. Memoised (a pure function of the plan and the names;
        every proposal and every candidate TPE weighs asks)."""
        key = (choice, name, picked)
        known = self._same_copies.get(key)
        if known is None:
            base = self.base_plan(choice)
            spec = next((s for s in base.all_collectives if s.name == name), None) if not isinstance(base, str) else None
            current = spec.algorithm if spec is not None else None
            known = picked == current or (
                spec is not None and current is not None and not isinstance(base, str)
                and cannot_run(picked, spec.kind, spec.group, base.topology) == ""
                and same_messages(picked, current, spec.group, base.topology))
            self._same_copies[key] = known
        return known

    def triple_choices(self, family: str) -> list[str]:
        """The family's ``distance/chunk/buffers`` choices (:func:`_triple_text`), listed once."""
        if family not in self._triples:
            self._triples[family] = [_triple_text(t) for t in self.space.schedule.families[family].triples()]
        return list(self._triples[family])

    def plan_reason(self, choice: str) -> str:
        """Why every candidate of this plan is invalid ('' when it builds and fits HBM)."""
        return self.check(Proposal(-1, "plan", choice, {}, None, reason="-")).removeprefix("-")

    def runnable_plans(self) -> list[str]:
        """The space's plans that build, divide the model and fit HBM (the study's plan choices;
        worked out once: every proposal asks, and each plan's reason is fixed)."""
        if self._runnable is None:
            self._runnable = [choice for choice in self.space.plans if not self.plan_reason(choice)]
        return list(self._runnable)

    def collectives(self, choice: str) -> list[tuple[str, str]]:
        """(name, kind) of the collectives the plan runs at this batch (one per name)."""
        plan = self.base_plan(choice)
        if isinstance(plan, str):
            return []
        seen: dict[str, str] = {}
        for spec in plan.collectives_at(self.workload.batch):
            seen.setdefault(spec.name, spec.kind)
        return list(seen.items())


def present_families(model: ModelConfig, program: Program) -> list[str]:
    from tpusim.schedule.schema import SCHEDULE_FAMILIES

    seen = {tensor.family for op in program.ops for tensor in op.tensors}
    if model.num_experts:
        seen.add(Family.ROUTED_EXPERT)
    return [family for family in SCHEDULE_FAMILIES if family in seen]


def _suggest(trial: Any, space: JointSpace, validator: _Validator, families: list[str], *,
             hashed: bool = True) -> Proposal:
    """Draw a trial's parameters (define-by-run: the plan first, then its collectives).
    ``hashed=False`` leaves :attr:`Proposal.hash` empty (a candidate only validated)."""
    choice = trial.suggest_categorical("plan", validator.runnable_plans())
    algorithms: dict[str, str] = {}
    for name, kind in validator.collectives(choice):
        picked = trial.suggest_categorical(f"alg.{name}", [KEEP_PLAN, *KIND_ALGORITHMS[kind]])
        if picked != KEEP_PLAN and not validator.plan_copies(choice, name, picked):
            algorithms[name] = picked
    sched = space.schedule
    families_out: dict[str, FamilySchedule] = {}
    pattern = trial.suggest_categorical("pools", list(sched.pool_patterns))
    owner = {m: pool for pool, members in sched.pool_patterns[pattern].items() for m in members}
    for family in families:
        spec = sched.families.get(family)
        if spec is None:
            continue
        # one categorical per family over the (distance, chunk, buffers) triples the schema accepts
        distance, chunk, buffers = _triple(trial.suggest_categorical(f"{family}.triple",
                                                                     validator.triple_choices(family)))
        families_out[family] = FamilySchedule.model_construct(
            prefetch_distance_ops=distance, chunk_bytes=chunk, buffers=buffers, pool=owner.get(family))
    issue = trial.suggest_categorical("expert_issue", sched.expert_issue)
    glob: dict[str, Any] = {
        "max_dmas_in_flight": trial.suggest_categorical("max_dmas_in_flight", sched.max_dmas_in_flight),
        "expert_issue": issue,
        "expert_speculation_ops": sched.expert_speculation_ops if issue == "speculative" else 0,
        "speculation_miss_rate": sched.speculation_miss_rate if issue == "speculative" else 0.0,
        "kv_tile_tokens": trial.suggest_categorical("kv_tile_tokens", sched.kv_tile_tokens),
        "kv_buffers": trial.suggest_categorical("kv_buffers", sched.kv_buffers),
        "pools": dict(sched.pool_modes.get(pattern, {})),
    }
    deployment = Deployment(plan=choice, collectives=algorithms)
    name = f"trial-{trial.number:05d}"
    try:
        families_valid = {f: FamilySchedule(**fs.model_dump()) for f, fs in families_out.items()}
        schedule = Schedule(name=name, description=f"joint sweep trial {trial.number}", families=families_valid,
                            deployment=deployment, **glob)
        reason = ""
    except ValidationError as error:
        schedule, reason = None, describe_validation_error("schema", error)
    proposal = Proposal(trial.number, "tpe", choice, algorithms, schedule, reason)
    if hashed:
        proposal.hash = schedule.content_hash() if schedule is not None else _params_hash(trial.params)
    return proposal


def _triple_text(triple: tuple[int, int | None, int]) -> str:
    """``distance/chunk_bytes/buffers`` (chunk ``whole`` for whole tensors): an Optuna choice."""
    return f"{triple[0]}/{'whole' if triple[1] is None else triple[1]}/{triple[2]}"


def _triple(text: str) -> tuple[int, int | None, int]:
    distance, chunk, buffers = text.split("/")
    return int(distance), None if chunk == "whole" else int(chunk), int(buffers)


def _params_hash(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]




class _Undrawn(Exception):
    """A parameter TPE did not draw jointly (the candidate cannot be judged yet)."""


class _PartialTrial:
    """The parameters of a candidate TPE is weighing, as a trial ``_suggest`` can read: a
    collective's algorithm not among them is the plan's (``plan``), any other is unknown."""

    number = -1

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        if name in self.params:
            return self.params[name]
        if name.startswith("alg."):
            return KEEP_PLAN
        raise _Undrawn(name)


FEASIBLE_MEMO = 20_000  # candidates remembered by relative_feasibility (~0.5 kB each), then forgotten at once


def relative_feasibility(space: JointSpace, validator: _Validator, families: list[str]) -> Any:
    """params -> whether the candidate passes step 3 (:meth:`_Validator.check`: static VMEM,
    DMAs, schema, kernel, capacity) with the collectives the plan writes where the candidate
    names none; True when a knob is not among ``params`` (it is drawn later, on its own).
    The sampler's filter (:func:`tpusim.sweep.joint_sampler.bounded_tpe`): a pure function
    of the parameters, memoised per distinct candidate (TPE's 24 candidates per ask repeat
    the good trials' choices)."""
    known: dict[str, bool] = {}

    def feasible(params: dict[str, Any]) -> bool:
        if "plan" not in params or "pools" not in params:
            return True  # a knob drawn on its own (TPE's independent sampling): nothing to judge
        key = json.dumps(params, sort_keys=True, default=str)
        answer = known.get(key)
        if answer is None:
            try:
                proposal = _suggest(_PartialTrial(params), space, validator, families, hashed=False)
            except _Undrawn:
                answer = True
            else:
                answer = not validator.check(proposal)
            if len(known) >= FEASIBLE_MEMO:
                known.clear()
            known[key] = answer
        return answer

    return feasible
