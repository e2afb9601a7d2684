"""The megakernel's run record: one line of ``calibration/data/tpu-v5e-kernel.jsonl``.

Written by ``megakernel.runner`` (the kernel) and ``megakernel.xla_run`` (the plain-JAX
baseline, ``implementation: "xla"``), both through :class:`KernelRecord`, so the two
cannot name a field differently; read back by ``calibration.sources.tpu_chip_records``
(:meth:`KernelRecord.from_row`). Its first fields are those of a
``calibration.sources.measurements.Measurement`` line (model, system, batch, ... label),
so the same file is also an ordinary measurement file (the rest land in its ``extra``).

Rows of every age read back exactly: :meth:`KernelRecord.from_row` keeps the keys a row
has, in its order, and :meth:`KernelRecord.to_dict` writes those again (a field a row lacks
stays absent, a key this class does not name is kept in ``extra``);
``tests/test_records_layer.py`` rewrites every committed row and compares the lines. A
record built anew writes every field in the order declared here, except the optional ones
(marked below) left at None, which the other implementation does not have.

Plain dataclass and the standard library: a TPU harness imports it without pydantic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

WALK = "walk"  # the expert list of every kernel before the field: one scalar SMEM store and branch per pick
_OPTIONAL = {"optional": True}  # field metadata: a new record omits the field when None


@dataclass(frozen=True, kw_only=True)
class KernelRecord:
    """One timed run of the megakernel or of its XLA baseline (module docstring)."""

    # --- what ran, in the measurement format
    model: str
    system: dict[str, Any]  # {"chip": catalog chip, "chips": 1}
    batch: int
    context: int
    routing: str | None  # trace:<routing file> (the router's choice in the first step)
    implementation: str | None = field(default=None, metadata=_OPTIONAL)  # "xla": megakernel.xla_run; absent: the kernel
    stands_next_to: dict[str, Any] | None = field(default=None, metadata=_OPTIONAL)  # the XLA row's kernel: schedule, hash, ms
    schedule: str | None = field(default=None, metadata=_OPTIONAL)
    schedule_hash: str | None = field(default=None, metadata=_OPTIONAL)  # tpusim.schedule.schema.Schedule.content_hash()
    backend: str  # the device kind, or cpu-interpret
    ms_per_step_median: float
    ms_per_step_spread: float  # half the inter-quartile range (spread_kind)
    spread_kind: str = "iqr/2"
    steps: int  # timed steps
    provenance: str
    label: str
    # --- checked against the pure-JAX reference, greedily, on the same chip
    max_abs_error: float | None = None
    relative_error: float | None = None  # max |kernel - reference| / max |reference|
    within_tolerance: bool | None = None
    tokens_identical: bool | None = None
    step_relative_errors: list[float] | None = field(default=None, metadata=_OPTIONAL)  # per checked step, while tokens agree
    checked_steps: int = 0
    # --- the run
    compile_s: float | None = None
    shard_of: str | None = None  # a plan name: one device's program of it
    weight_banks: int = 0
    hbm_bytes_per_step: int | None = None
    hbm_bytes_by_kind: dict[str, int] | None = None
    effective_bandwidth_bytes_per_s: float | None = None
    experts_per_layer: list[int] | None = field(default=None, metadata=_OPTIONAL)
    versions: dict[str, str | None] | None = None
    expert_cap: int | None = None  # a fixed-cost probe: at most this many experts a layer
    kernel_variant: dict[str, int] | None = field(default=None, metadata=_OPTIONAL)  # knobs away from the kernel's defaults
    panel_unroll: list[int] | None = field(default=None, metadata=_OPTIONAL)  # panels a panel-loop iteration: dense, experts
    decoder: str | None = field(default=None, metadata=_OPTIONAL)  # megakernel.expert_products name; rows without it ran "bytes"
    expert_list: str | None = field(default=None, metadata=_OPTIONAL)  # how moe.topk builds the list; rows without it: "walk"
    timing_note: str = ""
    # keys this class does not name (xla_bytes_accessed, ahead_compile_s, routing_layers, ...)
    extra: dict[str, Any] = field(default_factory=dict)
    # the keys of the row read, in its order (from_row); () for a record built anew
    order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON object of its line (module docstring)."""
        names = [f.name for f in dataclasses.fields(self) if f.name not in ("extra", "order")]
        if self.order:
            return {key: (getattr(self, key) if key in names else self.extra[key]) for key in self.order}
        optional = {f.name for f in dataclasses.fields(self) if f.metadata.get("optional")}
        out = {name: getattr(self, name) for name in names
               if not (name in optional and getattr(self, name) is None)}
        return {**out, **self.extra}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> KernelRecord:
        """The record of one parsed line; ValueError naming the required fields it lacks."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "order"}
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in row]
        if missing:
            raise ValueError(f"kernel record lacks {', '.join(missing)}")
        return cls(**{key: value for key, value in row.items() if key in names},
                   extra={key: value for key, value in row.items() if key not in names}, order=tuple(row))

    @property
    def expert_decoder(self) -> str:
        """The expert decoder the run's kernel used (rows before the field: ``bytes``)."""
        return self.decoder or "bytes"

    @property
    def list_build(self) -> str:
        """How the run's ``moe.topk`` built the expert list: ``vector`` (masked sums, one copy to
        SMEM) or, for rows before the field, ``walk`` (a scalar store and branch per pick)."""
        return self.expert_list or WALK

    @property
    def unroll(self) -> tuple[int, int]:
        """The kernel build's panel loops (:func:`record_unroll`)."""
        return record_unroll({"panel_unroll": self.panel_unroll, "kernel_variant": self.kernel_variant})


def record_unroll(row: Mapping[str, Any]) -> tuple[int, int]:
    """A kernel record's panel loops (dense, experts panels an iteration): its ``panel_unroll``;
    before that field, what its ``kernel_variant`` set on the one-panel kernel (1, 1 if nothing)."""
    if row.get("panel_unroll"):
        dense, expert = row["panel_unroll"]
        return int(dense), int(expert)
    knobs = row.get("kernel_variant") or {}
    return int(knobs.get("panel_unroll", 1)), int(knobs.get("expert_panel_unroll", 1))
