"""Which measured step times a fit sees: ``--holdout`` splits, the groups of each point, and
the one-line description of a set of points an overlay records."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from calibration.sources.measurements import Measurement
from hwmodels import values
from hwmodels.errors import InputError

HOLDOUT_KEYS = ("format", "batch", "width", "model", "context", "backend", "index", "kind")
_WIDTH = re.compile(r"[\[,]width=(\d+)")


# --------------------------------------------------------------------------- splits


@dataclass(frozen=True)
class Split:
    """Calibration and held-out records, and the spec that chose them."""

    calibration: list[Measurement]
    holdout: list[Measurement]
    spec: str = ""


def _matches(record: Measurement, index: int, key: str, values: set[str]) -> bool:
    width = _WIDTH.search(record.model)
    actual = {
        "format": record.format, "batch": str(record.batch), "model": record.model,
        "width": width.group(1) if width else "",
        "context": str(record.context), "backend": record.backend, "index": str(index),
        "kind": str(record.extra.get("kind", "decode_step")),  # what a gpu_bench record measures
    }[key]
    return actual in values


def split_records(records: Sequence[Measurement], spec: str | None) -> Split:
    """Hold out the records matching ``spec``: ``key=v1|v2`` clauses joined by ``;`` (all
    must match). Keys: format, batch, width (the ``width=`` model override), model, context,
    backend, index (0-based position), kind (``extra.kind`` of a :mod:`calibration.gpu_bench`
    record: copy, gap_compiled, matmul, decode_step, ...; ``decode_step`` when absent).
    An empty spec holds nothing out."""
    if not spec:
        return Split(list(records), [], "")
    clauses: list[tuple[str, set[str]]] = []
    for key, value in values.pairs(spec, "--holdout", separator=";", keys=tuple(HOLDOUT_KEYS)):
        clauses.append((key, set(values.items(value, f"--holdout {key}", separator="|"))))
    held, kept = [], []
    for index, record in enumerate(records):
        hit = all(_matches(record, index, key, values) for key, values in clauses)
        (held if hit else kept).append(record)
    if not held:
        raise InputError(f"--holdout {spec!r}: matches no measurement")
    if not kept:
        raise InputError(f"--holdout {spec!r}: holds out every measurement; nothing left to fit")
    return Split(kept, held, spec)



def describe_records(records: Sequence[Measurement]) -> str:
    """``12 points: muse-spark@{nvfp4+int8,int4+bf16} b1..8 on tpu-v7x4 (tpu7x (published))``."""
    models = sorted({r.model.partition("[")[0].partition("@")[0] for r in records})
    formats = sorted({r.format for r in records if r.format})
    batches = sorted({r.batch for r in records})
    systems = sorted({r.system.name for r in records})
    backends = sorted({r.backend for r in records})
    model = ",".join(models) + (f"@{{{','.join(formats)}}}" if formats else "")
    batch = f"b{batches[0]}..{batches[-1]}" if len(batches) > 1 else f"b{batches[0]}"
    return f"{len(records)} points: {model} {batch} on {','.join(systems)} ({', '.join(backends)})"



GROUP_DIMENSIONS = ("format", "batch", "model", "chips")  # what leave-one-group-out holds out together


def group_key(record: Measurement, dimension: str) -> str:
    """A record's label in one grouping dimension (the model without its format)."""
    return {"format": record.format or "", "batch": str(record.batch), "model": record.model.partition("@")[0],
            "chips": str(record.system.chips)}[dimension]


def groups_of(records: Sequence[Measurement]) -> dict[str, tuple[str, ...]]:
    """Per dimension of :data:`GROUP_DIMENSIONS`, each record's label (a problem's ``groups``)."""
    return {dimension: tuple(group_key(r, dimension) for r in records) for dimension in GROUP_DIMENSIONS}
