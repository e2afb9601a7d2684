"""Measurement records: one measured decode step configuration per JSON line.

A calibration is only as good as its data, so every measured number travels with what was
measured (model, system, batch, context, routing, schedule), how (backend, number of timed
steps, spread) and where it came from (provenance, label). One :class:`Measurement` is one
line of a ``.jsonl`` file::

    {"model": "muse-spark@nvfp4+int8", "system": {"chip": "tpu-v7", "chips": 4},
     "batch": 1, "context": 215, "routing": "identical", "schedule": "muse-published",
     "backend": "tpu7x (published)", "ms_per_step_median": 3.26, "ms_per_step_spread": null,
     "steps": 128, "provenance": "public TPU megakernel release ...", "label": "published"}

Fields
------
- ``model``: a :func:`tpusim.workload.model_catalog.load_model` name (``muse-spark@int4+bf16``).
- ``system``: ``{"chip": <catalog chip>, "chips": N, "execution": "eager" | "graphs" |
  "megakernel"}`` (execution optional: the chip's default); the string forms ``"tpu-v7x4"``
  (:attr:`hwmodels.schema.System.name`) and ``"tpu-v7 x 4"`` are accepted too.
- ``batch``, ``context`` (tokens already in each sequence's cache), ``routing``
  (:func:`tpusim.workload.routing.parse_routing` spec).
- ``schedule`` (a built-in schedule name, a path, or a description) and ``schedule_hash``
  (:meth:`tpusim.schedule.schema.Schedule.content_hash`), either may be missing.
- ``backend``: where it ran: ``"tpu7x (published)"``, ``"cpu-interpret"`` (Pallas interpret
  mode: *not* a TPU timing), ``"cpu-xla"`` (a jitted step on this host's CPU).
- ``ms_per_step_median`` and ``ms_per_step_spread`` (half the inter-quartile range of the
  timed steps unless ``spread_kind`` says otherwise; ``None`` when not published).
- ``phases``: per-phase timings where known (see :class:`PhaseTiming`).
- ``provenance`` (free text: file, commit, host, date) and ``label`` (``measured`` or
  ``published``).

Unknown keys are kept, not rejected, in ``extra`` (the kernel runner may add a commit hash
or a host name); known keys are validated strictly.

Reading and writing
-------------------
:func:`read_measurements` validates every line and turns the first problem into an
:class:`~hwmodels.errors.InputError` whose one-line message names the file and the line:

    runs.jsonl: line 7: invalid JSON (truncated line? a partial write): Expecting ',' ...
    runs.jsonl: line 3: batch: Input should be greater than or equal to 1

:func:`append_measurement` adds one record with a single ``O_APPEND`` write followed by
``fsync`` (concurrent appenders never interleave within a line) and refuses to append after
a partial last line; :func:`write_measurements` replaces a whole file atomically. Both are
the record layer's one JSON-lines writer (:mod:`hwmodels.records.jsonl`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hwmodels.catalog import display_path
from hwmodels.errors import InputError
from hwmodels.records.jsonl import append_lines, record_line, write_lines
from hwmodels.textfile import read_user_text
from hwmodels.validation import describe_validation_error

MS_PER_S = 1e3  # milliseconds per second: records use ms, the simulator seconds
US_PER_S = 1e6

_SYSTEM_TEXT = re.compile(r"^\s*([a-z0-9][a-z0-9.\-]*?)\s*x\s*(\d+)\s*$")


class SystemRef(BaseModel):
    """Which hardware: ``chips`` copies of catalog chip ``chip`` (see :func:`make_system`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chip: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="catalog chip name")
    chips: int = Field(ge=1, description="number of chips")
    execution: Literal["eager", "graphs", "megakernel"] | None = Field(
        default=None,
        description="how the step was dispatched: eager (one kernel launch per op), graphs "
        "(CUDA graphs replaying the launches) or megakernel (one persistent kernel); "
        "None: the chip's default (TPU: megakernel)",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        if isinstance(data, str):
            match = _SYSTEM_TEXT.match(data)
            if not match:
                raise ValueError(f"system {data!r}: expected '<chip>x<N>', e.g. 'tpu-v7x4'")
            return {"chip": match.group(1), "chips": int(match.group(2))}
        return data

    @property
    def name(self) -> str:
        return f"{self.chip}x{self.chips}"


class PhaseTiming(BaseModel):
    """Time spent in one phase of the step (``scope`` says per step or per layer)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="phase, e.g. dense_weight_ring, collectives")
    ms: float = Field(ge=0.0, description="milliseconds")
    scope: Literal["per_step", "per_layer"] = "per_step"
    source: str = ""


class Measurement(BaseModel):
    """One measured (or published) decode-step timing with everything needed to predict it."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    model: str = Field(min_length=1, description="load_model name, e.g. muse-spark@int4+bf16")
    system: SystemRef
    batch: int = Field(ge=1, description="sequences decoded per step")
    context: int = Field(
        ge=1,
        validation_alias=AliasChoices("context", "context_tokens"),
        description="tokens already in each sequence's cache",
    )
    routing: str = Field(default="uniform", description="parse_routing spec")
    schedule: str | None = Field(
        default=None,
        validation_alias=AliasChoices("schedule", "schedule_name"),
        description="schedule name, path or description",
    )
    schedule_hash: str | None = Field(default=None, description="Schedule.content_hash()")
    backend: str = Field(min_length=1, description="tpu7x (published), cpu-interpret, cpu-xla, ...")
    ms_per_step_median: float = Field(gt=0.0, description="median step time, milliseconds")
    ms_per_step_spread: float | None = Field(default=None, ge=0.0, description="spread, ms")
    spread_kind: str = Field(default="iqr/2", description="what ms_per_step_spread measures")
    steps: int | None = Field(default=None, ge=1, description="timed steps behind the median")
    phases: list[PhaseTiming] = Field(default_factory=list)
    provenance: str = Field(default="", description="where the number came from")
    label: str = Field(default="measured", description="measured | published | synthetic")
    extra: dict[str, Any] = Field(default_factory=dict, description="unrecognised keys, kept")

    @model_validator(mode="before")
    @classmethod
    def _collect_extra(cls, data: Any) -> Any:
        """Move keys the schema does not know into ``extra`` instead of rejecting them."""
        if not isinstance(data, dict):
            return data
        known: set[str] = set()
        for name, field in cls.model_fields.items():
            known.add(name)
            alias = field.validation_alias
            if isinstance(alias, AliasChoices):
                known.update(str(choice) for choice in alias.choices)
        unknown = {key: value for key, value in data.items() if key not in known}
        if not unknown:
            return data
        kept = {key: value for key, value in data.items() if key in known}
        kept["extra"] = {**dict(data.get("extra") or {}), **unknown}
        return kept

    @field_validator("routing")
    @classmethod
    def _check_routing(cls, routing: str) -> str:
        kind = routing.partition(":")[0]
        if kind not in ("uniform", "identical", "zipf", "trace"):
            raise ValueError(f"unknown routing {routing!r}; use uniform, identical, zipf[:s], trace:PATH")
        return routing

    @property
    def step_s(self) -> float:
        """The median step time in seconds (the simulator's unit)."""
        return self.ms_per_step_median / MS_PER_S

    @property
    def format(self) -> str:
        """The model's format variant (``int4+bf16``), or ``""`` for the default formats
        (overrides in brackets, ``muse-spark@int4+bf16[layers=4]``, are not part of it)."""
        return self.model.partition("[")[0].partition("@")[2]

    def key(self) -> str:
        """A short human-readable identity: ``muse-spark@int4+bf16 b8 ctx215 tpu-v7x4``."""
        return f"{self.model} b{self.batch} ctx{self.context} {self.system.name}"

    def to_json_line(self) -> str:
        """The record as one JSON line (no trailing newline); empty ``extra`` is omitted."""
        data = self.model_dump(mode="json", exclude_defaults=False)
        if not data["extra"]:
            del data["extra"]
        return record_line(data, ensure_ascii=False)


def measured_label(record: Measurement) -> str:
    """``published tpu7x`` / ``measured cpu-xla`` / ... for a record's backend."""
    backend = record.backend
    if "(published)" in backend:
        return f"published {backend.replace('(published)', '').strip()}"
    return f"measured {backend}"


# --------------------------------------------------------------------------- reading


def parse_measurement_line(text: str, *, source: str, line: int) -> Measurement:
    """Validate one JSON line; errors name ``source`` and ``line`` (1-based)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"{source}: line {line}: invalid JSON (truncated line? a partial write): "
            f"{error.msg} at column {error.colno}"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{source}: line {line}: expected a JSON object, got {type(data).__name__}")
    try:
        return Measurement.model_validate(data)
    except ValidationError as error:
        raise InputError(describe_validation_error(f"{source}: line {line}", error, data,
                                                   schema="measurement")) from None


def read_measurements(path: Path | str) -> list[Measurement]:
    """Every record of a ``.jsonl`` file; blank lines and ``#`` comment lines are skipped.

    The first invalid line raises an InputError naming the file and the line number. A last
    line without its newline that does not parse is reported as a partial write.
    """
    shown = display_path(path)
    text = read_user_text(path, kind="JSON lines", shown=shown)
    records: list[Measurement] = []
    lines = text.split("\n")
    for number, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        records.append(parse_measurement_line(stripped, source=shown, line=number))
    if not records:
        raise InputError(f"{shown}: no measurements in the file")
    return records


# --------------------------------------------------------------------------- writing


def append_measurement(path: Path | str, record: Measurement) -> Path:
    """Append ``record`` as one line: a single ``O_APPEND`` write, then ``fsync``.

    Readers see the file without the line or with the whole line (an ``O_APPEND`` write of
    one buffer is not interleaved with other appenders on a local filesystem). Refuses to
    append after a partial last line.
    """
    return append_lines(path, [record.to_json_line()], shown=display_path(path))


def write_measurements(path: Path | str, records: Iterable[Measurement]) -> Path:
    """Replace ``path`` with ``records`` atomically (old file or new file, never half)."""
    return write_lines(path, (record.to_json_line() for record in records))
