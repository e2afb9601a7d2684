"""The one JSON-lines appender every record file goes through (kernel runs, probes,
predictions, static counts; the GPU harness keeps its own, it runs without the house): one
``O_APPEND`` write of the whole line, then ``fsync`` (:func:`hwmodels.atomic.append_bytes`), so a run stopped mid-way keeps every record it finished and never leaves half a
line; a file whose last line is already partial is refused rather than extended.

Pure standard library (and the project's one-line input error), so the device harnesses import
it without JAX or the simulator.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hwmodels.atomic import append_bytes
from hwmodels.errors import InputError


def record_line(record: Any, *, sort_keys: bool = False, ensure_ascii: bool = True) -> str:
    """``record`` as one JSON line (no newline), in the records' one format."""
    return json.dumps(record, separators=(", ", ": "), sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def append_record(path: Path | str, record: Any, *, sort_keys: bool = False, ensure_ascii: bool = True) -> None:
    """Append ``record`` to ``path`` as one JSON line (module docstring); creates the file and
    its folder. Raises :class:`~hwmodels.errors.InputError` for a file whose last line is partial."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                raise InputError(f"{path}: last line is partial (an interrupted write?); not appending")
    append_bytes(path, (record_line(record, sort_keys=sort_keys, ensure_ascii=ensure_ascii) + "\n").encode())
