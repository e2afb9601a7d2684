"""Calibration's file format for ``tpusim schema``: the measurement record.

``tpusim schema`` (:mod:`tpusim.app.schemas`) lists the topics of the ``tpusim.schemas``
entry points (:mod:`tpusim.app.plugins`) beside its own; this is the ``measurement`` one, so
that the ground floor names no module of this layer. The validator and the example are
imported when asked for: listing the topics (``tpusim --help``) stays light.
"""

from __future__ import annotations

from pydantic import BaseModel

from tpusim.app.schemas import Topic

EXAMPLE_FORMAT = "nvfp4+int8"  # the measurement example: the published points of this format


def _measurement_model() -> type[BaseModel]:
    from calibration.sources.measurements import Measurement

    return Measurement


def _measurement_example() -> str:
    """The published TPU7x points of one weight format, each stating its execution mode."""
    from calibration.sources.tpu7x_published import load_published

    records = [record for record in load_published() if record.format == EXAMPLE_FORMAT]
    lines = []
    for record in records:
        system = record.system.model_copy(update={"execution": "megakernel"})
        lines.append(record.model_copy(update={"system": system, "phases": []}).to_json_line())
    return "\n".join(lines)


def measurement_topic() -> Topic:
    """The ``measurement`` entry point of group ``tpusim.schemas``."""
    return Topic("one measured decode step per JSON line (tpusim calibrate / report)",
                 _measurement_model, _measurement_example, "JSON lines (.jsonl)")
