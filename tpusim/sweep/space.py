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

Candidates (:func:`candidates`), in a fixed order so a seed gives the same list every time:

1. the built-in schedules (``naive``, ``published``, ``layer-double-buffer``), always;
2. every one-knob neighbour of each built-in (change one knob to another value of the
   space): the known-good design points, perturbed one step at a time;
3. ``samples`` random draws (numpy ``default_rng(seed)``): each global knob uniformly from
   its list; each family's (distance, chunk, buffers) triple uniformly from the triples the
   schema allows — and, with the default ``vmem-guided`` sampler, that still fit the VMEM
   limit (uniform draws over K3's space overflow VMEM nine times in ten).

Duplicates (same :meth:`Schedule.content_hash`) are dropped, keeping the first. Families the
model lacks (``gqa_proj`` for K3) keep their defaults, so they cannot create distinct-looking
duplicates. Settings the schema rejects stay candidates, marked ``rejected`` with the reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hwmodels.validation import describe_validation_error
from tpusim.schedule.schema import (
    BUILTIN_SCHEDULES,
    SCHEDULE_FAMILIES,
    FamilySchedule,
    PoolSpec,
    Schedule,
    load_schedule,
)

MIB = 1 << 20
ATTENTION_FAMILIES = ("kda_proj", "mla_proj", "gqa_proj")
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
        routed = self.families.get("routed_expert")
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
            "kda_proj": attention, "mla_proj": attention, "gqa_proj": attention,
            "small_params": FamilySpace(distances=[0, 2, 5, 10], chunk_bytes=[None], buffers=[1, 2]),
            "router": dense, "latent_proj": dense, "shared_expert": dense,
            "routed_expert": FamilySpace(distances=[0], chunk_bytes=[None], buffers=[2, 3, 4, 6, 8]),
            "dense_mlp": big, "lm_head": big,
        },
        pool_patterns={
            "none": {},
            "attention+experts": {"main": [*attention_all, "routed_expert"]},
            "attention+experts+shared": {"main": [*attention_all, "routed_expert", "shared_expert"]},
            "attention+mlp": {"main": [*attention_all, "shared_expert", "routed_expert", "dense_mlp", "lm_head"]},
            "attention|mlp": {"attention": attention_all, "mlp": ["routed_expert", "dense_mlp", "lm_head"]},
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
        if family != "routed_expert":
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
        if family != "routed_expert":
            knobs[f"{family}.chunk_mib"] = "" if fam.chunk_bytes is None else round(fam.chunk_bytes / MIB, 4)
        knobs[f"{family}.buffers"] = fam.buffers
    knobs["pools"] = pool_pattern_name(schedule, space, families)
    knobs["max_dmas_in_flight"] = schedule.max_dmas_in_flight
    issue = schedule.expert_issue
    knobs["expert_issue"] = f"speculative:{schedule.expert_speculation_ops}" if issue == "speculative" else issue
    knobs["kv_tile_tokens"] = schedule.kv_tile_tokens
    knobs["kv_buffers"] = schedule.kv_buffers
    return knobs


# ---------------------------------------------------------------------------------------
# Building candidates
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """One schedule to consider, with where it came from (builtin / neighbour / sample / refine).

    ``rejected`` is empty for a schedule the schema accepts. Otherwise it says why the schema
    rejects these settings (``schema: ...``), and ``schedule`` holds them unvalidated
    (``Schedule.model_construct``): the sweep reads its knobs and content hash for the row
    (stable across ``--resume``) and never prunes, estimates or simulates it.
    """

    schedule: Schedule
    source: str
    hash: str
    rejected: str = ""


def _make(name: str, description: str, families: dict[str, FamilySchedule],
          globals_: dict[str, Any]) -> tuple[Schedule, str]:
    """The schedule and ``""``, or, when the schema rejects it, the unvalidated settings and why."""
    try:
        return Schedule(name=name, description=description, families=families, **globals_), ""
    except ValidationError as error:
        settings = Schedule.model_construct(name=name, description=description, families=families, **globals_)
        return settings, describe_validation_error("schema", error)


def _globals_of(schedule: Schedule) -> dict[str, Any]:
    return {
        "max_dmas_in_flight": schedule.max_dmas_in_flight,
        "expert_issue": schedule.expert_issue,
        "expert_speculation_ops": schedule.expert_speculation_ops,
        "speculation_miss_rate": schedule.speculation_miss_rate,
        "kv_tile_tokens": schedule.kv_tile_tokens,
        "kv_buffers": schedule.kv_buffers,
        "pools": dict(schedule.pools),
    }


def _issue_globals(issue: str, space: SweepSpace) -> dict[str, Any]:
    if issue == "speculative":
        return {"expert_issue": issue, "expert_speculation_ops": space.expert_speculation_ops,
                "speculation_miss_rate": space.speculation_miss_rate}
    return {"expert_issue": issue, "expert_speculation_ops": 0, "speculation_miss_rate": 0.0}


def _with_pattern(families: dict[str, FamilySchedule], pools: dict[str, list[str]],
                  present: list[str]) -> dict[str, FamilySchedule]:
    owner = {member: pool for pool, members in pools.items() for member in members}
    return {f: families[f].model_copy(update={"pool": owner.get(f)}) for f in present}


def neighbours(base: Schedule, space: SweepSpace, present: list[str]) -> Iterator[Schedule]:
    """Every schema-valid schedule exactly one knob away from ``base`` within the space."""
    for cand in neighbour_candidates(base, space, present):
        if not cand.rejected:
            yield cand.schedule


def neighbour_candidates(base: Schedule, space: SweepSpace, present: list[str],
                         source: str = "neighbour") -> Iterator[Candidate]:
    """Every one-knob change of ``base`` within the space, those the schema rejects included
    (with ``rejected`` saying why); a "change" to the value ``base`` already has is none."""
    base_hash = base.content_hash()
    for schedule, rejected in _one_knob_changes(base, space, present):
        digest = schedule.content_hash()
        if digest != base_hash:
            yield Candidate(schedule, source, digest, rejected)


def _one_knob_changes(base: Schedule, space: SweepSpace, present: list[str]) -> Iterator[tuple[Schedule, str]]:
    fams = {f: base.family(f) for f in present}
    glob = _globals_of(base)
    tag = base.name
    for family in present:
        spec = space.families.get(family)
        if spec is None:
            continue
        fam = fams[family]
        for knob, values in (("prefetch_distance_ops", spec.distances), ("chunk_bytes", spec.chunk_bytes),
                             ("buffers", spec.buffers)):
            for value in values:
                if getattr(fam, knob) == value:
                    continue
                changed = {**fams, family: fam.model_copy(update={knob: value})}
                yield _make(f"{tag}~{family}.{knob}={value}", f"{tag} with {family}.{knob}={value}",
                            {**base.families, **changed}, glob)
    for pattern, pools in space.pool_patterns.items():
        changed = _with_pattern(fams, pools, present)
        yield _make(f"{tag}~pools={pattern}", f"{tag} with pools {pattern}", {**base.families, **changed},
                    {**glob, "pools": dict(space.pool_modes.get(pattern, {}))})
    for value in space.max_dmas_in_flight:
        yield _make(f"{tag}~max_dmas={value}", f"{tag} with max_dmas_in_flight={value}",
                    dict(base.families), {**glob, "max_dmas_in_flight": value})
    for issue in space.expert_issue:
        yield _make(f"{tag}~expert_issue={issue}", f"{tag} with expert_issue={issue}",
                    dict(base.families), {**glob, **_issue_globals(issue, space)})
    for tokens in space.kv_tile_tokens:
        yield _make(f"{tag}~kv_tile={tokens}", f"{tag} with kv_tile_tokens={tokens}",
                    dict(base.families), {**glob, "kv_tile_tokens": tokens})
    for buffers in space.kv_buffers:
        yield _make(f"{tag}~kv_buffers={buffers}", f"{tag} with kv_buffers={buffers}",
                    dict(base.families), {**glob, "kv_buffers": buffers})


class VmemGuide(Protocol):
    """Static VMEM bytes of single knob settings (implemented by :class:`~tpusim.sweep.prune.VmemAccountant`)."""

    def family_bytes(self, family: str, buffers: int, chunk_bytes: int | None) -> int:
        """Footprint of one family's ring(s) (0 when the model lacks it)."""
        ...

    def fixed_bytes(self, kv_buffers: int, kv_tile_tokens: int) -> int:
        """KV tiles + recurrent state + activations."""
        ...


def sample(space: SweepSpace, present: list[str], rng: np.random.Generator, index: int,
           guide: VmemGuide | None = None) -> Schedule:
    """One random schedule (raises ``ValueError`` when the schema rejects the draw)."""
    cand = sample_candidate(space, present, rng, index, guide)
    if cand.rejected:
        raise ValueError(f"{cand.schedule.name}: {cand.rejected}")
    return cand.schedule


def sample_candidate(space: SweepSpace, present: list[str], rng: np.random.Generator, index: int,
                     guide: VmemGuide | None = None) -> Candidate:
    """One random draw as a candidate (see :func:`candidates` for the two samplers); a draw the
    schema rejects (e.g. a ring pool that takes ``routed_expert``) comes back ``rejected``.

    Guided draw, step by step: (1) draw the global knobs and the pool pattern; (2) visit the
    families in a random order; (3) for each, keep the (distance, chunk, buffers) triples
    whose footprint still fits — the running total of arenas (a pool's arena is its largest
    member) plus the smallest footprint every family not yet drawn could take — and draw
    uniformly among them (among all when none fits: the candidate will be pruned).
    *Invariant:* whenever a fitting triple exists for every family, the draw fits.
    """
    pattern_names = list(space.pool_patterns)
    pattern = pattern_names[int(rng.integers(len(pattern_names)))]
    issue = space.expert_issue[int(rng.integers(len(space.expert_issue)))]
    glob = {
        "max_dmas_in_flight": space.max_dmas_in_flight[int(rng.integers(len(space.max_dmas_in_flight)))],
        **_issue_globals(issue, space),
        "kv_tile_tokens": space.kv_tile_tokens[int(rng.integers(len(space.kv_tile_tokens)))],
        "kv_buffers": space.kv_buffers[int(rng.integers(len(space.kv_buffers)))],
    }
    owner = {m: pool for pool, members in space.pool_patterns[pattern].items() for m in members}
    capacity = space.constraints.vmem_capacity_bytes
    guided = guide is not None and capacity is not None and space.sampler == "vmem-guided"
    order = [present[i] for i in rng.permutation(len(present))] if guided else list(present)
    chosen: dict[str, tuple[int, int | None, int]] = {}
    arena: dict[str, int] = {}
    if guided:
        assert guide is not None and capacity is not None
        used = guide.fixed_bytes(int(glob["kv_buffers"]), int(glob["kv_tile_tokens"]))
        least = {f: min(guide.family_bytes(f, b, c) for _d, c, b in space.families[f].triples())
                 for f in order if f in space.families}
    for position, family in enumerate(order):
        spec = space.families.get(family)
        if spec is None:
            continue
        triples = spec.triples()
        if guided:
            assert guide is not None and capacity is not None
            pool = owner.get(family, family)
            reserve = 0
            for later in order[position + 1:]:
                if later in least:
                    later_pool = owner.get(later, later)
                    reserve += max(0, least[later] - arena.get(later_pool, 0)) if later_pool != pool else 0
            fitting = []
            for triple in triples:
                size = guide.family_bytes(family, triple[2], triple[1])
                grown = max(0, size - arena.get(pool, 0))
                if used + grown + reserve <= capacity:
                    fitting.append(triple)
            triples = fitting or triples
        triple = triples[int(rng.integers(len(triples)))]
        chosen[family] = triple
        if guided:
            assert guide is not None
            pool = owner.get(family, family)
            size = guide.family_bytes(family, triple[2], triple[1])
            if size > arena.get(pool, 0):
                used += size - arena.get(pool, 0)
                arena[pool] = size
    families = {f: FamilySchedule(prefetch_distance_ops=chosen[f][0], chunk_bytes=chosen[f][1],
                                  buffers=chosen[f][2]) if f in chosen else FamilySchedule() for f in present}
    families = _with_pattern(families, space.pool_patterns[pattern], present)
    schedule, rejected = _make(f"sample-{index:05d}", f"random draw {index} of the sweep space ({pattern})",
                               families, {"pools": dict(space.pool_modes.get(pattern, {})), **glob})
    return Candidate(schedule, "sample", schedule.content_hash(), rejected)


def candidates(space: SweepSpace, present: list[str], *, seed: int,
               builtins: Iterable[str] = BUILTIN_SCHEDULES, guide: VmemGuide | None = None) -> list[Candidate]:
    """Built-ins, their one-knob neighbours, then ``space.samples`` seeded draws; unique by hash.

    ``guide`` enables the ``vmem-guided`` sampler (draws that fit the VMEM limit); without
    it, or with ``space.sampler == "uniform"``, every knob is drawn independently.
    """
    out: list[Candidate] = []
    seen: set[str] = set()

    def add(cand: Candidate) -> None:
        if cand.hash not in seen:
            seen.add(cand.hash)
            out.append(cand)

    bases = [load_schedule(name) for name in builtins]
    for base in bases:
        add(Candidate(base, "builtin", base.content_hash()))
    if space.neighbours:
        for base in bases:
            for cand in neighbour_candidates(base, space, present):
                add(cand)
    rng = np.random.default_rng(seed)
    for index in range(space.samples):
        add(sample_candidate(space, present, rng, index, guide))
    return out
