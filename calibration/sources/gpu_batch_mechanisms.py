"""The mechanisms found while looking at held-out rows, and the switches that take them out.

The frozen split (``data/gpu-batch-split.json``, ``mechanisms_found_on_held_out_rows``) lists
two mechanisms added while chasing held-out errors of the earlier split: the prefill's host
floor (45d6e0f, ``execution.gpu.eager_host_op_s``) and the prefill's combine by pairs (1aae464,
``tpusim.workload.prefill.prefill_combine_flops``). :class:`Mechanisms` says which of them a
prediction uses; :mod:`calibration.sources.gpu_batch_sweeps` refits and judges without them.
Taking the combine by pairs out needs other prefills: every aggregated point's prompt with
``moe.combine`` priced by the decode megakernel's rule, simulated once
(:func:`refresh_without_pairs`, about a minute) and cached in
``data/gpu-batch-prefill-decode-combine.json`` (:func:`without_pairs_prefill_s`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from calibration.sources.gpu_batch_data import DATA_DIR, MODELS_DIR, Sweep, points, sweep_chip
from tpusim.engine import simulate
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.prefill import PREFILL_ROW_TILE, prefill_op_cost
from tpusim.workload.program import StepPhase, _op_cost, build_program
from tpusim.workload.registry.names import MoeOp

# The prefills with moe.combine priced by the decode rule: the "without combine by pairs" counterfactual
WITHOUT_PAIRS_FILE = DATA_DIR / "gpu-batch-prefill-decode-combine.json"


def _decode_rule_combine_cost(name: str, ctx: Any, rows: int) -> dict[str, object]:
    """A prefill's op costs with ``moe.combine`` priced by the decode megakernel's rule (every
    distinct local expert over every row): the prefill before commit 1aae464."""
    return _op_cost(name, ctx, rows) if name == MoeOp.COMBINE else prefill_op_cost(name, ctx, rows)


@cache
def _prefill_decode_combine_s(sweep: Sweep, tokens: int) -> float:
    """The engine's prefill of a ``tokens``-token prompt with the decode rule's combine, seconds."""
    model = load_model(str(MODELS_DIR / sweep.model))
    plan = plan_for(model, sweep.devices, devices_per_chip=1, intra_link="nvlink", choice=sweep.plan)
    program = build_program(model, plan, batch=tokens, context_tokens=tokens, sequences=1,
                            op_cost=_decode_rule_combine_cost)
    program = dataclasses.replace(program, phase=StepPhase.PREFILL, resident_row_tile=PREFILL_ROW_TILE,
                                  meta={**program.meta, "prefix_tokens": 0})
    return simulate(program, load_schedule("naive"), sweep_chip(sweep)).step_s


def refresh_without_pairs(path: Path = WITHOUT_PAIRS_FILE) -> dict[str, Any]:
    """Simulate every aggregated point's prefill with the decode rule's combine (minutes) and write
    the counterfactual cache :class:`Mechanisms` ``combine_by_pairs=False`` reads."""
    data = {"what": "engine prefill (s) of each aggregated sweep point's prompt with moe.combine priced by the "
                    "decode megakernel's rule, the counterfactual of commit 1aae464 "
                    "(calibration.sources.gpu_batch_mechanisms.refresh_without_pairs)",
            "prefill_s": {p.key: _prefill_decode_combine_s(p.sweep, round(p.isl))
                          for p in points() if not p.sweep.disaggregated}}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return data


@cache
def without_pairs_prefill_s() -> dict[str, float]:
    return json.loads(WITHOUT_PAIRS_FILE.read_text(encoding="utf-8"))["prefill_s"]


@dataclass(frozen=True)
class Mechanisms:
    """Which of the mechanisms found on held-out rows (the split file's
    ``mechanisms_found_on_held_out_rows``) the prediction uses; the default is both, as shipped."""

    host_floor: bool = True  # a prefill lasts at least its kernels x eager_host_op_s (45d6e0f)
    combine_by_pairs: bool = True  # a prefill's moe.combine sums its (token, expert) pairs (1aae464)

    @property
    def label(self) -> str:
        off = [name for name, on in (("host floor", self.host_floor), ("combine by pairs", self.combine_by_pairs))
               if not on]
        return "both (shipped)" if not off else "without " + " and ".join(off)


SHIPPED = Mechanisms()
MECHANISM_VARIANTS = (SHIPPED, Mechanisms(host_floor=False), Mechanisms(combine_by_pairs=False),
                      Mechanisms(host_floor=False, combine_by_pairs=False))

