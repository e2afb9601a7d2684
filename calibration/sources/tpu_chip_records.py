"""K3-shard kernel records measured on a TPU v5e, and the simulator's prediction of each.

``calibration/data/tpu-v5e-kernel.jsonl`` (written by :mod:`megakernel.runner`) holds one
record per megakernel run (:class:`hwmodels.records.kernel.KernelRecord`, read back here). The rows this module reads are those with ``shard_of`` set:
one device's program of a plan (``k3-tp32``: K3's TP32 plan, real widths, all layers, no
collectives) run on one chip. Each names the schedule by ``schedule_hash``
(:meth:`tpusim.schedule.schema.Schedule.content_hash`), mapped back to a schedule file of
``tpusim/schedules`` or ``calibration/tpu_bench/schedules``, and the routing the kernel's
router chose (``trace:`` relative to the records file), which the prediction replays.
Repeated runs of one (schedule, batch) are merged: the median of their medians. Each row
names the expert decoder its kernel ran (``decoder``; none: the earlier ``bytes``): one load
reads one decoder's rows, by default the calibration's
(:data:`calibration.sources.tpu_probes.CALIBRATION_DECODER`, the kernel as it is now).

:func:`simulate_record` predicts one record (the fixed-cost probe's capped runs too), through
the one predictor of a measured step (:func:`calibration.sources.predict.simulate_measured`);
:class:`ChipRecordPredictor` builds each point's program once and caches engine results
by the chip's figures, so a fit re-simulating the same points pays only for new chips.
The measured step includes one host launch of the kernel; the engine's
``execution.per_step_overhead_s`` carries it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.core.fitting import median
from calibration.sources.predict import figures_key, simulate_measured
from calibration.sources.tpu_probes import CALIBRATION_DECODER
from hwmodels.errors import InputError
from hwmodels.records.kernel import WALK, KernelRecord
from hwmodels.schema import Chip
from tpusim.engine.reuse import keep_lowerings
from tpusim.schedule.schema import Schedule, load_schedule
from tpusim.workload.format_choice import formats_for_chip
from tpusim.workload.model_catalog import load_model, shard_plan
from tpusim.workload.program import Program, build_program
from tpusim.workload.routing import parse_routing

if TYPE_CHECKING:
    from tpusim.engine.result import SimResult

ROOT = Path(__file__).resolve().parents[2]
DECODE_CONTEXT = 1024  # the context every K3-shard decode ran at (a record elsewhere names its own in its key)
KERNEL_PATH = ROOT / "calibration" / "data" / "tpu-v5e-kernel.jsonl"
# The runs of other builds than the kernel's default of their day (panel loops unrolled
# otherwise: calibration.tpu_bench.ingest); every row names its build, so a build's decodes are
# its rows of both files (build_records).
VARIANTS_PATH = ROOT / "calibration" / "data" / "tpu-v5e-kernel-variants.jsonl"
SCHEDULE_DIRS = (ROOT / "tpusim" / "schedules", ROOT / "calibration" / "tpu_bench" / "schedules")


@dataclass(frozen=True)
class ChipRecord:
    """One measured (schedule, batch) point of a shard program."""

    model: str
    shard_of: str
    schedule: str  # the record's schedule name
    schedule_path: str  # the schedule file its hash maps to
    batch: int
    context: int
    routing: str  # trace:<path from the repository root>
    ms_median: float
    ms_spread: float
    runs: int
    expert_cap: int | None = None  # a fixed-cost probe run: at most this many experts a layer
    # the kernel build's panels a panel-loop iteration (dense, experts); records before the field: 1, 1
    panel_unroll: tuple[int, int] = (1, 1)
    # how its moe.topk built the expert list (hwmodels.records.kernel.KernelRecord.list_build)
    expert_list: str = WALK

    @property
    def key(self) -> str:
        cap = f"/cap{self.expert_cap}" if self.expert_cap is not None else ""
        unroll = "" if self.panel_unroll == (1, 1) else f"/u{self.panel_unroll[0]}x{self.panel_unroll[1]}"
        listed = "" if self.expert_list == WALK else f"/{self.expert_list}-list"
        context = "" if self.context == DECODE_CONTEXT else f"/ctx{self.context}"
        return f"{self.schedule}@b{self.batch}{cap}{unroll}{listed}{context}"


def schedules_by_hash() -> dict[str, Path]:
    """Every schedule file of the repository by its content hash."""
    out: dict[str, Path] = {}
    for folder in SCHEDULE_DIRS:
        for path in sorted(folder.glob("*.json")):
            try:
                out.setdefault(load_schedule(str(path)).content_hash(), path)
            except Exception:  # a file that is not a schedule is skipped
                continue
    return out


def schedule_named(name: str) -> Schedule:
    """The schedule a record names: a file ``<name>.json`` of :data:`SCHEDULE_DIRS` (the device
    sets' variants), else a built-in name or a path (:func:`tpusim.schedule.schema.load_schedule`)."""
    for folder in SCHEDULE_DIRS:
        if (folder / f"{name}.json").is_file():
            return load_schedule(str(folder / f"{name}.json"))
    return load_schedule(name)


def is_kernel_records(path: Path | str) -> bool:
    """Whether ``path`` is a JSONL file holding shard runs of the megakernel (rows with
    ``shard_of``: one device's program of a plan, what :func:`load_chip_records` reads). A
    file of whole-model runs (``megakernel.runner`` on kimi-k3-mini, say) is an ordinary
    measurement file for the end-to-end procedure."""
    path = Path(path)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                return False
            if isinstance(row, dict) and "shard_of" in row:
                return True
    return False


REQUIRED = ("schedule", "schedule_hash", "batch", "context", "routing", "model", "ms_per_step_median",
            "ms_per_step_spread")


def load_chip_records(path: Path | str | Sequence[Path] = KERNEL_PATH, shard_of: str = "k3-tp32",
                      expert_cap: int | None = None, decoder: str = CALIBRATION_DECODER) -> list[ChipRecord]:
    """The shard rows of ``path`` that ran ``decoder`` (the expert decoder,
    :data:`calibration.sources.tpu_probes.CALIBRATION_DECODER` by default), one per (schedule,
    batch), repeated runs merged: the decodes
    (``expert_cap`` None), or the fixed-cost probe runs capped at ``expert_cap`` experts. Raises
    :class:`~hwmodels.errors.InputError` (one line) for a missing or unreadable file, a row
    that is not JSON or lacks a field, a schedule no file matches, or no ``shard_of`` rows of ``decoder``.
    Several paths (in one directory: the routing traces are relative to it) are read as one file."""
    paths = [Path(p) for p in path] if isinstance(path, Sequence) and not isinstance(path, str) else [Path(path)]
    rows = []
    for path in paths:
        rows += _shard_rows(path, shard_of, expert_cap, decoder)
    path = paths[0]
    if not rows:
        raise InputError(f"{', '.join(map(str, paths))}: no kernel records with shard_of {shard_of!r} and decoder "
                         f"{decoder!r} (the K3-shard runs of megakernel.runner; records without a decoder ran 'bytes')")
    return _merged(rows, path, shard_of, expert_cap)


def build_records(decoder: str = CALIBRATION_DECODER, unroll: tuple[int, int] | None = None,
                  expert_cap: int | None = None, expert_list: str | None = None) -> list[ChipRecord]:
    """Every committed decode (or capped run) of ``decoder``'s kernel, of every build or of the
    build ``unroll`` (panel loops dense, experts) and ``expert_list`` only: its rows of
    :data:`KERNEL_PATH` and :data:`VARIANTS_PATH`, one record per (schedule, batch, build)."""
    paths = [KERNEL_PATH] + ([VARIANTS_PATH] if VARIANTS_PATH.is_file() else [])
    records = load_chip_records(paths, expert_cap=expert_cap, decoder=decoder)
    return [r for r in records if (unroll is None or r.panel_unroll == tuple(unroll))
            and (expert_list is None or r.expert_list == expert_list)]


def most_measured_build(decoder: str = CALIBRATION_DECODER) -> tuple[int, int]:
    """The build (panel loops dense, experts) with the most committed decodes of ``decoder``'s
    kernel: the one a ranking or a headline error is read on (ties: the later build listed)."""
    counts: dict[tuple[int, int], int] = {}
    for record in build_records(decoder):
        counts[record.panel_unroll] = counts.get(record.panel_unroll, 0) + 1
    return max(counts, key=lambda build: (counts[build], build))


def _shard_rows(path: Path, shard_of: str, expert_cap: int | None, decoder: str) -> list[KernelRecord]:
    if not path.is_file():
        raise InputError(f"{path}: no such kernel records file")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not a JSON record ({error.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: not a JSON object")
        if row.get("shard_of") == shard_of and row.get("expert_cap") == expert_cap:
            missing = [key for key in REQUIRED if key not in row]  # every decoder's rows: checked where they enter
            if missing:
                raise InputError(f"{path}:{number}: kernel record lacks {', '.join(missing)}")
            try:
                record = KernelRecord.from_row(row)
            except ValueError as error:
                raise InputError(f"{path}:{number}: {error}") from None
            if record.expert_decoder == decoder:
                rows.append(record)
    return rows


def _merged(rows: list[KernelRecord], path: Path, shard_of: str, expert_cap: int | None) -> list[ChipRecord]:
    files = schedules_by_hash()
    groups: dict[tuple[str, int, int, tuple[int, int], str], list[KernelRecord]] = {}
    for row in rows:  # runs of another kernel build (panel loops unrolled, list built) or context are another record
        groups.setdefault((str(row.schedule_hash), row.batch, row.context, row.unroll, row.list_build), []).append(row)
    out = []
    for (digest, batch, _context, unroll, listed), runs in groups.items():
        first = runs[0]
        if digest not in files:
            raise InputError(f"{path.name}: schedule {first.schedule} [{digest}] matches no schedule file")
        trace = str(first.routing).removeprefix("trace:")
        routing = (path.parent / trace).resolve()
        if not routing.is_file():
            raise InputError(f"{path.name}: {first.schedule} b{batch}: routing trace {trace} not found")
        try:
            routing_name = str(routing.relative_to(ROOT))
        except ValueError:
            routing_name = str(routing)
        out.append(ChipRecord(
            model=first.model, shard_of=shard_of, schedule=str(first.schedule),
            schedule_path=str(files[digest].relative_to(ROOT)), batch=batch, context=first.context,
            routing=f"trace:{routing_name}", ms_median=median(r.ms_per_step_median for r in runs),
            ms_spread=max(r.ms_per_step_spread for r in runs), runs=len(runs), expert_cap=expert_cap,
            panel_unroll=unroll, expert_list=listed))
    return sorted(out, key=lambda r: (r.batch, r.schedule, r.panel_unroll, r.expert_list, -r.context))


def record_program(record: ChipRecord) -> tuple[Program, Schedule]:
    """The program a record ran (its model as `tpusim simulate` formats it for a TPU, its
    shard, batch, context and routing trace) and its schedule."""
    model = formats_for_chip(load_model(record.model), None, "tpu")[0]
    if record.expert_cap is not None:  # a fixed-cost probe run: each row's first expert_cap picks
        model = model.model_copy(update={"moe": model.moe.model_copy(update={"top_k": record.expert_cap})})
    program = build_program(model, shard_plan(model, record.shard_of), batch=record.batch,
                            context_tokens=record.context, routing=parse_routing(_absolute_trace(record.routing)))
    return program, load_schedule(str(ROOT / record.schedule_path))


_PROGRAMS: dict[tuple[Any, ...], tuple[Program, Schedule]] = {}  # this process's programs, by what builds one
# Lowered steps each process keeps (tpusim.engine.reuse.keep_lowerings): every record's step, so
# a residual that moves only the copy engine's figures (the kernel fit: HBM bandwidth) runs each
# kept step again instead of lowering it (the 22 fitted tpu-v5e points: 443,000 copies, ~340 MB)
KEPT_STEPS, KEPT_COPIES = 32, 500_000


def record_step(record: ChipRecord) -> tuple[Program, Schedule]:
    """:func:`record_program`, built once per process (a fit re-simulates each record under
    many chips; a pool worker keeps its own)."""
    key = (record.model, record.shard_of, record.schedule_path, record.batch, record.context, record.routing,
           record.expert_cap)
    if key not in _PROGRAMS:
        keep_lowerings(KEPT_STEPS, KEPT_COPIES)
        _PROGRAMS[key] = record_program(record)
    return _PROGRAMS[key]


def simulate_record(record: ChipRecord, chip: Chip) -> SimResult:
    """The engine's prediction of ``record`` on ``chip``: its program and schedule
    (:func:`record_step`) and its kernel build's panel loops, through the one predictor of a
    measured step (:func:`calibration.sources.predict.simulate_measured`)."""
    program, schedule = record_step(record)
    return simulate_measured(program, schedule, chip, panel_unroll=record.panel_unroll)


def simulate_record_ms(record: ChipRecord, chip: Chip) -> float:
    """Predicted ms per step of ``record`` on ``chip`` (also a pool task)."""
    return simulate_record(record, chip).step_s * 1e3


@dataclass
class ChipRecordPredictor:
    """Predicted ms per step of each record on a chip (:func:`simulate_record_ms`; programs
    built once, results cached by the chip's figures).

    ``jobs > 1`` spreads the engine runs of one :meth:`predict_many` over that many worker
    processes (:class:`tpusim.sweep.executors.Executor`, results in record order, so the fit
    is the same whatever the count); call :meth:`close` when done."""

    records: list[ChipRecord]
    jobs: int = 1
    cache: dict[tuple[Any, int], float] = field(default_factory=dict)
    runs: int = 0  # engine runs so far
    _executor: Any = None

    def predict_ms(self, chip: Chip, index: int) -> float:
        return self.predict_many(chip, [index])[0]

    def predict_many(self, chip: Chip, indices: Sequence[int]) -> list[float]:
        figures = figures_key(chip)
        missing = [i for i in dict.fromkeys(indices) if (figures, i) not in self.cache]
        if len(missing) > 1 and self.jobs > 1:
            if self._executor is None:
                from tpusim.sweep.executors import Executor

                self._executor = Executor(jobs=self.jobs)
            found = self._executor.map(simulate_record_ms, [(self.records[i], chip) for i in missing])
        else:
            found = [simulate_record_ms(self.records[i], chip) for i in missing]
        for i, ms in zip(missing, found, strict=True):
            self.cache[(figures, i)] = ms
        self.runs += len(missing)
        return [self.cache[(figures, i)] for i in indices]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None


def _absolute_trace(routing: str) -> str:
    """``trace:<path>`` with a repository-relative path made absolute."""
    trace = Path(routing.removeprefix("trace:"))
    return f"trace:{trace if trace.is_absolute() else ROOT / trace}"
