"""The joint sweep (``tpusim sweep --space joint``): schedule x collective algorithms x plan, by Optuna.

A candidate *deployment* is three choices, searched together:

- the **plan** (:attr:`JointSpace.plans`): ``auto`` (the published plan for the model and
  device count, else the generic one) or a ``--plan`` SPEC (expert groups x expert TP,
  attention TP or DP on the generic structure; the published structure with another expert
  split, a fused shared+routed expert reduction or a deferred shared wait;
  :func:`plan_choices` lists them);
- per collective of that plan, its **algorithm** from the plan's vocabulary
  (:data:`tpusim.workload.collectives.KIND_ALGORITHMS`; ``plan``: as the plan says);
- the **prefetch schedule**, knob by knob from :attr:`JointSpace.schedule` (the default
  :class:`~tpusim.sweep.space.SweepSpace`: distances, slabs, buffers, pool patterns with
  their ring modes, DMAs in flight, expert issue, KV tiles).

Steps of :func:`run_joint_sweep` (invariants after each):

1. **Baselines.** The built-in schedules on the ``auto`` plan as written (``published``
   first) are simulated in full. *The published design always has a row.*
2. **Ask.** Parameter sets given in ``seed_trials`` (the winners of the batches a
   ``--batches`` run searched before this one) are asked first (``source: seeded``). Optuna's TPE sampler (seeded; categorical parameters; define-by-run, so each
   plan has its own collective parameters) proposes ``ASK_BATCH`` trials at a time. The
   batch size is fixed, never the worker count, *so the study's history, and its best, do
   not depend on how many workers evaluate it.* Of the candidates TPE weighs for a trial it
   takes the best that step 3 would keep (:func:`relative_feasibility`, with the plan's own
   collectives; a pure function of the parameters, so still deterministic), so few trials
   are spent on schedules that overflow VMEM.
3. **Validate** each trial before anything runs (:func:`validate`): the plan builds and
   divides the model; every chosen algorithm can run its collective over its group
   (:func:`tpusim.workload.collectives.cannot_run`); the multi-device megakernel runs the
   plan and its algorithms (:func:`tpusim.workload.kernel_support.kernel_cannot_run`, when
   it runs the model's auto plan at all and ``kernel_runs_winner`` is on), *so the winner is
   a deployment the kernel can run*; weights + KV fit HBM
   (:func:`tpusim.workload.capacity.capacity_report`); the schedule schema accepts the
   knobs; the static VMEM (:func:`tpusim.schedule.vmem.vmem_plan`, the one accounting) fits
   the chip's usable on-chip memory; DMAs in flight within the copy engine's limit. An
   invalid trial gets a ``pruned`` row with the reason and is told *pruned* without a value
   (TPE ranks it below every measured trial). *No invalid candidate is estimated or simulated.*
4. **Screen** (off by default; ``JointSpace.screen_percentile``): the analytic estimate of
   the full step (:mod:`tpusim.sweep.estimate`) is reported as the trial's step-0 value;
   Optuna's ``PercentilePruner`` stops a trial whose estimate is worse than that percentile
   of the completed trials'. Its row says ``screened out`` with the estimate. Off by default
   because an estimate now costs about as much CPU as the engine step it would save, and the
   pruner's bar keeps falling (it compares with the simulated trials, which all passed it):
   K3 at batch 1, budget 200, ``--jobs 2``: 36.5 s and 1.188x with the screen at the 50th
   percentile, 28.2 s and 1.243x without (simulated, published chip figures).
5. **Simulate** the survivors in full (the engine, every layer) on the executor
   (:mod:`tpusim.sweep.executors`: in-process, processes or Dask workers); each result is
   written to ``sweep.csv`` and told to the study in trial order.
   **Polish**: once ``1 - polish_share`` of the budget (at most ``explore_max_simulations``)
   is simulated or in flight, each round
   is the one-parameter neighbours of the best trial instead of TPE's proposals (coordinate
   descent, :mod:`tpusim.sweep.joint_polish`; TPE again when a neighbourhood is exhausted),
   validated, screened and simulated like any trial (``source: polish`` in ``sweep.csv``); a
   neighbour known already is skipped, and one validation refuses gets its pruned row before
   Optuna is asked (trial ``-1``, name ``neighbour``).
6. Repeat 2-5 until ``budget`` full simulations are done (the last batch may add up to
   ``ASK_BATCH - 1`` more). The rounds overlap by one: round *k + 1* is asked, validated and
   sent for its estimates while round *k* simulates, and round *k* is told before round *k + 1*
   is screened. The lag is the same for every executor (in-process, the tasks run when their
   results are read), *so the study still does not depend on the workers;* a proposal whose
   hash is in flight waits for that row's value instead of being evaluated twice. **Choose** the simulated row with the smallest
   ``(step_ms, hash)``; write ``best.json`` (the schedule with its :class:`Deployment`:
   ``tpusim simulate --schedule best.json`` runs the same plan and algorithms),
   ``summary.md`` and ``pareto.png`` (tokens/s against static VMEM, coloured by plan).

Record and resume (:mod:`tpusim.sweep.joint_study`). The study lives in an Optuna ``JournalStorage`` file (``study.journal``)
and every evaluated candidate in ``sweep.csv``, keyed by the hash of its schedule *with* its
deployment. A proposal whose hash already has a row is told that row's value and never
evaluated again. Ctrl-C (or SIGTERM) leaves the trials of the batch in flight *running* in
the journal; ``--resume`` marks them failed and re-enqueues their parameters, so they are
evaluated once, on the resume — *nothing finished is lost and nothing is repeated.*
"""

from __future__ import annotations

import json
import time
from concurrent.futures import BrokenExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwmodels.errors import InputError
from hwmodels.schema import System
from tpusim.schedule.schema import (
    BUILTIN_SCHEDULES,
    Deployment,
    Schedule,
    load_schedule,
    save_schedule,
)
from tpusim.sweep.executors import Executor, ExecutorKind
from tpusim.sweep.joint_candidates import (  # noqa: F401  (public names kept importable from here)
    ASK_BATCH,
    AUTO_PLAN,
    COLUMNS,
    FLOATS,
    KEEP_PLAN,
    MIB,
    MS_PER_S,
    JointSpace,
    JointWorkload,
    Proposal,
    _cached,
    _params_hash,
    _suggest,
    _triple,
    _triple_text,
    _Validator,
    default_joint_space,
    evaluate_task,
    plan_choices,
    present_families,
    relative_feasibility,
)
from tpusim.sweep.joint_polish import POLISH, Polish
from tpusim.sweep.joint_study import flushed_journal, study_storage, tell, tell_known
from tpusim.sweep.outputs import SweepCsv, write_text_atomic
from tpusim.sweep.progress import SweepProgress
from tpusim.sweep.space import knob_names, schedule_knobs
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.routing import RoutingModel

BASELINE_SOURCES = ("builtin", "given")  # rows whose schedule is a file or built-in named in the row
SEEDED = "seeded"  # the source of a trial asked from another sweep's winner (``seed_trials``)


@dataclass
class JointResult:
    """The outcome of a joint sweep (rows as written; best and published rows; paths; counts)."""

    best: Schedule
    best_row: dict[str, Any]
    published_row: dict[str, Any] | None
    rows: list[dict[str, Any]]
    trials: int
    simulated: int
    wall_s: float
    cpu_s: float
    executor: str
    paths: dict[str, Path] = field(default_factory=dict)
    robust: dict[str, Any] | None = None  # the winner's interval and P(best): tpusim.sweep.joint_robust
    study_params: dict[str, Any] | None = None  # the winning trial's parameters (None: a built-in won)

    @property
    def speedup(self) -> float | None:
        pub = self.published_row
        if not pub or not pub.get("predicted_ms"):
            return None
        return pub["predicted_ms"] / self.best_row["predicted_ms"]


def run_joint_sweep(
    model: ModelConfig, system: System, batch: int, *, out_dir: Path | str, budget: int = 2000, seed: int = 0,
    resume: bool = False, context_tokens: int = 1024, routing: RoutingModel | None = None,
    space: JointSpace | None = None, jobs: int = 1, executor: ExecutorKind = "local", workers: int = 2,
    scheduler: str | None = None, quiet: bool = False, plots: bool = True, on_row: Any = None,
    sequences: int | None = None, seed_trials: list[dict[str, Any]] | None = None,
    baselines: tuple[str, ...] = (),
) -> JointResult:
    """Search deployments for one workload and write the outputs (see the module docstring).

    ``budget``: full-step engine simulations (the baselines included). ``on_row`` is called
    after every row is written (tests use it to interrupt a sweep). ``seed_trials``: parameter
    sets (another sweep's winners, :func:`winner_params`) asked before TPE's first proposal,
    ``source: seeded``; enqueued once (a resumed sweep finds them in its study already).
    ``baselines``: schedule files simulated in full on the ``auto`` plan beside the built-ins
    (``source: given``; the demo gives the schedule sweep's winner, so the best this search
    reports is never slower than a configuration the same report shows elsewhere).
    """
    import optuna

    from tpusim.sweep.joint_sampler import bounded_tpe
    from tpusim.sweep.search import SweepInterrupted

    started, started_cpu = time.perf_counter(), time.process_time()
    if system.chip.execution.mode != "megakernel":
        raise InputError(f"{system.chip.name} dispatches one kernel per op: prefetch schedules do not apply "
                         "(sweep a megakernel chip such as tpu-v7)")
    if budget < 1:
        raise InputError("budget must be >= 1")
    out = Path(out_dir)
    workload = JointWorkload(model, system, batch, context_tokens, routing or RoutingModel("uniform"), seed, sequences)
    space = space or default_joint_space(model, system.devices)
    staging = system.chip.staging_memory
    space = space.model_copy(update={"schedule": space.schedule.with_capacity(
        staging.usable_bytes, f"{system.chip.name} {staging.name} usable bytes")})
    _space_file(out, workload, space, resume)
    validator = _Validator(workload, space)
    auto = validator.base_plan(AUTO_PLAN)
    if isinstance(auto, str):
        raise InputError(auto)
    families = present_families(model, workload.program(auto))
    knobs = knob_names(families)
    table = SweepCsv(out / "sweep.csv", [*COLUMNS, *knobs])
    rows: dict[str, dict[str, Any]] = {}
    for row in table.read() if resume else []:
        rows[row["hash"]] = {**row, **{k: (float(row[k]) if row.get(k) not in ("", None) else None)
                                      for k in FLOATS}}
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    screened = space.screen_percentile is not None  # None: every valid candidate is simulated, no estimate
    journal = out / "study.journal"
    if not resume and journal.exists():
        journal.unlink()
    out.mkdir(parents=True, exist_ok=True)
    backend = flushed_journal(str(journal))
    storage = study_storage(backend)
    study = optuna.create_study(
        study_name="joint", storage=storage, direction="minimize", load_if_exists=True,
        sampler=bounded_tpe(seed=seed, n_startup_trials=min(32, max(4, budget // 8)),
                            feasible=relative_feasibility(space, validator, families)),
        pruner=(optuna.pruners.PercentilePruner(space.screen_percentile, n_startup_trials=space.startup_trials)
                if screened else optuna.pruners.NopPruner()))
    for params in seed_trials or []:
        study.enqueue_trial(params, user_attrs={"source": SEEDED}, skip_if_exists=True)
    for stale in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.enqueue_trial(stale.params, skip_if_exists=False)  # asked, never finished: run it once now
        study.tell(stale.number, state=optuna.trial.TrialState.FAIL)
    progress = SweepProgress(enabled=not quiet)
    pool: Executor | None = None

    def simulated() -> int:
        return sum(r["status"] == "simulated" for r in rows.values())

    def emit(proposal: Proposal, row: dict[str, Any]) -> None:
        name = ("neighbour" if proposal.trial < 0 and proposal.source == POLISH else  # refused before it was asked
                proposal.schedule.name if proposal.schedule else
                "plan" if proposal.source == "plan" else f"trial-{proposal.trial:05d}")
        full = {"trial": proposal.trial, "hash": proposal.hash, "name": name, "source": proposal.source,
                "plan": proposal.plan_choice,
                "collectives": ";".join(f"{k}={v}" for k, v in sorted(proposal.algorithms.items())),
                "vmem_static_mib": proposal.static_mib, **proposal.knobs, **row}
        table.append(full)
        rows[proposal.hash] = full
        if full["status"] == "simulated":
            progress.offer_best(full["predicted_ms"], f"{full['plan']} {full['name']}")
        if on_row is not None:
            on_row(full)

    table.open(resume=resume)
    try:
        with progress:
            pool = Executor(executor, jobs=jobs, workers=workers, scheduler=scheduler)
            task = progress.phase(f"joint: simulate ({pool.label})", budget, completed=min(budget, simulated()))
            todo = [_baseline(name, space, families) for name in BUILTIN_SCHEDULES]
            todo += [_baseline(path, space, families, source="given") for path in baselines]
            todo = [p for p in dict((p.hash, p) for p in todo).values() if p.hash not in rows]
            for proposal in todo:
                reason = validator.check(proposal)
                if reason:
                    emit(proposal, {"status": "pruned", "reason": reason})
            todo = [p for p in todo if p.hash not in rows]
            for proposal, result in zip(todo, pool.map(evaluate_task, [
                    (workload, "simulate", p.schedule.model_dump(mode="json")) for p in todo]), strict=True):
                emit(proposal, _sim_row(result))
                progress.advance(task)
            for choice in space.plans:  # a plan no candidate can run: one row, never proposed
                reason = validator.plan_reason(choice)
                key = _params_hash({"plan": choice})
                if reason and key not in rows:
                    emit(Proposal(-1, "plan", choice, {}, None, hash=key), {"status": "pruned", "reason": reason})
            if not validator.runnable_plans():
                raise InputError("no plan in the space builds and fits HBM (see sweep.csv reasons)")
            asked = 0
            limit = budget * 50 + 200
            polish = Polish(space.polish_share, budget, space.explore_max_simulations)  # once TPE has explored
            waiting: dict[str, list[Any]] = {}  # hash in flight -> later trials proposing it again
            in_flight: list[tuple[Any, Proposal, float]] = []
            simulations: Any = None  # the results of the round in flight (Executor.submit)

            def finish(trial: Any, proposal: Proposal, row: dict[str, Any]) -> None:
                """Write the row of a proposal that was in flight, then tell it and the trials waiting
                on its hash (a row first: a trial interrupted before its tell is proposed again on
                --resume and told the row's value)."""
                emit(proposal, row)
                for told in [trial, *waiting.pop(proposal.hash, [])]:
                    tell_known(study, told, row)

            def neighbour_wanted(params: dict[str, Any]) -> bool:
                """A polish neighbour needs a trial unless it is known, in flight, or invalid (its
                pruned row is written here: :mod:`tpusim.sweep.joint_polish`, step 4)."""
                try:
                    proposal = _suggest(optuna.trial.FixedTrial(params, -1), space, validator, families)
                except ValueError:  # its plan adds parameters the base trial has not drawn
                    return True
                if proposal.hash in rows or proposal.hash in waiting:
                    return False
                if proposal.schedule is not None:
                    proposal.knobs = schedule_knobs(proposal.schedule, space.schedule, families)
                reason = validator.check(proposal)
                if reason:
                    proposal.source = POLISH
                    emit(proposal, {"status": "pruned", "reason": reason})
                    return False
                return True

            while True:
                # 1. ask and validate round k + 1 while round k simulates (see the module docstring)
                estimates: Any = None
                if simulated() + len(in_flight) < budget and asked < limit:
                    polish.enqueue(study, rows, simulated() + len(in_flight), ASK_BATCH, wanted=neighbour_wanted)
                    trials = [study.ask() for _ in range(ASK_BATCH)]
                    asked += len(trials)
                    proposals = [_suggest(t, space, validator, families) for t in trials]
                    for trial, proposal in zip(trials, proposals, strict=True):
                        if trial.user_attrs.get("source") in (POLISH, SEEDED):
                            proposal.source = trial.user_attrs["source"]
                    fresh: list[tuple[Any, Proposal]] = []
                    for trial, proposal in zip(trials, proposals, strict=True):
                        if proposal.schedule is not None:
                            proposal.knobs = schedule_knobs(proposal.schedule, space.schedule, families)
                        known = rows.get(proposal.hash)
                        if known is not None:  # evaluated before (this run or before a resume): reuse
                            tell_known(study, trial, known)
                            continue
                        if proposal.hash in waiting:  # in flight: told its value when it lands
                            waiting[proposal.hash].append(trial)
                            continue
                        reason = validator.check(proposal)
                        if reason:
                            emit(proposal, {"status": "pruned", "reason": reason})
                            tell(study, trial, state=optuna.trial.TrialState.PRUNED)
                            continue
                        waiting[proposal.hash] = []
                        fresh.append((trial, proposal))
                    estimates = (pool.submit(evaluate_task, [(workload, "estimate", p.schedule.model_dump(mode="json"))
                                                             for _, p in fresh]) if screened
                                 else _unscreened(len(fresh)))
                # 2. round k's results, in trial order
                if simulations is not None:
                    for (trial, proposal, est_ms), result in zip(in_flight, simulations(), strict=True):
                        finish(trial, proposal, {**_sim_row(result), "est_ms": est_ms})
                        progress.advance(task)
                    in_flight, simulations = [], None
                if estimates is None:
                    if simulated() < budget and asked < limit:
                        continue  # round k fell short of the budget (infeasible simulations): ask again
                    break
                # 3. screen round k + 1 and start its simulations
                for (trial, proposal), est in zip(fresh, estimates(), strict=True):
                    if not est["feasible"]:
                        finish(trial, proposal, {"status": "pruned", "reason": est["reason"]})
                        continue
                    if est["est_ms"] is not None:
                        trial.report(est["est_ms"], 0)
                    if est["est_ms"] is not None and trial.should_prune():
                        finish(trial, proposal, {"status": "pruned", "est_ms": est["est_ms"], "predicted_by": "estimate",
                                          "reason": f"screened out: estimate {est['est_ms']:.4f} ms above the "
                                          f"{space.screen_percentile:g}th percentile"})
                        continue
                    in_flight.append((trial, proposal, est["est_ms"]))
                simulations = pool.submit(evaluate_task, [(workload, "simulate", p.schedule.model_dump(mode="json"))
                                                          for _, p, _ in in_flight])
    except KeyboardInterrupt:
        if pool is not None:
            pool.close(cancel=True)
            pool = None
        table.close()
        raise SweepInterrupted(
            f"interrupted: {len(rows)} finished rows kept in {table.path} and the study in {journal}; rerun the "
            "same command with --resume to continue without repeating them") from None
    except BrokenExecutor as error:  # a worker died (killed, out of memory): say so in one line
        raise InputError(f"a worker process died ({error}); {len(rows)} finished rows are kept in {table.path}: "
                         "rerun the same command with --resume") from None
    finally:
        label = pool.label if pool is not None else executor
        if pool is not None:
            pool.close()
        table.close()
        backend.close()  # (reopened should anything write the study later)
    result = _result(list(rows.values()), workload, study, (space, validator, families), started, started_cpu,
                     label)
    from tpusim.sweep.joint_robust import robust_choice

    result.robust = robust_choice(result, workload, study, (space, validator, families), _suggest)
    _write_outputs(result, out, workload, space, plots=plots)
    return result


def winner_params(result: JointResult) -> dict[str, Any] | None:
    """The winning trial's parameters (``None``: a built-in schedule won), to seed another sweep."""
    if int(result.best_row["trial"]) < 0 or result.study_params is None:
        return None
    return dict(result.study_params)


def _unscreened(count: int) -> Any:
    """The screen's answer when there is none: every candidate feasible, no estimate."""
    return lambda: [{"feasible": True, "est_ms": None} for _ in range(count)]


def _sim_row(result: dict[str, Any]) -> dict[str, Any]:
    if not result["feasible"]:
        return {"status": "pruned", "reason": result["reason"]}
    return {"status": "simulated", "predicted_by": "simulated", **{k: v for k, v in result.items() if k != "feasible"}}


def _baseline(name: str, space: JointSpace, families: list[str], *, source: str = "builtin") -> Proposal:
    schedule = load_schedule(name).model_copy(update={"deployment": Deployment(plan=AUTO_PLAN)})
    if source == "given":  # the row names the file, so the winner rebuilds from it (the hash ignores names)
        schedule = schedule.model_copy(update={"name": str(name)})
    proposal = Proposal(-1, source, AUTO_PLAN, {}, schedule, hash=schedule.content_hash())
    proposal.knobs = schedule_knobs(schedule, space.schedule, families)
    return proposal


def _space_file(out: Path, workload: JointWorkload, space: JointSpace, resume: bool) -> None:
    config = {"workload": workload.describe(), "joint_space": space.model_dump(mode="json")}
    path = out / "space.json"
    if resume and path.exists():
        old = json.loads(path.read_text())
        for key in config:
            if old.get(key) != config[key]:
                raise InputError(f"{path}: this folder holds a sweep of a different {key.replace('_', ' ')}; "
                                 "--resume needs the same model, hardware, batch, seed and space (or a new --out)")
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(config, indent=2) + "\n")


def _result(rows: list[dict[str, Any]], workload: JointWorkload, study: Any, rebuild: tuple[Any, ...],
            started: float, started_cpu: float, executor: str) -> JointResult:
    simulated = sorted((r for r in rows if r["status"] == "simulated"), key=lambda r: (r["predicted_ms"], r["hash"]))
    if not simulated:
        raise InputError("no feasible deployment: every candidate was pruned (see sweep.csv reasons)")
    best_row = simulated[0]
    published = next((r for r in rows if r["source"] == "builtin" and r["name"] == "published"
                      and r["status"] == "simulated"), None)
    params: dict[str, Any] | None = None
    if best_row["source"] in BASELINE_SOURCES:
        schedule = load_schedule(best_row["name"])
    else:  # a trial's schedule, drawn again from its parameters in the study (the one record)
        import optuna

        params = study.get_trials(deepcopy=False)[int(best_row["trial"])].params
        proposal = _suggest(optuna.trial.FixedTrial(params, int(best_row["trial"])), *rebuild)
        assert proposal.schedule is not None
        schedule = proposal.schedule
    return JointResult(study_params=params, best=_best_schedule(schedule, best_row, published, workload),
                       best_row=best_row, published_row=published, rows=rows, trials=len(study.get_trials(deepcopy=False)),
                       simulated=len(simulated), wall_s=time.perf_counter() - started,
                       cpu_s=time.process_time() - started_cpu, executor=executor)


def _best_schedule(schedule: Schedule, best: dict[str, Any], published: dict[str, Any] | None,
                   workload: JointWorkload) -> Schedule:
    """The winner as a schedule file, with its deployment (plan and algorithms from its row)."""
    collectives = dict(item.split("=", 1) for item in (best["collectives"] or "").split(";") if item)
    deployment = Deployment(plan=best["plan"], collectives=collectives)
    w = workload.describe()
    text = (f"chosen by tpusim sweep --space joint from trial {best['trial']} ({best['source']}): {w['model']} on "
            f"{w['hardware']} x{w['chips']}, batch {w['batch']}, context {w['context_tokens']}, routing "
            f"{w['routing']}, seed {w['seed']}; plan {best['plan']}, {best['predicted_ms']:.4f} ms/step (simulated)")
    if published:
        text += f" vs published {published['predicted_ms']:.4f} ms (simulated)"
    chosen = schedule.model_copy(update={"name": f"best-{best['hash']}", "description": text,
                                         "deployment": deployment})
    if chosen.content_hash() != best["hash"]:
        raise AssertionError(f"best.json does not reproduce row {best['hash']} ({chosen.content_hash()})")
    return chosen


def _write_outputs(result: JointResult, out: Path, workload: JointWorkload, space: JointSpace, *,
                   plots: bool) -> None:
    from tpusim.sweep.joint_report import joint_summary, pareto_by_plan

    best_path = out / "best.json"
    save_schedule(result.best, best_path)
    result.paths = {"csv": out / "sweep.csv", "space": out / "space.json", "best": best_path,
                    "summary": out / "summary.md", "journal": out / "study.journal"}
    if plots:
        result.paths["pareto"] = pareto_by_plan(result, out / "pareto.png", workload)
    write_text_atomic(out / "summary.md", joint_summary(result, workload, space))
