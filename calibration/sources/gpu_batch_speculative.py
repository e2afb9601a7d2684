"""Speculative decoding at batch on Blackwell (issue 50 item 4): MTP's draft and verify costs as
the batch grows, judged on the public MTP rows the frozen split's rule puts on each side.

**Which rows.** The reference (``shared/reference/gpu-batch-scaling.md``) has three kinds of
speculative rows:

- **S1a** (InferenceX, DeepSeek-R1-0528 NVFP4, 1k/1k, Dynamo + TensorRT-LLM, MTP on,
  disaggregated; *published* TPOT per accepted token): two fixed-deployment segments,
  GB200 NVL72 rows 1-5 (concurrency 4-48; decode 32 GPUs, EP=8) and B200 rows 10-17
  (concurrency 6-875; decode 40 GPUs, EP=8). Used (:data:`SPEC_SWEEPS`). Not used: rows 6-9
  and 18-20, whose deployment changes from point to point.
- **S3** (SGLang cookbook, DeepSeek-V4 Flash/Pro, EAGLE/MTP 3-1-4 at concurrency 1-16, 1-1-2
  at 64-256): not used, DeepSeek-V4 is not modelled (``data/gpu-batch-models/``) and the server
  configuration changes with the speculative setting (TP only, then DP attention).
- **S7** (LMSYS GB200/GB300 long context, MTP on/off): not used. The on/off rows are not pairs
  at one operating point: MTP off is quoted in the 30-40 and 50-60 tok/s/user bands, MTP on in
  40-50 and 60-70; only tok/s/GPU is published (no TPOT, no concurrency, decode DEP8..DEP32
  not stated per row). The speed-up they show mixes MTP with a different batch.

No row publishes its acceptance length; S1a does not publish its MTP depth either.

**Sides.** The frozen split (``data/gpu-batch-split.json``) lists the plain sweeps only and is
not changed; a speculative sweep is put on a side by the split's own rule, written before
(:func:`calibration.sources.gpu_batch_data.held_out_by_rule`): the GB200 segment is held out
(GPU type not B200), the B200 segment is on the fit side. Each segment is anchored on its lowest
concurrency, as the plain sweeps are: 7 fit points, 4 held-out points.

**The rule** (:func:`tpusim.workload.speculative.speculative_tpot_s`), per point with ``B``
sequences per decode worker (concurrency / workers)::

    step(B)  = k x draft(B rows)                       the MTP module (the target's one MTP
                                                       layer + its vocabulary head), k forwards
             + verify(B x (k + 1) rows, B sequences)   the target's decode step
             (both from the engine with the batch figures of the shipped TPOT fit)
    TPOT(C)  = measured(C0) + (step(B) - step(B0)) / a anchored like the plain sweeps

against the **plain-step prediction** (the rule absent: the row treated as plain decode)::

    TPOT(C)  = measured(C0) + plain(B) - plain(B0)      plain: the engine's step of B rows

**Acceptance length ``a``** is fitted on the fit-side points only (:func:`fit_acceptance_length`:
least squares of the relative TPOT error, closed form in ``1/a``, kept in 1..k+1), then used
unchanged on the held-out points. It is not fitted through :mod:`calibration.core`: the core's
parameters are figures of a chip (``Problem.chip`` lays them over a Chip), and an acceptance
length is a property of the drafter and the prompts, not of a GPU. The level check,
:func:`implied_acceptance` (the anchor's unanchored step over its measured TPOT), is reported
beside it and fits nothing.

**Assumed** (not published; each stated in the report): ``k`` = :data:`MTP_DRAFT_TOKENS` = 3
MTP steps (TensorRT-LLM's DeepSeek-R1 MTP recipes run ``num_nextn_predict_layers`` 3 at low
latency; the sensitivity to ``k`` = 1, DeepSeek-V3's own MTP depth, is reported); decode workers
of 8 GPUs (EP=8) with attention TP8 (the deployment says EP=8 only); the NVFP4 checkpoint's
routed experts in NVFP4, the rest as DeepSeek-R1's FP8 (``deepseek-r1.yaml@nvfp4``).

Engine steps are cached in ``data/gpu-batch-speculative-baseline.json``
(:func:`refresh_speculative_baseline`, about a minute); tests/test_gpu_batch_speculative.py
re-simulates one point against it.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from calibration.sources.gpu_batch_data import (
    DATA_DIR,
    MODELS_DIR,
    Point,
    Sweep,
    held_out_by_rule,
    load_rows,
    load_split,
    sweep_chip,
)
from calibration.sources.gpu_batch_sweeps import STEP_FIGURES
from tpusim.engine import simulate
from tpusim.engine.gpu_batch import batch_terms
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import Program, build_program
from tpusim.workload.speculative import load_drafter, mtp_model, speculative_tpot_s

SPEC_BASELINE_FILE = DATA_DIR / "gpu-batch-speculative-baseline.json"
MS = 1e3
MTP_DRAFT_TOKENS = 3  # assumed (module docstring): S1a does not publish its MTP depth
SENSITIVITY_DRAFT_TOKENS = (1, 3)  # k cached and reported
MTP_LAYERS = 1  # DeepSeek-R1 config.json: num_nextn_predict_layers 1 (run k times, autoregressively)
DRAFTER = load_drafter("mtp")  # the target's own MTP layer, autoregressive (tpusim/models/drafters/mtp.yaml)

# S1a's two fixed-deployment segments (rows in gpu-batch-scaling.json); decode workers = decode
# GPUs / EP 8 (GB200 32 -> 4, B200 40 -> 5), each attention TP8 + experts EP8 (assumed).
SPEC_SWEEPS: tuple[Sweep, ...] = (
    Sweep("dsr1-b200-mtp", "S1a", (10, 11, 12, 13, 14, 15, 16, 17), "b200", 8, "deepseek-r1.yaml@nvfp4",
          "tp=8,expert_groups=8,expert_tp=1", True, "1k/1k", "trtllm", decode_workers=5),
    Sweep("dsr1-gb200-mtp", "S1a", (1, 2, 3, 4, 5), "gb200", 8, "deepseek-r1.yaml@nvfp4",
          "tp=8,expert_groups=8,expert_tp=1", True, "1k/1k", "trtllm", decode_workers=4),
)
INFERENCEX_LENGTH = 0.9  # as gpu_batch_data: InferenceX samples ISL/OSL at 80-100 % of nominal


def side(sweep: Sweep) -> str:
    """The side the frozen split's rule (``held_out_when``) puts ``sweep`` on: fit | held-out."""
    return "held-out" if held_out_by_rule(sweep, load_split()["held_out_when"]) else "fit"


def spec_points() -> list[Point]:
    """Every used S1a point with its role: the lowest concurrency of a segment is its anchor, the
    rest on the segment's side (:func:`side`)."""
    rows, out = load_rows(), []
    for sweep in SPEC_SWEEPS:
        chosen = sorted((rows[i] for i in sweep.rows), key=lambda r: r["concurrency"])
        for rank, row in enumerate(chosen):
            if row["spec_decoding"] != "MTP on" or row["gpus_decode"] != sweep.decode_workers * sweep.devices:
                raise ValueError(f"row {row['row_id']}: not an MTP row of {sweep.key}'s deployment")
            out.append(Point(sweep, int(row["row_id"]), int(row["concurrency"]), INFERENCEX_LENGTH * row["isl"],
                             INFERENCEX_LENGTH * row["osl"], float(row["tpot_ms"]),
                             "anchor" if rank == 0 else side(sweep)))
    return out


# --------------------------------------------------------------------------- the simulator side


def _programs(point: Point, draft_tokens: int) -> dict[str, Program]:
    """The plain step (B rows), the verify step (B x (k + 1) rows of B sequences) and one MTP
    draft forward (B rows) of a point."""
    model = load_model(str(MODELS_DIR / point.sweep.model))
    plan = plan_for(model, point.sweep.devices, devices_per_chip=1, intra_link="nvlink", choice=point.sweep.plan)
    drafter = mtp_model(model, MTP_LAYERS)
    draft_plan = plan_for(drafter, point.sweep.devices, devices_per_chip=1, intra_link="nvlink",
                          choice=point.sweep.plan)
    rows, context = point.rows, point.context_tokens
    return {"plain": build_program(model, plan, batch=rows, context_tokens=context, sequences=rows),
            "verify": build_program(model, plan, batch=rows * (draft_tokens + 1), context_tokens=context,
                                    sequences=rows),
            "draft": build_program(drafter, draft_plan, batch=rows, context_tokens=context, sequences=rows)}


def simulate_spec_point(point: Point) -> dict[str, Any]:
    """The engine's steps of a point without batch terms, and the batch terms per unit figure (they
    are linear in the figures), for the plain step, one draft forward and, per ``k`` of
    :data:`SENSITIVITY_DRAFT_TOKENS`, the verify step."""
    chip = sweep_chip(point.sweep)
    ones = {f.name: sweep_chip(point.sweep, {f.path: 1.0}) for f in STEP_FIGURES}

    def entry(program: Program) -> dict[str, Any]:
        return {"step_s": simulate(program, load_schedule("naive"), chip).step_s,
                "terms_per_unit_s": {name: sum(batch_terms(one, program).values()) for name, one in ones.items()}}

    out: dict[str, Any] = {}
    for k in SENSITIVITY_DRAFT_TOKENS:
        programs = _programs(point, k)
        out.setdefault("plain", entry(programs["plain"]))
        out.setdefault("draft", entry(programs["draft"]))
        out[f"verify_k{k}"] = entry(programs["verify"])
    return out


def refresh_speculative_baseline(path: Path = SPEC_BASELINE_FILE) -> dict[str, Any]:
    """Simulate every S1a point (about a minute) and write the cache the judgement reads."""
    data = {"what": "engine steps (no batch terms) and batch terms per unit figure of each S1a MTP point: plain "
                    "step, one MTP draft forward, verify step per k (calibration.sources.gpu_batch_speculative)",
            "mtp_layers": MTP_LAYERS, "points": {p.key: simulate_spec_point(p) for p in spec_points()}}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return data


@cache
def spec_baseline() -> dict[str, dict[str, Any]]:
    return json.loads(SPEC_BASELINE_FILE.read_text(encoding="utf-8"))["points"]


def _step_s(entry: dict[str, Any], values: dict[str, float]) -> float:
    return entry["step_s"] + sum(entry["terms_per_unit_s"][f.name] * values.get(f.name, 0.0) for f in STEP_FIGURES)


def plain_s(point: Point, values: dict[str, float]) -> float:
    """The plain decode step of ``point`` (B rows, batch figures ``values``), seconds: disaggregated,
    no prefill stalls it."""
    return _step_s(spec_baseline()[point.key]["plain"], values)


def spec_step_s(point: Point, values: dict[str, float], draft_tokens: int = MTP_DRAFT_TOKENS) -> float:
    """One speculative step of ``point`` (k draft forwards + the verify step), seconds: the rule's
    numerator, :func:`speculative_tpot_s` at acceptance 1."""
    entry = spec_baseline()[point.key]
    return speculative_tpot_s(draft_forward_s=_step_s(entry["draft"], values), draft_forwards=draft_tokens,
                              verify_step_s=_step_s(entry[f"verify_k{draft_tokens}"], values), acceptance_length=1.0)


# --------------------------------------------------------------------------- fit and judge


def fit_acceptance_length(step_growth_ms: np.ndarray, tpot_growth_ms: np.ndarray, tpot_ms: np.ndarray,
                          max_acceptance: float) -> float:
    """The acceptance length ``a`` that best fits anchored points ``tpot = anchor + step_growth / a``:
    least squares of the relative error, ``sum(((g u - y) / m)^2)`` over ``u = 1 / a``, closed form
    ``u = sum(g y / m^2) / sum(g^2 / m^2)`` (g: the simulated step's growth from the anchor, y: the
    measured TPOT's, m: the measured TPOT), then ``a`` kept in ``1 .. max_acceptance``."""
    g, y, m = (np.asarray(v, dtype=float) for v in (step_growth_ms, tpot_growth_ms, tpot_ms))
    u = float(np.sum(g * y / m**2) / np.sum(g**2 / m**2))
    return float(np.clip(1.0 / u, 1.0, max_acceptance)) if u > 0.0 else max_acceptance


def _anchors() -> dict[str, Point]:
    return {p.sweep.key: p for p in spec_points() if p.role == "anchor"}


def fitted_acceptance(values: dict[str, float], draft_tokens: int = MTP_DRAFT_TOKENS) -> float:
    """``a`` fitted on the fit-side S1a points alone (B200), the batch figures at ``values``."""
    anchors = _anchors()
    fit = [p for p in spec_points() if p.role == "fit"]
    growth = [(spec_step_s(p, values, draft_tokens) - spec_step_s(anchors[p.sweep.key], values, draft_tokens)) * MS
              for p in fit]
    measured = [p.tpot_ms - anchors[p.sweep.key].tpot_ms for p in fit]
    return fit_acceptance_length(np.array(growth), np.array(measured), np.array([p.tpot_ms for p in fit]),
                                 max_acceptance=draft_tokens + 1)


def implied_acceptance(values: dict[str, float], draft_tokens: int = MTP_DRAFT_TOKENS) -> dict[str, float]:
    """Per segment, the level check: the anchor's simulated step (unanchored) over its measured TPOT
    (*derived*; the engine's level error enters it whole). Fits nothing."""
    return {key: spec_step_s(p, values, draft_tokens) * MS / p.tpot_ms for key, p in _anchors().items()}


def spec_rows(values: dict[str, float], acceptance: float,
              draft_tokens: int = MTP_DRAFT_TOKENS) -> list[dict[str, Any]]:
    """Per point: measured TPOT, the rule's prediction and the plain-step prediction, and errors."""
    anchors, out = _anchors(), []
    for p in spec_points():
        a = anchors[p.sweep.key]
        rule = a.tpot_ms + (spec_step_s(p, values, draft_tokens) - spec_step_s(a, values, draft_tokens)) * MS / acceptance
        plain = a.tpot_ms + (plain_s(p, values) - plain_s(a, values)) * MS
        out.append({"sweep": p.sweep.key, "gpu": p.sweep.chip, "row_id": p.row_id, "concurrency": p.concurrency,
                    "rows": p.rows, "role": p.role, "measured_ms": p.tpot_ms, "rule_ms": rule, "plain_ms": plain,
                    "rule_error": rule / p.tpot_ms - 1.0, "plain_error": plain / p.tpot_ms - 1.0})
    return out


def _mape(rows: list[dict[str, Any]], role: str, column: str) -> dict[str, Any]:
    errors = np.array([abs(r[column]) for r in rows if r["role"] == role])
    return {"mape": float(errors.mean()), "max_abs_error": float(errors.max()), "points": int(errors.size)}


def spec_summary(values: dict[str, float], draft_tokens: int = MTP_DRAFT_TOKENS) -> dict[str, Any]:
    """Fit (in sample: ``a`` is fitted there) and held-out TPOT error with the rule and with the
    plain-step prediction, the fitted ``a`` and the level-implied ones, and every point."""
    acceptance = fitted_acceptance(values, draft_tokens)
    rows = spec_rows(values, acceptance, draft_tokens)
    return {"draft_tokens": draft_tokens, "acceptance": acceptance,
            "implied_acceptance": implied_acceptance(values, draft_tokens), "rows": rows,
            **{role: {"rule": _mape(rows, role, "rule_error"), "plain": _mape(rows, role, "plain_error")}
               for role in ("fit", "held-out")}}
