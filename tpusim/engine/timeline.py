"""Per-resource timelines: what the trace writer and the timeline plot draw.

Recording is off by default (a sweep runs a thousand simulations and needs none of it);
``simulate(..., record_timeline=True)`` attaches a :class:`Recorder` that the HBM server,
the staging memory and the compute stream call as things happen. All times are seconds
from the start of the step.

Tracks (``Timeline.tracks``), each a list of ``(start_s, end_s, label)`` intervals that do
not overlap within the track:

- ``mxu``, ``vpu`` — compute pieces (label: op name, layer);
- ``wait`` — the compute stream stalled on a copy (exposed DMA) or a collective;
- ``dma N`` — copies in flight, one lane per in-flight slot (lane = lowest free slot);
- ``link <name>`` — collective stages on that link (``ici``, ``sibling``, ``nvlink``);
  ``link <name> <lane>`` — remote copies of message collectives, one per interval, lanes so
  that copies in flight together do not overlap.

Counters (``Timeline.counters``): ``vmem_bytes`` as ``(time_s, bytes)`` samples at every
change. ``layer_starts`` marks where each layer (``-1``: the head) begins on the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpusim.engine.items import Descriptor

TRACK_GROUPS = {"mxu": "compute", "vpu": "compute", "wait": "compute"}


def track_group(track: str) -> str:
    """``compute``, ``dma`` or ``link``: which trace process a track belongs to."""
    if track.startswith("dma"):
        return "dma"
    if track.startswith("link"):
        return "link"
    return TRACK_GROUPS.get(track, "compute")


@dataclass
class Timeline:
    """Intervals per resource track plus the VMEM occupancy curve (see module docstring)."""

    tracks: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)
    counters: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    layer_starts: list[tuple[int, float]] = field(default_factory=list)
    step_s: float = 0.0
    vmem_capacity_bytes: float = 0.0

    def layer_window(self, first_layer: int, count: int) -> tuple[float, float]:
        """(start_s, end_s) covering ``count`` layers from ``first_layer`` on the stream."""
        starts = dict(self.layer_starts)
        order = [layer for layer, _ in self.layer_starts]
        if first_layer not in starts:
            return 0.0, self.step_s
        position = order.index(first_layer)
        end_position = position + count
        end = self.layer_starts[end_position][1] if end_position < len(order) else self.step_s
        return starts[first_layer], end


class Recorder:
    """Collects a :class:`Timeline` while the simulation runs."""

    def __init__(self) -> None:
        self.timeline = Timeline(tracks={"mxu": [], "vpu": [], "wait": []}, counters={"vmem_bytes": []})

    def interval(self, track: str, start_s: float, end_s: float, label: str) -> None:
        if end_s > start_s:
            self.timeline.tracks.setdefault(track, []).append((start_s, end_s, label))

    def dma(self, desc: Descriptor) -> None:
        label = f"{desc.tensor} L{desc.layer} c{desc.chunk}"
        self.interval(f"dma {desc.lane}", desc.issue_s, desc.land_s, label)

    def vmem(self, time_s: float, used_bytes: float) -> None:
        samples = self.timeline.counters["vmem_bytes"]
        if samples and samples[-1][0] == time_s:
            # Several allocations and frees at one instant: keep the highest level seen, so
            # the counter shows the same peak the engine reports (frees at an instant can
            # follow the takes that set it).
            samples[-1] = (time_s, max(samples[-1][1], used_bytes))
        else:
            samples.append((time_s, used_bytes))

    def layer_start(self, layer: int, time_s: float) -> None:
        self.timeline.layer_starts.append((layer, time_s))
