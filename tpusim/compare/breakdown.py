"""Where a comparison row's step time goes: compute, launches, collectives, exposed copies,
other overheads and (with speculation) drafting, in simulated milliseconds.

The parts come from the engine's own breakdown (:func:`tpusim.engine.gpu.gpu_breakdown`,
stored per row as ``breakdown.where_ms``) and sum to the row's ``step_ms``:

- ``batch growth`` joins a GPU serving stack's batch-growth terms (per-expert grouped-GEMM
  cost, attention per sequence, sampling and scheduling per request, CUDA-graph padding:
  :mod:`tpusim.engine.gpu_batch`; each is named in ``where_ms``);
- ``other`` joins fixed per-step/per-layer overheads that are not launches with the drain
  at the end of the step;
- a speculative row's step is the drafter's steps plus one verify step: ``drafting`` is
  ``step_ms - verify_ms`` and the other parts are the verify step's.
"""

from __future__ import annotations

from typing import Any

from tpusim.engine.gpu_batch import BATCH_TERMS

PARTS = ("compute", "launches", "batch growth", "collectives", "exposed copies", "other", "drafting")
_ENGINE_PART = {"compute": "compute", "launches": "launches", "collectives": "collectives",
                "exposed_dma": "exposed copies", "other_overheads": "other", "drain": "other",
                **dict.fromkeys(BATCH_TERMS, "batch growth")}


def where_ms(row: dict[str, Any]) -> dict[str, float] | None:
    """The row's step split into :data:`PARTS` (ms), or None for a row that does not fit."""
    if not row.get("fits", True) or row.get("step_ms") is None:
        return None
    breakdown = row.get("breakdown") or {}
    verify = breakdown.get("verify_breakdown")
    engine = (verify if verify is not None else breakdown).get("where_ms", {})
    parts = dict.fromkeys(PARTS, 0.0)
    for key, value in engine.items():
        parts[_ENGINE_PART.get(key, "other")] += value
    if verify is not None:
        parts["drafting"] = row["step_ms"] - breakdown["verify_ms"]
    return parts
