"""Grouped bar charts of a comparison, one column per speculation setting (none, then each
acceptance length): tokens/s by batch with one bar per system on top, and under it where each
step's time goes (:mod:`tpusim.compare.breakdown`) as stacked bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

from tpusim.compare.breakdown import PARTS, where_ms
from tpusim.report.figures import save_png

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PART_COLORS = {"compute": "#4C72B0", "launches": "#DD8452", "batch growth": "#C44E52", "collectives": "#64B5CD",
               "exposed copies": "#CCB974", "other": "#8C8C8C", "drafting": "#8172B2"}


def _throughput_panel(ax: Any, rows: list[dict[str, Any]], setting: Any, systems: list[str],
                      batches: list[int]) -> None:
    width = 0.8 / max(1, len(systems))
    for index, system in enumerate(systems):
        values = []
        for batch in batches:
            match = [r for r in rows if r["system"] == system and r["batch"] == batch
                     and r["acceptance_length"] == setting]
            values.append(match[0]["tokens_per_s"] if match and match[0]["tokens_per_s"] else 0.0)
        xs = [b + (index - (len(systems) - 1) / 2) * width for b in range(len(batches))]
        bars = ax.bar(xs, values, width, label=system)
        for bar, value in zip(bars, values, strict=True):
            if value == 0.0:
                ax.annotate("does not fit", (bar.get_x() + bar.get_width() / 2, 0), rotation=90,
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("tokens/s (aggregate, simulated)" if setting is None else "accepted tokens/s (simulated)")
    ax.set_title("no speculation" if setting is None else f"speculative, acceptance length {setting:g}")
    ax.grid(axis="y", alpha=0.3)


def _breakdown_panel(ax: Any, rows: list[dict[str, Any]], setting: Any, systems: list[str],
                     batches: list[int]) -> None:
    """One stacked bar per (system, batch): the step's ms by part (tpusim.compare.breakdown)."""
    width = 0.8 / max(1, len(systems))
    labelled: set[str] = set()
    for index, system in enumerate(systems):
        bottoms = [0.0] * len(batches)
        xs = [b + (index - (len(systems) - 1) / 2) * width for b in range(len(batches))]
        parts_by_batch = []
        for batch in batches:
            match = [r for r in rows if r["system"] == system and r["batch"] == batch
                     and r["acceptance_length"] == setting]
            parts_by_batch.append(where_ms(match[0]) if match else None)
        for part in PARTS:
            heights = [(parts or {}).get(part, 0.0) for parts in parts_by_batch]
            if any(heights):
                ax.bar(xs, heights, width * 0.95, bottom=bottoms, color=PART_COLORS[part],
                       label=None if part in labelled else part, edgecolor="white", linewidth=0.3)
                labelled.add(part)
                bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        for x, system_label in zip(xs, [system] * len(xs), strict=True):
            ax.annotate(system_label, (x, 0), rotation=90, ha="center", va="bottom", fontsize=6,
                        color="white")
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("batch (sequences); one bar per system, in legend order above")
    ax.set_ylabel("step ms by part (simulated)")
    ax.grid(axis="y", alpha=0.3)


def plot_comparison(rows: list[dict[str, Any]], path: Path, *, title: str) -> Path:
    """Write the chart to ``path`` (PNG) atomically: throughput bars on top, and under each
    panel where the step time goes (stacked); rows that do not fit are marked."""
    settings = list(dict.fromkeys(row["acceptance_length"] for row in rows))
    systems = list(dict.fromkeys(row["system"] for row in rows))
    batches = sorted({row["batch"] for row in rows})
    fig, axes = plt.subplots(2, len(settings), figsize=(5.5 * len(settings), 8.0), squeeze=False)
    for column, setting in enumerate(settings):
        _throughput_panel(axes[0][column], rows, setting, systems, batches)
        _breakdown_panel(axes[1][column], rows, setting, systems, batches)
    axes[0][0].legend(fontsize=8)
    for panel in axes[1]:
        panel.legend(fontsize=7, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, path)
