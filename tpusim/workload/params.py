"""Parameter counts of a model, from the same tensor shapes the simulator streams.

The count sums ``rows x cols`` of every tensor :mod:`tpusim.workload.shapes` gives one device
of an unpadded single-device plan (``lane_multiple = 1``, so no lane padding enters), over
every layer, every routed expert, the embedding (once when ``tied_embeddings``), the
lm_head, the final norm and the multi-token-prediction layers (DeepSeek-V3's MTP layer: one
more block plus :func:`~tpusim.workload.shapes.mtp_tensors`; it shares the embedding and
head). Comparing this number with a model's published total checks the readers and the
shapes together (``tests/test_hf_models.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.shapes import (
    TensorSpec,
    expert_slice_tensors,
    layer_tensors,
    lm_head_tensors,
    mtp_tensors,
)
from tpusim.workload.sharding import generic_plan


def _values(tensors: list[TensorSpec]) -> int:
    return sum(t.rows * t.cols for t in tensors)


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by part (counts of values, not bytes)."""

    layers: int  # attention, norms, router, shared experts, dense MLPs
    routed_experts: int
    embedding_and_head: int
    mtp: int

    @property
    def total(self) -> int:
        return self.layers + self.routed_experts + self.embedding_and_head + self.mtp

    @property
    def main_model(self) -> int:
        """Without the multi-token-prediction layers."""
        return self.total - self.mtp


def parameter_count(model: ModelConfig) -> ParameterCount:
    """Parameters of ``model`` by part (see the module docstring)."""
    plan = generic_plan(model, 1, lane_multiple=1)
    hidden = model.hidden_size
    one_expert = _values(expert_slice_tensors(model, plan)) if model.moe else 0
    layers = sum(_values(layer_tensors(model, plan, layer)) for layer in range(model.num_layers)) + hidden
    experts = len(model.moe_layers) * model.num_experts * one_expert
    head = _values(lm_head_tensors(model, plan))
    embedding_and_head = head if model.tied_embeddings else 2 * head
    mtp = 0
    if model.mtp_layers:
        last = model.num_layers - 1
        block = _values(layer_tensors(model, plan, last)) + (model.num_experts * one_expert if model.is_moe_layer(last) else 0)
        mtp = model.mtp_layers * (block + _values(mtp_tensors(model, plan)))
    return ParameterCount(layers, experts, embedding_and_head, mtp)
