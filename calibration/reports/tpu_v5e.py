"""Predicted vs measured on the TPU v5e K3-shard kernel records, three ways (issue 34).

``python -m calibration.reports.tpu_v5e [--out docs/tpu-v5e-measured.md] [--heldout PATH] [--plot PNG] [--decoder D]``

Renders :func:`calibration.sources.tpu_kernel_fit.calibrate_kernel_records` (what
``tpusim calibrate --hardware tpu-v5e --measurements <records>`` runs): the summary per way
(MAPE, Kendall τ and regret per batch), one table per way (schedule, batch, predicted ms,
measured ms, error, inside the 90 % interval or not), the coverage and width of the
intervals, the fitted figures per fold, and the scatter plot (predicted on x, measured on
y, the diagonal, the held-out intervals as bars). ``--heldout`` writes the guard test's
reference (:func:`heldout_reference`). ``--decoder`` picks the expert decoder whose records,
dequant probes and fixed-cost runs the study reads (default
:data:`calibration.sources.tpu_probes.CALIBRATION_DECODER`, the kernel as it is now;
``--decoder bytes --out /tmp/bytes.md`` regenerates the earlier kernel's study).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibration.reports.tpu_v5e_fp_sensitivity import BEGIN as FP_BEGIN
from calibration.reports.tpu_v5e_fp_sensitivity import END as FP_END
from calibration.reports.tpu_v5e_replay import scatter
from calibration.reports.tpu_v5e_sensitivity import BEGIN as SENSITIVITY_BEGIN
from calibration.reports.tpu_v5e_sensitivity import END as SENSITIVITY_END
from calibration.reports.tpu_v5e_sensitivity import kept_block, put_block
from calibration.sources.tpu_chip_records import KERNEL_PATH, record_step, simulate_record
from calibration.sources.tpu_kernel_fit import LABEL, SPLITS, KernelFit, calibrate_kernel_records
from calibration.sources.tpu_probes import CALIBRATION_DECODER
from hwmodels.atomic import write_text_atomic

COMMAND = ("JAX_PLATFORMS=cpu .venv/bin/python -m calibration.reports.tpu_v5e --out docs/tpu-v5e-measured.md "
           "--heldout calibration/data/tpu-v5e-heldout.json --plot docs/tpu-v5e-measured.png")
WAY_TITLES = {"a": "(a) catalog priors only", "b": "(b) probes only (micro-probes and the kernel's fixed-cost probe; no decode step time)",
              "c:schedule": "(c) fitted on kernel step times, held out by schedule half",
              "c:batch": "(c) fitted on kernel step times, held out by batch half",
              "c:fit": "(c) fitted on every record (in sample, not a held-out figure)"}
NO_INTERVAL = "—"
NOTES = [
    "- **What is fitted.** Way (c) starts from the probe chip (b) and fits the figures of "
    "`calibration.sources.tpu_kernel_fit.FITTED` on the kernel step times, in log space, through the one "
    "calibration core (`calibration.core.fit`; held out by `calibration.core.leave_one_group_out`, the same "
    "problem and options refitted without each fold).",
    "- **The splits.** Schedule halves alternate in name order; batch halves put the smaller half of the "
    "batch sizes against the rest (an extrapolation in batch). Both are computed from whatever records the "
    "file holds.",
    "- **The model error term.** A held-out record's 90 % half-width is the split-conformal quantile of the "
    "out-of-sample relative residuals (measured - predicted) / predicted of the *other* fold of its split "
    "(`calibration.core.coverage`): what the fitted figures cannot absorb, measured on records outside each "
    "refit. With fewer than 9 residuals per fold the rank exceeds n and the largest is used. The refit's "
    "parameter spread is not added: each residual already comes from a refit on other records, so it carries "
    "that error (the solver runs without a covariance, `uncertainty='none'`). The judged record never enters "
    "the fit nor its own interval.",
    "- **The mechanism.** v5e's MXU takes bf16/int8, not FP8 or FP4: every routed expert's FP8 gate/up and "
    "MXFP4 down slices are converted to bf16 on the VPU after they land in VMEM "
    "(`compute.vpu.dequant_s_per_element`); at these batches it is most of the step. The MXU multiplies "
    "each 128-column panel while the VPU converts the next (`tpusim.engine.build`), so an expert part costs "
    "its conversion plus one panel's products.",
]  # then the note on which kernel's records these are (kernel_note), then the notes below
LATER_NOTES = [
    "- **The copy engine serves in issue order** (`dma.service: in_order`, the `dma_order` probe: a 64 KiB "
    "copy issued behind eight 1 MiB copies lands after all eight, 1.02 of their transfer time; behind two, "
    "0.76 (2026-12-05); again 2026-12-07 behind 2 / 8 / 16 / 32: 1.09 / 1.01 / 1.02 / 0.98 — in issue order "
    "32 deep): a later, more urgent copy waits for every copy issued before it, where the simulator used to "
    "share the bandwidth among all copies in flight and serve the most urgent first.",
    "- **Every MXU product has a fixed cost** (`compute.mxu.dot_overhead_s`, 71 ns, the intercept of the "
    "`matmul` probe's time per 128-column panel product against its depth in tiles; the slope, 6.8 ns a tile, "
    "is the push): the kernel multiplies a streamed tensor panel by panel and 256-row input chunk by chunk "
    "(`tpusim.schedule.kernel_layout.matmul_dots`), so a K3-shard KDA layer issues about 900 products, "
    "which the simulator had priced as pushes alone.",
    "- **TPU v7.** Which of these figures are the chip's and which the architecture's, and the K3 TPU v7 "
    "prediction with v5e's architecture figures as priors: [tpu-v5e-to-v7.md](tpu-v5e-to-v7.md).",
    "- **Ranking.** Schedules whose measured steps lie within their spreads of each other have no true "
    "order: a regret of a few hundredths of a percent between them is noise, and plain τ counts their swaps "
    "in full. The second τ of each cell counts only the *resolved* pairs, whose measured steps differ by "
    "more than the sum of their half-IQRs (`calibration.sources.tpu_kernel_fit.resolved_tau`; a predicted "
    "tie counts as neither concordant nor discordant).",
]

def kernel_note(decoder: str = CALIBRATION_DECODER) -> str:
    """Which kernel's records the study read: the kernel as it is now, or an earlier decoder's."""
    if decoder == CALIBRATION_DECODER:
        return (f"- **Which kernel.** These records ran the kernel as it is now, with its `{CALIBRATION_DECODER}` "
                "expert decoders (rows with that `decoder`; `calibration.sources.tpu_probes.CALIBRATION_DECODER`), "
                "and way (b) "
                "reads that decoder's dequant probes and its own fixed-cost runs. The earlier `bytes` kernel's records "
                "(through 2026-12-05) stay in the same files; the two kernels side by side, measured and predicted: "
                "[tpu-v5e-decoders.md](tpu-v5e-decoders.md). On the `bytes` kernel's 34 points this study gave (its "
                "figures, not these): held out 1.9 / 2.2 % (schedule / batch half), coverage 94.1 / 97.1 %, widths "
                "7.6 / 9.4 %, τ at batch 1 0.94, at batch 8 0.51-0.60, regret at batch 8 0.45 %.")
    return (f"- **Which kernel.** These records ran the kernel's earlier `{decoder}` expert decoders (rows with "
            "that `decoder`; rows without one ran `bytes`), and way (b) reads that decoder's dequant probes and its "
            "own fixed-cost runs: the study as it stood before it moved to the kernel as it is now "
            f"(`{CALIBRATION_DECODER}`, [tpu-v5e-measured.md](tpu-v5e-measured.md)); the two kernels side by side: "
            "[tpu-v5e-decoders.md](tpu-v5e-decoders.md).")


def fixed_cost_note(decoder: str = CALIBRATION_DECODER) -> str:
    """The fixed-cost probe's reading, from the committed runs of ``decoder`` (computed, not quoted)."""
    from calibration.sources.tpu_fixed_cost import committed_fixed_cost

    found = committed_fixed_cost(decoder)
    if found is None:
        return "- **The kernel's fixed-cost probe**: no capped runs committed."
    per_expert_us = found.slope_ms_per_expert * 1e3
    return ("- **The kernel's fixed-cost probe** (`calibration.sources.tpu_fixed_cost`: the K3-shard kernel at "
            "batch 1 with each layer's experts capped at 4, 8 and 12 of 16, published and naive, kept apart from "
            f"the decodes in `tpu-v5e-fixed-cost.jsonl`): {per_expert_us:.1f} µs a routed expert on the chip, where "
            f"the simulator at the micro-probe rates gives {per_expert_us / found.dequant_factor:.1f} (way (b) "
            f"scales the dequant rates by the ratio, {found.dequant_factor:.2f}), and about "
            f"{found.per_layer_s * 1e6:.0f} µs a layer that the simulator's ops still do not price "
            "(`execution.per_layer_overhead_s`; an empty layer loop costs 0.07 µs, the kernel's top-k alone "
            "4.5-5 µs, the `routing` probe); which ops carry it is not yet measured.")


EXPOSURE_NOTES = [
    "Every schedule of a batch has the same simulated compute (the same ops, the same chip), so the last "
    "column but one is the DMA time the chip leaves exposed *if* that compute were right. Read it against "
    "`naive`, which overlaps nothing: the difference between its measured step and the simulated compute is "
    "the whole DMA time of the step on the chip, to set against the simulated DMA time (its exposed DMA). "
    "A schedule whose measured exposure exceeds its simulated one is one whose overlap the simulator "
    "overrates; a negative figure says the simulated compute is too long.",
]


def _pct(value: float | None, sign: bool = False) -> str:
    return "—" if value is None else (f"{100 * value:+.1f} %" if sign else f"{100 * value:.1f} %")


def ranking_cells(fit: KernelFit, way: str, batch: int) -> tuple[str, str]:
    found = next((r for r in fit.rankings(way) if r["batch"] == batch), None)
    if found is None:
        return "—", "—"
    resolved = found.get("tau_resolved")
    over = ("; no pair resolved" if resolved is None else
            f"; {resolved:+.2f} over the {found['pairs_resolved']} of {found['pairs']} pairs the spreads resolve")
    return (f"{found['tau']:+.2f} ({found['schedules']} schedules){over}",
            f"{found['pick']}: {100 * found['regret']:.2f} %")


def summary_lines(fit: KernelFit) -> list[str]:
    batches = sorted({r.batch for r in fit.records})
    shown = [b for b in (1, 8) if b in batches] or batches[:1]
    head = "| way | MAPE | " + " | ".join(f"τ (batch {b}) | pick, regret (batch {b})" for b in shown) + " |"
    lines = [head, "|" + " --- |" * (2 + 2 * len(shown))]
    for way, title in WAY_TITLES.items():
        if way not in fit.ways:
            continue
        cells = [c for b in shown for c in ranking_cells(fit, way, b)]
        lines.append(f"| {title} | {_pct(fit.mape(way))} | " + " | ".join(cells) + " |")
    for b in shown:
        best = next((r["best"] for r in fit.rankings("b") if r["batch"] == b), "—")
        lines.append(f"\nMeasured best at batch {b}: {best}.")
    return lines


def coverage_lines(fit: KernelFit) -> list[str]:
    lines = ["| held out by | points inside the 90 % interval | coverage | mean width (of the prediction) |",
             "| --- | ---: | ---: | ---: |"]
    for split in SPLITS:
        c = fit.coverage.get(split)
        if c is not None:
            lines.append(f"| {split} half | {c.inside} / {c.points} | {_pct(c.empirical)} | {_pct(c.mean_width_rel)} |")
    if fit.model_error is not None:
        lines.append(f"\nModel error stored with the overlay (every fold pooled, {fit.model_error.points} "
                     f"out-of-sample residuals): q = {_pct(fit.model_error.in_range_rel)} "
                     f"({'exact' if fit.model_error.exact else 'the largest residual: too few for an exact 90 % rank'}).")
    return lines


def way_table(fit: KernelFit, way: str) -> list[str]:
    lines = ["| schedule | batch | predicted ms | measured ms | error | inside 90 % |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    widths = fit.intervals.get(way, {})
    for i, predicted in sorted(fit.ways[way].items()):
        record = fit.records[i]
        measured = record.ms_median
        if i in widths:
            t = widths[i]
            inside = f"{'yes' if abs(measured - predicted) <= t * predicted else 'no'} (±{100 * t:.1f} %)"
        else:
            inside = NO_INTERVAL
        lines.append(f"| {record.schedule} | {record.batch} | {predicted:.2f} | {measured:.2f} | "
                     f"{100 * (predicted - measured) / measured:+.1f} % | {inside} |")
    return lines


def fitted_lines(fit: KernelFit) -> list[str]:
    lines = [f"| figure | probes (start) | {LABEL} (all records) | 1σ |", "| --- | ---: | ---: | ---: |"]
    start = fit.solution.start
    for j, (path, value) in enumerate(fit.values().items()):
        sigma = fit.sigma()[path]
        lines.append(f"| `{path}` | {start[j]:.4g} | {value:.4g} | {'—' if sigma is None else f'{sigma:.2g}'} |")
    lines += ["", "| split | fold held out | " + " | ".join(f"`{p.rsplit('.', 1)[-1]}`" for p in fit.fitted) + " |",
              "|" + " --- |" * (2 + len(fit.fitted))]
    lower, upper = fit.solution.lower, fit.solution.upper

    def cell(j: int, value: float) -> str:
        near = 1e-3 * (upper[j] - lower[j])  # within 0.1 % of the range: the fold pressed on the bound
        bound = " (at its lower bound)" if value <= lower[j] + near else (
            " (at its upper bound)" if value >= upper[j] - near else "")
        return f"{value:.4g}{bound}"

    for fold in fit.folds:
        values = fold.values or {}
        lines.append(f"| {fold.dimension} | {fold.value} | " + " | ".join(cell(j, values.get(p, float("nan")))
                                                                          for j, p in enumerate(fit.fitted)) + " |")
    bounds = ", ".join(f"`{p}` {lower[j]:.4g} … {upper[j]:.4g}" for j, p in enumerate(fit.fitted))
    lines += ["", f"Bounds (`calibration.core.parameters`): {bounds}. A fold at a bound says the records it was "
              "fitted on ask for more than the figure can physically give: the model misses something there."]
    return lines


def exposure_lines(fit: KernelFit, batches: Sequence[int] = (1, 8)) -> list[str]:
    """Where way (b) goes wrong, per record at ``batches``: the simulated step split into its
    compute (the step less the exposed DMA) and its exposed DMA, next to the DMA time the
    measurement leaves exposed if that compute were right (measured - simulated compute)."""
    from calibration.sources.tpu_fixed_cost import kernel_probe_chip
    from hwmodels.catalog import load_chip

    chip = kernel_probe_chip(load_chip("tpu-v5e", calibrated=False), decoder=fit.decoder)
    lines = ["| schedule | batch | measured ms | (b) simulated ms | simulated compute ms | simulated exposed DMA ms "
             "| measured - simulated compute ms | DMAs in flight (max) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for record in fit.records:
        if record.batch not in batches:
            continue
        result, schedule = simulate_record(record, chip), record_step(record)[1]
        step_ms, exposed_ms = result.step_s * 1e3, result.exposed_dma_s * 1e3
        lines.append(f"| {record.schedule} | {record.batch} | {record.ms_median:.2f} | {step_ms:.2f} | "
                     f"{step_ms - exposed_ms:.2f} | {exposed_ms:.2f} | {record.ms_median - step_ms + exposed_ms:+.2f} | "
                     f"{schedule.max_dmas_in_flight} |")
    return lines


def markdown(fit: KernelFit, command: str = COMMAND) -> str:
    lines = ["# TPU v5e: predicted vs measured on the K3-shard kernel records (issue 34)", "",
             "Generated by:", "", "```bash", command, "```", "",
             f"({fit.engine_runs} engine runs, {fit.seconds:.0f} s on the shared 2-core CPU host.) Records: "
             f"`{Path(fit.path).name}`, rows `shard_of: k3-tp32` and `decoder: {fit.decoder}` (one device's program of K3's TP32 plan, real "
             "widths, 93 layers, context 1024, the kernel router's own routing replayed), repeated runs merged by "
             f"median: {len(fit.records)} points. Measured ms is the kernel's median step (host launch included). "
             "Error = (predicted - measured) / measured. Labels: (a) *simulated, published/assumed figures*; (b) "
             "*simulated with figures measured on tpu-v5e by probes* (three of them *derived* from the kernel's "
             "fixed-cost probe runs, none a decode); (c) *simulated, "
             f"{LABEL}* (each held-out row by a refit that never saw it).", "",
             "## Probe figures (way b)", "", "| figure | on tpu-v5e | source and rule |", "| --- | ---: | --- |"]
    for path, figure in fit.probe_figures.items():  # the whole source: its "derived (...)" part included
        lines.append(f"| `{path}` | {figure['value']:.4g} | {figure['source']} |")
    lines += ["", "## Summary", "", *summary_lines(fit), "", "## Reading", "", *NOTES, kernel_note(fit.decoder),
              *LATER_NOTES, fixed_cost_note(fit.decoder), "",
              "## Intervals (way c, held out)", "",
              *coverage_lines(fit), "", "## Fitted figures (way c)", "", *fitted_lines(fit), "",
              "## Where the probe model goes wrong (way b, batch 1 and 8)", "", *EXPOSURE_NOTES, "",
              *exposure_lines(fit)]
    for way, title in WAY_TITLES.items():
        if way in fit.ways:
            lines += ["", f"## {title}", "", *way_table(fit, way)]
    return "\n".join(lines) + "\n"


def heldout_reference(fit: KernelFit, command: str = COMMAND) -> dict[str, Any]:
    """What the guard test re-predicts: per split, each fold's fitted figures, its held-out
    points, and the documented held-out MAPE."""
    out: dict[str, Any] = {
        "what": "way (c) of calibration.sources.tpu_kernel_fit: each fold's fitted figures (fit on the records "
                "outside the fold) and the held-out MAPE documented in docs/tpu-v5e-measured.md; read by "
                "tests/test_tpu_v5e_records.py and the demo's 'Measured on a real TPU' section",
        "command": command, "fitted": fit.fitted, "values_all": fit.values(), "splits": {}}
    for split in SPLITS:
        way = f"c:{split}"
        if way not in fit.ways:
            continue
        entry: dict[str, Any] = {"documented_mape": fit.mape(way), "folds": {}}
        for fold in fit.folds:
            if fold.dimension != split:
                continue
            entry["folds"][fold.value] = {"values": fold.values, "held": [
                {"schedule": fit.records[i].schedule, "batch": fit.records[i].batch, "predicted_ms": p}
                for i, p in zip(fold.points, fold.predicted, strict=True)]}
        cover = fit.coverage.get(split)
        if cover is not None:
            entry["coverage"] = cover.empirical
            entry["mean_width_rel"] = cover.mean_width_rel
        out["splits"][split] = entry
    return out


def plot(fit: KernelFit, path: Path, way: str = "c:schedule") -> Path:
    """:func:`calibration.reports.tpu_v5e_replay.scatter` of ``way`` (held out) beside way (b)."""
    widths = fit.intervals.get(way, {})
    rows = [{"heldout_ms": fit.ways[way][i], "measured_ms": fit.records[i].ms_median, "probes_ms": fit.ways["b"][i],
             "half_width": widths.get(i, 0.0)} for i in sorted(fit.ways[way])]
    return scatter(rows, path, f"K3 TP32 shard on one TPU v5e, the {fit.decoder} kernel\n"
                   f"predicted vs measured ({way[2:]} halves held out)")


def command_for(args: argparse.Namespace) -> str:
    """The command line a page says generated it: :data:`COMMAND` for the calibration decoder,
    else the one with ``--decoder`` and the outputs asked for."""
    if args.decoder == CALIBRATION_DECODER:
        return COMMAND
    outputs = [f"--{name} {value}" for name in ("out", "json", "heldout", "plot") if (value := getattr(args, name))]
    return " ".join(["JAX_PLATFORMS=cpu .venv/bin/python -m calibration.reports.tpu_v5e", f"--decoder {args.decoder}",
                     *outputs])


def main(argv: Sequence[str] | None = None) -> None:
    from calibration.reports.tpu_v5e_decoders import EARLIER_DECODER

    parser = argparse.ArgumentParser(allow_abbrev=False, description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--records", type=Path, default=KERNEL_PATH, help="the kernel records (JSONL)")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown tables here")
    parser.add_argument("--json", type=Path, default=None, help="write the full result as JSON here")
    parser.add_argument("--heldout", type=Path, default=None, help="write the guard test's reference here")
    parser.add_argument("--plot", type=Path, default=None, help="write the scatter plot (PNG) here")
    parser.add_argument("--no-first-principles", action="store_true",
                        help="leave out the first-principles tables of the kernel's builds (minutes of simulation)")
    parser.add_argument("--decoder", choices=(CALIBRATION_DECODER, EARLIER_DECODER), default=CALIBRATION_DECODER,
                        help=f"the expert decoder whose records and probes the study reads (default "
                             f"{CALIBRATION_DECODER}, the kernel as it is now; {EARLIER_DECODER}: the earlier kernel)")
    args = parser.parse_args(argv)
    fit = calibrate_kernel_records(args.records, progress=lambda line: sys.stderr.write(line + "\n"),
                                   decoder=args.decoder)
    command = command_for(args)
    text = markdown(fit, command)
    if args.out:
        # the sensitivity tables (their own commands, minutes of refits) are kept where the page had them
        page = args.out.read_text() if args.out.is_file() else ""
        for begin, end in ((SENSITIVITY_BEGIN, SENSITIVITY_END), (FP_BEGIN, FP_END)):
            kept = kept_block(page, begin, end)
            text = put_block(text, kept, begin, end) if kept else text
        write_text_atomic(args.out, text)
    if args.heldout:
        args.heldout.write_text(json.dumps(heldout_reference(fit, command), indent=1) + "\n")
    if args.json:
        args.json.write_text(json.dumps(fit.to_json(), indent=1, default=float) + "\n")
    if args.plot:
        plot(fit, args.plot)
    sys.stdout.write(text)
    if not args.no_first_principles:
        sys.stdout.write(first_principles_text())


def first_principles_text() -> str:
    """Every build of the kernel's decoder predicted from first principles (micro-probes and
    libtpu's static schedule, no kernel run), way (b) beside it, and the capped runs held out
    (:mod:`calibration.reports.tpu_v5e_first_principles`): printed, not written into the page."""
    from calibration.reports import tpu_v5e_first_principles as fp

    parts = ["", "## The kernel as it is, from first principles (simulated after the runs; measured on tpu-v5e)", ""]
    for unroll, listed in fp.builds():
        sys.stderr.write(f"first principles: build {unroll[0]}/{unroll[1]}, {listed} expert list\n")
        parts += [*fp.report_lines(unroll, listed), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    main()
