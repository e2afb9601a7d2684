"""TPU v5e probe records -> measured chip figures (way (b) of :mod:`calibration.reports.tpu_v5e`).

``calibration/data/tpu-v5e-probes.jsonl`` holds micro-benchmarks run on one TPU v5e
(:mod:`calibration.tpu_bench.probes`, ``probes_dma``, ``probes_compute``: each record's
``what`` says what it measures). This module turns them into figures of the chip and
nothing else: it never reads a kernel step time (``tests/test_tpu_v5e_records.py`` checks).

| figure | probe | rule |
| --- | --- | --- |
| ``hbm.sustained_bandwidth_bytes_per_s`` | ``dma_stream`` | median of the whole-call rate of the copies of >= 4 MiB (any depth), the empty call's time subtracted: the plateau large copies saturate at |
| ``dma.issue_latency_s`` | ``dma_latency`` | 4 KiB copies one in flight: (call - empty call) / copies, less the copy's transfer (the engine's issue-to-first-byte latency) |
| ``compute.vpu.dequant_s_per_element.fp8_e4m3_b256`` | ``dequant_fp8_gate_up`` | (t(R=16) - t(R=4)) / (elements(16) - elements(4)): the per-panel loop the kernel runs, call overhead cancelled |
| ``compute.vpu.dequant_s_per_element.mxfp4`` | ``dequant_mxfp4_down`` | the same |
| ``execution.per_step_overhead_s`` | ``empty_call`` | median of the empty pallas_call records (launch + dispatch + sync from the host; a measured step pays it once) |
| ``execution.per_layer_overhead_s`` | ``layer_loop`` | least-squares slope of whole-call time over L empty layers (0 … 93), clipped at 0: the loop and semaphore bookkeeping of one layer (below the probe's noise on v5e: a standard error of about 0.4 µs) |
| ``compute.mxu.weight_push_s_per_tile`` | ``matmul`` | at 8 rows (one sublane tile: every decode batch up to 8), panel-loop form: per kernel shape the seconds of one panel's product ((t(R=64) - t(R=8)) / 56 matmuls / panels); least squares of that over the 128 x 128 tiles down a panel (K / 128), across the shapes: the slope |
| ``compute.mxu.dot_overhead_s`` | ``matmul`` | the same fit's intercept: what one product costs besides its pushes (fill, drain, the loop step), which a kernel pays per panel and input chunk |
| ``dma.service`` (not a number) | ``dma_order`` | per number of 1 MiB copies ahead (2, 8): the 64 KiB copy's time behind them less its time alone, over the large copies' own time (each over the probe's iterations, at the longest VPU chain); ``in_order`` when the median is over 1/2 (it waited for them), else ``shared``; see :func:`dma_service` |
| ``dma.concurrency_penalty_per_dma`` | ``dma_stream`` | per copy size >= 1 MiB: ((t(8 in flight) - empty) / (t(4 in flight) - empty) - 1) / 4, clipped at 0; the median over sizes (8 copies in flight move as fast as 4 on v5e: 0) |

Rates subtract the empty call, as the probes' own notes say (``probes_dma``: "whole-call
wall time, launch included: subtract empty_call"): the whole-call plateau of 512 MiB of
large copies is 414–426 GB/s, the copies alone ≈ 0.75–0.78 TB/s. ``dma_issue`` (4 KiB
copies 8 and 16 in flight: ≈ 24 ns per copy at 16) measures a per-copy issue throughput the
engine has no figure for (its DMA issue is a latency, not a serial cost): reported by
:func:`issue_throughput_s`, not applied.

Each figure is labelled ``measured on tpu-v5e (probe <name>, <date>)``. :func:`probe_overlay`
writes them as the chip's overlay through the one overlay mechanism
(:mod:`hwmodels.overlay`; loading it labels them ``calibrated``, fitted on the probes),
:func:`probe_chip` returns the chip with them in place, labelled ``measured``.

**Which decoder.** The kernel's expert decoders changed on 2026-12-06 (``bytes`` ->
``words32``, :data:`megakernel.quant_pairs.KERNEL_DECODER`; the dequant probes time both, each
record's ``params.decoder``, none = ``bytes``). Every loader here takes ``decoder``: the
dequant figures are that decoder's, every other figure is shared. The default,
:data:`CALIBRATION_DECODER`, is the decoder of the kernel as it is now (``words32``): the
calibration study (:mod:`calibration.reports.tpu_v5e`) runs on its K3-shard decode records
and its own fixed-cost runs. The ``bytes`` kernel's records (through 2026-12-05) stay in the
same files as history: :mod:`calibration.reports.tpu_v5e_decoders` sets the two kernels side
by side, and any loader reads them with ``decoder="bytes"``.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.core.fitting import fit_line, median
from calibration.core.overlay_builder import build_overlay, fitted_figure, write_overlay
from hwmodels.overlay import CalibrationOverlay, _figure_slot
from hwmodels.schema import Chip

PROBES_PATH = Path(__file__).resolve().parents[1] / "data" / "tpu-v5e-probes.jsonl"
LARGE_COPY_BYTES = 4 << 20  # copies at least this large sit on the bandwidth plateau
SESSION_GAP_S = 30 * 60  # probe records further apart than this ran in different device sessions
DEQUANT_PROBES = {"dequant_fp8_gate_up": "fp8_e4m3_b256", "dequant_mxfp4_down": "mxfp4"}
SUSTAINED = "hbm.sustained_bandwidth_bytes_per_s"
ISSUE = "dma.issue_latency_s"
PER_STEP = "execution.per_step_overhead_s"
PER_LAYER = "execution.per_layer_overhead_s"
PUSH = "compute.mxu.weight_push_s_per_tile"
DOT = "compute.mxu.dot_overhead_s"
PENALTY = "dma.concurrency_penalty_per_dma"
MXU_TILE = 128  # tpu-v5e's MXU tile (the catalog's tile_rows x tile_cols): the push figure is per such tile
PUSH_ROWS = 8  # the row pad: decode batches 1 … 8 stream 8 rows through each loaded tile
CALIBRATION_DECODER = "words32"  # the kernel as it is now: the study's decode and fixed-cost records (module docstring)


def record_decoder(record: dict[str, Any]) -> str:
    """The expert decoder a probe or kernel record ran (records before 2026-12-06 say none: ``bytes``)."""
    return str(record.get("params", {}).get("decoder") or record.get("decoder") or "bytes")
PENALTY_MIN_BYTES = 1 << 20  # copies this large are bandwidth-bound at 4 in flight


def dequant_path(format_name: str) -> str:
    return f"compute.vpu.dequant_s_per_element.{format_name}"


@dataclass(frozen=True)
class ProbeFigure:
    """One figure measured by probes: its value and where it came from."""

    path: str
    value: float
    probe: str
    date: str
    rule: str
    points: int

    @property
    def source(self) -> str:
        return f"measured on tpu-v5e (probe {self.probe}, {self.date}): {self.rule}"


def load_probes(path: Path | str = PROBES_PATH, decoder: str = CALIBRATION_DECODER) -> list[dict[str, Any]]:
    """The probe records that ran and checked out (``check: ok``); of the dequant probes, only
    ``decoder``'s."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("kind") == "probe" and r.get("check", "ok") == "ok"
            and (r.get("probe") not in DEQUANT_PROBES or record_decoder(r) == decoder)]


def _date(records: list[dict[str, Any]]) -> str:
    return min(str(r.get("date", ""))[:10] for r in records)


def probe_figures(records: list[dict[str, Any]]) -> dict[str, ProbeFigure]:
    """Every figure the probes measure, by chip path (see the module docstring)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by.setdefault(record["probe"], []).append(record)
    out: dict[str, ProbeFigure] = {}
    empty = by.get("empty_call", [])
    empty_s = median(r["seconds_median"] for r in empty) if empty else 0.0
    if empty:
        out[PER_STEP] = ProbeFigure(PER_STEP, empty_s, "empty_call", _date(empty),
                                    "median of the empty pallas_call records", len(empty))
    large = [r for r in by.get("dma_stream", []) if r["params"]["size_bytes"] >= LARGE_COPY_BYTES]
    if large:
        rates = [_bytes_moved(r) / max(r["seconds_median"] - empty_s, 1e-9) for r in large]
        out[SUSTAINED] = ProbeFigure(
            SUSTAINED, median(rates), "dma_stream", _date(large),
            f"median HBM->VMEM rate of the {len(large)} stream points with copies >= 4 MiB "
            "(bytes copied / (call - empty call))", len(large))
    latency = [r for r in by.get("dma_latency", []) if r["params"]["in_flight"] == 1]
    if latency:
        # one copy in flight: (call - empty call) / copies is one round trip (issue, a 4 KiB
        # transfer, semaphore wait); the engine's issue latency is that less the transfer
        point = latency[0]
        rate = out[SUSTAINED].value if SUSTAINED in out else float("inf")
        round_trip = (point["seconds_median"] - empty_s) / point["params"]["copies"]
        out[ISSUE] = ProbeFigure(
            ISSUE, max(round_trip - point["params"]["size_bytes"] / rate, 0.0), "dma_latency", _date([point]),
            f"(call - empty call) / copies of {point['params']['size_bytes']} B copies one in flight, "
            "less one copy's transfer at the sustained rate", 1)
    out.update(_architecture_figures(by, empty_s))
    for probe, format_name in DEQUANT_PROBES.items():
        pairs = []  # (low, high) of one session each
        for session in sessions(by.get(probe, [])):
            points = sorted(session, key=lambda r: r["params"]["repeats_in_kernel"])
            if len({r["params"]["repeats_in_kernel"] for r in points}) >= 2:
                pairs.append((next((r for r in points if r["params"]["repeats_in_kernel"] == 4), points[-2]), points[-1]))
        if not pairs:
            continue
        rates = [(high["seconds_median"] - low["seconds_median"]) / (high["elements"] - low["elements"])
                 for low, high in pairs]
        low, high = pairs[-1]
        path = dequant_path(format_name)
        out[path] = ProbeFigure(
            path, median(rates), probe, _date([r for pair in pairs for r in pair]),
            f"(t(R={high['params']['repeats_in_kernel']}) - t(R={low['params']['repeats_in_kernel']})) / "
            f"elements between them, both from one device session, median over {len(pairs)} session(s); "
            f"per-panel loop form, the kernel's {record_decoder(high)} decoder", 2 * len(pairs))
    return out


def sessions(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``records`` split into device sessions: by date, a new one after a gap of more than
    :data:`SESSION_GAP_S` (a session's probes run within minutes of each other)."""
    out: list[list[dict[str, Any]]] = []
    last: dt.datetime | None = None
    for r in sorted(records, key=lambda r: str(r.get("date", ""))):
        when = dt.datetime.fromisoformat(r["date"]) if r.get("date") else None
        if not out or when is None or last is None or (when - last).total_seconds() > SESSION_GAP_S:
            out.append([])
        out[-1].append(r)
        last = when
    return out


def _repeat_slope(points: list[dict[str, Any]]) -> float | None:
    """Seconds per repeat between the two largest ``repeats_in_kernel`` of one probe shape,
    both from one device session; the median over the sessions that ran both (a pair from two
    sessions would carry the sessions' difference in launch and clock state into the slope)."""
    slopes = []
    for session in sessions(points):
        by_r = {r["params"]["repeats_in_kernel"]: r["seconds_median"] for r in session}
        if len(by_r) >= 2:
            high, low = sorted(by_r)[-1], sorted(by_r)[-2]
            slopes.append((by_r[high] - by_r[low]) / (high - low))
    return median(slopes) if slopes else None


def _architecture_figures(by: dict[str, list[dict[str, Any]]], empty_s: float) -> dict[str, ProbeFigure]:
    """Per-layer cost, MXU push per tile and the DMA concurrency penalty (module table)."""
    out: dict[str, ProbeFigure] = {}
    loop = by.get("layer_loop", [])
    if len({r["params"]["layers"] for r in loop}) >= 2:
        slope = fit_line([r["params"]["layers"] for r in loop], [r["seconds_median"] for r in loop]).slope
        out[PER_LAYER] = ProbeFigure(
            PER_LAYER, max(slope, 0.0), "layer_loop", _date(loop),
            f"least-squares slope of whole-call time over {len(loop)} empty-layer counts "
            f"({slope * 1e6:+.2f} µs per layer), clipped at 0", len(loop))
    shapes: dict[str, list[dict[str, Any]]] = {}
    for r in by.get("matmul", []):
        if r["params"]["rows"] == PUSH_ROWS and r["params"].get("dtype", "bf16") == "bf16":
            shapes.setdefault(r["params"]["shape"], []).append(r)
    depth, per_product = [], []  # per shape: weight tiles down one panel, seconds per panel product
    for points in shapes.values():
        slope = _repeat_slope(points)
        params = points[0]["params"]
        if slope is not None and slope > 0:
            depth.append(-(-params["k"] // MXU_TILE))
            per_product.append(slope / -(-params["n"] // MXU_TILE))
    if len(set(depth)) >= 2:
        line = fit_line(depth, per_product)
        push, fixed = line.slope, line.intercept
        used = [p for points in shapes.values() for p in points]
        rule = (f"bf16 matmuls at {PUSH_ROWS} rows on VMEM-resident weights, one product per 128-column panel: "
                f"seconds per product (difference of the two largest repeat counts / panels) = fixed + push x "
                f"{MXU_TILE}x{MXU_TILE} tiles down the panel, least squares over {len(depth)} kernel shapes")
        out[PUSH] = ProbeFigure(PUSH, push, "matmul", _date(used), f"{rule}: the slope", len(used))
        out[DOT] = ProbeFigure(DOT, max(fixed, 0.0), "matmul", _date(used), f"{rule}: the intercept", len(used))
    sizes: dict[int, dict[int, float]] = {}
    for r in by.get("dma_stream", []):
        if r["params"]["size_bytes"] >= PENALTY_MIN_BYTES:
            sizes.setdefault(r["params"]["size_bytes"], {})[r["params"]["in_flight"]] = r["seconds_median"]
    ratios = [max(0.0, ((d[8] - empty_s) / (d[4] - empty_s) - 1.0) / 4) for d in sizes.values() if 4 in d and 8 in d]
    if ratios:
        out[PENALTY] = ProbeFigure(
            PENALTY, median(ratios), "dma_stream", _date(by["dma_stream"]),
            f"copies >= 1 MiB, 8 vs 4 in flight, empty call subtracted: loss per copy beyond 4, "
            f"clipped at 0, median over {len(ratios)} sizes", 2 * len(ratios))
    return out


def issue_throughput_s(records: list[dict[str, Any]]) -> float | None:
    """Seconds per 4 KiB copy at the deepest ``dma_issue`` point, empty call subtracted."""
    issue = [r for r in records if r["probe"] == "dma_issue"]
    empty = [r["seconds_median"] for r in records if r["probe"] == "empty_call"]
    if not issue:
        return None
    deepest = max(issue, key=lambda r: r["params"]["in_flight"])
    return float((deepest["seconds_median"] - (median(empty) if empty else 0.0))
                 / deepest["params"]["copies"])


def _bytes_moved(record: dict[str, Any]) -> float:
    """HBM bytes one stream probe reads (copies x size, the record's ``bytes``)."""
    return float(record["params"]["copies"] * record["params"]["size_bytes"])


def probe_overlay(chip_name: str = "tpu-v5e", path: Path | str = PROBES_PATH) -> CalibrationOverlay:
    """The probe figures as an overlay of ``chip_name`` (fitted on the probes, no step time)."""
    figures = probe_figures(load_probes(path))
    return build_overlay(
        chip_name,
        f"measured on tpu-v5e: {sum(f.points for f in figures.values())} probe records "
        f"({', '.join(sorted({f.probe for f in figures.values()}))}); no kernel step time",
        {p: fitted_figure(f.value, fitted_on=f.source) for p, f in figures.items()},
        measurements=str(Path(path).name),
    )


def probe_chip(chip: Chip, path: Path | str = PROBES_PATH, decoder: str = CALIBRATION_DECODER) -> Chip:
    """``chip`` with the probe figures in place, each labelled ``measured`` with a source naming
    its probe and date, and the DMA service order the ``dma_order`` probe shows (the chip's
    ``calibration`` stays None: nothing here was fitted)."""
    data = chip.model_dump(mode="python")
    records = load_probes(path, decoder)
    for key, figure in probe_figures(records).items():
        parent, name = _figure_slot(data, key)
        parent[name] = {"value": figure.value, "source": figure.source, "label": "measured", "uncertainty": None}
    service = dma_service(records)
    if service is not None:
        data["dma"]["service"], data["dma"]["service_source"] = service
    return Chip.model_validate(data)


def dma_service(records: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(``dma.service``, its source) from the ``dma_order`` records, or None without them.

    At the longest VPU chain (longer than the large copies, so an iteration lasts the small
    copy's wait plus the chain), per number ``F`` of large copies ahead: ``behind`` = the
    64 KiB copy's extra time per iteration with ``F`` large copies issued before it,
    ``alone`` = the same with none, ``large`` = the ``F`` large copies' own time per iteration
    (no chain, no small copy, less the empty loop). Served in issue order the small copy
    waits for them all (``(behind - alone) / large`` ≈ 1); shared, it moves alongside them
    (≈ (F + 1) x 64 KiB / F MiB, under 0.1)."""
    order = [r for r in records if r["probe"] == "dma_order"]
    if not order:
        return None
    chain = max(r["params"]["chain_iterations"] for r in order)
    keyed = {(r["params"]["large_copies"], r["params"]["small_copy"], r["params"]["chain_iterations"]): r
             for r in order}  # a later session's point replaces an earlier one's
    by = {key: r["seconds_median"] / r["params"]["iterations"] for key, r in keyed.items()}
    alone = by[(0, 1, chain)] - by[(0, 0, chain)]
    ratios, counts = [], sorted({k[0] for k in by if k[0] > 0 and (k[0], 1, chain) in by})
    for copies in counts:
        large = by[(copies, 0, 0)] - by[(0, 0, 0)]
        behind = by[(copies, 1, chain)] - by[(copies, 0, chain)]
        ratios.append((behind - alone) / large)
    ratio = median(ratios)
    service = "in_order" if ratio > 0.5 else "shared"
    detail = ", ".join(f"{x:.2f}" for x in ratios)
    used = [keyed[k] for k in keyed if k[2] in (0, chain) and (k[0] == 0 or k[0] in counts)]
    dates = sorted({str(r.get("date", ""))[:10] for r in used})
    return service, (f"measured on tpu-v5e (probe dma_order, {' and '.join(dates)}): a 64 KiB copy issued behind "
                     f"{' / '.join(map(str, counts))} copies of 1 MiB waits {detail} of their own transfer time ({service})")


def main(argv: list[str] | None = None) -> None:
    """``python -m calibration.sources.tpu_probes [--save] [--probes PATH]``: print the probe
    figures; ``--save`` writes them as the tpu-v5e overlay (the one writer,
    :func:`calibration.core.overlay_builder.write_overlay`),
    so ``tpusim simulate --hardware tpu-v5e`` runs on them."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(allow_abbrev=False, description="TPU v5e probe records -> measured chip figures")
    parser.add_argument("--probes", type=Path, default=PROBES_PATH, help="the probe records (JSONL)")
    parser.add_argument("--save", action="store_true", help="write the figures as the tpu-v5e overlay")
    args = parser.parse_args(argv)
    for figure in probe_figures(load_probes(args.probes)).values():
        sys.stdout.write(f"{figure.path} = {figure.value:.6g}  ({figure.source})\n")
    if args.save:
        sys.stdout.write(f"saved {write_overlay(probe_overlay('tpu-v5e', args.probes))}\n")


if __name__ == "__main__":
    main()
