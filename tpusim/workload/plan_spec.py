"""Deployment plans written on the command line: ``--plan tp=8,expert_groups=2,expert_tp=4``.

A SPEC is comma-separated ``key=value`` pairs:

| key | meaning | default |
| --- | --- | --- |
| ``tp`` | devices the plan spans (the tensor-parallel world); must equal the system's devices | the system's devices |
| ``expert_groups`` | expert-parallel groups: each owns ``num_experts / expert_groups`` experts | as many as divide both |
| ``expert_tp`` | devices splitting each expert's intermediate width | ``tp / expert_groups`` |
| ``attention`` | ``tp``: heads split over all devices; ``dp``: every device holds all heads and serves its share of the batch | ``tp`` |
| ``attention_dp`` | attention data-parallel groups (``attention=dp`` is ``attention_dp=tp``) | 1 |
| ``base`` | ``generic``: :func:`tpusim.workload.sharding.generic_plan`'s structure; ``published``: the model's published plan for these devices (its collectives, as the multi-device kernel runs them) with the SPEC's expert split (attention stays the published TP) | ``generic`` |
| ``expert_reduce`` | ``separate`` or ``fused``: the shared and routed expert reductions in one collective (:func:`tpusim.workload.plan_variants.fuse_expert_reductions`) | ``separate`` |
| ``shared_wait`` | ``plan`` or ``deferred``: the shared experts' reduction waited at the next layer's first op (:func:`tpusim.workload.plan_variants.defer_shared_reduce`) | ``plan`` |

``expert_groups x expert_tp`` must equal ``tp``; the experts, the expert width and (for a
SPEC) the attention heads must divide as asked, else one line says which does not.
``base=published,expert_groups=4,expert_tp=8,expert_reduce=fused`` is K3's published TP32
structure with 4 expert groups of 8 ranks and one fused expert reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwmodels import values
from hwmodels.errors import InputError
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.plan_variants import (
    EXPERT_REDUCE,
    SHARED_WAIT,
    defer_shared_reduce,
    fuse_expert_reductions,
    with_expert_split,
)
from tpusim.workload.sharding import ShardingPlan, attention_heads, generic_plan

KEYS = ("tp", "expert_groups", "expert_tp", "attention", "attention_dp", "base", "expert_reduce", "shared_wait")
BASES = ("generic", "published")
# the keys whose value is a word, with the words each takes
WORD_KEYS = {"base": BASES, "expert_reduce": EXPERT_REDUCE, "shared_wait": SHARED_WAIT}


@dataclass(frozen=True)
class PlanSpec:
    """A parsed SPEC (``None``: take the default)."""

    text: str
    tp: int | None = None
    expert_groups: int | None = None
    expert_tp: int | None = None
    attention_dp: int | None = None
    attention_all_dp: bool = False
    base: str = "generic"
    expert_reduce: str = "separate"
    shared_wait: str = "plan"


def is_plan_spec(text: str) -> bool:
    return "=" in text


def parse_plan_spec(text: str) -> PlanSpec:
    """Parse ``text``; InputError naming the bad pair."""
    numbers: dict[str, int] = {}
    words: dict[str, str] = {}
    all_dp = False
    for key, value in values.pairs(text, "--plan", keys=tuple(KEYS)):  # no empty item, no key twice
        if key == "attention":
            if value not in ("tp", "dp"):
                raise InputError(f"--plan {text!r}: attention={value!r}: expected tp or dp")
            all_dp = value == "dp"
            continue
        if key in WORD_KEYS:
            if value not in WORD_KEYS[key]:
                raise InputError(f"--plan {text!r}: {key}={value!r}: expected {' or '.join(WORD_KEYS[key])}")
            words[key] = value
            continue
        numbers[key] = int(values.number(value, f"--plan {text!r}: {key}=", kind=int, minimum=1))
    return PlanSpec(text=text, attention_all_dp=all_dp, **numbers, **words)


def plan_from_spec(model: ModelConfig, spec: PlanSpec, devices: int, *, devices_per_chip: int = 1,
                   intra_link: str = "ici", devices_per_host: int = 8,
                   published: ShardingPlan | None = None) -> ShardingPlan:
    """The plan ``spec`` asks for on ``devices`` devices: the generic plan, or with
    ``base=published`` ``published`` (the model's published plan for these devices, None when
    it has none) with the SPEC's expert split; then the structure options. ValueError when it
    does not fit the system or does not divide the model."""
    tp = spec.tp or devices
    if tp != devices:
        raise ValueError(f"plan {spec.text!r} spans tp={tp} devices but the system has {devices}")
    if spec.base == "published":
        if published is None:
            raise ValueError(f"plan {spec.text!r}: {model.name} has no published plan for {devices} devices")
        if spec.attention_all_dp or (spec.attention_dp or 1) > 1:
            raise ValueError(f"plan {spec.text!r}: base=published keeps the published attention TP (no attention DP)")
        plan = published
        if spec.expert_groups or spec.expert_tp:
            plan = with_expert_split(published, model, spec.expert_groups, spec.expert_tp, name=spec.text)
    else:
        plan = _generic_from_spec(model, spec, devices, devices_per_chip=devices_per_chip, intra_link=intra_link,
                                  devices_per_host=devices_per_host)
    if spec.expert_reduce == "fused":
        plan = fuse_expert_reductions(plan)
    if spec.shared_wait == "deferred":
        plan = defer_shared_reduce(plan)
    return plan.model_copy(update={"name": spec.text}) if plan.name != spec.text else plan


def _generic_from_spec(model: ModelConfig, spec: PlanSpec, devices: int, *, devices_per_chip: int,
                       intra_link: str, devices_per_host: int) -> ShardingPlan:
    attention_dp = devices if spec.attention_all_dp else (spec.attention_dp or 1)
    if devices % attention_dp:
        raise ValueError(f"plan {spec.text!r}: attention_dp={attention_dp} does not divide tp={devices}")
    attention_tp = devices // attention_dp
    heads = attention_heads(model)
    if heads % attention_tp:
        raise ValueError(f"plan {spec.text!r}: {heads} attention heads do not split {attention_tp} ways")
    plan = generic_plan(model, devices, devices_per_chip=devices_per_chip, intra_link=intra_link,
                        devices_per_host=devices_per_host, expert_groups=spec.expert_groups,
                        expert_tp=spec.expert_tp, attention_dp=attention_dp, name=spec.text)
    if model.moe is None and (spec.expert_groups or spec.expert_tp):
        raise ValueError(f"plan {spec.text!r}: {model.name} is dense: expert_groups / expert_tp do not apply")
    return plan
