"""Predict a planned TPU v5e kernel set before it runs, and record the predictions.

``python -m calibration.reports.tpu_v5e_plan --set NAME [--write]`` predicts every K3-shard
decode case of set ``NAME`` (``calibration/tpu_bench/sets.json``) for the kernel as it is now
(:data:`megakernel.quant_pairs.KERNEL_DECODER`) and, with ``--write``, appends one row per case to
``calibration/data/tpu-v5e-predictions.jsonl`` — committed before the device call, so the
predicted figure is on record before the chip measures it (:mod:`calibration.reports.tpu_v5e_judge`
sets the two side by side afterwards).

The chip the prediction runs on (no figure fitted on the runs it predicts):

- way (b) of the ``words32`` kernel (:func:`calibration.sources.tpu_fixed_cost.kernel_probe_chip`):
  the micro-probes (``measured``) and that kernel's fixed-cost probe (``derived``: its
  per-layer cost, its dequant factor on the MXFP4 rate — the down part is still ``words32``);
- each new decoder's cost per weight from libtpu's static schedule of the ``expert_product``
  probe (``calibration/data/tpu-v5e-static-schedule.jsonl``): the panel loop's bundles x panels
  / the clock / the part's weights (``derived``: the whole loop, its products included, as the
  decoder's time; the engine still adds the MXU stage behind it). The MXFP4 ``fold`` decoder
  (per-value f32 work in the ``words32`` layout) takes the ``words32`` decoder's ratio of its
  way-(b) figure to its static one (1.35: the stalls the static schedule does not count); the
  FP8 ``pairs`` decoder, of another form, takes none (:data:`STALLS_LIKE`).

Routing: a planned run's router is the kernel's own on the same weights and seeds as the
committed ``words32`` run of the same schedule and batch, so its routing trace is reused.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from calibration.sources.tpu_chip_records import (
    KERNEL_PATH,
    ROOT,
    ChipRecord,
    ChipRecordPredictor,
    build_records,
    load_chip_records,
)
from calibration.sources.tpu_fixed_cost import (
    FIXED_COST_PATH,
    capped_runs,
    fixed_cost,
    kernel_probe_chip,
    refit_chip,
)
from calibration.sources.tpu_layer_static import STATIC_PATH, V5E_CLOCK_HZ, layer_remainder
from calibration.sources.tpu_probes import PROBES_PATH, dequant_path
from hwmodels.catalog import load_chip
from hwmodels.overlay import _figure_slot
from hwmodels.records.kernel import WALK
from hwmodels.schema import Chip
from megakernel.dma_plan import check_expert_cap
from megakernel.errors import UnsupportedSchedule
from megakernel.kernel_moe import EXPERT_LIST_BUILD
from megakernel.quant import WORDS32_DECODER
from megakernel.quant_pairs import FP8_PAIRS_DECODER, KERNEL_DECODER
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL
from tpusim.schedule.schema import load_schedule

DATA = Path(__file__).resolve().parents[1] / "data"
PREDICTIONS_PATH = DATA / "tpu-v5e-predictions.jsonl"
FORMAT_OF_PART = {"gate_up": "fp8_e4m3_b256", "down": "mxfp4"}
# a decoder whose static figure takes the measured/static ratio of the one it replaces
STALLS_LIKE = {"fold": WORDS32_DECODER}
PART_DECODERS = {FP8_PAIRS_DECODER: {"gate_up": "pairs", "down": WORDS32_DECODER},
                 KERNEL_DECODER: {"gate_up": "pairs", "down": "fold"}}


def static_rows(batch: int, part: str, decoder: str, path: Path | str = STATIC_PATH) -> int:
    """The row count of the static-schedule record that prices ``part``/``decoder`` at
    ``batch``: the smallest compiled for at least the batch's rows (the products' VPU work grows
    with their 8-row sublane tiles: gate/up pairs 321 bundles a panel at 8 rows, 359 at 16), else
    the largest."""
    compiled = sorted({r["params"]["rows"] for r in map(json.loads, Path(path).read_text().splitlines())
                       if r["chip"] == "tpu-v5e" and r.get("probe") == "expert_product"
                       and (r["params"]["part"], r["params"]["decoder"]) == (part, decoder)})
    if not compiled:
        raise KeyError(f"no static-schedule record for {part}/{decoder} in {path}")
    return next((rows for rows in compiled if rows >= batch), compiled[-1])


def static_figure(part: str, decoder: str, path: Path | str = STATIC_PATH, rows: int = 1,
                  clock_hz: float = V5E_CLOCK_HZ, loop_iteration_s: float = 0.0,
                  panels_per_iteration: int = 1) -> tuple[float, str]:
    """(seconds per weight, source) of one expert part's panel loop from the static schedule;
    with ``loop_iteration_s``, each iteration of the kernel's panel loop (``panels_per_iteration``
    panels) costs that much beyond its bundles."""
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        p = r["params"]
        if r.get("probe") == "expert_product" and (p["part"], p["decoder"], p["rows"]) == (part, decoder, rows) \
                and r["chip"] == "tpu-v5e":
            weights = p["k"] * 128
            value = (r["panel_bundles"] / clock_hz + loop_iteration_s / panels_per_iteration) / weights
            loop = (f" + {loop_iteration_s * 1e9:.1f} ns a loop iteration of {panels_per_iteration} panels"
                    if loop_iteration_s else "")
            return value, (f"derived from libtpu's static schedule (expert_product {part}/{decoder}, rows {rows}, "
                           f"{r['date'][:10]}): ({r['panel_bundles']} bundles a panel / {clock_hz / 1e9:.3f} G bundles/s"
                           f"{loop}) / {weights} weights")
    raise KeyError(f"no static-schedule record for {part}/{decoder}/rows {rows} in {path}")


def planned_chip(decoder: str = KERNEL_DECODER, expert_panel_unroll: int = 1, batch: int = 1) -> Chip:
    """The chip the planned runs of ``decoder``'s kernel are predicted on (module docstring),
    before any refit on the build's own capped runs (:func:`build_chip`). With the expert
    panel loop unrolled (``expert_panel_unroll`` > 1) no decoder takes the one-panel
    ``words32`` stall ratio: that ratio held the MXU round trip per panel, which the engine
    prices itself since set v5e-z (each product's fixed cost over the panels in flight). The
    decoders' figures are the static schedule's at ``batch``'s rows (:func:`static_rows`)."""
    base = kernel_probe_chip(load_chip("tpu-v5e", calibrated=False), decoder=WORDS32_DECODER)
    data = base.model_dump(mode="python")
    for part, part_decoder in PART_DECODERS[decoder].items():
        if part_decoder == WORDS32_DECODER:
            continue
        value, source = static_figure(part, part_decoder, rows=static_rows(batch, part, part_decoder))
        parent, name = _figure_slot(data, dequant_path(FORMAT_OF_PART[part]))
        if part_decoder in STALLS_LIKE and expert_panel_unroll == 1:  # carry the measured/static ratio
            like = STALLS_LIKE[part_decoder]
            ratio = parent[name]["value"] / static_figure(part, like)[0]
            value *= ratio
            source += (f"; x {ratio:.3f}, the {like} decoder's way-(b) figure over its static one "
                       "(a decoder of the same form: per-value f32 work, same layout)")
        parent[name] = {**parent[name], "value": value, "label": "derived", "source": source}
    return Chip.model_validate(data)


def build_chip(decoder: str = KERNEL_DECODER, unroll: tuple[int, int] = (PANEL_UNROLL, EXPERT_PANEL_UNROLL),
               batch: int = 1, expert_list: str = WALK) -> tuple[Chip, str]:
    """(chip, label) for predicting a build of the kernel (``decoder``, panel loops ``unroll``,
    ``moe.topk``'s ``expert_list``) at ``batch``: :func:`planned_chip` at the batch's rows,
    refit by way (b) on that build's own capped runs
    (:func:`calibration.sources.tpu_fixed_cost.fixed_cost`; its decodes are never read) when
    there are two published caps of it; else on the capped runs of the build nearest it (the
    same panel loops, then the same expert loop first: the refit's figures are the experts'
    decode and the per-layer cost), named in the label; else as it is. The refit reads the
    capped runs at ``batch`` when the build has them, else those at batch 1; when the runs are
    of another batch or another expert list, the per-layer cost moves by what the layer loop's
    static schedule says changes between the two (:func:`calibration.sources.tpu_layer_static.
    layer_remainder`: the kernel's per-row code doubles past one 8-row sublane tile; the list
    built as vectors drops a scalar store and branch per pick), and the label says which."""
    at_batch = planned_chip(decoder, unroll[1], batch)
    builds = sorted({(r.panel_unroll, r.expert_list) for r in capped_runs(FIXED_COST_PATH, decoder, batch=None)},
                    key=lambda b: (b[0] != tuple(unroll), b[0][1] != unroll[1], abs(b[0][0] - unroll[0]),
                                   b[1] != expert_list))
    for build, build_list in builds:
        for fit_batch in dict.fromkeys((batch, 1)):
            found = fixed_cost(planned_chip(decoder, unroll[1], fit_batch), FIXED_COST_PATH, decoder, build, fit_batch,
                               build_list)
            if found is not None:
                break
        if found is None:
            continue
        whose = "this build's own" if build == tuple(unroll) else f"the nearest build's (u{build[0]}x{build[1]})"
        if build_list != expert_list:
            whose += f" ({build_list} expert list)"
        growth = ""
        if fit_batch != batch or build_list != expert_list:  # what the static schedule changes from the runs
            at = layer_remainder(planned_chip(decoder, unroll[1], batch), batch, tuple(unroll), expert_list=expert_list)[0]
            fitted = layer_remainder(planned_chip(decoder, unroll[1], fit_batch), fit_batch, tuple(unroll),
                                     expert_list=build_list)[0]
            found = replace(found, per_layer_s=max(found.per_layer_s + at - fitted, 0.0))
            moved = [f"batch {fit_batch} to {batch}"] if fit_batch != batch else []
            moved += [f"the {build_list} expert list to the {expert_list} one"] if build_list != expert_list else []
            growth = (f", {(at - fitted) * 1e6:+.1f} µs of it the layer loop's static schedule from "
                      f"{' and '.join(moved)} (calibration.sources.tpu_layer_static)")
        return refit_chip(at_batch, found), (
            f"simulated (the new decoders from the static schedule, refit by way (b) on {whose} capped "
            f"runs u{build[0]}x{build[1]} at batch {fit_batch}: {', '.join(found.runs)}; dequant factor "
            f"{found.dequant_factor:.2f}, {found.per_layer_s * 1e6:.1f} µs a layer{growth})")
    return at_batch, "simulated (way (b) of the words32 kernel; the new decoders from the static schedule)"


ChipFor = Callable[[int, str], Chip]  # (batch, schedule name) -> the chip a run is simulated on


def simulate_build(chip: Chip | ChipFor, unroll: tuple[int, int], decoder: str = KERNEL_DECODER,
                   expert_list: str = WALK) -> list[tuple[ChipRecord, float]]:
    """Every committed decode of the kernel build (``decoder``, panel loops ``unroll``,
    ``expert_list``) with its simulated ms on ``chip`` (or on ``chip(batch, schedule)``: a chip
    per run, its decoders' static figures at the batch's rows, its layer code the kernel's
    under that schedule), after the runs: not a prediction recorded before them."""
    records = build_records(decoder, unroll, expert_list=expert_list)
    chip_of = chip if callable(chip) else (lambda _batch, _schedule: chip)
    predictor = ChipRecordPredictor(records)
    simulated: dict[int, float] = {}
    for batch, schedule in sorted({(r.batch, r.schedule) for r in records}):
        at = [i for i, r in enumerate(records) if (r.batch, r.schedule) == (batch, schedule)]
        simulated.update(zip(at, predictor.predict_many(chip_of(batch, schedule), at), strict=True))
    return [(r, simulated[i]) for i, r in enumerate(records)]


def _figure(chip: Chip, path: str) -> float:
    parent, name = _figure_slot(chip.model_dump(mode="python"), path)
    return float(parent[name]["value"])


def predict_set(set_name: str, chip_for: Callable[[int, str], tuple[Chip, str]] | None = None) -> list[dict[str, Any]]:
    """One row per K3-shard case of ``set_name`` that a committed words32 run shares
    (schedule file, batch, context) with, or whose routing can be borrowed (published's at the
    batch; for a capped fixed-cost case at any context: rows ``expert_cap``); others are skipped
    (their routing is unknown).
    ``chip_for(batch, schedule)``: the chip each run is simulated on and its label (default: way
    (b) on the build's capped runs, :func:`build_chip`, the same for every schedule)."""
    from calibration.tpu_bench.device_run import load_cases

    known = load_chip_records(KERNEL_PATH, decoder=WORDS32_DECODER)
    planned, rows = [], []
    for case in load_cases(set_name):
        if case.shard_of != "k3-tp32":
            continue
        name = Path(case.schedule).stem if case.schedule.endswith(".json") else case.schedule
        try:  # the kernel's own refusal, before any routing is looked for
            check_expert_cap(load_schedule(case.schedule), case.expert_cap)
        except UnsupportedSchedule as exc:
            sys.stderr.write(f"{case.schedule} b{case.batch}: the kernel refuses it ({exc}); not predicted\n")
            continue
        match = next((r for r in known if r.batch == case.batch and r.context == case.context
                      and (r.schedule == name or Path(r.schedule_path).stem == name)), None)
        borrowed = match is None
        if match is None:
            match = _borrowed_routing(known, name, case)
        traced_at = match.context if match is not None else None
        if match is not None and case.expert_cap is not None:  # a fixed-cost probe run: its program capped
            match = replace(match, context=case.context, expert_cap=case.expert_cap,
                            routing=capped_trace(match.routing, case.expert_cap))
        if match is None:
            sys.stderr.write(f"{case.schedule} b{case.batch}: no words32 run to take the routing from; not predicted\n")
            continue
        unroll = (case.panel_unroll or PANEL_UNROLL, case.expert_panel_unroll or EXPERT_PANEL_UNROLL)
        planned.append((case, replace(match, ms_median=float("nan"), ms_spread=float("nan"), runs=0,
                                      panel_unroll=unroll, expert_list=EXPERT_LIST_BUILD), borrowed, traced_at))
    predictor = ChipRecordPredictor([r for _, r, _, _ in planned])
    # decoders' figures at its rows; the kernel as it is now (its expert list)
    if chip_for is None:
        fitted = functools.cache(lambda batch: build_chip(batch=batch, expert_list=EXPERT_LIST_BUILD))  # a fit a batch

        def chip_for(batch: int, _schedule: str) -> tuple[Chip, str]:
            return fitted(batch)
    built = {key: chip_for(*key) for key in {(r.batch, r.schedule) for _, r, _, _ in planned}}
    chips = {key: chip for key, (chip, _) in built.items()}
    predicted = [predictor.predict_many(chips[r.batch, r.schedule], [i])[0] for i, (_, r, _, _) in enumerate(planned)]
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for (case, record, borrowed, traced_at), ms in zip(planned, predicted, strict=True):
        rows.append({"kind": "prediction", "set": set_name, "decoder": KERNEL_DECODER, "model": case.model,
                     "shard_of": case.shard_of, "schedule": case.schedule, "batch": case.batch,
                     "context": case.context, "routing": record.routing, "predicted_ms": ms,
                     "label": built[record.batch, record.schedule][1] + ("" if record.panel_unroll == (1, 1) else
                        "; the panel loops' unroll: each product's fixed cost over the panels in flight")
                        + ("; routing: published's trace at this batch (the schedule's own not yet run)" if borrowed
                           else "")
                        + (f"; a fixed-cost probe run: each row's first {case.expert_cap} picks, the list capped "
                           f"at {case.expert_cap} experts a layer"
                           + (f" (routing: the trace of a run at context {traced_at})" if traced_at != case.context else "")
                           if case.expert_cap is not None else "")
                        + ("; the per-layer cost in equal shares at each of the layer's ops (execution."
                           "per_layer_overhead_at: each_op)"
                           if chips[record.batch, record.schedule].execution.per_layer_overhead_at == "each_op" else ""),
                     "figures": {dequant_path(f): _figure(chips[record.batch, record.schedule], dequant_path(f))
                                 for f in FORMAT_OF_PART.values()},
                     "date": now, "probes": str(PROBES_PATH.name), "panel_unroll": list(record.panel_unroll),
                     "expert_list": record.expert_list,
                     **({"expert_cap": case.expert_cap} if case.expert_cap is not None else {}),
                     **({"kernel_variant": variant} if (variant := case_variant(case)) else {})})
    return rows


def _borrowed_routing(known: list[ChipRecord], name: str, case: Any) -> ChipRecord | None:
    """A words32 run of ``published`` at the case's batch and context with the case's schedule put
    in: the routing of a schedule not yet run at that batch. The router is the kernel's own on the
    same weights and seeds whatever the schedule (at batch 1 the committed traces of every schedule
    are identical); above batch 1 the traces of two schedules part a little where their greedy
    tokens, fed back, do. None when the schedule is neither a file nor a name with a run (no file to name)."""
    if case.schedule.endswith(".json"):  # a schedule file: it names itself
        path = case.schedule
    else:
        own = next((r for r in known if r.schedule == name or Path(r.schedule_path).stem == name), None)
        path = own.schedule_path if own is not None else None
    donor = next((r for r in known if r.batch == case.batch and r.context == case.context
                  and r.schedule == "published" and r.expert_cap is None), None)
    if donor is None and case.expert_cap is not None:
        # a capped run keeps each row's first picks: which experts matters little, so a trace at
        # another context serves (the context itself is the case's)
        donor = next((r for r in known if r.batch == case.batch and r.schedule == "published"
                      and r.expert_cap is None), None)
    if path is None or donor is None:
        return None
    sys.stderr.write(f"{case.schedule} b{case.batch}: routing borrowed from published's run at that batch\n")
    return replace(donor, schedule=name, schedule_path=path)


def capped_trace(routing: str, cap: int) -> str:
    """``trace:<path>`` of what a kernel capped at ``cap`` experts a layer runs on the routing
    ``trace:<path>`` (:func:`megakernel.runner.capped_routing`), written beside it (once) as
    ``<name>-cap<cap>-borrowed.json``: the trace a capped case is predicted on before its own run."""
    from hwmodels.atomic import write_text_atomic
    from megakernel.runner import capped_routing

    source = Path(routing.removeprefix("trace:"))
    source = source if source.is_absolute() else ROOT / source
    out = source.with_name(f"{source.stem}-cap{cap}-borrowed.json")
    if not out.exists():
        layers = np.asarray(json.loads(source.read_text())["layers"])
        write_text_atomic(out, json.dumps({"layers": capped_routing(layers, cap).tolist()}))  # as ingest writes a trace
    return f"trace:{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}"


def case_variant(case: Any) -> dict[str, int] | None:
    """The kernel knobs a planned case sets (the engine prices the panel loops' unroll since
    set v5e-z; the predictions of sets v5e-x and v5e-y, recorded before, did not)."""
    variant = {k: v for k in ("panel_unroll", "expert_panel_unroll") if (v := getattr(case, k, None)) is not None}
    return variant or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.reports.tpu_v5e_plan", allow_abbrev=False)
    parser.add_argument("--set", required=True, help="a set of calibration/tpu_bench/sets.json")
    parser.add_argument("--write", action="store_true", help=f"append the rows to {PREDICTIONS_PATH.name}")
    args = parser.parse_args(argv)
    emit_predictions(predict_set(args.set), args.write)
    return 0


def emit_predictions(rows: list[dict[str, Any]], write: bool, path: Path = PREDICTIONS_PATH) -> None:
    """Print prediction rows; with ``write``, append each to ``path`` (the records' one
    appender, :func:`hwmodels.records.jsonl.append_record`)."""
    from hwmodels.records.jsonl import append_record

    for r in rows:
        variant = f" variant {r['kernel_variant']}" if r.get("kernel_variant") else ""
        sys.stdout.write(f"{r['schedule']} b{r['batch']}{variant}: predicted {r['predicted_ms']:.2f} ms, {r['label']}\n")
    if write:
        for r in rows:
            append_record(path, r)


if __name__ == "__main__":
    raise SystemExit(main())
