"""Saving a matplotlib figure: one PNG, written atomically, the figure closed whatever happens."""

from __future__ import annotations

import io
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
