"""Sharding plans: how a model's weights and work are split over devices.

A :class:`ShardingPlan` states, per device, the widths every sharded tensor gets and the
collectives each layer runs. Published plans are YAML files in ``tpusim/models/``
(``plan-k3-tp32.yaml``: Kimi K3 on 16 TPU v7 chips = 32 devices; ``plan-muse-tp8.yaml``);
:func:`generic_plan` derives one for any model and device count (attention heads split
tensor-parallel, or data-parallel over ``attention_dp`` groups; experts split expert-parallel
into groups, each group optionally splitting every expert's intermediate width
tensor-parallel; a dense model splits its MLP columns). ``--plan tp=8,expert_groups=2,...``
reaches it through :mod:`tpusim.workload.plan_spec`; which plan a command gets is decided by
:func:`tpusim.workload.model_catalog.plan_for`.

Routed experts: device ``r`` belongs to group ``r // expert_tp`` of ``expert_groups``
groups; the group owns ``num_experts / expert_groups`` consecutive experts and the device
holds ``1 / expert_tp`` of each owned expert's intermediate width (K3 TP32: 8 groups of 4
ranks, 112 experts per group, a 768-wide quarter of each).

Collectives are listed with their payload per token. A collective with an ``algorithm``
(the published TPU plans) is expanded into messages by :mod:`tpusim.workload.collectives`
(which rank copies how many bytes to which peer over which link, in which phase); its
``stages`` (link, peers per phase) are derived from that expansion for stage-level pricing
(GPU pricers, analytic floors). A collective without one (generic plans) lists its stages;
the engine prices each stage as ``stage latency + bytes / link bandwidth``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tpusim.workload.collectives import (
    ALGORITHMS,
    Algorithm,
    Group,
    Topology,
    cannot_run,
    link_stages,
)
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import AttnOp, Collective, MlpOp, MoeOp, Role


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CollectiveStage(_Frozen):
    link: Literal["sibling", "ici", "nvlink", "pcie", "local"] = Field(
        description="which link carries this stage"
    )
    peers: int = Field(ge=1, description="devices this device sends to in this stage")


class CollectiveSpec(_Frozen):
    """One in-kernel collective of a layer."""

    name: str
    phase: Literal["attention", "moe", "mlp", "head"]
    kind: Literal["exchange", "all_gather", "all_reduce", "reduce_scatter"]
    bytes_per_token: int = Field(ge=0, description="payload per rank per token, bytes (a "
                                 "reduction's partial, a gather's own piece)")
    stages: list[CollectiveStage] = Field(
        default_factory=list, description="(link, peers) per phase; derived from ``algorithm`` "
        "when it is given")
    after: str = Field(description="issuing point: the role of the op whose end issues it, or "
                       "the name of the collective whose completion issues it")
    overlapped: bool = Field(
        default=False, description="runs concurrently with the following compute (latent gather)"
    )
    algorithm: Algorithm | None = Field(
        default=None, description="how the kernel runs it as remote copies "
        "(tpusim.workload.collectives); None: priced per stage")
    group: Group = Field(default="all", description="ranks taking part, seen from one rank")
    consumed_by: str | None = Field(
        default=None, description="role of the first op that reads the result: the compute "
        "stream waits only there (None: the next op)")
    min_batch: int = Field(default=1, ge=1, description="smallest batch this variant serves")
    max_batch: int | None = Field(default=None, ge=1, description="largest batch it serves (None: any)")

    def serves(self, batch: int) -> bool:
        """Whether this variant is the one the plan runs at ``batch``."""
        return self.min_batch <= batch and (self.max_batch is None or batch <= self.max_batch)

    @model_validator(mode="after")
    def _check_spec(self) -> CollectiveSpec:
        if not self.stages and self.algorithm is None:
            raise ValueError(f"collective {self.name}: give an algorithm or stages")
        if self.max_batch is not None and self.max_batch < self.min_batch:
            raise ValueError(f"collective {self.name}: max_batch < min_batch")
        return self


class ShardingPlan(_Frozen):
    """Per-device widths and per-layer collectives of one deployment."""

    name: str
    description: str = ""
    source: str = "derived"
    model: str | None = Field(
        default=None, description="catalog name of the model the plan was written for (a published "
        "plan's widths are that model's); None: any model whose shapes it splits")
    devices: int = Field(ge=1, description="JAX devices the model is split over")
    devices_per_chip: int = Field(default=1, ge=1)
    devices_per_host: int = Field(default=8, ge=1, description="devices per host (host = rank // this)")
    lane_multiple: int = Field(default=128, ge=1, description="per-device widths pad to this")
    attention_heads_per_device: int = Field(ge=1)
    kv_heads_per_device: int = Field(default=1, ge=1, description="GQA KV heads per device")
    expert_groups: int = Field(ge=1, description="expert-parallel groups")
    expert_tp: int = Field(ge=1, description="devices splitting each expert's intermediate width")
    router_cols_per_device: int = Field(ge=0, description="router output columns per device (0: dense model)")
    latent_down_cols_per_device: int = Field(default=0, ge=0)
    latent_up_cols_per_device: int = Field(default=0, ge=0)
    shared_intermediate_per_device: int = Field(default=0, ge=0)
    dense_intermediate_per_device: int = Field(default=0, ge=0)
    vocab_rows_per_device: int = Field(ge=1)
    attention_dp: int = Field(
        default=1, ge=1, description="attention data-parallel groups: each group holds every head of its "
        "devices // attention_dp TP shard and serves batch / attention_dp sequences")
    attention_collectives: list[CollectiveSpec] = Field(default_factory=list)
    moe_collectives: list[CollectiveSpec] = Field(default_factory=list)
    mlp_collectives: list[CollectiveSpec] = Field(default_factory=list)
    head_collectives: list[CollectiveSpec] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _derive_stages(cls, data: object) -> object:
        """Fill each algorithm collective's ``stages`` from its message expansion (rank 0)."""
        if not isinstance(data, dict) or "devices" not in data:
            return data
        topology = Topology(int(data["devices"]), int(data.get("devices_per_host", 8)),
                            int(data.get("devices_per_chip", 1)))
        out = dict(data)
        for key in COLLECTIVE_LISTS:
            specs = []
            for spec in data.get(key) or []:
                fields = spec.model_dump() if isinstance(spec, CollectiveSpec) else spec
                if isinstance(fields, dict) and fields.get("algorithm") and not fields.get("stages"):
                    if fields["algorithm"] not in ALGORITHMS:
                        raise ValueError(f"collective {fields.get('name')}: unknown algorithm {fields['algorithm']!r}")
                    fields = {**fields, "stages": [
                        {"link": link, "peers": peers} for link, peers in
                        link_stages(fields["algorithm"], fields.get("group", "all"), 0, topology)]}
                    if not fields["stages"]:  # no peer (one device): nothing to run
                        continue
                specs.append(fields)
            if key in data:
                out[key] = specs
        return out

    @model_validator(mode="after")
    def _check(self) -> ShardingPlan:
        if self.expert_groups * self.expert_tp != self.devices:
            raise ValueError(
                f"expert_groups ({self.expert_groups}) x expert_tp ({self.expert_tp}) must equal "
                f"devices ({self.devices})"
            )
        if self.devices % self.attention_dp:
            raise ValueError(f"attention_dp ({self.attention_dp}) does not divide devices ({self.devices})")
        specs = self.all_collectives
        names = {spec.name for spec in specs}
        for spec in specs:
            if spec.after in names and spec.after == spec.name:
                raise ValueError(f"collective {spec.name} is issued after itself")
            rivals = [other for other in specs if other.name == spec.name and other is not spec]
            for other in rivals:
                top, other_top = spec.max_batch or 1 << 30, other.max_batch or 1 << 30
                if spec.min_batch <= other_top and other.min_batch <= top:
                    raise ValueError(f"collective {spec.name}: variants with overlapping batch ranges")
        return self

    @property
    def attention_tp(self) -> int:
        """Devices one attention group splits its heads over."""
        return self.devices // self.attention_dp

    def attention_rows(self, rows: int) -> int:
        """Rows (or sequences) one device's attention serves out of ``rows`` (DP splits them)."""
        return -(-rows // self.attention_dp)

    @property
    def chips(self) -> int:
        return math.ceil(self.devices / self.devices_per_chip)

    @property
    def topology(self) -> Topology:
        """Where the ranks sit (host = rank // devices_per_host; sibling = rank ^ 1 on 2-core chips)."""
        return Topology(self.devices, self.devices_per_host, self.devices_per_chip)

    @property
    def all_collectives(self) -> list[CollectiveSpec]:
        """Every collective of every phase, every batch variant, in plan order."""
        return self.attention_collectives + self.moe_collectives + self.mlp_collectives + self.head_collectives

    def collectives_at(self, batch: int) -> list[CollectiveSpec]:
        """The collectives the plan runs at ``batch`` (one variant per name), in plan order."""
        return [spec for spec in self.all_collectives if spec.serves(batch)]

    def check_against(self, model: ModelConfig) -> None:
        """Raise ValueError when the plan does not split ``model``: a plan written for another
        model, per-device head counts other than the model's heads over the attention TP group
        (as :func:`generic_plan` derives them), a vocabulary shard that does not cover the
        vocabulary, or experts and expert widths the plan's split does not divide."""
        base = model.name.partition("@")[0]
        if self.model is not None and self.model != base:
            raise ValueError(f"plan {self.name} was written for {self.model}, not {base}; use a plan for {base} "
                             "(--plan generic, or a SPEC such as tp=8)")
        heads = math.ceil(attention_heads(model) / self.attention_tp)
        if self.attention_heads_per_device != heads:
            raise ValueError(f"plan {self.name}: {self.attention_heads_per_device} attention heads per device, but "
                             f"{model.name}'s {attention_heads(model)} heads over {self.attention_tp} devices "
                             f"are {heads}")
        if model.gqa is not None:
            kv_heads = max(1, math.ceil(model.gqa.num_kv_heads / self.attention_tp))
            if self.kv_heads_per_device != kv_heads:
                raise ValueError(f"plan {self.name}: {self.kv_heads_per_device} KV heads per device, but "
                                 f"{model.name}'s {model.gqa.num_kv_heads} KV heads over {self.attention_tp} "
                                 f"devices are {kv_heads}")
        if self.vocab_rows_per_device * self.devices < model.vocab_size:
            raise ValueError(f"plan {self.name}: {self.vocab_rows_per_device} vocabulary rows x {self.devices} "
                             f"devices do not cover {model.name}'s {model.vocab_size} tokens")
        moe = model.moe
        if moe is None:
            return
        if moe.num_experts % self.expert_groups:
            raise ValueError(
                f"plan {self.name}: {moe.num_experts} experts do not split into "
                f"{self.expert_groups} expert groups"
            )
        if moe.expert_intermediate_size % self.expert_tp:
            raise ValueError(
                f"plan {self.name}: expert width {moe.expert_intermediate_size} does not split "
                f"{self.expert_tp} ways"
            )

    def with_algorithms(self, choices: dict[str, str]) -> ShardingPlan:
        """This plan with each named collective run by the given algorithm (every batch
        variant of that name); ValueError naming the collective when the algorithm cannot run
        it (:func:`tpusim.workload.collectives.cannot_run`) or the plan has no such collective.

        A collective priced per stage (a generic plan's) gets the group its ranks form: all
        devices, or the attention TP group when that is ``all`` or ``host``; any other group
        has no name in the message vocabulary and cannot take an algorithm."""
        if not choices:
            return self
        names = {spec.name for spec in self.all_collectives}
        unknown = sorted(set(choices) - names)
        if unknown:
            raise ValueError(f"plan {self.name} has no collective {unknown[0]!r} (it has {', '.join(sorted(names))})")
        data = self.model_dump()
        for key in COLLECTIVE_LISTS:
            specs = []
            for spec in getattr(self, key):
                algorithm = choices.get(spec.name)
                if algorithm is None or algorithm == spec.algorithm:
                    specs.append(spec.model_dump())
                    continue
                group = spec.group if spec.algorithm is not None else self._stage_group(spec)
                reason = cannot_run(algorithm, spec.kind, group, self.topology)
                if reason:
                    raise ValueError(f"collective {spec.name}: {reason}")
                specs.append({**spec.model_dump(), "algorithm": algorithm, "group": group, "stages": []})
            data[key] = specs
        return ShardingPlan.model_validate(data)

    def _stage_group(self, spec: CollectiveSpec) -> str:
        """The message group of a stage-priced collective (see :meth:`with_algorithms`)."""
        if spec.name != Collective.ATTN_ALLREDUCE or self.attention_tp == self.devices:
            return "all"
        if self.attention_tp == self.devices_per_host:
            return "host"
        raise ValueError(f"collective {spec.name}: its group (attention TP {self.attention_tp} of {self.devices} "
                         "devices) has no name in the message vocabulary (all, sibling, same_parity, host)")

    def experts_per_group(self, model: ModelConfig) -> int:
        """Routed experts one expert group owns (0 for a dense model)."""
        return model.num_experts // self.expert_groups

    def expert_slice_width(self, model: ModelConfig) -> int:
        return model.moe.expert_intermediate_size // self.expert_tp if model.moe else 0

    def group_of_device(self, device: int) -> int:
        return device // self.expert_tp


COLLECTIVE_LISTS = ("attention_collectives", "moe_collectives", "mlp_collectives", "head_collectives")


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def attention_heads(model: ModelConfig) -> int:
    """Query (KDA: key) heads of the model's attention; a hybrid's kinds must agree, since a
    plan gives one ``attention_heads_per_device`` (K3: KDA 96 / MLA 96; Qwen3-Next 16 / 16)."""
    counts = {kind: heads for kind, heads in (
        ("kda", model.kda.num_heads if model.kda else 0), ("mla", model.mla.num_heads if model.mla else 0),
        ("gqa", model.gqa.num_query_heads if model.gqa else 0)) if heads}
    if len(set(counts.values())) > 1:
        raise ValueError(f"attention kinds have different head counts ({counts}); one plan cannot split them")
    return next(iter(counts.values()))


def _expert_split(model: ModelConfig, devices: int, expert_groups: int | None,
                  expert_tp: int | None) -> tuple[int, int]:
    """(expert_groups, expert_tp): given, completed from ``devices``, or EP as wide as divides."""
    if model.moe is None:
        return 1, devices
    if expert_groups is None and expert_tp is None:
        expert_groups = math.gcd(devices, model.moe.num_experts)
    if expert_groups is None:
        expert_groups = devices // expert_tp if expert_tp and devices % expert_tp == 0 else 0
    if expert_tp is None:
        expert_tp = devices // expert_groups if expert_groups and devices % expert_groups == 0 else 0
    if not expert_groups or not expert_tp or expert_groups * expert_tp != devices:
        raise ValueError(f"expert_groups ({expert_groups}) x expert_tp ({expert_tp}) must equal devices ({devices})")
    return expert_groups, expert_tp


def generic_plan(
    model: ModelConfig, devices: int, *, devices_per_chip: int = 1, lane_multiple: int = 128,
    devices_per_host: int = 8, intra_link: str = "ici", name: str | None = None,
    expert_groups: int | None = None, expert_tp: int | None = None, attention_dp: int = 1,
) -> ShardingPlan:
    """A plan for any device count: attention TP over heads (or DP: ``attention_dp`` groups
    each holding all heads of a ``devices / attention_dp`` TP shard), experts EP over
    ``expert_groups`` x TP within an expert over ``expert_tp`` (default: EP as wide as the
    expert count divides, TP for the rest), every other projection column-split, vocabulary
    split. A dense model column-splits its MLP over all devices.

    Collectives: an all-reduce of the attention output over the attention TP group; with DP
    attention an all-gather of the hidden rows to every device before the MoE/MLP; an
    all-reduce (DP: reduce-scatter) of the MoE/MLP output over all devices (two stages:
    within a host, then across hosts); an all-gather of the latent when experts are split.
    """
    if devices < 1:
        raise ValueError("devices must be >= 1")
    if devices % attention_dp:
        raise ValueError(f"attention_dp ({attention_dp}) does not divide devices ({devices})")
    attention_tp = devices // attention_dp
    num_heads = attention_heads(model)
    heads = max(1, math.ceil(num_heads / attention_tp))
    kv_heads = max(1, math.ceil(model.gqa.num_kv_heads / attention_tp)) if model.gqa else 1
    groups, slice_tp = _expert_split(model, devices, expert_groups, expert_tp)
    moe = model.moe
    if moe is not None and moe.expert_intermediate_size % slice_tp:
        raise ValueError(f"expert width {moe.expert_intermediate_size} does not split {slice_tp} ways")
    hidden = model.hidden_size
    latent = moe.latent_size or 0 if moe else 0
    shared = moe.shared_intermediate_size if moe else 0
    collectives = _generic_collectives(model, devices, attention_tp, devices_per_host, intra_link, lane_multiple)
    attention_words = f"attention TP{min(attention_tp, num_heads)}" + (f" x DP{attention_dp}" if attention_dp > 1 else "")
    experts_words = f"experts EP{groups}xTP{slice_tp}" if moe else "dense MLP"
    return ShardingPlan(
        name=name or f"generic-{devices}",
        description=f"generic: {attention_words}, {experts_words}, columns split {devices} ways",
        source="derived by tpusim.workload.sharding.generic_plan",
        devices=devices,
        devices_per_chip=devices_per_chip,
        lane_multiple=lane_multiple,
        attention_heads_per_device=heads,
        kv_heads_per_device=kv_heads,
        attention_dp=attention_dp,
        expert_groups=groups,
        expert_tp=slice_tp,
        router_cols_per_device=round_up(moe.num_experts, lane_multiple) if moe else 0,
        latent_down_cols_per_device=round_up(math.ceil(latent / devices), lane_multiple) if latent else 0,
        latent_up_cols_per_device=round_up(math.ceil(hidden / devices), lane_multiple) if latent else 0,
        shared_intermediate_per_device=round_up(math.ceil(shared / devices), lane_multiple) if shared else 0,
        dense_intermediate_per_device=round_up(math.ceil(model.dense_intermediate_size / devices), lane_multiple)
        if model.dense_intermediate_size else 0,
        vocab_rows_per_device=math.ceil(model.vocab_size / devices),
        **collectives,
    )


def _generic_collectives(model: ModelConfig, devices: int, attention_tp: int, devices_per_host: int,
                         intra_link: str, lane_multiple: int) -> dict[str, list[CollectiveSpec]]:
    """The generic plan's collectives by phase (see :func:`generic_plan`)."""
    hidden = model.hidden_size
    latent = model.moe.latent_size or 0 if model.moe else 0

    def stages(group: int) -> list[CollectiveStage]:
        hosts = max(1, math.ceil(group / devices_per_host))
        local_peers = min(group, devices_per_host) - 1
        out = [CollectiveStage(link=intra_link, peers=local_peers)] if local_peers else []  # type: ignore[arg-type]
        if hosts > 1:
            out.append(CollectiveStage(link=intra_link, peers=hosts - 1))  # type: ignore[arg-type]
        return out

    def collective(name: str, phase: str, kind: str, after: str, group: int) -> list[CollectiveSpec]:
        if group == 1:
            return []
        return [CollectiveSpec(name=name, phase=phase, kind=kind, bytes_per_token=hidden * 2,  # type: ignore[arg-type]
                               stages=stages(group), after=after)]

    data_parallel = attention_tp < devices
    attention = collective(Collective.ATTN_ALLREDUCE, "attention", "all_reduce", Role.ATTN_OUT, attention_tp)
    if data_parallel:
        attention += collective(Collective.ATTN_DP_ALLGATHER, "attention", "all_gather", Role.ATTN_OUT, devices)
    out_kind = "reduce_scatter" if data_parallel else "all_reduce"
    moe: list[CollectiveSpec] = []
    if model.moe is not None and latent and devices > 1:
        moe = _latent_moe_collectives(model, devices, intra_link, lane_multiple, out_kind, stages)
    elif model.moe is not None:
        moe = collective(Collective.MOE_ALLREDUCE, "moe", out_kind, MoeOp.COMBINE, devices)
    return {  # only the phases the model has: a dense model has no MoE, an all-MoE model no MLP
        "attention_collectives": attention,
        "moe_collectives": moe,
        "mlp_collectives": collective(Collective.MLP_ALLREDUCE, "mlp", out_kind, MlpOp.DOWN, devices)
        if model.dense_layers else [],
    }


def _latent_moe_collectives(model: ModelConfig, devices: int, intra_link: str, lane_multiple: int, out_kind: str,
                            stages: Callable[[int], list[CollectiveStage]]) -> list[CollectiveSpec]:
    """A latent MoE's collectives in the generic plan, from what each device holds after each op:

    1. ``moe.latent_down`` column-split: each device holds ``latent / devices`` latent columns
       → ``moe.latent_allgather`` (direct, every device's columns to every other) before the
       experts, overlapped with the selection;
    2. the shared experts (intermediate channels split): each device holds a *partial over the
       whole hidden width* → ``moe.shared_reduce`` (hidden x 2 B per token), issued when
       ``moe.shared_down`` ends, consumed by ``moe.combine`` (the published plan's placement);
    3. the routed experts of the device's group (its part of each one's width): a *partial of
       the latent-width routed sum* after ``moe.combine`` → ``moe.routed_reduce`` (latent x 2 B
       per token), consumed by ``moe.latent_up``;
    4. ``moe.latent_up`` column-split: each device holds ``hidden / devices`` columns of the
       routed output → ``moe.output_allgather`` (its columns to every other device), consumed
       by the next layer's first op.

    Before this, the generic plan reduced the whole hidden output once after ``moe.combine``
    and had no gather after ``latent_up`` (one reduction of hidden x 2 B instead of hidden +
    latent, and no gather at all). With attention DP the shared reduction is a
    reduce-scatter (each device keeps its rows); the routed sum is all-reduced (``latent_up``
    runs every row) and the output gather sends every row's columns (an upper bound on the
    all-to-all that would send each device only its rows)."""
    moe = model.moe
    assert moe is not None and moe.latent_size
    latent_cols = round_up(math.ceil(moe.latent_size / devices), lane_multiple)
    up_cols = round_up(math.ceil(model.hidden_size / devices), lane_multiple)
    every = [CollectiveStage(link=intra_link, peers=devices - 1)]  # type: ignore[arg-type]
    out = [CollectiveSpec(
        name=Collective.MOE_LATENT_ALLGATHER, phase="moe", kind="all_gather", bytes_per_token=latent_cols * 2,
        stages=every, after=MoeOp.LATENT_DOWN, consumed_by=Role.MOE_EXPERT, overlapped=True)]
    if moe.shared_intermediate_size:
        out.append(CollectiveSpec(
            name=Collective.MOE_SHARED_REDUCE, phase="moe", kind=out_kind, bytes_per_token=model.hidden_size * 2,
            stages=stages(devices), after=Role.MOE_SHARED, consumed_by=MoeOp.COMBINE, overlapped=True))
    out += [
        CollectiveSpec(name=Collective.MOE_ROUTED_REDUCE, phase="moe", kind="all_reduce",
                       bytes_per_token=moe.latent_size * 2, stages=stages(devices), after=MoeOp.COMBINE,
                       consumed_by=MoeOp.LATENT_UP),
        CollectiveSpec(name=Collective.MOE_OUTPUT_ALLGATHER, phase="moe", kind="all_gather",
                       bytes_per_token=up_cols * 2, stages=every, after=MoeOp.LATENT_UP,
                       consumed_by=AttnOp.MIX_NORM),
    ]
    return out
