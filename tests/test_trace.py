"""Perfetto trace-event JSON and the timeline PNG from a simulated K3 step."""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path

import pytest

from hwmodels.catalog import make_system
from tpusim.engine import SimResult, simulate
from tpusim.report.perfetto import VMEM_COUNTER, trace_events, write_trace
from tpusim.report.timeline import plot_timeline
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program


@cache
def k3_recorded() -> SimResult:
    system = make_system("tpu-v7", 16, calibrated=False)
    model = load_model("kimi-k3")
    plan = plan_for(model, system.devices, devices_per_chip=2)
    program = build_program(model, plan, batch=1)
    return simulate(program, load_schedule("published"), system.chip, record_timeline=True)


def test_trace_file_is_valid_trace_event_json_with_the_expected_tracks(tmp_path: Path) -> None:
    result = k3_recorded()
    assert result.timeline is not None
    path = write_trace(result.timeline, tmp_path / "k3.json", metadata={"schedule": "published"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k3.json"]  # no temporary file left
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    assert data["otherData"]["schedule"] == "published"
    assert {event["ph"] for event in events} <= {"M", "X", "C", "i"}
    processes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {"compute stream", "HBM / DMA", "links", "VMEM"}
    threads = {e["args"]["name"]: (e["pid"], e["tid"]) for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"mxu", "vpu", "wait", "dma 0", "link ici 0", "link sibling 0"} <= set(threads)
    # every remote copy is its own slice on a link track: 31 latent-gather copies per MoE layer
    gathers = [e for e in events if e["ph"] == "X" and e["name"].startswith("moe.latent_allgather p0")]
    assert len(gathers) == 92 * 31
    assert all(threads_pid == 3 for threads_pid in {e["pid"] for e in gathers})
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(e["name"] == VMEM_COUNTER for e in counters)
    assert max(e["args"]["MiB"] for e in counters) == pytest.approx(result.vmem_peak_bytes / (1 << 20), abs=1e-3)
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in events:
        if event["ph"] == "X":
            assert event["dur"] >= 0 and event["ts"] >= 0
            slices.setdefault((event["pid"], event["tid"]), []).append((event["ts"], event["ts"] + event["dur"]))
    assert set(slices) <= set(threads.values())
    for spans in slices.values():  # a thread's slices must not overlap (Perfetto nests them)
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start + 1e-6
    step_us = result.step_s * 1e6
    assert max(end for spans in slices.values() for _, end in spans) <= step_us + 1e-3


def test_trace_events_builds_the_same_document_in_memory() -> None:
    result = k3_recorded()
    assert result.timeline is not None
    document = trace_events(result.timeline, metadata={"model": "kimi-k3"})
    assert document["otherData"]["model"] == "kimi-k3"
    assert document["otherData"]["source"].startswith("simulated")
    json.dumps(document)  # JSON-serialisable as is


def test_timeline_plot_writes_a_png(tmp_path: Path) -> None:
    result = k3_recorded()
    assert result.timeline is not None
    path = plot_timeline(result.timeline, tmp_path / "timeline.png", first_layer=2, layers=2)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.png"]
