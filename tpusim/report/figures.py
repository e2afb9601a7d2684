"""Figures: saving one PNG atomically (the figure closed whatever happens), and one colour per
label that never repeats within a figure."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hwmodels.atomic import write_bytes_atomic


def save_png(fig: Any, path: Path, *, dpi: int = 110, **savefig: Any) -> Path:
    """Render ``fig`` to PNG in memory, close it, and write ``path`` by temp file + rename."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi, **savefig)
    finally:
        plt.close(fig)
    return write_bytes_atomic(path, buffer.getvalue())


def distinct_colours(labels: Sequence[str]) -> dict[str, Any]:
    """One colour per label, none repeated: ``tab10`` for up to 10 labels, ``tab20`` (its light and
    dark pairs) up to 20, evenly spaced hues beyond (a joint sweep's plot has 13 or more plans)."""
    import matplotlib.pyplot as plt

    count = len(labels)
    if count <= 10:
        return {label: plt.get_cmap("tab10")(i) for i, label in enumerate(labels)}
    if count <= 20:
        return {label: plt.get_cmap("tab20")(i) for i, label in enumerate(labels)}
    return {label: plt.get_cmap("hsv")(i / count) for i, label in enumerate(labels)}
