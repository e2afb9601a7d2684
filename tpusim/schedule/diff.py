"""The knobs two schedules set differently.

A schedule's knobs are its top-level fields (``max_dmas_in_flight``, ``expert_issue``, KV
tiling, ...) and, for every family in :data:`~tpusim.schedule.schema.SCHEDULE_FAMILIES`,
its :class:`~tpusim.schedule.schema.FamilySchedule` fields. A family a schedule leaves out
runs with the defaults, so it is compared as the defaults: a schedule that spells out a
default and one that omits it do not differ. ``name`` and ``description`` are not knobs.
"""

from __future__ import annotations

from typing import Any

from tpusim.schedule.schema import SCHEDULE_FAMILIES, Schedule

NOT_KNOBS = ("name", "description", "families")


def knobs(schedule: Schedule) -> dict[str, Any]:
    """Every knob of ``schedule`` by dotted name (``families.mla_proj.chunk_bytes``)."""
    values = {key: value for key, value in schedule.model_dump().items() if key not in NOT_KNOBS}
    for family in SCHEDULE_FAMILIES:
        for key, value in schedule.family(family).model_dump().items():
            values[f"families.{family}.{key}"] = value
    return values


def knob_differences(a: Schedule, b: Schedule) -> list[tuple[str, Any, Any]]:
    """(knob, value in a, value in b) for every knob the two set differently, in schema order."""
    first, second = knobs(a), knobs(b)
    return [(key, first[key], second[key]) for key in first if first[key] != second[key]]
