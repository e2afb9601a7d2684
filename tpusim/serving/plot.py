"""The serving plot: output tokens/s per chip against tokens/s per user, one curve per system.

Each point is one traffic level (a concurrency, labelled next to it); up and to the right is
better. The plot serving teams read to find "users per chip at my latency target".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

from tpusim.report.figures import save_png

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_serving_curves(rows: list[dict[str, Any]], path: Path, *, title: str) -> Path:
    """Write the throughput-latency curves of ``rows`` (:func:`tpusim.serving.serve.serving_rows`)
    to ``path`` (PNG) atomically."""
    fig, ax = plt.subplots(figsize=(7.0, 5.0))
    for system in dict.fromkeys(row["system"] for row in rows):
        points = sorted(((r["tokens_per_s_per_user"], r["output_tokens_per_s_per_chip"], r["traffic"])
                         for r in rows if r["system"] == system and r["completed"]), key=lambda p: p[0])
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
        for user, chip, label in points:
            ax.annotate(label.replace("concurrency ", "c="), (user, chip), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("output tokens/s per user (1 / TPOT, simulated)")
    ax.set_ylabel("output tokens/s per chip (simulated)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)
