"""Read ``jax.profiler`` traces: per-kernel durations and step times from trace-event JSON.

What ``jax.profiler.trace(dir)`` writes
---------------------------------------
::

    dir/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.trace.json.gz   Chrome trace events
    dir/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/<host>.xplane.pb       the raw XSpace (not read)

The trace file is a gzipped JSON object whose ``traceEvents`` list holds metadata events
(``"ph": "M"``: process and thread names) and complete events (``"ph": "X"``: ``name``,
``ts`` start and ``dur`` duration in **microseconds**, ``pid``/``tid``, ``args``). Three
kinds of complete event matter here:

1. **Kernels / ops.** Each executed HLO op (an XLA CPU thunk such as ``ynn_fusion`` or
   ``broadcast_add_fusion``; a TPU/GPU kernel on a ``/device:...`` process) carries
   ``args.hlo_op`` and ``args.hlo_module`` (``jit_decode_step``), and on CPU a ``run_id``
   shared by the ops of one execution.
2. **Step markers.** ``jax.profiler.StepTraceAnnotation("decode", step_num=i)`` becomes an
   event named ``decode`` with ``args.step_num``: the wall time of one step as the caller saw
   it (dispatch included).
3. Everything else (Python frames ``$file.py:line fn``, PjRt client internals) is kept but
   not interpreted.

From these :class:`ProfileTrace` gives per-kernel statistics (:meth:`ProfileTrace.kernel_stats`),
per-execution spans (:meth:`ProfileTrace.executions`), step durations
(:meth:`ProfileTrace.step_durations_us`), and :func:`trace_measurement` folds them into a
:class:`~calibration.sources.measurements.Measurement` (median step, spread, per-kernel phases).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibration.core.fitting import median
from calibration.sources.measurements import MS_PER_S, US_PER_S, Measurement, PhaseTiming, SystemRef
from hwmodels.catalog import display_path
from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json

TRACE_SUFFIXES = (".trace.json.gz", ".trace.json", ".json.gz")


@dataclass(frozen=True)
class TraceEvent:
    """One complete (``"ph": "X"``) event; times in microseconds."""

    name: str
    start_us: float
    dur_us: float
    pid: int
    tid: int
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us

    @property
    def hlo_op(self) -> str | None:
        value = self.args.get("hlo_op")
        return str(value) if value is not None else None

    @property
    def hlo_module(self) -> str | None:
        value = self.args.get("hlo_module")
        return str(value) if value is not None else None


@dataclass(frozen=True)
class KernelStats:
    """Durations of one kernel (HLO op) over a trace, microseconds."""

    name: str
    count: int
    total_us: float
    median_us: float


@dataclass(frozen=True)
class Execution:
    """One execution of a compiled module: its ops' span and busy time, microseconds."""

    module: str
    run_id: str
    start_us: float
    end_us: float
    busy_us: float
    ops: int

    @property
    def span_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class ProfileTrace:
    """The complete events of one trace file with process and thread names."""

    path: Path
    events: list[TraceEvent]
    processes: dict[int, str]
    threads: dict[tuple[int, int], str]

    def kernel_events(self, module: str | None = None) -> list[TraceEvent]:
        """Executed ops: events with ``args.hlo_op`` or on a ``/device:`` process.

        ``module`` keeps only the ops of that HLO module (``jit_decode_step``).
        """
        kernels = []
        for event in self.events:
            on_device = self.processes.get(event.pid, "").startswith("/device:")
            if event.hlo_op is None and not on_device:
                continue
            if module is not None and event.hlo_module != module:
                continue
            kernels.append(event)
        return kernels

    def modules(self) -> list[str]:
        """HLO modules that executed, most ops first."""
        counts: dict[str, int] = defaultdict(int)
        for event in self.kernel_events():
            if event.hlo_module:
                counts[event.hlo_module] += 1
        return sorted(counts, key=lambda name: (-counts[name], name))

    def kernel_stats(self, module: str | None = None) -> dict[str, KernelStats]:
        """Kernel name (``hlo_op``, else event name) -> count, total and median duration."""
        durations: dict[str, list[float]] = defaultdict(list)
        for event in self.kernel_events(module):
            durations[event.hlo_op or event.name].append(event.dur_us)
        return {
            name: KernelStats(name, len(values), sum(values), median(values))
            for name, values in sorted(durations.items(), key=lambda item: -sum(item[1]))
        }

    def executions(self, module: str | None = None) -> list[Execution]:
        """Ops grouped by ``(hlo_module, run_id)``: one entry per execution, in time order."""
        groups: dict[tuple[str, str], list[TraceEvent]] = defaultdict(list)
        for event in self.kernel_events(module):
            run_id = event.args.get("run_id")
            if run_id is None:
                continue
            groups[(event.hlo_module or "", str(run_id))].append(event)
        runs = [
            Execution(
                module=name, run_id=run_id,
                start_us=min(e.start_us for e in events), end_us=max(e.end_us for e in events),
                busy_us=sum(e.dur_us for e in events), ops=len(events),
            )
            for (name, run_id), events in groups.items()
        ]
        return sorted(runs, key=lambda run: run.start_us)

    def step_events(self, name: str | None = None) -> list[TraceEvent]:
        """``StepTraceAnnotation`` events (those with ``args.step_num``), optionally by name."""
        steps = [e for e in self.events if "step_num" in e.args and (name is None or e.name == name)]
        return sorted(steps, key=lambda event: event.start_us)

    def step_durations_us(self, name: str | None = None) -> list[float]:
        return [event.dur_us for event in self.step_events(name)]


# --------------------------------------------------------------------------- reading


def find_trace_files(root: Path | str) -> list[Path]:
    """Trace-event files under ``root`` (a file is returned as is), oldest run first."""
    path = Path(root)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"{display_path(path)}: no such trace file or folder")
    found = [p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)]
    return sorted(found, key=lambda p: (p.parent.name, p.name))


def _read_json(path: Path) -> Any:
    return read_user_json(path, kind="trace-event JSON", shown=display_path(path), gzipped=True)


def load_trace(path_or_dir: Path | str) -> ProfileTrace:
    """Parse one trace file, or the newest trace under a ``jax.profiler.trace`` folder."""
    files = find_trace_files(path_or_dir)
    if not files:
        raise InputError(
            f"{display_path(path_or_dir)}: no *.trace.json.gz under it (did jax.profiler.trace run?)"
        )
    path = files[-1]
    data = _read_json(path)
    raw_events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(raw_events, list):
        raise InputError(f"{display_path(path)}: expected a traceEvents list")
    processes: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    events: list[TraceEvent] = []
    for index, raw in enumerate(raw_events):
        if not isinstance(raw, dict):
            raise InputError(f"{display_path(path)}: traceEvents[{index}]: expected an object")
        phase = raw.get("ph")
        if phase == "M":
            name = (raw.get("args") or {}).get("name")
            if raw.get("name") == "process_name" and name is not None:
                processes[int(raw.get("pid", 0))] = str(name)
            elif raw.get("name") == "thread_name" and name is not None:
                threads[(int(raw.get("pid", 0)), int(raw.get("tid", 0)))] = str(name)
        elif phase == "X":
            try:
                events.append(TraceEvent(
                    name=str(raw["name"]), start_us=float(raw["ts"]), dur_us=float(raw.get("dur", 0.0)),
                    pid=int(raw.get("pid", 0)), tid=int(raw.get("tid", 0)), args=dict(raw.get("args") or {}),
                ))
            except (KeyError, TypeError, ValueError) as error:
                raise InputError(
                    f"{display_path(path)}: traceEvents[{index}]: bad complete event ({error})"
                ) from None
    return ProfileTrace(path=path, events=events, processes=processes, threads=threads)


# --------------------------------------------------------------------------- measurements


def _iqr_half(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    quartiles = statistics.quantiles(values, n=4, method="inclusive")
    return (quartiles[2] - quartiles[0]) / 2.0


def trace_measurement(
    trace: ProfileTrace,
    *,
    model: str,
    system: SystemRef | str,
    batch: int,
    context: int,
    backend: str,
    routing: str = "uniform",
    schedule: str | None = None,
    step_name: str | None = None,
    module: str | None = None,
    top_kernels: int = 12,
) -> Measurement:
    """A measurement record from a trace.

    Step time: the ``StepTraceAnnotation`` durations (named ``step_name``, any if None) when
    the trace has them, else the execution spans of ``module`` (default: the module with
    most ops). Phases: the ``top_kernels`` kernels by total time, as ms per step.
    """
    steps = trace.step_durations_us(step_name)
    chosen = module or (trace.modules() or [None])[0]
    if steps:
        samples_us, how = steps, f"StepTraceAnnotation {step_name or 'steps'}"
    else:
        runs = trace.executions(chosen)
        samples_us, how = [run.span_us for run in runs], f"execution spans of {chosen}"
    if not samples_us:
        raise InputError(f"{display_path(trace.path)}: no step markers and no executions to time")
    to_ms = MS_PER_S / US_PER_S
    per_step = 1.0 / len(samples_us)
    stats = list(trace.kernel_stats(chosen).values())[:top_kernels]
    phases = [
        PhaseTiming(name=s.name, ms=s.total_us * per_step * to_ms, scope="per_step",
                    source=f"{s.count} executions in the trace, total / {len(samples_us)} steps")
        for s in stats
    ]
    return Measurement(
        model=model,
        system=system if isinstance(system, SystemRef) else SystemRef.model_validate(system),
        batch=batch,
        context=context,
        routing=routing,
        schedule=schedule,
        backend=backend,
        ms_per_step_median=median(samples_us) * to_ms,
        ms_per_step_spread=_iqr_half(samples_us) * to_ms,
        steps=len(samples_us),
        phases=phases,
        provenance=f"jax.profiler trace {display_path(trace.path)}: {how}",
        label="measured",
    )
