"""The simulations a comparison repeats, each run once.

A comparison asks the engine for the same step many times over:

- speculative rows at several acceptance lengths share their verify step (``batch x
  (draft_tokens + 1)`` rows) and their drafter forward: the acceptance length only enters the
  arithmetic of :class:`~tpusim.workload.speculative.SpeculativeStep`;
- a calibrated row's 90 % interval re-simulates that row's program on each sampled chip
  (:mod:`tpusim.report.intervals`), and the speculative rows of one batch re-simulate the same
  verify and draft programs on the same sampled chips.

:class:`SimulationCache` builds each program once (key: model, plan, rows, sequences,
context, routing, seed) and simulates each (program, schedule, chip) once, returning the
same step time and breakdown as a fresh simulation would (the engine is deterministic:
equal inputs give identical results). One cache lives for one :func:`compare_rows` call;
chips are keyed by identity (a sampled chip is one object for the whole call), models and
plans by content.
"""

from __future__ import annotations

from typing import Any

from hwmodels.schema import Chip
from tpusim.schedule.schema import Schedule
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.program import Program, build_program
from tpusim.workload.routing import RoutingModel
from tpusim.workload.sharding import ShardingPlan

MS_PER_S = 1000.0

# (step seconds, breakdown keys in ms) of one simulated step
Simulated = tuple[float, dict[str, Any]]


class SimulationCache:
    """Programs and simulated steps of one comparison, each computed once (see the module docstring)."""

    def __init__(self) -> None:
        self._content: dict[int, tuple[object, str]] = {}  # id -> (object kept alive, its JSON)
        self._programs: dict[tuple[object, ...], Program] = {}
        self._steps: dict[tuple[object, ...], Simulated] = {}
        self._chips: dict[int, Chip] = {}  # keeps every keyed chip alive, so an id is never reused
        self.simulated = 0  # engine runs (for tests and progress)
        self.reused = 0  # answers given from the cache

    def _json(self, value: ModelConfig | ShardingPlan) -> str:
        known = self._content.get(id(value))
        if known is None:
            known = self._content[id(value)] = (value, value.model_dump_json())
        return known[1]

    def program(self, model: ModelConfig, plan: ShardingPlan, *, rows: int, context_tokens: int,
                routing: RoutingModel, seed: int, sequences: int | None) -> tuple[tuple[object, ...], Program]:
        """(key, program) of one step's per-device program, built once."""
        key = (self._json(model), self._json(plan), rows, sequences or rows, context_tokens, routing, seed)
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = build_program(model, plan, batch=rows, context_tokens=context_tokens,
                                                          routing=routing, seed=seed, sequences=sequences)
        return key, program

    def step(self, model: ModelConfig, plan: ShardingPlan, chip: Chip, schedule: Schedule, *, rows: int,
             context_tokens: int, routing: RoutingModel, seed: int, sequences: int | None = None) -> Simulated:
        """Step seconds and breakdown (ms) of ``model`` under ``plan`` and ``schedule`` on ``chip``."""
        program_key, program = self.program(model, plan, rows=rows, context_tokens=context_tokens,
                                             routing=routing, seed=seed, sequences=sequences)
        self._chips[id(chip)] = chip
        key = (program_key, schedule.content_hash(), id(chip))
        known = self._steps.get(key)
        if known is not None:
            self.reused += 1
            return known[0], dict(known[1])
        simulated = self._steps[key] = _simulate(program, schedule, chip)
        self.simulated += 1
        return simulated[0], dict(simulated[1])


def _simulate(program: Program, schedule: Schedule, chip: Chip) -> Simulated:
    from tpusim.engine import simulate
    from tpusim.engine.gpu import gpu_breakdown

    result = simulate(program, schedule, chip)
    breakdown: dict[str, Any] = {f"{key}_ms": value * MS_PER_S for key, value in result.breakdown_s.items()}
    breakdown["launch_count"] = result.launch_count
    breakdown["where_ms"] = {key: value * MS_PER_S for key, value in gpu_breakdown(result).items()}
    breakdown["exposed_dma_ms"] = result.exposed_dma_s * MS_PER_S
    breakdown["hbm_busy_fraction"] = result.busy_fraction.get("hbm", 0.0)
    return result.step_s, breakdown
