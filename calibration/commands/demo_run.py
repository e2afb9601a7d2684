"""What one ``tpusim demo`` run is: its settings and the record of each step.

Shared by :mod:`calibration.commands.demo_steps` (which runs the steps) and :mod:`calibration.commands.demo_report`
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
    sweep_samples: int = 400  # random draws per sweep of the default run (--full: the sweep's own 1,200)
    joint_budget: int = 40  # full-step simulations of the deployment search (plan x collectives x schedule)
    # each swept at its own batch; None: 1,8 by default (minutes), 1,4,8 with --full
    compare_batches: str | None = None
    compare_acceptance: str = "3,6"
    compare_systems: str = "tpu-v7:16,gb200:16,gb200:16:megakernel"
    kernel_steps: int = 1
    quick: bool = False  # smaller budgets (tests)
    full: bool = False  # also the long steps: kernel run, calibrations, deployment search, Mosaic compiles

    @property
    def batches_compared(self) -> list[int]:
        chosen = self.compare_batches or ("1,4,8" if self.full else "1,8")
        return sorted({int(b) for b in chosen.split(",") if b.strip()})


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
    # best-of figures the report refused to print (calibration.commands.demo_consistency): the demo fails
    refusals: list[str] = field(default_factory=list)

    def step(self, name: str) -> StepRecord:
        record = StepRecord(name)
        self.steps.append(record)
        return record

    @property
    def ok(self) -> bool:
        return all(step.ok for step in self.steps) and not self.refusals
