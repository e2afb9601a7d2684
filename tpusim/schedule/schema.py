"""Prefetch schedules: the contract between the simulator and the megakernel.

A :class:`Schedule` says, for every weight family, *when* its HBM→VMEM copies are issued
relative to the compute stream, in what pieces, and into how many VMEM buffers; where the
routed-expert copies are issued; and how KV tiles stream. ``tpusim simulate`` predicts a
schedule, ``tpusim sweep`` searches over them and writes the best as JSON, and the kernel
(:mod:`megakernel`) reads the same JSON and issues exactly those DMAs.

Vocabulary (the kernel and the engine use the same words):

- **op**: one compute step of the per-device program (``kda.qkvgb``, ``moe.router``,
  ``expert[3]``, ...). The step is a flat sequence of ops across all layers.
- **prefetch distance** ``d`` (``prefetch_distance_ops``): the copy feeding op ``i`` is
  issued when the compute stream *starts* op ``i - d`` of the flat sequence, so ``d`` crosses
  layer boundaries freely; ``d = 0`` issues it as its own op starts and waits at once (no
  overlap). A copy is issued no earlier than its buffer is free, nor before the last routing
  decision ahead of it (the full rule: :mod:`tpusim.schedule.issue_plan`).
- **chunk**: a tensor larger than ``chunk_bytes`` is copied as row slabs of at most that
  size; its op computes slab by slab as they land. ``None`` copies whole tensors.
- **buffers**: the ring depth of a family: how many chunks (for ``routed_expert``: whole
  expert slices, the "expert slots") may be resident at once. A buffer is reused only after
  the op reading it has finished with it.
- **pool**: families naming the same pool share VMEM, in one of two modes
  (:class:`PoolSpec`, under ``pools``; a pool not listed there is an ``arena``):

  - ``arena`` (default): the members time-share one arena sized for the largest member
    footprint (the published K3 kernel's ≈ 29.8 MiB pool holds attention projections *or*
    expert slots);
  - ``ring``: one ring of ``banks`` banks of ``bank_bytes`` each, shared by every member
    tensor: each tensor is cut into bank-sized slabs and the slabs of all members take the
    banks in turn, in consumption order, so the pool streams ahead across tensors and layers
    as far as free banks allow (the Muse kernel's 12 x 2 MiB dense-weight ring). Members'
    ``chunk_bytes`` and ``buffers`` are the pool's; their distances still apply. Routed
    experts keep their own slots.

  See :mod:`tpusim.schedule.vmem` for the byte accounting both sides use.
- **expert issue**: ``after_routing`` (copies start when the top-k is known),
  ``during_selection`` (each locally owned winner's copies start as the selection finds it,
  as the published kernel does), or ``speculative`` (issued ``expert_speculation_ops`` ops
  before routing from a prediction; a miss, at ``speculation_miss_rate``, refetches).

Built-ins (``tpusim/schedules/*.json``): ``naive``, ``published``, ``layer-double-buffer``
(K3), ``muse-published`` (the Muse Spark kernel: a shared ring pool), ``k3-ring`` (that ring
applied to K3; derived).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from hwmodels.errors import InputError
from hwmodels.textfile import read_user_json
from tpusim.workload.registry.names import WEIGHT_FAMILIES, Family

# Per-layer norms, biases and gates: one small copy read through the whole layer.
SMALL_FAMILY = Family.SMALL_PARAMS
# Families a schedule controls (the registry's weight families; KV tiles and state have knobs of their own).
SCHEDULE_FAMILIES = WEIGHT_FAMILIES



def _a_number(value: object) -> object:
    """Counts and rates are numbers: a boolean (``"buffers": true`` would read as 1) or a text
    is refused; an integral float such as 4.0 still reads as a count."""
    if isinstance(value, bool | str | bytes):
        raise ValueError(f"expected a number, got {json.dumps(value) if isinstance(value, bool | str) else value!r}")
    return value


# A schedule count (buffers, distances, bytes, banks, copies in flight) or rate: no booleans, no text.
Count = Annotated[int, BeforeValidator(_a_number)]
Rate = Annotated[float, BeforeValidator(_a_number)]

SCHEDULES_DIR = Path(__file__).resolve().parents[1] / "schedules"
BUILTIN_SCHEDULES = ("naive", "published", "layer-double-buffer")  # K3's: the sweep's fixed starting points
MODEL_SCHEDULES = ("muse-published", "k3-ring")  # built-ins written for one model (Muse Spark; K3)


class FamilySchedule(BaseModel):
    """How one weight family streams into VMEM."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefetch_distance_ops: Count = Field(
        default=0, ge=0, le=4096,
        description="issue the copy this many ops before its consumer starts (crosses layers)",
    )
    chunk_bytes: Count | None = Field(
        default=None, ge=4096, description="split tensors into row slabs of at most this size"
    )
    buffers: Count = Field(default=1, ge=1, le=64, description="ring depth (expert slots)")
    pool: str | None = Field(default=None, description="VMEM pool shared with other families")


class PoolSpec(BaseModel):
    """How the families naming a pool share VMEM (module docstring: ``arena`` or ``ring``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["arena", "ring"] = Field(default="arena", description="arena: time-shared, sized for "
                                           "the largest member; ring: banks shared by every member tensor")
    banks: Count | None = Field(default=None, ge=2, le=256, description="ring mode: number of banks")
    bank_bytes: Count | None = Field(default=None, ge=65536, description="ring mode: bytes per bank")

    @model_validator(mode="after")
    def _check(self) -> PoolSpec:
        if self.mode == "ring" and (self.banks is None or self.bank_bytes is None):
            raise ValueError("mode ring needs banks and bank_bytes")
        if self.mode == "arena" and (self.banks is not None or self.bank_bytes is not None):
            raise ValueError("banks and bank_bytes only apply to mode ring")
        return self


ReceiveSlots = Literal["per_message", "shared"]
RECEIVE_SLOTS: tuple[str, ...] = ("per_message", "shared")
class Deployment(BaseModel):
    """The plan and collective algorithms a schedule was chosen for (a joint sweep's winner).

    ``tpusim simulate --schedule best.json`` reads it: ``plan`` is a ``--plan`` choice
    (``auto``: the published plan for the model and device count, else a SPEC such as
    ``expert_groups=8,expert_tp=4,attention=dp``), ``collectives`` the algorithm per
    collective name (:meth:`tpusim.workload.sharding.ShardingPlan.with_algorithms`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: str = Field(min_length=1, description="a --plan choice: auto, generic, a SPEC or a plan name")
    collectives: dict[str, str] = Field(
        default_factory=dict, description="collective name -> algorithm (tpusim.workload.collectives)")


class Schedule(BaseModel):
    """A complete prefetch schedule for one decode step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    families: dict[str, FamilySchedule] = Field(
        default_factory=dict, description="per family; a family left out gets the defaults"
    )
    pools: dict[str, PoolSpec] = Field(
        default_factory=dict, description="per pool name its sharing mode; a pool left out is an arena"
    )
    max_dmas_in_flight: Count = Field(default=8, ge=1, le=256, description="outstanding copies")
    expert_issue: Literal["after_routing", "during_selection", "speculative"] = "after_routing"
    expert_speculation_ops: Count = Field(
        default=0, ge=0, description="with speculative issue: ops before routing the copies start"
    )
    speculation_miss_rate: Rate = Field(
        default=0.0, ge=0.0, le=1.0, description="fraction of speculative expert copies refetched"
    )
    kv_tile_tokens: Count = Field(default=128, ge=8, description="KV cache tile, tokens")
    kv_buffers: Count = Field(default=2, ge=1, le=16, description="KV tiles in flight")
    receive_slots: ReceiveSlots = Field(
        default="shared",
        description="collective receive-slot layout (multi-device kernels): per_message = every collective "
        "its own send buffer and one receive slot per incoming message; shared = as per_message, but a "
        "collective that runs once in the dense layers reuses the buffers of the MoE collective of the same "
        "algorithm, group and payload (their lifetimes never overlap; tpusim.schedule.vmem rule 6)",
    )
    deployment: Deployment | None = Field(
        default=None, description="plan + collective algorithms this schedule was chosen with "
        "(a joint sweep's best.json); None: the schedule alone, on whatever plan is asked for")

    @model_validator(mode="after")
    def _check(self) -> Schedule:
        unknown = [name for name in self.families if name not in SCHEDULE_FAMILIES]
        if unknown:
            raise ValueError(
                f"families: unknown family {unknown[0]!r}; known: {', '.join(SCHEDULE_FAMILIES)}"
            )
        routed = self.family(Family.ROUTED_EXPERT)
        members = {fam.pool for fam in self.families.values() if fam.pool}
        for pool, spec in self.pools.items():
            if pool not in members:
                raise ValueError(f"pools.{pool}: no family names this pool")
            if spec.mode == "ring" and routed.pool == pool:
                raise ValueError(f"pools.{pool}: routed_expert keeps its own slots; it cannot join a ring pool")
        if routed.chunk_bytes is not None:
            raise ValueError("families.routed_expert.chunk_bytes: expert slices are copied whole")
        if self.expert_issue == "speculative" and self.expert_speculation_ops == 0:
            raise ValueError("expert_speculation_ops must be > 0 with expert_issue=speculative")
        if self.expert_issue != "speculative" and self.speculation_miss_rate:
            raise ValueError("speculation_miss_rate only applies to expert_issue=speculative")
        for name, fam in self.families.items():
            if fam.prefetch_distance_ops >= 1 and fam.buffers < 2 and fam.chunk_bytes:
                # One buffer and a chunked tensor: the next chunk cannot land before this one
                # is consumed, so a distance > 0 would refill a buffer still being read.
                raise ValueError(
                    f"families.{name}: prefetch_distance_ops > 0 with chunk_bytes needs buffers >= 2 "
                    "(a single buffer would be refilled while still being read)"
                )
        return self

    def family(self, name: str) -> FamilySchedule:
        if name not in SCHEDULE_FAMILIES:
            raise KeyError(f"unknown schedule family {name!r}")
        # the default built only when missing (building one validates it; a lowering asks hundreds of times)
        fam = self.families.get(name)
        return FamilySchedule() if fam is None else fam

    def pool_spec(self, pool: str) -> PoolSpec:
        """The sharing mode of ``pool`` (an ``arena`` unless ``pools`` says otherwise)."""
        spec = self.pools.get(pool)  # the default built only when missing
        return PoolSpec() if spec is None else spec

    def ring_pool(self, family: str) -> PoolSpec | None:
        """The ring-mode pool ``family`` streams through, or None. Small parameters never do:
        they are read through the whole layer, so they always get an arena of their own."""
        if family == SMALL_FAMILY:
            return None
        pool = self.family(family).pool
        spec = self.pools.get(pool) if pool else None
        return spec if spec is not None and spec.mode == "ring" else None

    def member_pools(self) -> dict[str, list[str]]:
        """Pool name -> member families; unpooled families get a pool of their own."""
        pools: dict[str, list[str]] = {}
        for name in SCHEDULE_FAMILIES:
            pool = self.family(name).pool or name
            pools.setdefault(pool, []).append(name)
        return pools

    def content_hash(self) -> str:
        """Stable 16-hex-digit hash of everything but name and description."""
        data = self.model_dump(mode="json", exclude={"name", "description"})
        if not self.pools:  # added later: schedules without ring pools keep their hashes
            del data["pools"]
        if self.receive_slots == "shared":  # added later (the default): existing schedules keep their hashes
            del data["receive_slots"]
        if self.deployment is None:  # added later: schedules without a deployment keep their hashes
            del data["deployment"]
        data["families"] = {
            name: self.family(name).model_dump(mode="json") for name in SCHEDULE_FAMILIES
        }
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def with_changes(self, **changes: object) -> Schedule:
        return Schedule.model_validate({**self.model_dump(), **changes})


def load_schedule(name_or_path: str) -> Schedule:
    """A built-in schedule by name, or a schedule JSON file."""
    path = Path(name_or_path)
    if name_or_path in BUILTIN_SCHEDULES + MODEL_SCHEDULES:
        path = SCHEDULES_DIR / f"{name_or_path}.json"
    elif not path.exists():
        raise InputError(f"unknown schedule {name_or_path!r}: not a file and not one of "
                         f"{', '.join(BUILTIN_SCHEDULES + MODEL_SCHEDULES)}")
    data = read_user_json(path)
    try:
        return Schedule.model_validate(data)
    except ValidationError as error:
        from tpusim.workload.model_catalog import format_validation_error

        raise InputError(format_validation_error(path, error, None, "schedule")) from None


def save_schedule(schedule: Schedule, path: Path) -> None:
    """Write ``schedule`` as JSON atomically (temp file in the same folder, then rename)."""
    from hwmodels.atomic import write_text_atomic

    data = schedule.model_dump(mode="json")
    if schedule.deployment is None:  # files of schedules without a deployment stay as they were
        del data["deployment"]
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
