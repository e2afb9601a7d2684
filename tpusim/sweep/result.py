"""What a sweep found: :class:`SweepResult`, read by the summary, the plots and the CLI.

Its own module so the writers of the outputs (:mod:`tpusim.sweep.report`,
:mod:`tpusim.sweep.plots`) and the search that fills it (:mod:`tpusim.sweep.search`) import
it from below, and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpusim.schedule.schema import Schedule


@dataclass
class SweepResult:
    """What a sweep found. Times in ms; every row's ``predicted_by`` says simulated or estimate.

    ``rows`` are the ``sweep.csv`` rows of the candidates considered (see
    :mod:`tpusim.sweep.outputs` for their columns); ``published_rank`` is 1-based among the
    simulated candidates; ``sensitivity`` holds one-knob variations around
    ``sensitivity_seed`` (``{knob, value, ms, sim_ms, is_seed}``, times labelled by
    ``sensitivity_label``).
    """

    best: Schedule
    best_row: dict[str, Any]
    published_row: dict[str, Any] | None
    published_rank: int | None
    considered: int
    pruned: int
    screened: int
    simulated: int
    estimated: int
    wall_s: float
    rows: list[dict[str, Any]]
    knobs: list[str]
    paths: dict[str, Path] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)  # wall time per phase, s
    sensitivity_seed: str = ""
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    sensitivity_label: str = ""
    schedules: dict[str, Schedule] = field(default_factory=dict)  # ranked rows' schedules by hash (re-simulation)
    # checks beyond the simulator, fastest first, until one is accepted ({name, hash, predicted_ms,
    # vmem_static_mib, accepted, note}; accepted None: passed over unchecked; run_sweep's ``accept``,
    # the CLI's --compile-check)
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def check_failed(self) -> bool:
        """Checks ran and none accepted a schedule: ``best`` is the simulated best, unchecked."""
        return bool(self.checks) and not any(c["accepted"] for c in self.checks)

    @property
    def speedup_vs_published(self) -> float | None:
        """``published``'s step time over the chosen schedule's (None when it has none)."""
        if not self.published_row or not self.published_row.get("predicted_ms"):
            return None
        return self.published_row["predicted_ms"] / self.best_row["predicted_ms"]
