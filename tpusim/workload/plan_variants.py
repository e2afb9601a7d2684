"""Variants of a plan's structure: another expert split, a fused expert reduction, a deferred wait.

Each is a pure function of a :class:`~tpusim.workload.sharding.ShardingPlan` returning a new
plan (ValueError saying why when the plan cannot take it), so every consumer -- the program
builder, the engine (messages from :mod:`tpusim.workload.collectives`), the VMEM accounting
(:func:`tpusim.schedule.vmem.collective_bytes`), the joint sweep and the multi-device kernel
(which places issues and waits from the simulator's program) -- sees the variant through the
plan alone. A SPEC reaches them (:mod:`tpusim.workload.plan_spec`):

| SPEC key | function | what changes |
| --- | --- | --- |
| ``base=published,expert_groups=G,expert_tp=T`` | :func:`with_expert_split` | the published plan's collectives unchanged; each device holds the experts of group ``r // T`` (``E / G`` of them), part ``r mod T`` of each one's width |
| ``expert_reduce=fused`` | :func:`fuse_expert_reductions` | ``moe.shared_reduce`` + ``moe.routed_reduce`` become one ``moe.fused_reduce`` |
| ``shared_wait=deferred`` | :func:`defer_shared_reduce` | ``moe.shared_reduce`` is waited at the next layer's first op, not at ``moe.combine`` |

**Why another expert split keeps the published collectives.** In the published K3 structure
every collective's payload is set by the hidden, latent and router widths, not by the expert
split: after ``moe.combine`` each device holds a partial of the latent-width routed sum (its
group's experts, its part of each one's width), whatever ``G x T`` is, and the routed reduction
over all ranks sums the partials exactly once. The split changes only the expert weights a
device reads (``E / G`` experts of width ``w / T``) and how many distinct experts a batch
touches per device, which the program derives from the plan.

**The fused expert reduction** (``moe.fused_reduce``). After ``moe.shared_down`` each device
holds a partial of the shared experts' output (hidden wide); after ``moe.combine`` a partial of
the routed sum (latent wide). Both are summed over the same ranks, so one collective can carry
both in the same messages: payload = shared + routed bytes per token, one set of phases (K3
``one_shot_two_level``: 7 + 3 messages per rank instead of 2 x (7 + 3)), each message paying
the link latency once. It is issued where the later of the two is ready (``moe.combine``, the
routed reduction's issue point) and consumed where the earlier *remaining* need is
(``moe.latent_up``, which needs the routed sum; the shared output is read only when the layer's
output is formed, after ``latent_up``, so moving its wait there is allowed by the data). The
algorithm and group are the routed reduction's (per batch variant); a reduction one of them
runs as an all-reduce stays an all-reduce. What it costs: the shared partial no longer travels
during the routed experts (its copies used to overlap them), and ``latent_up`` waits for the
bigger payload.

**The deferred shared wait.** The shared experts' output is only needed when the layer's
output is formed (the residual add after ``moe.output_allgather``), so its wait can move past
``moe.latent_up`` to the next layer's first op (``attn.mix_norm``: the first read of the
residual, where the output all-gather is already waited); its link time then overlaps the
routed experts, ``latent_up``, the output gather and the next layer's weight copies issued
before that point. The receive slots stay valid: the next copy into the same parity slot is
issued a layer later, after this wait (the slots are double-buffered by layer parity,
:func:`tpusim.workload.collectives.buffer_bytes`).

The multi-device kernels run both variants (the fused payload is ``[shared | routed]`` per
token, split at ``moe.latent_up``; the deferred wait is where the plan puts it, the shared
output is added at the next layer's first op). :func:`kernel_cannot_run` states what they
cannot run of these additions (the joint sweep's kernel rule, ``tpusim.workload.kernel_support``,
merges it).
"""

from __future__ import annotations

from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import AttnOp, Collective
from tpusim.workload.sharding import CollectiveSpec, ShardingPlan

EXPERT_REDUCE = ("separate", "fused")  # SPEC expert_reduce=...
SHARED_WAIT = ("plan", "deferred")  # SPEC shared_wait=...
DEFERRED_CONSUMER = AttnOp.MIX_NORM  # the next layer's first op: the first read of the residual


def with_expert_split(plan: ShardingPlan, model: ModelConfig, expert_groups: int | None,
                      expert_tp: int | None, *, name: str | None = None) -> ShardingPlan:
    """``plan`` with ``expert_groups x expert_tp`` (one may be None: completed from the
    devices) and every collective unchanged; ValueError when the split does not multiply to
    the devices or does not divide the model's experts and expert width."""
    devices = plan.devices
    groups = expert_groups or (devices // expert_tp if expert_tp and devices % expert_tp == 0 else 0)
    tp = expert_tp or (devices // groups if groups and devices % groups == 0 else 0)
    if not groups or not tp or groups * tp != devices:
        raise ValueError(f"plan {plan.name}: expert_groups ({expert_groups}) x expert_tp ({expert_tp}) "
                         f"must equal its {devices} devices")
    if model.moe is None:
        raise ValueError(f"plan {plan.name}: {model.name} is dense: expert_groups / expert_tp do not apply")
    split = plan.model_copy(update={"expert_groups": groups, "expert_tp": tp, "name": name or plan.name,
                                    "description": f"{plan.description}; experts split {groups} groups x TP{tp}"})
    ShardingPlan.model_validate(split.model_dump())  # the plan's invariants
    split.check_against(model)
    return split


def _named(plan: ShardingPlan, name: str) -> list[CollectiveSpec]:
    return [spec for spec in plan.moe_collectives if spec.name == name]


def fuse_expert_reductions(plan: ShardingPlan) -> ShardingPlan:
    """``plan`` with ``moe.shared_reduce`` and ``moe.routed_reduce`` as one ``moe.fused_reduce``
    per batch variant of the routed reduction (see the module docstring); ValueError when the
    plan has not both, or they run over different ranks or links."""
    shared = _named(plan, Collective.MOE_SHARED_REDUCE)
    routed = _named(plan, Collective.MOE_ROUTED_REDUCE)
    if not shared or not routed:
        raise ValueError(f"plan {plan.name}: expert_reduce=fused needs both {Collective.MOE_SHARED_REDUCE} and "
                         f"{Collective.MOE_ROUTED_REDUCE} (a latent MoE with shared experts)")
    fused: list[CollectiveSpec] = []
    for part in routed:
        for other in shared:
            low = max(part.min_batch, other.min_batch)
            high = min(part.max_batch or 1 << 30, other.max_batch or 1 << 30)
            if low > high:
                continue
            same_stages = part.algorithm is not None or other.stages == part.stages
            if other.group != part.group or (other.algorithm is None) != (part.algorithm is None) or not same_stages:
                raise ValueError(f"plan {plan.name}: {other.name} and {part.name} run over different ranks "
                                 "or links; one message cannot carry both")
            kind = "all_reduce" if "all_reduce" in (part.kind, other.kind) else part.kind
            fused.append(part.model_copy(update={
                "name": Collective.MOE_FUSED_REDUCE, "kind": kind,
                "bytes_per_token": part.bytes_per_token + other.bytes_per_token,
                "min_batch": low, "max_batch": None if high == 1 << 30 else high}))
    rest = [spec for spec in plan.moe_collectives
            if spec.name not in (Collective.MOE_SHARED_REDUCE, Collective.MOE_ROUTED_REDUCE)]
    at = next(i for i, spec in enumerate(plan.moe_collectives) if spec.name == Collective.MOE_ROUTED_REDUCE)
    before = len([s for s in plan.moe_collectives[:at] if s in rest])
    data = plan.model_dump()
    data["moe_collectives"] = [s.model_dump() for s in rest[:before] + fused + rest[before:]]
    data["description"] = f"{plan.description}; shared + routed expert reductions fused"
    return ShardingPlan.model_validate(data)


def defer_shared_reduce(plan: ShardingPlan) -> ShardingPlan:
    """``plan`` with ``moe.shared_reduce`` waited at the next layer's first op (see the module
    docstring); ValueError when the plan has no separate shared reduction."""
    if not _named(plan, Collective.MOE_SHARED_REDUCE):
        raise ValueError(f"plan {plan.name}: shared_wait=deferred needs a separate {Collective.MOE_SHARED_REDUCE} "
                         "(a fused expert reduction is waited by moe.latent_up)")
    data = plan.model_dump()
    data["moe_collectives"] = [
        {**spec.model_dump(), "consumed_by": DEFERRED_CONSUMER} if spec.name == Collective.MOE_SHARED_REDUCE
        else spec.model_dump() for spec in plan.moe_collectives]
    data["description"] = f"{plan.description}; shared reduction waited at the next layer"
    return ShardingPlan.model_validate(data)


def is_deferred(spec: CollectiveSpec) -> bool:
    """Whether ``spec`` is a shared reduction waited at the next layer (:func:`defer_shared_reduce`)."""
    return spec.name == Collective.MOE_SHARED_REDUCE and spec.consumed_by == DEFERRED_CONSUMER


KERNEL_SUMS = ("one_shot_two_level", "reduce_scatter_all_gather")  # reductions the kernels' combine sums


def kernel_cannot_run(plan: ShardingPlan) -> str:
    """What of this module's variants the multi-device kernels cannot run ('' when they can).

    Both kernels (:class:`megakernel.multi_device_decode.DecodeKernel` and the schedule-driven
    :class:`megakernel.kernel_collectives.CollectiveMegakernel`) run the fused expert
    reduction and the deferred shared wait (checked at nano size on 8 virtual devices against
    the one-device reference, race detector on: ``tests/test_plan_variants_kernel.py``). Their
    combine sums a reduction only when it runs ``one_shot_two_level`` or
    ``reduce_scatter_all_gather`` (a ``direct_all_gather`` result is concatenated by source
    rank), so a fused reduction given ``direct_all_gather`` cannot run."""
    for spec in plan.all_collectives:
        if spec.name == Collective.MOE_FUSED_REDUCE and spec.algorithm not in KERNEL_SUMS:
            return (f"the kernel sums {Collective.MOE_FUSED_REDUCE} only by {' or '.join(KERNEL_SUMS)}, "
                    f"not {spec.algorithm}")
    return ""
