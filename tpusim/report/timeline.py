"""A timeline PNG: a few layers as a Gantt chart, the VMEM occupancy curve under it.

``plot_timeline(timeline, "out.png", first_layer=1, layers=3)`` draws, for the window from
the start of ``first_layer`` to the start of ``first_layer + layers`` on the compute stream:

- top: one row per resource track (MXU, VPU, stream waits, each in-flight DMA slot, each
  link), a bar per interval, coloured by what it is (attention, MoE dense, routed experts,
  dense MLP / head, copies, collectives, waits); dotted lines at layer starts;
- bottom: VMEM occupancy (MiB) as a step curve, with the usable capacity as a dashed line.

Rendered with matplotlib's non-interactive Agg backend (no display needed) and written
atomically (:func:`hwmodels.atomic.write_bytes_atomic`). Times on the axis are
milliseconds from the start of the step; every number drawn is *simulated*.
:func:`plot_timelines` stacks several timelines (two schedules, ``tpusim diff``) on one time
axis.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported: no display needed
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from hwmodels.atomic import write_bytes_atomic
from hwmodels.units import MIB
from tpusim.engine.timeline import Timeline

MS_PER_S = 1e3
COLORS = {
    "attention": "#4C72B0",
    "moe": "#55A868",
    "expert": "#8172B2",
    "mlp": "#C44E52",
    "copy": "#CCB974",
    "link": "#64B5CD",
    "wait": "#DD8452",
}
LEGEND = (("attention", "attention"), ("moe", "MoE dense"), ("expert", "routed experts"),
          ("mlp", "dense MLP / head"), ("copy", "copies"), ("link", "collectives"), ("wait", "stalls"))


def _category(track: str, label: str) -> str:
    if track == "wait":  # stalls on copies, or the stream held by a blocking collective
        return "wait" if label.startswith("wait") else "link"
    if track.startswith("dma"):
        return "copy"
    if track.startswith("link"):
        return "link"
    if label.startswith("expert"):
        return "expert"
    if label.startswith(("kda", "mla", "gqa", "attn")):
        return "attention"
    if label.startswith("moe"):
        return "moe"
    return "mlp"


def _track_rank(track: str) -> tuple[int, int, str]:
    fixed = {"mxu": 0, "vpu": 1, "wait": 2}
    if track in fixed:
        return (0, fixed[track], track)
    if track.startswith("dma"):
        lane = track.split()[-1]
        return (1, int(lane) if lane.isdigit() else 999, track)
    return (2, 0, track)


def _draw_gantt(gantt: Any, timeline: Timeline, start_s: float, end_s: float, *,
                legend: bool) -> list[str]:
    """Bars of every track active in [start_s, end_s); returns the tracks drawn."""
    tracks = sorted((t for t, spans in timeline.tracks.items()
                     if any(s < end_s and e > start_s for s, e, _ in spans)), key=_track_rank)
    for row, track in enumerate(tracks):
        bars, colors = [], []
        for s, e, label in timeline.tracks[track]:
            if e <= start_s or s >= end_s:
                continue
            bars.append((s * MS_PER_S, (e - s) * MS_PER_S))
            colors.append(COLORS[_category(track, label)])
        if bars:
            gantt.broken_barh(bars, (row - 0.4, 0.8), facecolors=colors, linewidth=0)
    gantt.set_yticks(range(len(tracks)), tracks, fontsize=7)
    gantt.set_ylim(len(tracks) - 0.5, -0.5)
    for layer, time_s in timeline.layer_starts:
        if start_s <= time_s <= end_s:
            gantt.axvline(time_s * MS_PER_S, color="grey", linestyle=":", linewidth=0.8)
            gantt.text(time_s * MS_PER_S, len(tracks) - 0.55, " head" if layer < 0 else f" L{layer}",
                       fontsize=7, va="bottom", color="grey")
    if legend:
        gantt.legend(handles=[Patch(color=COLORS[key], label=text) for key, text in LEGEND],
                     loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=7, ncol=len(LEGEND), frameon=False)
    return tracks


def _draw_vmem(vmem: Any, timeline: Timeline, start_s: float, end_s: float) -> None:
    """VMEM occupancy as a step curve with the usable capacity dashed."""
    samples = timeline.counters.get("vmem_bytes", [])
    times = [t * MS_PER_S for t, _ in samples]
    values = [v / MIB for _, v in samples]
    if samples:
        times.append(timeline.step_s * MS_PER_S)
        values.append(values[-1])
        vmem.step(times, values, where="post", color="#333333", linewidth=1.0, label="occupancy")
    if timeline.vmem_capacity_bytes:
        vmem.axhline(timeline.vmem_capacity_bytes / MIB, color="#C44E52", linestyle="--",
                     linewidth=1.0, label="usable capacity")
    for _, time_s in timeline.layer_starts:
        if start_s <= time_s <= end_s:
            vmem.axvline(time_s * MS_PER_S, color="grey", linestyle=":", linewidth=0.8)
    vmem.set_ylabel("VMEM MiB", fontsize=8)
    vmem.set_xlim(start_s * MS_PER_S, end_s * MS_PER_S)
    vmem.legend(loc="lower right", fontsize=7)


def _track_count(timeline: Timeline, start_s: float, end_s: float) -> int:
    return sum(1 for spans in timeline.tracks.values() if any(s < end_s and e > start_s for s, e, _ in spans))


def plot_timeline(timeline: Timeline, path: Path | str, *, first_layer: int = 1, layers: int = 3,
                  title: str = "") -> Path:
    """Draw ``layers`` layers from ``first_layer`` (see the module docstring); returns the path."""
    return plot_timelines([("", timeline)], path, first_layer=first_layer, layers=layers, title=title)


def plot_timelines(timelines: list[tuple[str, Timeline]], path: Path | str, *, first_layer: int = 1,
                   layers: int = 3, title: str = "") -> Path:
    """One figure with a Gantt chart and a VMEM curve per (label, timeline), stacked on one
    time axis: the window runs from the earliest start of ``first_layer`` to the latest end
    of its ``layers`` layers, so two schedules are compared at the same scale."""
    windows = [timeline.layer_window(first_layer, layers) for _, timeline in timelines]
    start_s, end_s = min(w[0] for w in windows), max(w[1] for w in windows)
    ratios: list[float] = []
    for _, timeline in timelines:
        ratios += [max(1.0, 1.6 + 0.28 * max(1, _track_count(timeline, start_s, end_s))), 2.0]
    figure, axes = plt.subplots(len(ratios), 1, sharex=True, figsize=(12, sum(ratios) + 0.6),
                                gridspec_kw={"height_ratios": ratios}, squeeze=False)
    try:
        for index, (label, timeline) in enumerate(timelines):
            gantt, vmem = axes[2 * index][0], axes[2 * index + 1][0]
            _draw_gantt(gantt, timeline, start_s, end_s, legend=index == 0)
            _draw_vmem(vmem, timeline, start_s, end_s)
            if label:
                gantt.set_title(label, fontsize=8, loc="right")
        axes[-1][0].set_xlabel("time from step start, ms (simulated)", fontsize=8)
        figure.suptitle(title or f"simulated timeline, layers {first_layer}..{first_layer + layers - 1}",
                        fontsize=9)
        figure.tight_layout()
        return _save_atomic(figure, Path(path))
    finally:
        plt.close(figure)


def _save_atomic(figure: plt.Figure, target: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=120, format="png")
    return write_bytes_atomic(target, buffer.getvalue())  # the one output-path owner
