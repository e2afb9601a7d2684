"""The kernel as it is, predicted from first principles: micro-probes and the compiler's
schedule, no kernel run of any kind.

``python -m calibration.reports.tpu_v5e_first_principles [--panel-unroll DENSE EXPERT]``
simulates every committed decode of the kernel build (decoder
:data:`megakernel.quant_pairs.KERNEL_DECODER`, panel loops ``--panel-unroll``, default the build
with the most committed decodes) on
:func:`first_principles_chip`: the catalog's tpu-v5e with every figure the micro-probes measure
(``calibration.sources.tpu_probes.probe_chip``: copy rate and order, MXU product costs, the
empty call, the empty layer loop) and the expert decoders' cost per weight from libtpu's static
schedule of their panel loops (:func:`calibration.reports.tpu_v5e_plan.static_figure`), with no
figure from the kernel's capped runs (way (b)) and none from its decodes. It prints each
decode's error, the MAPE and the largest error, and Kendall's τ per batch — beside way (b) on the
build's own capped runs (:func:`calibration.reports.tpu_v5e_plan.build_chip`, a kernel-level
fit, named so). Both are simulated after the runs: neither is a prediction recorded before.
The static schedule's bundles are priced at the ``code_size`` probe's measured rate and loop
cost (:mod:`calibration.sources.tpu_code_issue`).

``--predict-set SET [--write]`` predicts a planned set's cases from first principles instead
(:func:`calibration.reports.tpu_v5e_plan.predict_set` with :func:`fp_chip_for`), appended with
``--write`` to ``calibration/data/tpu-v5e-fp-predictions.jsonl`` before the device call — the
first-principles chain judged on runs it has not seen, beside way (b)'s predictions
(``tpu-v5e-predictions.jsonl``).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np

from calibration.core.fitting import rank_agreement
from calibration.reports.tpu_v5e_plan import (
    FORMAT_OF_PART,
    PART_DECODERS,
    ChipFor,
    build_chip,
    emit_predictions,
    predict_set,
    simulate_build,
    static_figure,
    static_rows,
)
from calibration.sources.tpu_attention_core import (
    attention_core_probe,
    context_table,
    kernel_context_costs,
)
from calibration.sources.tpu_chip_records import DECODE_CONTEXT, build_records, most_measured_build
from calibration.sources.tpu_code_issue import code_issue
from calibration.sources.tpu_fixed_cost import FIXED_COST_PATH, capped_runs, simulated_ms
from calibration.sources.tpu_layer_static import (
    PUBLISHED,
    V5E_CLOCK_HZ,
    attention_core_figures,
    layer_issue,
    layer_remainder,
    put_attention_core,
)
from calibration.sources.tpu_probes import PER_LAYER, dequant_path, probe_chip
from hwmodels.catalog import load_chip
from hwmodels.overlay import _figure_slot
from hwmodels.records.kernel import WALK
from hwmodels.schema import Chip
from megakernel.kernel_moe import EXPERT_LIST_BUILD
from megakernel.quant import WORDS32_DECODER
from megakernel.quant_pairs import KERNEL_DECODER
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL


def first_principles_chip(decoder: str = KERNEL_DECODER, batch: int = 1,
                          unroll: tuple[int, int] = (PANEL_UNROLL, EXPERT_PANEL_UNROLL),
                          expert_list: str = WALK, probes: Chip | None = None,
                          clock_hz: float | None = None, loop_iteration_s: float | None = None,
                          core_probe: bool = True, schedule: str = PUBLISHED) -> Chip:
    """tpu-v5e with the micro-probes' figures, ``decoder``'s static-schedule decode rates at
    ``batch``'s rows and the layer's own work from the static schedule of the kernel's layer
    loop (:func:`calibration.sources.tpu_layer_static.layer_remainder`: the bundles one layer
    issues less the engine's compute for the same ops; the build (``unroll``, ``expert_list``)'s
    record, else the nearest build's) and of the MLA core's KV loop, which that record leaves
    out as data-dependent (:func:`calibration.sources.tpu_layer_static.attention_core_figures`:
    the engine prices each KV tile's code with it), all ``derived``, except the KV loop's seconds
    a tile where the ``mla_core`` probe measured it (``core_probe``;
    :func:`calibration.sources.tpu_attention_core.attention_core_probe`, measured on tpu-v5e);
    every other figure the catalog's. ``schedule``: the layer-loop record of the kernel compiled
    under that schedule where there is one (its copies' issue code, a ring pool's bookkeeping),
    else published's (:func:`calibration.sources.tpu_layer_static.layer_issue`).
    ``probes``: the micro-probe chip to start from (default: the committed probe records'); the
    static schedule's bundles become seconds at ``clock_hz`` bundles a second and each loop
    iteration they run costs ``loop_iteration_s`` more (default: both measured by the
    ``code_size`` probe, :func:`calibration.sources.tpu_code_issue.code_issue`; without its
    records the clock derived from the MXU's peak and no loop cost; both varied by the
    sensitivity table, :mod:`calibration.reports.tpu_v5e_fp_sensitivity`)."""
    if probes is None:
        probes = probe_chip(load_chip("tpu-v5e", calibrated=False), decoder=WORDS32_DECODER)
    clock_hz, loop_iteration_s = issue_figures(clock_hz, loop_iteration_s)
    data = probes.model_dump(mode="python")
    for part, part_decoder in PART_DECODERS[decoder].items():
        value, source = static_figure(part, part_decoder, rows=static_rows(batch, part, part_decoder),
                                      clock_hz=clock_hz, loop_iteration_s=loop_iteration_s,
                                      panels_per_iteration=unroll[1])
        parent, name = _figure_slot(data, dequant_path(FORMAT_OF_PART[part]))
        parent[name] = {**parent[name], "value": value, "label": "derived", "source": source}
    chip = Chip.model_validate(data)
    value, source = layer_remainder(chip, batch, unroll, clock_hz=clock_hz, expert_list=expert_list,
                                    loop_iteration_s=loop_iteration_s, schedule=schedule)
    parent, name = _figure_slot(data, PER_LAYER)
    parent[name] = {**parent[name], "value": value, "label": "derived", "source": source}
    # the MLA core's KV loop, out of the layer's remainder (data-dependent): the mla_core probe's
    # seconds a tile where it ran (the loop's bundles issue 1/4 ... 4/5 of it), else the bundles
    static = attention_core_figures(batch, unroll, clock_hz=clock_hz, expert_list=expert_list,
                                    loop_iteration_s=loop_iteration_s, schedule=schedule)
    probed = attention_core_probe(batch, static[1] if static is not None else 0.0) if core_probe else None
    if probed is not None:
        put_attention_core(data, probed, label="measured")
    else:
        put_attention_core(data, static)
    return Chip.model_validate(data)



FP_PREDICTIONS_PATH = Path(__file__).resolve().parents[1] / "data" / "tpu-v5e-fp-predictions.jsonl"
FP_LABEL = ("simulated from first principles (micro-probes, the decoders' and the layer loop's static schedule at the "
            "code_size probe's bundle rate and loop cost; no kernel run of any kind), the kernel as it is")


def fp_chip_for(batch: int, schedule: str = PUBLISHED) -> tuple[Chip, str]:
    """The first-principles chip of the kernel as it is at ``batch`` under ``schedule``, and its
    label (for :func:`calibration.reports.tpu_v5e_plan.predict_set`)."""
    return fp_chips((PANEL_UNROLL, EXPERT_PANEL_UNROLL), EXPERT_LIST_BUILD)(batch, schedule), FP_LABEL


def fp_chips(unroll: tuple[int, int], expert_list: str = WALK, **figures: Any) -> ChipFor:
    """``chip(batch, schedule)``: :func:`first_principles_chip` of the build (``figures``: its
    keyword arguments), one per batch and per layer-loop record the schedule reads (a schedule
    with no record of its own shares published's chip)."""
    built: dict[tuple[int, str], Chip] = {}

    def chip(batch: int, schedule: str) -> Chip:
        key = (batch, layer_issue(batch, unroll, expert_list=expert_list, schedule=schedule).schedule)
        if key not in built:
            built[key] = first_principles_chip(KERNEL_DECODER, batch, unroll, expert_list, schedule=key[1], **figures)
        return built[key]
    return chip


def issue_figures(clock_hz: float | None = None, loop_iteration_s: float | None = None) -> tuple[float, float]:
    """(bundles a second, seconds a loop iteration) the static schedule is priced at: each one
    given, else the ``code_size`` probe's (:mod:`calibration.sources.tpu_code_issue`), else the
    clock derived from the MXU's peak (:data:`V5E_CLOCK_HZ`) and no loop cost."""
    issue = code_issue() if clock_hz is None or loop_iteration_s is None else None
    if clock_hz is None:
        clock_hz = issue.bundles_per_s if issue is not None else V5E_CLOCK_HZ
    if loop_iteration_s is None:
        loop_iteration_s = issue.loop_iteration_s if issue is not None else 0.0
    return clock_hz, loop_iteration_s


def errors(chip: Chip | ChipFor, unroll: tuple[int, int],
           expert_list: str = WALK) -> list[tuple[str, int, float, float]]:
    """(schedule, batch, measured ms, simulated ms) of every committed decode of the build."""
    return [(r.schedule, r.batch, r.ms_median, ms) for r, ms in simulate_build(chip, unroll, expert_list=expert_list)]


def capped_errors(chip: ChipFor, unroll: tuple[int, int],
                  expert_list: str = WALK) -> list[tuple[str, int, float, float]]:
    """(schedule, expert cap, measured ms, simulated ms) of the build's capped runs at every
    batch (the fixed-cost probe): a held-out check of the first-principles decomposition, which
    reads none."""
    runs = capped_runs(FIXED_COST_PATH, KERNEL_DECODER, unroll, batch=None, expert_list=expert_list)
    return [(f"{r.schedule} b{r.batch}" + ("" if r.context == DECODE_CONTEXT else f", context {r.context}"),
             int(r.expert_cap or 0), r.ms_median, simulated_ms([r], chip(r.batch, r.schedule))[0]) for r in runs]


def summary(rows: list[tuple[str, int, float, float]]) -> str:
    e = np.array([sim / ms - 1 for _, _, ms, sim in rows])
    taus = []
    for batch in sorted({b for _, b, _, _ in rows}):
        at = [(ms, sim) for _, b, ms, sim in rows if b == batch]
        if len(at) >= 3:
            taus.append(f"b{batch} {rank_agreement(*zip(*at, strict=True)):.2f}")
    return (f"{len(rows)} decodes: MAPE {np.mean(np.abs(e)):.1%}, max {np.max(np.abs(e)):.1%}, "
            f"{int(np.sum(np.abs(e) <= 0.05))} within 5 %; Kendall tau {', '.join(taus)}")


def builds() -> list[tuple[tuple[int, int], str]]:
    """Every build (panel loops, expert list) with committed decodes of the kernel's decoder."""
    return sorted({(r.panel_unroll, r.expert_list) for r in build_records(KERNEL_DECODER)})


def report_lines(unroll: tuple[int, int], listed: str = WALK) -> list[str]:
    """The build's table: every committed decode, first principles beside way (b), then its
    capped runs held out from the first principles; [] when the build has no decode."""
    chips = fp_chips(unroll, listed)
    first = errors(chips, unroll, listed)
    if not first:
        return []
    fitted_chip = functools.cache(lambda batch: build_chip(KERNEL_DECODER, unroll, batch, listed)[0])  # a fit a batch
    fitted = errors(lambda batch, _schedule: fitted_chip(batch), unroll, listed)
    out = [f"Build: panel loops {unroll[0]}/{unroll[1]}, {listed} expert list (decoder {KERNEL_DECODER}; measured on "
           "tpu-v5e, simulated after the runs)",
           "| schedule | batch | measured ms | first principles ms | error | way (b), kernel-level fit ms | error |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for (name, batch, ms, a), (_, _, _, b) in zip(first, fitted, strict=True):
        out.append(f"| {name} | {batch} | {ms:.2f} | {a:.2f} | {a / ms - 1:+.1%} | {b:.2f} | {b / ms - 1:+.1%} |")
    out += ["", f"first principles (micro-probes + static schedule, no kernel run): {summary(first)}",
            f"way (b) (refit on the build's own capped runs: a kernel-level fit): {summary(fitted)}"]
    capped = capped_errors(chips, unroll, listed)
    if capped:
        out += ["", "The build's capped runs (fixed-cost probe), held out from the first principles "
                "(way (b) is fitted on them):", "| schedule | expert cap | measured ms (tpu-v5e) | first principles ms (simulated) | error |",
                "|---|---:|---:|---:|---:|"]
        out += [f"| {name} | {cap} | {ms:.2f} | {sim:.2f} | {sim / ms - 1:+.1%} |" for name, cap, ms, sim in capped]
        e = np.array([sim / ms - 1 for *_, ms, sim in capped])
        out.append(f"capped runs: MAPE {np.mean(np.abs(e)):.1%}, max {np.max(np.abs(e)):.1%}")
        costs = kernel_context_costs(capped_runs(FIXED_COST_PATH, KERNEL_DECODER, unroll, batch=None,
                                                 expert_list=listed))
        if costs:
            out += ["", "Where the capped runs' error grows with the rows: the cache's cost in the kernel against the "
                    "same loop probed alone (the simulator prices the probe's):", *context_table(costs)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.reports.tpu_v5e_first_principles",
                                     allow_abbrev=False)
    parser.add_argument("--panel-unroll", type=int, nargs=2, default=None,
                        metavar=("DENSE", "EXPERT"))
    parser.add_argument("--expert-list", default=WALK, choices=(WALK, EXPERT_LIST_BUILD),
                        help="the builds whose moe.topk built the expert list so (default: walk, the older kernels')")
    parser.add_argument("--predict-set", default=None, metavar="SET",
                        help="predict the K3-shard cases of a sets.json set from first principles (the kernel as "
                             "it is) instead of reporting the committed decodes")
    parser.add_argument("--write", action="store_true",
                        help=f"with --predict-set: append the rows to {FP_PREDICTIONS_PATH.name} (before the run)")
    args = parser.parse_args(argv)
    if args.predict_set:
        emit_predictions(predict_set(args.predict_set, fp_chip_for), args.write, FP_PREDICTIONS_PATH)
        return 0
    unroll = tuple(args.panel_unroll) if args.panel_unroll else most_measured_build(KERNEL_DECODER)
    out = report_lines(unroll, args.expert_list)  # type: ignore[arg-type]
    if not out:
        sys.stderr.write(f"no committed decodes of the build u{unroll[0]}x{unroll[1]} with the {args.expert_list} "
                         "expert list\n")
        return 2
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
