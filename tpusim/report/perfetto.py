"""Chrome / Perfetto trace-event JSON from a simulated timeline.

Open the file in https://ui.perfetto.dev (or ``chrome://tracing``). Layout:

| process (pid) | threads / tracks | events |
| --- | --- | --- |
| 1 ``compute stream`` | ``mxu``, ``vpu``, ``wait`` | ``X`` slices per compute piece / stall; ``i`` marks at layer starts |
| 2 ``HBM / DMA`` | ``dma 0`` .. ``dma N-1`` (one per in-flight slot) | ``X`` slice per copy, issue to landing |
| 3 ``links`` | per link, lanes ``link ici 0``, ``link ici 1``, ... (message collectives) or one ``link ici`` track (stage-priced) | ``X`` slice per remote copy, issue to landing (label ``<collective> p<phase> →r<dst>``), or per collective stage |
| 4 ``VMEM`` | counter ``VMEM occupancy`` | ``C`` samples (bytes, MiB) at every change |

Names come as ``M`` metadata events (``process_name``, ``thread_name``, sort indices).
Timestamps and durations are microseconds (the format's unit), converted from the engine's
seconds here and nowhere else. The file is written atomically (temporary file in the same
folder, then ``os.replace``), so a reader never sees half a trace.

Trace-event format reference: the "Trace Event Format" document of the Chromium project.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hwmodels.atomic import write_text_atomic
from hwmodels.units import MIB
from tpusim.engine.timeline import Timeline, track_group

US_PER_S = 1e6
PIDS = {"compute": 1, "dma": 2, "link": 3, "vmem": 4}
PROCESS_NAMES = {1: "compute stream", 2: "HBM / DMA", 3: "links", 4: "VMEM"}
COMPUTE_ORDER = ("mxu", "vpu", "wait")
VMEM_COUNTER = "VMEM occupancy"


def _us(seconds: float) -> float:
    return round(seconds * US_PER_S, 4)


def _track_order(track: str) -> tuple[int, int, str]:
    group = track_group(track)
    if group == "compute":
        return (PIDS["compute"], COMPUTE_ORDER.index(track) if track in COMPUTE_ORDER else 99, track)
    if group == "dma":
        return (PIDS["dma"], int(track.split()[-1]) if track.split()[-1].isdigit() else 999, track)
    return (PIDS["link"], 0, track)


def trace_events(timeline: Timeline, *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``traceEvents`` plus ``otherData``)."""
    events: list[dict[str, Any]] = []
    for pid, name in PROCESS_NAMES.items():
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}})
    tracks = sorted((track for track, spans in timeline.tracks.items() if spans or track in COMPUTE_ORDER),
                    key=_track_order)
    tids: dict[str, tuple[int, int]] = {}
    next_tid: dict[int, int] = {}
    for track in tracks:
        pid = PIDS[track_group(track)]
        tid = next_tid.get(pid, 1)
        next_tid[pid] = tid + 1
        tids[track] = (pid, tid)
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": track}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for track in tracks:
        pid, tid = tids[track]
        category = track_group(track)
        for start, end, label in timeline.tracks[track]:
            start_us = _us(start)  # end rounded on its own: neighbours never overlap
            events.append({"ph": "X", "pid": pid, "tid": tid, "name": label, "cat": category,
                           "ts": start_us, "dur": round(_us(end) - start_us, 4)})
    for layer, start in timeline.layer_starts:
        name = "head" if layer < 0 else f"layer {layer}"
        events.append({"ph": "i", "pid": PIDS["compute"], "tid": tids.get("mxu", (1, 1))[1], "s": "p",
                       "name": name, "ts": _us(start)})
    for time_s, used in timeline.counters.get("vmem_bytes", []):
        events.append({"ph": "C", "pid": PIDS["vmem"], "tid": 0, "name": VMEM_COUNTER, "ts": _us(time_s),
                       "args": {"MiB": round(used / MIB, 4)}})
    other = {"step_us": _us(timeline.step_s), "vmem_capacity_bytes": timeline.vmem_capacity_bytes,
             "times": "microseconds", "source": "simulated (tpusim engine)"}
    other.update(metadata or {})
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def write_trace(timeline: Timeline, path: Path | str, *, metadata: dict[str, Any] | None = None) -> Path:
    """Write the trace JSON to ``path`` atomically; returns the path."""
    text = json.dumps(trace_events(timeline, metadata=metadata), separators=(",", ":"))
    return write_text_atomic(Path(path), text)
