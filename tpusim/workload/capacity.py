"""HBM capacity: does a model's shard, plus its KV cache, fit on each device?

Resident bytes per device = every layer's dense tensors (:mod:`tpusim.workload.shapes`) + the slices
of every routed expert the device owns (``experts_per_group`` per MoE layer) + the lm_head
and embedding shards, plus the KV cache and recurrent state for ``batch`` sequences of
``context_tokens`` (+ the tokens a step appends). A deployment that does not fit raises
:class:`hwmodels.errors.InputError` with the numbers, so `tpusim compare` and
`tpusim simulate` refuse it instead of predicting a speed nobody can run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hwmodels.errors import InputError
from hwmodels.schema import Chip
from tpusim.workload.formats import tensor_bytes, weight_format
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.shapes import (
    expert_slice_bytes,
    kv_cache_bytes_per_token,
    layer_tensors,
    lm_head_tensors,
    mtp_tensors,
    recurrent_state_bytes,
)
from tpusim.workload.sharding import ShardingPlan

GB = 1e9


@dataclass(frozen=True)
class CapacityReport:
    weight_bytes: int
    expert_bytes: int
    kv_bytes: int
    capacity_bytes: float

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


def resident_weight_bytes(model: ModelConfig, plan: ShardingPlan) -> tuple[int, int]:
    """(all weights, routed-expert part) one device holds in HBM, bytes.

    Tied embeddings are stored once (the lm_head shard); multi-token-prediction layers
    (``mtp_layers``: a copy of the last block plus :func:`~tpusim.workload.shapes.mtp_tensors`)
    are resident, since serving stacks load them for speculative decoding.
    """
    dense = sum(t.bytes for layer in range(model.num_layers) for t in layer_tensors(model, plan, layer))
    head = sum(t.bytes for t in lm_head_tensors(model, plan))
    embedding = 0 if model.tied_embeddings else tensor_bytes(
        weight_format(model.format_of("embedding")), plan.vocab_rows_per_device, model.hidden_size)
    slice_bytes = expert_slice_bytes(model, plan)
    experts = len(model.moe_layers) * plan.experts_per_group(model) * slice_bytes
    if model.mtp_layers:
        last = model.num_layers - 1
        block = sum(t.bytes for t in layer_tensors(model, plan, last) + mtp_tensors(model, plan))
        mtp_experts = plan.experts_per_group(model) * slice_bytes if model.is_moe_layer(last) else 0
        dense += model.mtp_layers * block
        experts += model.mtp_layers * mtp_experts
    return dense + head + embedding + experts, experts


def cache_bytes(model: ModelConfig, plan: ShardingPlan, *, batch: int, context_tokens: int) -> int:
    """KV cache + recurrent state for ``batch`` sequences of ``context_tokens`` on one device
    (with data-parallel attention a device caches only its ``batch / attention_dp`` share)."""
    sequences = plan.attention_rows(batch)
    total = 0
    for layer in range(model.num_layers):
        total += kv_cache_bytes_per_token(model, plan, layer) * context_tokens * sequences
        total += recurrent_state_bytes(model, plan, layer) * sequences
    return total


def capacity_report(model: ModelConfig, plan: ShardingPlan, chip: Chip, *, batch: int,
                    context_tokens: int) -> CapacityReport:
    weights, experts = resident_weight_bytes(model, plan)
    kv = cache_bytes(model, plan, batch=batch, context_tokens=context_tokens)
    return CapacityReport(weights, experts, kv, chip.hbm.capacity_bytes.value)


# Chip counts the advice of :func:`check_capacity` tries: powers of two and doublings of the
# given count, up to this many chips.
MAX_ADVICE_CHIPS = 4096


def fitting_chips(model: ModelConfig, chip: Chip, *, chips: int, batch: int, context_tokens: int,
                  plan_for_chips: Callable[[int], ShardingPlan]) -> tuple[int, CapacityReport] | None:
    """The smallest chip count above ``chips`` (powers of two and doublings of ``chips``, up to
    :data:`MAX_ADVICE_CHIPS`) whose plan (``plan_for_chips(count)``) fits, with its report; None
    when none does (the KV cache and state per device need not shrink with more chips: a TP
    plan keeps every sequence's latent cache on every device)."""
    counts = sorted({2 ** k for k in range(13)} | {chips * 2 ** k for k in range(1, 13)})
    for count in (c for c in counts if chips < c <= MAX_ADVICE_CHIPS):
        try:
            plan = plan_for_chips(count)
        except ValueError:  # no plan for that count (an InputError is a ValueError too)
            continue
        report = capacity_report(model, plan, chip, batch=batch, context_tokens=context_tokens)
        if report.fits:
            return count, report
    return None


def check_capacity(model: ModelConfig, plan: ShardingPlan, chip: Chip, *, chips: int, batch: int,
                   context_tokens: int,
                   plan_for_chips: Callable[[int], ShardingPlan] | None = None) -> CapacityReport:
    """Raise InputError when weights + KV cache do not fit one device's HBM. With
    ``plan_for_chips`` (chip count -> the plan the command would use there) the message says
    how many chips fit, found by this same check on those plans (:func:`fitting_chips`)."""
    report = capacity_report(model, plan, chip, batch=batch, context_tokens=context_tokens)
    if not report.fits:
        advice = ""
        if plan_for_chips is not None:
            found = fitting_chips(model, chip, chips=chips, batch=batch, context_tokens=context_tokens,
                                  plan_for_chips=plan_for_chips)
            advice = (f"; {found[0]} x {chip.name} fit ({found[1].total_bytes / GB:.1f} GB per device)" if found
                      else f"; no count up to {MAX_ADVICE_CHIPS} x {chip.name} fits (the KV cache and state per "
                      "device do not shrink enough with more chips): lower --batch or --context")
        raise InputError(
            f"{model.name} does not fit on {chips} x {chip.name}: each device needs "
            f"{report.total_bytes / GB:.1f} GB (weights {report.weight_bytes / GB:.1f} GB of which routed experts "
            f"{report.expert_bytes / GB:.1f} GB, KV cache and state {report.kv_bytes / GB:.2f} GB at batch {batch}, "
            f"context {context_tokens}) but has {report.capacity_bytes / GB:.1f} GB of HBM{advice}"
        )
    return report
