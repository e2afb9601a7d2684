"""Deployment plans a GPU row tries, and the rule that picks one.

GPU serving stacks deploy an MoE model in one NVLink domain as (``gpu-serving.md``):

- ``attention TP{n} + experts EP{n}`` — attention heads and every projection split over all
  GPUs, each GPU holding whole experts (:func:`tpusim.workload.sharding.generic_plan`);
- ``attention TP{n/2} x DP2 + experts EP{n}`` — two attention data-parallel groups, each
  serving half the sequences with every head of a TP{n/2} shard (wide-EP serving);
- ``attention TP{n} + experts TP4 x EP{n/4}`` — the first plan's attention, each expert's
  width split over 4 GPUs inside ``n / 4`` expert-parallel groups (TensorRT-LLM's
  minimum-latency DeepSeek-R1 layout splits experts TP4 x EP2);
- ``attention TP{n} + experts TP{n}`` — plain tensor parallelism, every GPU reading 1/n of
  each selected expert (SGLang's K3 TP8 recipe, ``k3-on-sglang.md`` 2.2: no all-to-all, no
  expert-load imbalance at small batch).

A compare row simulates every candidate that fits HBM and keeps the fastest
(:func:`pick_plan`), reporting which.

The system→plan rule (:func:`tpusim.workload.model_catalog.plan_for_system`) stays the one
owner of a row's plan when ``--plan`` is given, and on TPUs; on GPUs without ``--plan`` the
rule's plan and :func:`gpu_plan_candidates` are tried (:mod:`tpusim.compare.rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.sharding import ShardingPlan, generic_plan

EXPERT_TP = 4  # the expert-TP width of the expert-TP candidate
ATTENTION_DP = 2  # attention data-parallel groups of the DP candidate


@dataclass(frozen=True)
class PlanOutcome:
    """One candidate's result in a row: ``step_s`` is None when it does not fit."""

    label: str
    plan: ShardingPlan
    step_s: float | None
    why_not: str = ""


def gpu_plan_candidates(model: ModelConfig, devices: int, *, devices_per_chip: int = 1,
                        intra_link: str = "nvlink") -> list[tuple[str, ShardingPlan]]:
    """The plans a GPU row of ``devices`` GPUs tries (see the module docstring), each named
    apart (``generic-N``, ``generic-N-dp2``, ``generic-N-etp4``)."""
    common = {"devices_per_chip": devices_per_chip, "intra_link": intra_link}
    base = generic_plan(model, devices, **common)
    out = [(f"attention TP{devices} + experts EP{base.expert_groups}"
            + (f" x TP{base.expert_tp}" if base.expert_tp > 1 else ""), base)]
    if devices % ATTENTION_DP == 0 and devices > ATTENTION_DP:
        dp = generic_plan(model, devices, attention_dp=ATTENTION_DP, name=f"{base.name}-dp{ATTENTION_DP}", **common)
        out.append((f"attention TP{devices // ATTENTION_DP} x DP{ATTENTION_DP} + experts EP{dp.expert_groups}", dp))
    groups = devices // EXPERT_TP
    moe = model.moe
    if (moe is not None and base.expert_tp == 1 and devices % EXPERT_TP == 0 and groups >= 1
            and moe.num_experts % groups == 0 and moe.expert_intermediate_size % EXPERT_TP == 0):
        plan = generic_plan(model, devices, expert_groups=groups, expert_tp=EXPERT_TP,
                            name=f"{base.name}-etp{EXPERT_TP}", **common)
        out.append((f"attention TP{devices} + experts TP{EXPERT_TP} x EP{groups}", plan))
    if (moe is not None and base.expert_tp == 1 and devices > EXPERT_TP
            and moe.expert_intermediate_size % devices == 0):
        plan = generic_plan(model, devices, expert_groups=1, expert_tp=devices, name=f"{base.name}-etp{devices}",
                            **common)
        out.append((f"attention TP{devices} + experts TP{devices}", plan))
    return out


def pick_plan(outcomes: Sequence[PlanOutcome]) -> PlanOutcome | None:
    """The fastest candidate that fits (None when none fits); ties keep the first listed."""
    fitting = [outcome for outcome in outcomes if outcome.step_s is not None]
    return min(fitting, key=lambda outcome: outcome.step_s) if fitting else None  # type: ignore[arg-type, return-value]
