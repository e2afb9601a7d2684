"""90 % intervals for the rows of a sweep a user reads, and how often each would win.

A calibrated chip stores parameter sets drawn from its fit's uncertainty
(:mod:`tpusim.report.intervals`). The rows the sweep prints (the ``TOP`` fastest simulated
rows, and ``published``) are re-simulated on every stored set, the same program each time:

- each row gets its interval (``step_ms_low``/``high``, ``tokens_per_s_low``/``high``);
- the rows share the sets (one chip per set for all rows), so the comparison is paired:
  ``p_best`` is the share of sets on which the row is the fastest of these rows (a tie goes
  to the better-ranked row). Two intervals can overlap while one schedule is faster on every
  set; ``p_best`` says whether the *choice* survives the calibration's uncertainty.

Cost: ``len(rows) x samples`` full-step simulations (6 x 24 at most with the defaults).
Rows that were only estimated have no interval (nothing was simulated to re-run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hwmodels.schema import Chip
from tpusim.engine import simulate
from tpusim.report.intervals import interval_terms, no_interval, step_fields
from tpusim.sweep.result import SweepResult
from tpusim.workload.program import Program

TOP = 5  # the rows the human table shows


def leading_rows(result: SweepResult, top: int = TOP) -> list[dict[str, Any]]:
    """The ``top`` fastest simulated rows, then ``published`` when simulated and not among them."""
    simulated = sorted((r for r in result.rows if r["status"] == "simulated"),
                       key=lambda r: (r["predicted_ms"], r["hash"]))
    rows = simulated[:top]
    published = result.published_row
    if published and published.get("status") == "simulated" and published not in rows:
        rows.append(published)
    return rows


def row_intervals(result: SweepResult, build_program: Callable[[], Program], chip: Chip,
                  top: int = TOP, outside: list[str] | None = None, batch: int = 1) -> list[dict[str, Any]]:
    """Per leading row: ``hash``, ``name``, ``predicted_ms``, the interval keys and ``p_best``
    (None without an interval). ``build_program`` returns the sweep's full-step program
    (called only when there is something to re-simulate)."""
    rows = leading_rows(result, top)
    terms = interval_terms(chip)
    chips = terms.chips
    missing = [r["name"] for r in rows if r["hash"] not in result.schedules]
    if not terms or (chips and missing):
        reason = ("uncalibrated figures" if not chip.is_calibrated else
                  "the overlay stores no samples and no model error" if not terms
                  else f"no schedule kept for {missing[0]}")
        return [_entry(r, no_interval(reason), None) for r in rows]
    if not chips:  # model error only: no re-simulation, no ranking probability
        return [_entry(r, step_fields(r["predicted_ms"] / 1e3, [], batch,
                                      terms.model_error, outside or []), None) for r in rows]
    program = build_program()
    steps = np.array([[simulate(program, result.schedules[r["hash"]], sample).step_s for sample in chips]
                      for r in rows])
    wins = np.bincount(steps.argmin(axis=0), minlength=len(rows))
    return [_entry(r, step_fields(r["predicted_ms"] / 1e3, steps[i], program.batch, terms.model_error, outside or []),
                   wins[i] / len(chips))
            for i, r in enumerate(rows)]


def _entry(row: dict[str, Any], fields: dict[str, Any], p_best: float | None) -> dict[str, Any]:
    return {"hash": row["hash"], "name": row["name"], "predicted_ms": row["predicted_ms"], **fields,
            "p_best": None if p_best is None else float(p_best)}
