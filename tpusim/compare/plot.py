"""Grouped bar chart of a comparison: tokens/s by batch, one bar per system, one panel per
speculation setting (none, then each acceptance length)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib

from hwmodels.atomic import write_bytes_atomic

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_comparison(rows: list[dict[str, Any]], path: Path, *, title: str) -> Path:
    """Write the chart to ``path`` (PNG) atomically; rows that do not fit are marked."""
    settings = list(dict.fromkeys(row["acceptance_length"] for row in rows))
    systems = list(dict.fromkeys(row["system"] for row in rows))
    batches = sorted({row["batch"] for row in rows})
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    width = 0.8 / max(1, len(systems))
    for ax, setting in zip(axes[0], settings, strict=True):
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
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(fig)
    return write_bytes_atomic(path, buffer.getvalue())
