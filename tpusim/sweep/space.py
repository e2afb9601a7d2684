"""The schedule space a sweep searches: a choice list for every knob of the schedule schema.

A :class:`SweepSpace` is data (pydantic, frozen). It is saved as ``space.json`` beside the
results, so a sweep's output says exactly what was searched. For every schedule knob
(:class:`tpusim.schedule.schema.Schedule`) it lists the values a candidate may take:

========================  ===========================================================
knob                      space field
========================  ===========================================================
per-family distance       ``families[f].distances``  (``prefetch_distance_ops``)
per-family chunk          ``families[f].chunk_bytes`` (``None`` = whole tensors)
per-family ring depth     ``families[f].buffers``    (expert slots for routed_expert)
VMEM pools                ``pool_patterns`` (named groupings, e.g. attention+experts), with
                          ``pool_modes`` (a pattern's ring-of-banks pools)
DMAs in flight            ``max_dmas_in_flight``
expert issue              ``expert_issue`` (+ ``expert_speculation_ops``)
KV streaming              ``kv_tile_tokens``, ``kv_buffers``
========================  ===========================================================

and the constraints a candidate must meet (:class:`SpaceConstraints`): its static VMEM
scratch must fit the chip's usable on-chip memory (capacity less the compiler reserve,
``chip.staging_memory.usable_bytes``) and its ``max_dmas_in_flight`` may not exceed the copy
engine's outstanding-descriptor limit.

The candidates drawn from a space are built in :mod:`tpusim.sweep.candidates`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hwmodels.units import MIB
from tpusim.schedule.schema import (
    SCHEDULE_FAMILIES,
    FamilySchedule,
    PoolSpec,
    Schedule,
)
from tpusim.workload.registry.names import ATTENTION_FAMILIES, Family

ExpertIssue = Literal["after_routing", "during_selection", "speculative"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FamilySpace(_Frozen):
    """The values one weight family's three knobs may take."""

    distances: list[int] = Field(min_length=1, description="prefetch_distance_ops choices")
    chunk_bytes: list[int | None] = Field(min_length=1, description="slab size choices, bytes")
    buffers: list[int] = Field(min_length=1, description="ring depth choices")

    @model_validator(mode="after")
    def _within_the_schema(self) -> FamilySpace:
        """Every value must be one the schedule schema accepts (its bounds are the one owner):
        a space listing ``buffers: [0]`` would otherwise yield only rejected candidates."""
        knobs = (("prefetch_distance_ops", "distances", self.distances),
                 ("chunk_bytes", "chunk_bytes", self.chunk_bytes), ("buffers", "buffers", self.buffers))
        for knob, field, values in knobs:
            for value in values:
                try:
                    FamilySchedule(**{knob: value})
                except ValidationError as error:
                    reason = error.errors(include_url=False)[0]["msg"]
                    raise ValueError(f"{field}: {value!r} is outside the schedule schema's bounds "
                                     f"({reason})") from None
        return self

    def triples(self) -> list[tuple[int, int | None, int]]:
        """Every (distance, chunk, buffers) the schedule schema accepts, in a fixed order."""
        out = []
        for distance, chunk, buffers in itertools.product(self.distances, self.chunk_bytes, self.buffers):
            if distance >= 1 and buffers < 2 and chunk:
                continue  # the schema forbids it: a single buffer refilled while being read
            out.append((distance, chunk, buffers))
        return out


class SpaceConstraints(_Frozen):
    """Hard limits a candidate must meet (violations are pruned, with the reason recorded)."""

    vmem_capacity_bytes: float | None = Field(
        default=None, gt=0,
        description="usable on-chip bytes for explicit buffers (capacity less the compiler "
        "reserve); None = the chip's staging_memory.usable_bytes, filled in when the sweep runs",
    )
    vmem_capacity_source: str = Field(default="", description="where vmem_capacity_bytes comes from")
    max_dmas_in_flight_limit: int = Field(
        default=32, ge=1,
        description="outstanding-DMA limit of the copy engine (assumed: DMA semaphores and "
        "descriptor queue; not published)",
    )


class SweepSpace(_Frozen):
    """Choices for every knob of :class:`~tpusim.schedule.schema.Schedule`, and the constraints."""

    families: dict[str, FamilySpace]
    pool_patterns: dict[str, dict[str, list[str]]] = Field(
        description="named pool assignments: pattern -> {pool name: member families}; "
        "families in no pool get their own arena",
    )
    pool_modes: dict[str, dict[str, PoolSpec]] = Field(
        default_factory=dict,
        description="pattern -> pool -> sharing mode (e.g. a ring of banks); pools left out are arenas",
    )
    max_dmas_in_flight: list[int] = Field(min_length=1)
    expert_issue: list[ExpertIssue] = Field(min_length=1)
    expert_speculation_ops: int = Field(default=2, ge=1, description="with speculative issue")
    speculation_miss_rate: float = Field(
        default=0.25, ge=0.0, le=1.0,
        description="assumed predictor miss rate for speculative expert issue",
    )
    kv_tile_tokens: list[int] = Field(min_length=1)
    kv_buffers: list[int] = Field(min_length=1)
    samples: int = Field(default=1200, ge=0, description="random draws (after built-ins and neighbours)")
    sampler: Literal["uniform", "vmem-guided"] = Field(
        default="vmem-guided",
        description="uniform: every knob independent; vmem-guided: each family's triple drawn "
        "from those that still fit the VMEM limit given the families drawn before it",
    )
    neighbours: bool = Field(default=True, description="include one-knob neighbours of the built-ins")
    constraints: SpaceConstraints = Field(default_factory=SpaceConstraints)

    @model_validator(mode="after")
    def _check(self) -> SweepSpace:
        for name in self.families:
            if name not in SCHEDULE_FAMILIES:
                raise ValueError(f"families.{name}: unknown family; known: {', '.join(SCHEDULE_FAMILIES)}")
        routed = self.families.get(Family.ROUTED_EXPERT)
        if routed and any(c is not None for c in routed.chunk_bytes):
            raise ValueError("families.routed_expert.chunk_bytes: expert slices are copied whole (use [null])")
        for pattern, pools in self.pool_patterns.items():
            seen: set[str] = set()
            for pool, members in pools.items():
                for member in members:
                    if member not in SCHEDULE_FAMILIES:
                        raise ValueError(f"pool_patterns.{pattern}.{pool}: unknown family {member!r}")
                    if member in seen:
                        raise ValueError(f"pool_patterns.{pattern}: {member} is in two pools")
                    seen.add(member)
        if not self.pool_patterns:
            raise ValueError("pool_patterns: at least one pattern (e.g. none: {})")
        for pattern, modes in self.pool_modes.items():
            unknown = [pool for pool in modes if pool not in self.pool_patterns.get(pattern, {})]
            if unknown:
                raise ValueError(f"pool_modes.{pattern}: {unknown[0]!r} is not a pool of that pattern")
        return self

    def with_capacity(self, capacity_bytes: float, source: str) -> SweepSpace:
        """This space with the VMEM capacity filled in (unless it was set explicitly)."""
        if self.constraints.vmem_capacity_bytes is not None:
            return self
        constraints = self.constraints.model_copy(
            update={"vmem_capacity_bytes": capacity_bytes, "vmem_capacity_source": source})
        return self.model_copy(update={"constraints": constraints})


def default_space() -> SweepSpace:
    """The default space: 2.8e17 schedules for K3's families, of which a sweep considers ~1650.

    Values bracket the built-ins: distances from 0 (no overlap) to 16 ops (about a layer
    ahead at batch 1), slabs of 1-8 MiB or whole tensors, 1-4 buffers (2-8 expert slots).
    ``routed_expert`` has no distance choice: the engine issues expert copies at the
    routing decision (``expert_issue``), and the slots bound how far ahead they run.
    """
    attention = FamilySpace(distances=[0, 1, 2, 3, 5, 8, 12, 16],
                            chunk_bytes=[None, 1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB], buffers=[1, 2, 3, 4])
    dense = FamilySpace(distances=[0, 1, 2, 3, 4, 8, 12],
                        chunk_bytes=[None, 1 * MIB, 2 * MIB, 4 * MIB], buffers=[1, 2, 3])
    big = FamilySpace(distances=[0, 1, 2, 4, 8, 10],
                      chunk_bytes=[None, 1 * MIB, 2 * MIB, 4 * MIB], buffers=[1, 2, 4])
    attention_all = list(ATTENTION_FAMILIES)
    return SweepSpace(
        families={
            Family.KDA_PROJ: attention, Family.MLA_PROJ: attention, Family.GQA_PROJ: attention,
            Family.SMALL_PARAMS: FamilySpace(distances=[0, 2, 5, 10], chunk_bytes=[None], buffers=[1, 2]),
            Family.ROUTER: dense, Family.LATENT_PROJ: dense, Family.SHARED_EXPERT: dense,
            Family.ROUTED_EXPERT: FamilySpace(distances=[0], chunk_bytes=[None], buffers=[2, 3, 4, 6, 8]),
            Family.DENSE_MLP: big, Family.LM_HEAD: big,
        },
        pool_patterns={
            "none": {},
            "attention+experts": {"main": [*attention_all, Family.ROUTED_EXPERT]},
            "attention+experts+shared": {"main": [*attention_all, Family.ROUTED_EXPERT, Family.SHARED_EXPERT]},
            "attention+mlp": {"main": [*attention_all, Family.SHARED_EXPERT, Family.ROUTED_EXPERT, Family.DENSE_MLP, Family.LM_HEAD]},
            "attention|mlp": {"attention": attention_all, "mlp": [Family.ROUTED_EXPERT, Family.DENSE_MLP, Family.LM_HEAD]},
            "all": {"main": list(SCHEDULE_FAMILIES)},
        },
        max_dmas_in_flight=[4, 8, 16, 32],
        expert_issue=["after_routing", "during_selection"],
        kv_tile_tokens=[64, 128, 256],
        kv_buffers=[1, 2, 3],
    )


# ---------------------------------------------------------------------------------------
# Knobs: a flat, named view of a schedule (the CSV columns and the sensitivity table)
# ---------------------------------------------------------------------------------------

GLOBAL_KNOBS = ("pools", "max_dmas_in_flight", "expert_issue", "kv_tile_tokens", "kv_buffers")


def knob_names(families: Iterable[str]) -> list[str]:
    """Knob column names for the families present: ``<family>.distance|chunk_mib|buffers``."""
    names = []
    for family in families:
        names.append(f"{family}.distance")
        if family != Family.ROUTED_EXPERT:
            names.append(f"{family}.chunk_mib")
        names.append(f"{family}.buffers")
    return [*names, *GLOBAL_KNOBS]


def pool_partition(schedule: Schedule, families: Iterable[str]) -> frozenset[frozenset[str]]:
    """The schedule's pools as a partition of ``families`` (only pools of ≥ 2 members)."""
    present = set(families)
    groups = [frozenset(m for m in members if m in present) for members in schedule.member_pools().values()]
    return frozenset(g for g in groups if len(g) > 1)


def pattern_partition(pools: dict[str, list[str]], families: Iterable[str]) -> frozenset[frozenset[str]]:
    present = set(families)
    groups = [frozenset(m for m in members if m in present) for members in pools.values()]
    return frozenset(g for g in groups if len(g) > 1)


def pool_pattern_name(schedule: Schedule, space: SweepSpace, families: Iterable[str]) -> str:
    """The name of the space pattern the schedule's pools (and their modes) match, else ``custom``."""
    families = list(families)
    partition = pool_partition(schedule, families)
    for name, pools in space.pool_patterns.items():
        if pattern_partition(pools, families) == partition and (
                _modes(space, name, families) == _schedule_modes(schedule, families)):
            return name
    return "custom"


def _modes(space: SweepSpace, pattern: str, families: list[str]) -> dict[frozenset[str], PoolSpec]:
    pools = space.pool_patterns.get(pattern, {})
    return {frozenset(pools[pool]) & set(families): spec
            for pool, spec in space.pool_modes.get(pattern, {}).items() if spec.mode != "arena"}


def _schedule_modes(schedule: Schedule, families: list[str]) -> dict[frozenset[str], PoolSpec]:
    members = schedule.member_pools()
    return {frozenset(members.get(pool, [])) & set(families): spec
            for pool, spec in schedule.pools.items() if spec.mode != "arena"}


def schedule_knobs(schedule: Schedule, space: SweepSpace, families: Iterable[str]) -> dict[str, Any]:
    """The schedule's knob values keyed by :func:`knob_names` (chunks in MiB, '' = whole)."""
    families = list(families)
    knobs: dict[str, Any] = {}
    for family in families:
        fam = schedule.family(family)
        knobs[f"{family}.distance"] = fam.prefetch_distance_ops
        if family != Family.ROUTED_EXPERT:
            knobs[f"{family}.chunk_mib"] = "" if fam.chunk_bytes is None else round(fam.chunk_bytes / MIB, 4)
        knobs[f"{family}.buffers"] = fam.buffers
    knobs["pools"] = pool_pattern_name(schedule, space, families)
    knobs["max_dmas_in_flight"] = schedule.max_dmas_in_flight
    issue = schedule.expert_issue
    knobs["expert_issue"] = f"speculative:{schedule.expert_speculation_ops}" if issue == "speculative" else issue
    knobs["kv_tile_tokens"] = schedule.kv_tile_tokens
    knobs["kv_buffers"] = schedule.kv_buffers
    return knobs
