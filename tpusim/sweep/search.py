"""The sweep: prune, estimate, screen, simulate, refine, choose — deterministic for a seed.

:func:`run_sweep` searches a :class:`~tpusim.sweep.space.SweepSpace` for the fastest
prefetch schedule of one workload (model, plan, system, batch) and writes its outputs.

Steps (each keeps the invariant named after it):

1. **Candidates.** Built-ins, their one-knob neighbours and ``space.samples`` seeded draws
   (:func:`~tpusim.sweep.candidates.candidates`). *The list depends only on the space, the
   model's families and the seed.*
2. **Prune** every candidate with the static VMEM accounting and the DMA limit
   (:mod:`tpusim.sweep.prune`), and every one the schedule schema rejected (reason
   ``schema: ...``); pruned rows are written at once. *No pruned candidate
   is ever estimated or simulated.*
3. **Estimate** the survivors (:mod:`tpusim.sweep.estimate`, ~30-60 ms each) and order them
   by ``(estimate, hash)``.
4. **Screen** (successive halving, rung 1): the engine on the first ``screen_layers`` layers
   (~1/8 of a K3 step) for the built-ins and the ``screen_factor x budget`` best-estimated.
5. **Simulate** (rung 2): the full step for the built-ins plus the best screened, up to the
   round's budget. *``published`` and the other built-ins are always simulated*, so the
   chosen schedule is never predicted slower than ``published``.
6. **Refine**: steps 2-5 again, with ``refine_share`` of the budget, on the one-knob
   neighbours of the ``REFINE_FROM`` best simulated schedules (a step of hill climbing from
   where the random search landed).
7. **Choose** the simulated candidate with the smallest ``(step_ms, hash)``; write
   ``best.json``, ``summary.md``, ``pareto.png`` and ``sensitivity.png``.

Determinism: every evaluation is a pure function of (workload, schedule), every ranking
sorts on ``(value, hash)``, and parallel results are gathered before any decision, so the
same seed gives the same ``best.json`` whatever ``jobs`` is. Only the order of rows in
``sweep.csv`` follows completion order.

Resume: rows already in ``sweep.csv`` (by schedule hash) are reused — a candidate with a
row is never evaluated again; the estimates and screens of candidates without a row yet are
recomputed (they are cheap, and deterministic, so the same finalists follow). Ctrl-C stops
the workers (they ignore SIGINT; the parent cancels what is queued), keeps every finished
row, and raises :class:`SweepInterrupted`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwmodels.errors import InputError
from hwmodels.schema import System
from tpusim.progress_notes import note
from tpusim.schedule.schema import BUILTIN_SCHEDULES, SCHEDULE_FAMILIES, Schedule, save_schedule
from tpusim.sweep.candidates import Candidate, candidates, neighbour_candidates, neighbours
from tpusim.sweep.defaults import (
    DEFAULT_BUDGET,
    DEFAULT_REFINE_SHARE,
    DEFAULT_SCREEN_FACTOR,
    DEFAULT_SCREEN_LAYERS,
    ESTIMATE_CHUNK,
    REFINE_FROM,
)
from tpusim.sweep.evaluate import MIB, Evaluator, Workload
from tpusim.sweep.outputs import SweepCsv, csv_columns, write_text_atomic
from tpusim.sweep.progress import SweepProgress
from tpusim.sweep.prune import VmemAccountant, check_candidate
from tpusim.sweep.result import SweepResult
from tpusim.sweep.space import SweepSpace, default_space, knob_names, schedule_knobs
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import Family
from tpusim.workload.routing import RoutingModel
from tpusim.workload.sharding import ShardingPlan

RowHook = Callable[[dict[str, Any]], None]
# A check of a ranked row's schedule beyond the simulator -> (accepted, what it found), accepted
# None for a row the check passed over without checking it; e.g. the CLI's Mosaic compile
# (megakernel.commands.sweep_compile); the library never compiles.
Acceptor = Callable[[Schedule, dict[str, Any]], tuple[bool | None, str]]


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep; ``sweep.csv`` keeps every finished row (message says how to resume)."""


def present_families(workload: Workload) -> list[str]:
    """Weight families the program reads (the only ones whose knobs matter)."""
    seen = {tensor.family for op in workload.program().ops for tensor in op.tensors}
    if workload.model.num_experts:
        seen.add(Family.ROUTED_EXPERT)
    return [family for family in SCHEDULE_FAMILIES if family in seen]


def _check_space_file(path: Path, config: dict[str, Any], resume: bool) -> None:
    if resume and path.exists():
        old = json.loads(path.read_text())
        for key in ("workload", "space"):
            if old.get(key) != config[key]:
                raise InputError(
                    f"{path}: this folder holds a sweep of a different {key}; --resume needs the same "
                    "model, hardware, batch, seed and space (or use a new --out)")


class _Search:
    """The state of one sweep: rows written so far and the per-candidate numbers."""

    def __init__(self, workload: Workload, space: SweepSpace, families: list[str], table: SweepCsv,
                 done: dict[str, dict[str, Any]], accountant: VmemAccountant, evaluator: Evaluator,
                 progress: SweepProgress, on_row: RowHook | None, screen_factor: int) -> None:
        self.workload, self.space, self.families = workload, space, families
        self.table, self.done, self.accountant = table, done, accountant
        self.evaluator, self.progress, self.on_row = evaluator, progress, on_row
        self.screen_factor = screen_factor if workload.screen_layers < workload.model.num_layers else 0
        self.considered: list[Candidate] = []
        self.by_hash: dict[str, Candidate] = {}
        self.base: dict[str, dict[str, Any]] = {}
        self.static_mib: dict[str, float] = {}
        self.refine_seed: str | None = None  # hash of the schedule the refine round started from
        self.stage_s: dict[str, float] = {}  # wall time per "<round>.<stage>"
        self._mark = time.perf_counter()
        self.est = {h: r["est_ms"] for h, r in done.items() if r.get("est_ms") is not None}
        self.screen = {h: r["screen_ms"] for h, r in done.items() if r.get("screen_ms") is not None}

    def emit(self, row: dict[str, Any]) -> None:
        """Append a candidate's final row to sweep.csv (flushed) and remember it."""
        self.table.append(row)
        self.done[row["hash"]] = row
        if row["status"] == "simulated":
            self.progress.offer_best(row["predicted_ms"], row["name"])
        if self.on_row is not None:
            self.on_row(row)

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stage_s[name] = self.stage_s.get(name, 0.0) + now - self._mark
        self._mark = now

    def status(self, digest: str) -> str | None:
        row = self.done.get(digest)
        return row["status"] if row else None

    def add(self, cands: list[Candidate]) -> list[Candidate]:
        """Register new candidates (duplicates of earlier ones are dropped)."""
        fresh = []
        for cand in cands:
            if cand.hash in self.by_hash:
                continue
            fresh.append(cand)
            self.considered.append(cand)
            self.by_hash[cand.hash] = cand
            self.base[cand.hash] = {"hash": cand.hash, "name": cand.schedule.name, "source": cand.source,
                                    **schedule_knobs(cand.schedule, self.space, self.families)}
        return fresh

    def prune(self, label: str, cands: list[Candidate]) -> list[Candidate]:
        """Step 2: the feasible candidates; a ``pruned`` row for each of the rest (once).

        A candidate the schema rejected is pruned with the schema's reason and never reaches
        the VMEM accounting (its settings are not a valid schedule).
        """
        feasible: list[Candidate] = []
        task = self.progress.phase(f"{label}: prune", len(cands))
        for cand in cands:
            row: dict[str, Any] | None = None
            if cand.rejected:
                row = {"reason": cand.rejected}
            else:
                verdict = check_candidate(cand.schedule, self.space, self.accountant)
                self.static_mib[cand.hash] = verdict.vmem_static_bytes / MIB
                if verdict.feasible:
                    feasible.append(cand)
                else:
                    row = {"reason": verdict.reason, "vmem_static_mib": self.static_mib[cand.hash]}
            if row is not None and self.status(cand.hash) is None:
                self.emit({**self.base[cand.hash], "status": "pruned", **row})
            self.progress.advance(task)
        return feasible

    def run_round(self, label: str, cands: list[Candidate], sim_budget: int, must: list[str], *,
                  screen_all: bool = False) -> None:
        """Prune, estimate, screen and simulate ``cands`` (steps 2-5 of the module docstring).

        ``screen_all`` screens every feasible candidate, not only the best-estimated.
        """
        progress, base, batch = self.progress, self.base, self.workload.batch
        self._mark = time.perf_counter()
        feasible = self.prune(label, cands)
        must = [h for h in must if any(c.hash == h for c in feasible)]
        self.lap(f"{label}.prune")

        est = self.est
        todo = [c for c in feasible if c.hash not in est]
        task = progress.phase(f"{label}: estimate", len(feasible), completed=len(feasible) - len(todo))
        for _, rows in self.evaluator.run("estimate", _chunks(todo, ESTIMATE_CHUNK)):
            for row in rows:
                est[row["hash"]] = row["est_ms"]
            progress.advance(task, len(rows))
        order = sorted(feasible, key=lambda c: (est[c.hash], c.hash))
        self.lap(f"{label}.estimate")

        screen, failed = self.screen, set()
        ranked = order
        if self.screen_factor:
            width = len(order) if screen_all else self.screen_factor * sim_budget
            pool = _unique([*(self.by_hash[h] for h in must), *order[:width]])
            todo = [c for c in pool if c.hash not in screen and self.status(c.hash) != "pruned"]
            task = progress.phase(f"{label}: screen ({self.workload.screen_layers} layers)", len(pool),
                                  completed=len(pool) - len(todo))
            for done_batch, rows in self.evaluator.run("screen", [[c] for c in todo]):
                for cand, row in zip(done_batch, rows, strict=True):
                    if row["feasible"]:
                        screen[cand.hash] = row["step_ms"]
                    else:
                        failed.add(cand.hash)
                        self.emit({**base[cand.hash], "status": "pruned", "est_ms": est[cand.hash],
                                   "reason": f"{row['reason']} ({self.workload.screen_layers} layers)",
                                   "vmem_static_mib": self.static_mib[cand.hash]})
                progress.advance(task, len(rows))
            ranked = sorted((c for c in pool if c.hash in screen), key=lambda c: (screen[c.hash], c.hash))
        self.lap(f"{label}.screen")

        finalists = _unique([*(self.by_hash[h] for h in must if h not in failed), *ranked])
        finalists = finalists[: max(sim_budget, len(must))]
        todo = [c for c in finalists if self.status(c.hash) not in ("simulated", "pruned")]
        task = progress.phase(f"{label}: simulate", len(finalists), completed=len(finalists) - len(todo))
        for cand in finalists:
            if self.status(cand.hash) == "simulated":
                progress.offer_best(self.done[cand.hash]["predicted_ms"], self.done[cand.hash]["name"])
        for done_batch, rows in self.evaluator.run("simulate", [[c] for c in todo]):
            for cand, row in zip(done_batch, rows, strict=True):
                self.emit(_final_row(base[cand.hash], row, est.get(cand.hash), screen.get(cand.hash),
                                     self.static_mib[cand.hash]))
            progress.advance(task, len(rows))

        self.lap(f"{label}.simulate")
        for cand in order:  # the rest of the round: estimate only
            if self.status(cand.hash) is None:
                ms = est[cand.hash]
                self.emit({**base[cand.hash], "status": "estimated", "predicted_ms": ms, "predicted_by": "estimate",
                           "tokens_per_s": batch * 1000.0 / ms, "est_ms": ms, "screen_ms": screen.get(cand.hash),
                           "vmem_static_mib": self.static_mib[cand.hash]})

    def screen_only(self, cands: list[Candidate]) -> None:
        """Screen candidates that already have rows (for the sensitivity table; no rows written)."""
        todo = [c for c in cands if c.hash not in self.screen and self.status(c.hash) not in (None, "pruned")]
        if not (todo and self.screen_factor):
            return
        task = self.progress.phase("sensitivity: screen", len(todo))
        for done_batch, rows in self.evaluator.run("screen", [[c] for c in todo]):
            for cand, row in zip(done_batch, rows, strict=True):
                if row["feasible"]:
                    self.screen[cand.hash] = row["step_ms"]
            self.progress.advance(task, len(rows))

    def sensitivity(self, seed: Candidate) -> list[dict[str, Any]]:
        """One-knob variations around ``seed``: ``{knob, value, ms, sim_ms, is_seed}`` per schedule.

        ``ms`` is the screen time (the engine on the first layers) when screening ran, else
        the estimate; ``sim_ms`` the full simulated step where one exists.
        """
        metric = self.screen if self.screen_factor else self.est
        seed_knobs = schedule_knobs(seed.schedule, self.space, self.families)
        out = [{"knob": knob, "value": value, "ms": metric.get(seed.hash), "is_seed": True,
                "sim_ms": self.done.get(seed.hash, {}).get("sim_ms")} for knob, value in seed_knobs.items()]
        for schedule in neighbours(seed.schedule, self.space, self.families):
            digest = schedule.content_hash()
            changed = [(k, v) for k, v in schedule_knobs(schedule, self.space, self.families).items()
                       if seed_knobs[k] != v]
            if len(changed) == 1 and metric.get(digest) is not None:
                out.append({"knob": changed[0][0], "value": changed[0][1], "ms": metric[digest], "is_seed": False,
                            "sim_ms": self.done.get(digest, {}).get("sim_ms")})
        return [entry for entry in out if entry["ms"] is not None]

    def ranked(self) -> list[dict[str, Any]]:
        """Simulated rows by (step, hash); estimated ones when nothing was simulated."""
        rows = [self.done[c.hash] for c in self.considered if c.hash in self.done]
        simulated = [r for r in rows if r["status"] == "simulated"]
        pick = simulated or [r for r in rows if r["status"] == "estimated"]
        return sorted(pick, key=lambda r: (r["predicted_ms"], r["hash"]))


def run_sweep(
    model: ModelConfig,
    plan: ShardingPlan,
    system: System,
    batch: int,
    *,
    out_dir: Path | str,
    budget: int = DEFAULT_BUDGET,
    jobs: int = 1,
    seed: int = 0,
    resume: bool = False,
    context_tokens: int = 1024,
    routing: RoutingModel | None = None,
    quiet: bool = False,
    space: SweepSpace | None = None,
    screen_factor: int = DEFAULT_SCREEN_FACTOR,
    screen_layers: int = DEFAULT_SCREEN_LAYERS,
    refine_share: float = DEFAULT_REFINE_SHARE,
    builtins: tuple[str, ...] = BUILTIN_SCHEDULES,
    on_row: RowHook | None = None,
    plots: bool = True,
    sequences: int | None = None,
    accept: Acceptor | None = None,
) -> SweepResult:
    """Search schedules for one workload and write the outputs (see the module docstring).

    ``budget`` is the number of full-step engine simulations (built-ins included; they are
    simulated even when the budget is smaller); ``refine_share`` of it goes to the refine
    round. ``seed`` fixes the random draws and the routing draw of the program; ``sequences``
    (default: one per row) is how many sequences the ``batch`` rows belong to (a speculative
    verify step: ``draft_tokens + 1`` rows each), which sizes the KV tiles and reads. ``on_row``
    is called after every row is written (tests use it to interrupt a sweep). ``accept``, when
    given, checks the simulated rows fastest first beyond the simulator (the CLI's
    ``--compile-check``: Mosaic compiles the schedule) and the first it accepts is chosen;
    every check is in :attr:`SweepResult.checks`. When it accepts none, the simulated best
    is written and ``checks`` says so.
    """
    started = time.perf_counter()
    if system.chip.execution.mode != "megakernel":
        raise InputError(f"{system.chip.name} dispatches one kernel per op: prefetch schedules do not apply "
                         "(sweep a megakernel chip such as tpu-v7)")
    if budget < 1 or jobs < 1:
        raise InputError("budget and jobs must be >= 1")
    out = Path(out_dir)
    workload = Workload(model, plan, system, batch, context_tokens, routing or RoutingModel("uniform"), seed,
                        screen_layers, sequences)
    families = present_families(workload)
    space = _space_file(out, workload, space or default_space(), resume)

    knobs = knob_names(families)
    table = SweepCsv(out / "sweep.csv", csv_columns(knobs))
    done = {row["hash"]: row for row in table.read()} if resume else {}
    accountant = VmemAccountant(model, plan, batch, sequences)
    progress = SweepProgress(enabled=not quiet)
    evaluator: Evaluator | None = None
    refine_budget = int(budget * refine_share) if budget >= 8 else 0
    phase_s: dict[str, float] = {}
    mark = started

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phase_s[name] = now - mark
        mark = now

    table.open(resume=resume)
    try:
        with progress:
            evaluator = Evaluator(workload, jobs)
            search = _Search(workload, space, families, table, done, accountant, evaluator, progress, on_row,
                             screen_factor)
            _search_rounds(search, space, families, budget, refine_budget, seed, builtins, accountant, lap)
    except KeyboardInterrupt:
        if evaluator is not None:
            evaluator.close(cancel=True)
        table.close()
        raise SweepInterrupted(
            f"interrupted: {len(done)} finished rows kept in {table.path}; rerun the same command with --resume "
            "to continue without repeating them") from None
    finally:
        if evaluator is not None:
            evaluator.close()
        table.close()
    result = _sweep_result(search, done, workload, knobs, phase_s, screen_layers, accept)
    note("writing best.json, summary.md and the plots")
    _write_outputs(result, out, workload, space, plots=plots)
    lap("outputs")
    result.wall_s = time.perf_counter() - started
    return result


def _space_file(out: Path, workload: Workload, space: SweepSpace, resume: bool) -> SweepSpace:
    """The space with the chip's VMEM capacity filled in, written as ``space.json`` (checked
    against the existing file on ``--resume``)."""
    chip = workload.system.chip
    staging = chip.staging_memory
    space = space.with_capacity(staging.usable_bytes, f"{chip.name} {staging.name} usable bytes: "
                                + (staging.usable_capacity_bytes or staging.capacity_bytes).source)
    config = {"workload": workload.describe(), "space": space.model_dump(mode="json")}
    _check_space_file(out / "space.json", config, resume)
    write_text_atomic(out / "space.json", json.dumps(config, indent=2) + "\n")
    return space


def _search_rounds(search: _Search, space: SweepSpace, families: list[str], budget: int, refine_budget: int,
                   seed: int, builtins: tuple[str, ...], accountant: VmemAccountant,
                   lap: Callable[[str], None]) -> None:
    """Steps 1-6 of the module docstring: candidates, the search round, the refine round."""
    first = search.add(candidates(space, families, seed=seed, builtins=builtins, guide=accountant))
    lap("candidates")
    must = [c.hash for c in first if c.source == "builtin"]
    search.run_round("search", first, budget - refine_budget, must)
    lap("search")
    if refine_budget:  # 6. refine: one-knob neighbours of the best simulated so far
        seeds = [search.by_hash[r["hash"]].schedule for r in search.ranked()[:REFINE_FROM]]
        around = [list(neighbour_candidates(seed_schedule, space, families, "refine")) for seed_schedule in seeds]
        fresh = search.add([c for group in around for c in group])
        search.run_round("refine", fresh, refine_budget, [], screen_all=True)
        if seeds:  # every one-knob neighbour of the first seed screened: the sensitivity table
            search.refine_seed = seeds[0].content_hash()
            search.screen_only([search.by_hash[c.hash] for c in around[0]])
        lap("refine")


def _sweep_result(search: _Search, done: dict[str, dict[str, Any]], workload: Workload, knobs: list[str],
                  phase_s: dict[str, float], screen_layers: int, accept: Acceptor | None = None) -> SweepResult:
    """The ranked outcome of a finished search (raises when every candidate was pruned)."""
    ranked = search.ranked()
    if not ranked:
        raise InputError("no feasible schedule: every candidate was pruned (see sweep.csv reasons)")
    seed = search.by_hash[(search.refine_seed or ranked[0]["hash"])]
    rows = [done[c.hash] for c in search.considered if c.hash in done]
    best_row, checks = _accepted(search, ranked, accept)
    published_hash = next((c.hash for c in search.considered
                           if c.source == "builtin" and c.schedule.name == "published"), None)
    published_row = done.get(published_hash) if published_hash else None
    note = next((c["note"] for c in checks if c["accepted"]), "")
    return SweepResult(
        best=_best_schedule(search.by_hash[best_row["hash"]].schedule, best_row, published_row, workload, note),
        checks=checks,
        best_row=best_row, published_row=published_row,
        published_rank=next((i + 1 for i, r in enumerate(ranked) if r["hash"] == published_hash), None),
        considered=len(search.considered), pruned=sum(r["status"] == "pruned" for r in rows),
        screened=sum(r.get("screen_ms") is not None for r in rows),
        simulated=sum(r["status"] == "simulated" for r in rows),
        estimated=sum(r["status"] == "estimated" for r in rows),
        wall_s=0.0, rows=rows, knobs=knobs, phase_s={**phase_s, **search.stage_s}, sensitivity_seed=seed.schedule.name,
        sensitivity=search.sensitivity(seed),
        sensitivity_label=(f"simulated, first {screen_layers} layers" if search.screen_factor
                           else "estimate"),
        schedules={r["hash"]: search.by_hash[r["hash"]].schedule for r in ranked})


def _final_row(base: dict[str, Any], row: dict[str, Any], est_ms: float | None, screen_ms: float | None,
               static_mib: float) -> dict[str, Any]:
    """The CSV row of a finalist from its full-step engine evaluation (simulated, or pruned
    when the engine found it does not fit)."""
    common = {**base, "est_ms": est_ms, "screen_ms": screen_ms, "vmem_static_mib": static_mib}
    if not row["feasible"]:
        return {**common, "status": "pruned", "reason": row["reason"]}
    return {**common, "status": "simulated", "predicted_ms": row["step_ms"], "predicted_by": row["predicted_by"],
            "tokens_per_s": row["tokens_per_s"], "exposed_dma_ms": row["exposed_dma_ms"],
            "vmem_peak_mib": row.get("vmem_peak_mib"), "overlap_fraction": row.get("overlap_fraction"),
            "busy": row.get("busy", ""), "sim_ms": row["step_ms"]}


def _accepted(search: _Search, ranked: list[dict[str, Any]],
              accept: Acceptor | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The fastest row ``accept`` accepts (ranked order) and every check made on the way; the
    fastest row when there is no check or none is accepted."""
    checks: list[dict[str, Any]] = []
    for row in ranked if accept is not None else []:
        ok, note = accept(search.by_hash[row["hash"]].schedule, row)
        checks.append({"name": row["name"], "hash": row["hash"], "predicted_ms": row["predicted_ms"],
                       "vmem_static_mib": row.get("vmem_static_mib"), "accepted": ok, "note": note})  # ok: None = passed over
        if ok:
            return row, checks
    return ranked[0], checks


def _best_schedule(schedule: Schedule, best: dict[str, Any], published: dict[str, Any] | None,
                   workload: Workload, check: str = "") -> Schedule:
    """The chosen schedule renamed ``best-<hash>`` with a description of how it was chosen."""
    w = workload.describe()
    label = best["predicted_by"]
    text = (f"chosen by tpusim sweep from {best['name']!r} ({best['source']}): {w['model']} on {w['hardware']} x"
            f"{w['chips']}, batch {w['batch']}, context {w['context_tokens']}, routing {w['routing']}, seed {w['seed']}; "
            f"{best['predicted_ms']:.4f} ms/step ({label})")
    if published and published.get("predicted_ms"):
        text += f" vs published {published['predicted_ms']:.4f} ms ({published['predicted_by']})"
    if check:
        text += f"; {check}"
    return schedule.model_copy(update={"name": f"best-{best['hash']}", "description": text})


def _write_outputs(result: SweepResult, out: Path, workload: Workload, space: SweepSpace, *, plots: bool) -> None:
    from tpusim.sweep.report import summary_markdown

    best_path = out / "best.json"
    save_schedule(result.best, best_path)
    result.paths = {"csv": out / "sweep.csv", "space": out / "space.json", "best": best_path,
                    "summary": out / "summary.md"}
    if plots:
        from tpusim.sweep.plots import pareto_plot, sensitivity_plot

        result.paths["pareto"] = pareto_plot(result, out / "pareto.png", workload)
        result.paths["sensitivity"] = sensitivity_plot(result, out / "sensitivity.png")
    write_text_atomic(out / "summary.md", summary_markdown(result, workload, space))


def _chunks(items: list[Candidate], size: int) -> list[list[Candidate]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _unique(items: list[Candidate]) -> list[Candidate]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item.hash not in seen:
            seen.add(item.hash)
            out.append(item)
    return out
