"""What one ``tpusim demo`` run is: its settings and the record of each step.

Shared by :mod:`tpusim.app.demo` (which runs the steps) and :mod:`tpusim.app.demo_report`
(which writes them up), so neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DemoConfig:
    out_dir: Path
    jobs: int = 2
    sweep_budget: int = 32
    joint_budget: int = 40  # full-step simulations of the deployment search (plan x collectives x schedule)
    compare_batches: str = "1,4,8"  # each swept at its own batch: four sweeps would pass the 10-minute budget
    compare_acceptance: str = "3,6"
    compare_systems: str = "tpu-v7:16,gb200:16,gb200:16:megakernel"
    kernel_steps: int = 1
    quick: bool = False  # smaller budgets (tests)


@dataclass
class StepRecord:
    name: str
    wall_s: float = 0.0
    cpu_s: float = 0.0  # CPU seconds of the demo and its finished worker processes (os.times)
    ok: bool = True
    error: str = ""
    data: Any = None


@dataclass
class DemoRun:
    config: DemoConfig
    steps: list[StepRecord] = field(default_factory=list)
    # best-of figures the report refused to print (tpusim.app.demo_consistency): the demo fails
    refusals: list[str] = field(default_factory=list)

    def step(self, name: str) -> StepRecord:
        record = StepRecord(name)
        self.steps.append(record)
        return record

    @property
    def ok(self) -> bool:
        return all(step.ok for step in self.steps) and not self.refusals
