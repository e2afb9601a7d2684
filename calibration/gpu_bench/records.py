"""The harness's measurement records, as plain dicts (no pydantic).

Every timing here follows one recipe (:func:`time_call`, the record layer's
:func:`hwmodels.records.timing.sample_seconds`): ``warmup`` untimed calls (compile, allocate,
warm caches), then ``repeats`` timed samples, each the wall time of ``inner`` back-to-back
calls divided by ``inner``, ending with ``block_until_ready``. The record keeps the median
and half the inter-quartile range (``spread_kind: iqr/2``), and the fastest sample in
``extra.min_ms`` (:func:`hwmodels.records.timing.summarise`).

:func:`measurement` writes the dict of one :class:`calibration.sources.measurements.Measurement`
line by hand (the harness runs where pydantic is absent); ``tests/test_gpu_bench.py``
validates the harness's output with the pydantic model, so the two cannot drift apart.
Micro-benchmarks use the same record with a ``bench:`` model name
(``bench:copy[bytes=65536]``, ``bench:gap-compiled[ops=64]``,
``bench:matmul@bf16[k=2048,n=8192]`` with ``batch`` = the matmul's rows) and say what they
are in ``extra.kind`` (``copy``, ``gap_eager``, ``gap_compiled``, ``matmul``,
``decode_step``). Lines are appended by the record layer's one writer
(:func:`hwmodels.records.jsonl.append_record`); the layer is standard library only, so the
GPU host's bare Python imports it (``tests/test_gpu_bench.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwmodels.records.jsonl import append_record
from hwmodels.records.timing import Timing, sample_seconds, summarise

MS_PER_S = 1e3


def time_call(call: Callable[[int], Any], *, warmup: int, repeats: int, inner: int = 1) -> Timing:
    """Time ``call(i)``, which runs the work of call number ``i`` and returns something
    :func:`jax.block_until_ready` accepts; a sample is ``inner`` consecutive calls and one
    final wait, so dispatch of call ``i+1`` overlaps execution of call ``i`` exactly as in a
    serving loop.
    """
    import jax

    samples = sample_seconds(call, warmup=warmup, repeats=repeats, inner=inner, wait=jax.block_until_ready)
    return summarise(samples, inner)


@dataclass(frozen=True)
class RunInfo:
    """Where and when the harness ran: the fields every record carries."""

    chip: str  # catalog chip name the records calibrate (h200, host-cpu)
    label: str  # measured-on-h200 | measured-on-cpu
    backend: str  # gpu-xla | cpu-xla
    device: str  # jax device_kind
    jax_version: str
    date: str  # UTC, YYYY-MM-DD HH:MM
    host: str


def measurement(info: RunInfo, *, model: str, batch: int, timing: Timing, kind: str, what: str,
                context: int = 1, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ``Measurement`` line as a plain dict (see the module docstring)."""
    return {
        "model": model,
        "system": {"chip": info.chip, "chips": 1},
        "batch": batch,
        "context": context,
        "routing": "uniform",
        "schedule": None,
        "backend": info.backend,
        "ms_per_step_median": timing.median_s * MS_PER_S,
        "ms_per_step_spread": timing.spread_s * MS_PER_S,
        "spread_kind": f"iqr/2 over {timing.repeats} samples of {timing.inner} call(s)",
        "steps": timing.repeats * timing.inner,
        "phases": [],
        "provenance": (f"calibration.gpu_bench on {info.device} ({info.host}), jax {info.jax_version}, "
                       f"{info.date}: {what}"),
        "label": info.label,
        "extra": {"kind": kind, "device": info.device, "jax_version": info.jax_version, "date": info.date,
                  "min_ms": timing.min_s * MS_PER_S, **(extra or {})},
    }


class RecordWriter:
    """Appends records to ``path`` one line at a time (each line one ``O_APPEND`` write,
    synced), so a run stopped by its time limit keeps every record it finished."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def write(self, record: dict[str, Any]) -> None:
        append_record(self.path, record, ensure_ascii=False)
        self.count += 1
