"""Evaluating candidates: the engine adapter and the per-process worker.

Three ways to evaluate one schedule, cheapest first (every number keeps its label):

- ``estimate``: :mod:`tpusim.sweep.estimate` on the full program (milliseconds each);
- ``screen``: the engine on a *reduced* program (the first ``screen_layers`` layers plus the
  head; ~1/8 of a K3 step) — a cheap, engine-faithful ranking signal, labelled
  "simulated, N layers" and never reported as a step time;
- ``simulate``: the engine on the full program: the number the sweep reports.

:func:`evaluate` is the adapter to :func:`tpusim.engine.simulate`; it turns a ``SimResult``
(or an :class:`~tpusim.schedule.vmem.InfeasibleSchedule` raised while simulating) into a flat row.

Workers. A sweep with ``jobs > 1`` evaluates in a ``ProcessPoolExecutor`` (spawn start
method: no inherited threads or locks). Each worker is initialised once with the
:class:`Workload` and builds its programs and estimate contexts lazily, once; a task ships
only schedules (as JSON-able dicts) and gets rows back. Every function here is top-level,
so the pool can pickle it, and pure given the workload, so results do not depend on which
worker ran them.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from hwmodels.schema import Chip, System
from hwmodels.units import MIB
from tpusim.engine import simulate
from tpusim.schedule.schema import Schedule
from tpusim.schedule.vmem import InfeasibleSchedule
from tpusim.sweep.candidates import Candidate
from tpusim.sweep.estimate import EstimateContext, estimate
from tpusim.sweep.prune import VmemAccountant
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import Program, build_program
from tpusim.workload.routing import RoutingModel
from tpusim.workload.sharding import ShardingPlan

MS_PER_S = 1000.0


@dataclass(frozen=True)
class Workload:
    """Everything that fixes the program a schedule is evaluated on (picklable)."""

    model: ModelConfig
    plan: ShardingPlan
    system: System
    batch: int
    context_tokens: int = 1024
    routing: RoutingModel = field(default_factory=lambda: RoutingModel("uniform"))
    seed: int = 0
    screen_layers: int = 12
    sequences: int | None = None  # sequences the rows belong to (a verify step: fewer than rows)

    @property
    def chip(self) -> Chip:
        return self.system.chip

    def program(self, *, layers: int | None = None) -> Program:
        """The per-device program (``layers``: the first N layers only, for screening)."""
        model = self.model if layers is None or layers >= self.model.num_layers else self.model.with_layers(layers)
        return build_program(model, self.plan, batch=self.batch, context_tokens=self.context_tokens,
                             routing=self.routing, seed=self.seed, sequences=self.sequences)

    def describe(self) -> dict[str, Any]:
        """A JSON-able identity of the workload (saved in ``space.json``; checked on resume)."""
        return {
            "model": self.model.name, "formats": self.model.formats, "plan": self.plan.name, "hardware": self.chip.name,
            "chips": self.system.chips, "devices": self.system.devices, "batch": self.batch,
            "context_tokens": self.context_tokens, "routing": self.routing.label, "seed": self.seed,
            "screen_layers": self.screen_layers,
            **({"sequences": self.sequences} if self.sequences else {}),
        }


def evaluate(program: Program, schedule: Schedule, chip: Chip) -> dict[str, Any]:
    """One schedule on one program: the engine's result as a flat row (times in ms).

    Keys: ``predicted_by`` ("simulated"), ``feasible``, ``reason``, ``step_ms``,
    ``tokens_per_s``, ``exposed_dma_ms``, ``overlap_fraction``, ``vmem_peak_mib``, ``busy``
    ("resource=fraction;..."), ``hash``.
    """
    digest = schedule.content_hash()
    try:
        result = simulate(program, schedule, chip)
    except InfeasibleSchedule as error:
        return {"predicted_by": "simulated", "feasible": False, "reason": f"vmem (simulated): {error}",
                "hash": digest}
    busy = getattr(result, "busy_fraction", {}) or {}
    return {
        "predicted_by": "simulated", "feasible": True, "reason": "", "hash": digest,
        "step_ms": result.step_s * MS_PER_S,
        "tokens_per_s": result.tokens_per_s,
        "exposed_dma_ms": result.exposed_dma_s * MS_PER_S,
        "overlap_fraction": result.overlap_fraction,
        "vmem_peak_mib": result.vmem_peak_bytes / MIB,
        "busy": ";".join(f"{name}={value:.4f}" for name, value in sorted(busy.items())),
    }


class WorkerState:
    """A worker's lazily built programs and estimate context for one workload."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._programs: dict[str, Program] = {}
        self._estimate_ctx: EstimateContext | None = None
        self._vmem = VmemAccountant(workload.model, workload.plan, workload.batch, workload.sequences)

    def program(self, stage: str) -> Program:
        if stage not in self._programs:
            layers = self.workload.screen_layers if stage == "screen" else None
            self._programs[stage] = self.workload.program(layers=layers)
        return self._programs[stage]

    def estimate_ctx(self) -> EstimateContext:
        if self._estimate_ctx is None:
            self._estimate_ctx = EstimateContext(self.program("full"), self.workload.chip)
        return self._estimate_ctx

    def run(self, stage: str, schedules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Evaluate ``schedules`` at ``stage`` (estimate | screen | simulate)."""
        rows = []
        for data in schedules:
            schedule = Schedule.model_validate(data)
            if stage == "estimate":
                est = estimate(self.estimate_ctx(), schedule, self._vmem.plan_for(schedule))
                rows.append({"hash": schedule.content_hash(), "est_ms": est.step_s * MS_PER_S,
                             "est_exposed_dma_ms": est.exposed_dma_s * MS_PER_S})
            else:
                rows.append(evaluate(self.program(stage), schedule, self.workload.chip))
        return rows


_STATE: WorkerState | None = None


def init_worker(workload: Workload) -> None:
    """Pool initializer: remember the workload; leave Ctrl-C to the parent process."""
    global _STATE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STATE = WorkerState(workload)


def run_task(stage: str, schedules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pool task: evaluate ``schedules`` at ``stage`` in this worker."""
    assert _STATE is not None, "init_worker was not called"
    return _STATE.run(stage, schedules)


class Evaluator:
    """Evaluates batches of schedules in-process (``jobs == 1``) or in a spawn process pool."""

    def __init__(self, workload: Workload, jobs: int) -> None:
        self.jobs = jobs
        self.local = WorkerState(workload) if jobs == 1 else None
        self.pool = None
        if jobs > 1:
            self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=init_worker, initargs=(workload,))

    def run(self, stage: str, batches: list[list[Candidate]]) -> Iterator[tuple[list[Candidate], list[dict[str, Any]]]]:
        """Yield ``(batch, rows)`` as batches finish (order: completion, not submission)."""
        if self.local is not None:
            for batch in batches:
                yield batch, self.local.run(stage, [c.schedule.model_dump(mode="json") for c in batch])
            return
        assert self.pool is not None
        pending: dict[Future[list[dict[str, Any]]], list[Candidate]] = {
            self.pool.submit(run_task, stage, [c.schedule.model_dump(mode="json") for c in batch]): batch
            for batch in batches
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield pending.pop(future), future.result()

    def close(self, *, cancel: bool = False) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=cancel)
            self.pool = None
