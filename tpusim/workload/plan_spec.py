"""Deployment plans written on the command line: ``--plan tp=8,expert_groups=2,expert_tp=4``.

A SPEC is comma-separated ``key=value`` pairs:

| key | meaning | default |
| --- | --- | --- |
| ``tp`` | devices the plan spans (the tensor-parallel world); must equal the system's devices | the system's devices |
| ``expert_groups`` | expert-parallel groups: each owns ``num_experts / expert_groups`` experts | as many as divide both |
| ``expert_tp`` | devices splitting each expert's intermediate width | ``tp / expert_groups`` |
| ``attention`` | ``tp``: heads split over all devices; ``dp``: every device holds all heads and serves its share of the batch | ``tp`` |
| ``attention_dp`` | attention data-parallel groups (``attention=dp`` is ``attention_dp=tp``) | 1 |

``expert_groups x expert_tp`` must equal ``tp``; the experts, the expert width and (for a
SPEC) the attention heads must divide as asked, else one line says which does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwmodels.errors import InputError
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.sharding import ShardingPlan, attention_heads, generic_plan

KEYS = ("tp", "expert_groups", "expert_tp", "attention", "attention_dp")


@dataclass(frozen=True)
class PlanSpec:
    """A parsed SPEC (``None``: take the default)."""

    text: str
    tp: int | None = None
    expert_groups: int | None = None
    expert_tp: int | None = None
    attention_dp: int | None = None
    attention_all_dp: bool = False


def is_plan_spec(text: str) -> bool:
    return "=" in text


def parse_plan_spec(text: str) -> PlanSpec:
    """Parse ``text``; InputError naming the bad pair."""
    values: dict[str, int] = {}
    all_dp = False
    for item in (part.strip() for part in text.split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in KEYS:
            raise InputError(f"--plan {text!r}: {item!r}: expected KEY=VALUE with KEY one of {', '.join(KEYS)}")
        if key == "attention":
            if value not in ("tp", "dp"):
                raise InputError(f"--plan {text!r}: attention={value!r}: expected tp or dp")
            all_dp = value == "dp"
            continue
        try:
            number = int(value)
        except ValueError:
            raise InputError(f"--plan {text!r}: {key}={value!r}: expected a whole number") from None
        if number < 1:
            raise InputError(f"--plan {text!r}: {key}={number}: must be >= 1")
        values[key] = number
    return PlanSpec(text=text, attention_all_dp=all_dp, **values)


def plan_from_spec(model: ModelConfig, spec: PlanSpec, devices: int, *, devices_per_chip: int = 1,
                   intra_link: str = "ici", devices_per_host: int = 8) -> ShardingPlan:
    """The generic plan ``spec`` asks for on ``devices`` devices; ValueError when it does not
    fit the system or does not divide the model."""
    tp = spec.tp or devices
    if tp != devices:
        raise ValueError(f"plan {spec.text!r} spans tp={tp} devices but the system has {devices}")
    attention_dp = devices if spec.attention_all_dp else (spec.attention_dp or 1)
    if devices % attention_dp:
        raise ValueError(f"plan {spec.text!r}: attention_dp={attention_dp} does not divide tp={tp}")
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
