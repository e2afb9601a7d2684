"""The candidate schedules a sweep considers, built from a :class:`~tpusim.sweep.space.SweepSpace`.

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

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from pydantic import ValidationError

from hwmodels.validation import describe_validation_error
from tpusim.schedule.schema import (
    BUILTIN_SCHEDULES,
    SMALL_FAMILY,
    FamilySchedule,
    Schedule,
    load_schedule,
)
from tpusim.sweep.space import (
    SweepSpace,
)


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

SHARED_SLOTS = "shared"  # the receive-slot layout the sweep moves toward (vmem rule 6)


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
        "receive_slots": schedule.receive_slots,
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
    if base.receive_slots != SHARED_SLOTS:  # only toward shared: same step time, less VMEM (vmem rule 6)
        yield _make(f"{tag}~receive_slots={SHARED_SLOTS}", f"{tag} with receive_slots={SHARED_SLOTS}",
                    dict(base.families), {**glob, "receive_slots": SHARED_SLOTS})


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
    owner.pop(SMALL_FAMILY, None)  # small parameters always keep an arena of their own (vmem rule 3)
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
            # none fits: the smallest footprint (the likeliest to leave room for the rest)
            triples = fitting or [min(triples, key=lambda t: guide.family_bytes(family, t[2], t[1]))]
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
