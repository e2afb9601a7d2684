"""What the multi-device megakernel runs, and how a deployment maps onto a smaller kernel run.

One owner of two rules that the simulator side (the joint sweep) and the kernel side
(:mod:`megakernel.collective_plan`, :mod:`megakernel.commands.collective_check`, ``tpusim lower``)
both read; this module is pure and imports nothing from ``megakernel/``.

**What the kernel runs** (:func:`kernel_cannot_run`): the collective megakernel
(:class:`megakernel.kernel_collectives.CollectiveMegakernel`) has a payload and a result for
each collective of K3's TP pattern (:data:`KERNEL_COLLECTIVES`: the published plans'
``attn.head_exchange`` / ``attn.partial_reduce`` / ``attn.half_gather``, the MoE block's five
and the dense layer's all-reduce) and runs each by one of :data:`KERNEL_ALGORITHMS`. A plan
naming any other collective (a generic plan's ``attn.allreduce`` / ``moe.allreduce``, an
attention-DP gather) or algorithm, or splitting attention other than TP over every device,
or cutting an expert into slices that are not a multiple of :data:`KERNEL_SLICE_MULTIPLE`
columns, is refused with the reason. Finer rules (payload widths, message counts per rank) are
checked by the kernel when it is built and reported the same way.

**Mapping a deployment to the kernel's size** (:func:`map_deployment`): a joint sweep's
``best.json`` names a deployment for the model and device count it was searched on (K3 on
32 devices); the interpreter runs ``kimi-k3-nano`` on 8 virtual devices. The mapping, step
by step:

1. the source plan (the deployment resolved at its own size) must be one the kernel runs
   (:func:`kernel_cannot_run`), else refused;
2. the target starts from the published plan of the target model on ``devices``
   (:func:`tpusim.workload.model_catalog.plan_for`; nano on 8: ``k3-nano-tp8``); a target
   without a published plan is refused;
3. attention is kept: TP over every device (the only split the kernel runs);
4. expert TP scales with the device count, ``expert_tp' = max(1, expert_tp * devices //
   source_devices)``, and expert groups take the rest, ``expert_groups' = devices //
   expert_tp'`` (K3 8 x 4 on 32 -> nano 8 x 1 on 8; K3 4 x 8 -> nano 4 x 2); refused when
   ``expert_tp'`` does not divide ``devices`` or the target model's experts and expert width
   do not split that way;
   *widening*: when ``expert_tp'`` would cut the target model's experts into slices the kernel
   cannot run (not a multiple of :data:`KERNEL_SLICE_MULTIPLE` columns: nano's 64-wide experts
   over 2 or 4 devices), the target's experts are widened to the narrowest width it can cut,
   :func:`kernel_expert_width` (nano 4 x 2: 64 -> 128; nano 2 x 4: 64 -> 256), and the mapping
   says so (``expert_width`` / ``model_expert_width``): the kernel then runs the deployment's
   split at nano size instead of refusing it (the widths of a nano model are synthetic anyway;
   the check is that the kernel runs that split and those collectives and matches the reference);
5. the deployment's structure variants are kept (a fused expert reduction, a deferred shared
   wait: :mod:`tpusim.workload.plan_variants`);
6. the deployment's algorithm choices are kept by collective name
   (:meth:`ShardingPlan.with_algorithms`, which refuses an algorithm the target's groups
   cannot run).

Every refusal is a :class:`KernelDeploymentError` (a ValueError) whose message is one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpusim.workload import plan_variants
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import Collective
from tpusim.workload.sharding import ShardingPlan

# the collectives the kernel has a payload and a result for (megakernel.kernel_collectives' table)
KERNEL_COLLECTIVES: tuple[str, ...] = (
    Collective.ATTN_HEAD_EXCHANGE, Collective.ATTN_PARTIAL_REDUCE, Collective.ATTN_HALF_GATHER,
    Collective.MOE_ROUTER_EXCHANGE, Collective.MOE_LATENT_ALLGATHER, Collective.MOE_SHARED_REDUCE,
    Collective.MOE_ROUTED_REDUCE, Collective.MOE_OUTPUT_ALLGATHER, Collective.MLP_ALLREDUCE,
    Collective.MOE_FUSED_REDUCE,  # plan_variants.fuse_expert_reductions: [shared | routed] in one message
)
# the algorithms the decode and collective megakernels run (tpusim.workload.collectives' messages)
KERNEL_ALGORITHMS: tuple[str, ...] = ("pair_exchange", "direct_all_gather", "one_shot_two_level",
                                      "reduce_scatter_all_gather")
MAPPING_RULE = "tpusim.workload.kernel_support.map_deployment"
# The kernel's expert math (megakernel.kernel_moe.expert_loop) takes gate/up's output (2 x slice
# width) in whole 128-lane panels and down's MXFP4 scales in 64-column groups (two E8M0 bytes per
# 16-bit word), so a device's expert slice must be a multiple of 64 columns: K3 (width 3072) runs
# expert TP 1-16 (slice 192 at TP16) but not TP32 (slice 96: found lowering a joint sweep's winner).
KERNEL_SLICE_MULTIPLE = 64


def kernel_expert_width(width: int, expert_tp: int) -> int:
    """The narrowest expert width >= ``width`` that ``expert_tp`` devices cut into slices of a
    multiple of :data:`KERNEL_SLICE_MULTIPLE` columns (``width`` itself when it already cuts)."""
    unit = expert_tp * KERNEL_SLICE_MULTIPLE
    return -(-width // unit) * unit


class KernelDeploymentError(ValueError):
    """A deployment the kernel cannot run or the mapping cannot scale (one-line message)."""


def kernel_cannot_run(model: ModelConfig, plan: ShardingPlan, batch: int = 1) -> str:
    """Why the multi-device megakernel cannot run ``plan`` for ``model`` at ``batch`` ('' when
    it can, as far as the plan's collectives and attention split say; see the module docstring)."""
    if model.moe is None:
        return f"model {model.name}: the collective megakernel runs K3-structured MoE models only"
    if plan.attention_dp != 1:
        return f"plan {plan.name}: attention data-parallel ({plan.attention_dp} groups) is not run in the kernel"
    width = plan.expert_slice_width(model)
    if width % KERNEL_SLICE_MULTIPLE:
        return (f"plan {plan.name}: expert slice width {width} (expert width {model.moe.expert_intermediate_size} / "
                f"expert TP {plan.expert_tp}) is not a multiple of {KERNEL_SLICE_MULTIPLE}: the kernel's expert math "
                "needs whole 128-lane rows (gate/up's 2 x slice in 128-lane panels, down's scales in 64-column groups)")
    for spec in plan.collectives_at(batch):
        if spec.name not in KERNEL_COLLECTIVES:
            return (f"plan {plan.name}: collective {spec.name} is not run in the kernel (it runs "
                    f"the published plans' {', '.join(KERNEL_COLLECTIVES)})")
        if spec.algorithm not in KERNEL_ALGORITHMS:
            return (f"plan {plan.name}: collective {spec.name}: algorithm {spec.algorithm} is not run in the "
                    f"kernel (it runs {', '.join(KERNEL_ALGORITHMS)})")
    why = plan_variants.kernel_cannot_run(plan)  # the structure variants' own limits
    return f"plan {plan.name}: {why}" if why else ""


def _with_source_structure(plan: ShardingPlan, source: ShardingPlan) -> ShardingPlan:
    """``plan`` with the structure variants ``source`` carries (a fused expert reduction, a
    deferred shared wait: :mod:`tpusim.workload.plan_variants`), so the mapped kernel runs the
    same collective structure as the deployment."""
    names = {spec.name for spec in source.all_collectives}
    if Collective.MOE_FUSED_REDUCE in names:
        plan = plan_variants.fuse_expert_reductions(plan)
    if any(plan_variants.is_deferred(spec) for spec in source.all_collectives):
        plan = plan_variants.defer_shared_reduce(plan)
    return plan


@dataclass(frozen=True)
class KernelDeployment:
    """A deployment mapped onto the kernel's model and device count (:func:`map_deployment`)."""

    plan: ShardingPlan
    model: ModelConfig  # the model the kernel runs: the target, its experts widened if step 4 says so
    source_plan: str
    source_devices: int
    source_expert_split: tuple[int, int]  # (expert_groups, expert_tp) of the source
    collectives: dict[str, str] = field(default_factory=dict)
    model_expert_width: int = 0  # the target model's own expert width (before any widening)

    @property
    def expert_width(self) -> int:
        """The expert width the kernel runs (``model_expert_width`` unless widened)."""
        return self.model.moe.expert_intermediate_size if self.model.moe else 0

    def describe(self) -> dict[str, Any]:
        """The mapping as the output JSON records it."""
        return {"rule": MAPPING_RULE, "source_plan": self.source_plan, "source_devices": self.source_devices,
                "source_expert_groups": self.source_expert_split[0],
                "source_expert_tp": self.source_expert_split[1], "plan": self.plan.name,
                "devices": self.plan.devices, "expert_groups": self.plan.expert_groups,
                "expert_tp": self.plan.expert_tp, "attention_tp": self.plan.attention_tp,
                "collectives": dict(self.collectives), "expert_width": self.expert_width,
                "model_expert_width": self.model_expert_width}


def map_deployment(source: ShardingPlan, source_model: ModelConfig, collectives: dict[str, str],
                   model: ModelConfig, devices: int, batch: int = 1) -> KernelDeployment:
    """The deployment (``source``: its plan resolved at its own size, algorithms applied;
    ``collectives``: its algorithm choices) on ``model`` over ``devices`` devices, by the
    numbered rule of the module docstring; :class:`KernelDeploymentError` when it cannot map."""
    from tpusim.workload.model_catalog import plan_for  # model_catalog imports sharding, not this

    why = kernel_cannot_run(source_model, source, batch)
    if why:
        raise KernelDeploymentError(f"deployment plan {source.name}: {why}")
    try:
        base = plan_for(model, devices)
    except ValueError as error:
        raise KernelDeploymentError(str(error)) from None
    if base.name.startswith("generic"):
        raise KernelDeploymentError(f"model {model.name} on {devices} devices has no published plan to map onto")
    expert_tp = max(1, source.expert_tp * devices // source.devices)
    if devices % expert_tp:
        raise KernelDeploymentError(f"expert TP {source.expert_tp} of {source.devices} devices scales to "
                                    f"{expert_tp}, which does not divide {devices} devices")
    data = {**base.model_dump(), "expert_groups": devices // expert_tp, "expert_tp": expert_tp}
    own_width = model.moe.expert_intermediate_size if model.moe else 0
    if model.moe is not None and kernel_expert_width(own_width, expert_tp) != own_width:
        model = model.with_expert_width(kernel_expert_width(own_width, expert_tp))
    try:
        plan = ShardingPlan.model_validate(data)
        plan.check_against(model)
        plan = _with_source_structure(plan, source).with_algorithms(collectives)
    except ValueError as error:
        raise KernelDeploymentError(f"deployment {source.name} mapped to {devices} devices "
                                    f"(expert groups {devices // expert_tp} x expert TP {expert_tp}): "
                                    f"{str(error).splitlines()[0]}") from None
    if (plan.expert_groups, plan.expert_tp) != (base.expert_groups, base.expert_tp):
        plan = ShardingPlan.model_validate({**plan.model_dump(), "name": f"{base.name}-ep{plan.expert_groups}"
                                            f"x{plan.expert_tp}"})
    why = kernel_cannot_run(model, plan, batch)
    if why:
        raise KernelDeploymentError(why)
    return KernelDeployment(plan, model, source.name, source.devices, (source.expert_groups, source.expert_tp),
                            dict(collectives), own_width)


def kernel_deployment(plan_choice: str, collectives: dict[str, str], source_model: ModelConfig,
                      source_devices: int | None, model: ModelConfig, devices: int,
                      batch: int = 1) -> KernelDeployment:
    """A schedule's deployment (``plan_choice`` + ``collectives``, as searched for
    ``source_model`` on ``source_devices``; None: the devices the choice names itself, e.g. a
    plan file's) resolved at its own size and mapped onto ``model`` over ``devices``
    (:func:`map_deployment`); :class:`KernelDeploymentError` with one line when it cannot."""
    from tpusim.workload.model_catalog import plan_devices, plan_for

    named = plan_devices(plan_choice)
    count = named or source_devices
    if count is None:
        raise KernelDeploymentError(f"deployment plan {plan_choice!r} names no device count: give the devices "
                                    "it was searched on")
    try:
        source = plan_for(source_model, count, choice=plan_choice).with_algorithms(collectives)
    except ValueError as error:
        raise KernelDeploymentError(f"deployment plan {plan_choice!r} for {source_model.name} on {count} devices: "
                                    f"{str(error).splitlines()[0]}") from None
    return map_deployment(source, source_model, collectives, model, devices, batch)
