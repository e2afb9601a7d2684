"""Each device's shard of the full K3 weights and decode state, per the sharding plan.

The multi-device decode kernel (:mod:`megakernel.multi_device_decode`) runs on the shards
this module cuts out of the *same* full weights the single-device reference reads
(:class:`megakernel.layout.Weights` of the one-device plan), so the gathered logits can be
compared with the reference's. Per-device widths come from :func:`megakernel.dims.model_dims`
of the multi-device plan (:mod:`tpusim.workload.shapes`, the one owner). Device ``r`` with
``a`` attention heads per device holds heads ``a·r .. a·r + a - 1``; its sibling pair
``p = r // 2`` holds ``2a`` heads and rank parity ``s = r % 2`` picks a hidden half. A plan
with more head slots than the model has heads (nano TP32: 32 devices x 1 head, 8 heads)
holds each head on ``replicas = devices·a / heads`` devices: device ``r`` is head slot
``r mod (heads / a)`` of replica ``q = r div (heads / a)`` (one replica per host there), and
splits its pair's output-projection rows ``replicas`` ways (part ``q``), so the same-parity
partial reduce over every (pair, replica) sums each head's projection exactly once. Device
``r`` of an expert group (``t = r mod expert_tp``) holds part ``t`` of every group expert's
intermediate width ``w`` (:func:`tpusim.workload.shapes.device_widths`): gate and up columns
``t·w ..``, down rows ``t·w ..``; the routed reduce over all ranks sums the parts:

| tensor | device r's shard of the full tensor |
| --- | --- |
| ``kda.qkvgb`` | columns of its heads in each of the q, k, v, gate blocks, then its beta columns (each block padded to the plan's lane multiple) |
| ``kda.decay_a`` / ``mla.q_a`` / ``mla.kv_a`` | whole (replicated; ``kv_a``'s rope padding cut to the plan's) |
| ``kda.decay_b`` / ``mla.q_b`` / ``mla.kv_b`` / ``mla.gate`` | its heads' columns |
| ``kda.o`` / ``mla.o`` | the pair's ``2a`` heads' rows (part ``q`` of ``replicas``) x hidden half ``s``: the head exchange gives both siblings the pair's head outputs, each projects them onto its half (one replica: as many values as the table's ``a·hd x H``) |
| ``moe.router`` | expert scores ``s·rc .. (s+1)·rc - 1`` (``rc`` router columns): the pair exchange assembles all scores |
| ``moe.latent_down`` | latent columns ``r·ld ..`` (the all-gather assembles the latent) |
| ``moe.latent_up`` | hidden columns of its lane in its host (the host all-gather assembles them) |
| ``moe.shared_*`` / ``mlp.*`` | its intermediate channels (gate and up columns, down rows): a partial over the whole hidden |
| ``expert.*`` | the experts of its expert group, part ``t`` of each one's width (FP8 gate/up: columns and their scales; MXFP4 down: rows repacked by :func:`megakernel.quant.mxfp4_row_slice`, a part inside one 32-row block keeps the block's scale) |
| ``head.lm_head`` | vocabulary columns ``r·vr ..`` (the logits are gathered outside the kernel) |
| ``small`` | norms, mixture, router bias, latent norm whole; KDA decay and conv parameters of its heads |

State: KDA state and conv window of its heads; the MLA KV cache whole (the latent is shared
by all heads), rope padding cut to the plan's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from megakernel.collective_plan import UnsupportedPlan
from megakernel.dims import ModelDims
from megakernel.quant import mxfp4_row_slice
from tpusim.workload.collectives import group_ranks
from tpusim.workload.modelconfig import ModelConfig
from tpusim.workload.registry.names import (
    HeadTensor,
    KdaTensor,
    MlaTensor,
    MlpTensor,
    MoeTensor,
    SmallParam,
)
from tpusim.workload.sharding import ShardingPlan


@dataclass(frozen=True)
class Cut:
    """Where device ``rank`` sits: its heads, pair half, replica, expert group and part, host lane."""

    rank: int
    heads: int  # a: heads per device
    parity: int  # s = rank % 2: the hidden half of the attention output projection
    lane: int  # position of rank in its host group (latent_up columns)
    group: int  # expert group
    local_experts: int
    head_slots: int = 0  # model heads / a (0: one slot per device, no replicas)
    replicas: int = 1  # devices holding each head
    expert_part: int = 0  # t: the part of each group expert's width this device holds
    expert_tp: int = 1

    @property
    def slot(self) -> int:
        return self.rank % self.head_slots if self.head_slots else self.rank

    @property
    def replica(self) -> int:
        return self.rank // self.head_slots if self.head_slots else 0

    @property
    def first_head(self) -> int:
        return self.heads * self.slot

    @property
    def pair_first_head(self) -> int:
        return 2 * self.heads * (self.slot // 2)

    def pair_rows(self, head_rows: int) -> slice:
        """This device's part of its pair's output-projection rows (``head_rows`` per head)."""
        part = 2 * self.heads * head_rows // self.replicas
        first = self.pair_first_head * head_rows + self.replica * part
        return slice(first, first + part)


def cut_of(model: ModelConfig, plan: ShardingPlan, rank: int) -> Cut:
    """Device ``rank``'s place; raises :class:`UnsupportedPlan` for a head layout it cannot cut."""
    a, heads = plan.attention_heads_per_device, model.kda.num_heads
    if model.mla.num_heads != heads or heads % a or (plan.devices * a) % heads or (heads // a) % 2:
        raise UnsupportedPlan(f"plan {plan.name}: {a} heads per device on {plan.devices} devices do not "
                              f"replicate {heads} heads in whole sibling pairs")
    slots, replicas = heads // a, plan.devices * a // heads
    if any((2 * a * n) % replicas for n in (model.kda.head_dim, model.mla.v_head_dim)):
        raise UnsupportedPlan(f"plan {plan.name}: a pair's output-projection rows do not split {replicas} ways")
    lane = group_ranks("host", rank, plan.topology).index(rank)
    return Cut(rank, a, rank % 2, lane, plan.group_of_device(rank), plan.experts_per_group(model),
               slots, replicas, rank % plan.expert_tp, plan.expert_tp)


def _cols(x: np.ndarray, start: int, width: int, padded: int | None = None) -> np.ndarray:
    """Columns ``start .. start + width`` of the last axis, zero-padded to ``padded``."""
    part = x[..., start: start + width]
    if padded is None or padded == width:
        return part
    pad = np.zeros((*part.shape[:-1], padded - width), part.dtype)
    return np.concatenate([part, pad], axis=-1)


def _attention(full: dict[str, np.ndarray], one: ModelDims, dev: ModelDims, c: Cut) -> dict[str, np.ndarray]:
    kd1, kd, md1, md = one.kda, dev.kda, one.mla, dev.mla
    hd, a, half = kd.head_dim, c.heads, one.hidden // 2
    qkvgb = full[KdaTensor.QKVGB]
    blocks = [_cols(qkvgb, i * kd1.padded_width + c.first_head * hd, a * hd, kd.padded_width) for i in range(4)]
    blocks.append(_cols(qkvgb, 4 * kd1.padded_width + c.first_head, a, kd.beta_cols))
    pair_rows = c.pair_rows(hd)
    halves = slice(c.parity * half, (c.parity + 1) * half)
    q_cols = [_cols(full[MlaTensor.Q_B], (c.first_head + i) * md1.q_head_cols, md.q_head_cols) for i in range(a)]
    v_rows = c.pair_rows(md.v_dim)
    return {
        KdaTensor.QKVGB: np.concatenate(blocks, axis=-1),
        KdaTensor.DECAY_A: full[KdaTensor.DECAY_A],
        KdaTensor.DECAY_B: _cols(full[KdaTensor.DECAY_B], c.first_head * hd, a * hd),
        KdaTensor.OUT: full[KdaTensor.OUT][:, pair_rows, halves],
        MlaTensor.Q_A: full[MlaTensor.Q_A],
        MlaTensor.KV_A: full[MlaTensor.KV_A][..., : md.kv_cols],
        MlaTensor.Q_B: np.concatenate(q_cols, axis=-1),
        MlaTensor.KV_B: _cols(full[MlaTensor.KV_B], c.first_head * md.kv_b_head_cols, a * md.kv_b_head_cols),
        MlaTensor.GATE: _cols(full[MlaTensor.GATE], c.first_head * md.v_dim, a * md.v_dim),
        MlaTensor.OUT: full[MlaTensor.OUT][:, v_rows, halves],
    }


def _mlp(full: dict[str, np.ndarray], one: ModelDims, dev: ModelDims, c: Cut) -> dict[str, np.ndarray]:
    e1, e = one.moe, dev.moe
    r = c.rank
    sw, dw = e.shared_width, dev.dense_width
    experts = slice(c.group * c.local_experts, (c.group + 1) * c.local_experts)
    out = {
        MoeTensor.ROUTER: _cols(full[MoeTensor.ROUTER], c.parity * e.router_cols, e.router_cols),
        MoeTensor.LATENT_DOWN: _cols(full[MoeTensor.LATENT_DOWN], r * e.latent_down_cols, e.latent_down_cols),
        MoeTensor.LATENT_UP: _cols(full[MoeTensor.LATENT_UP], c.lane * e.latent_up_cols, e.latent_up_cols),
        MoeTensor.SHARED_GATE_UP: np.concatenate([_cols(full[MoeTensor.SHARED_GATE_UP], r * sw, sw),
                                              _cols(full[MoeTensor.SHARED_GATE_UP], e1.shared_width + r * sw, sw)], -1),
        MoeTensor.SHARED_DOWN: full[MoeTensor.SHARED_DOWN][:, r * sw: (r + 1) * sw],
        MlpTensor.GATE_UP: np.concatenate([_cols(full[MlpTensor.GATE_UP], r * dw, dw),
                                       _cols(full[MlpTensor.GATE_UP], one.dense_width + r * dw, dw)], -1),
        MlpTensor.DOWN: full[MlpTensor.DOWN][r * dw: (r + 1) * dw],
        HeadTensor.LM_HEAD: _cols(full[HeadTensor.LM_HEAD], r * dev.vocab_rows, dev.vocab_rows),
    }
    out.update(_expert_parts(full, one, dev, c, experts))
    return out


def _expert_parts(full: dict[str, np.ndarray], one: ModelDims, dev: ModelDims, c: Cut,
                  experts: slice) -> dict[str, np.ndarray]:
    """Part ``c.expert_part`` of each group expert: gate and up columns (with their scale
    columns) and down rows, the part's width ``w`` from the plan's shapes."""
    whole, w = one.moe.slice_width, dev.moe.slice_width
    if w * c.expert_tp != whole:
        raise UnsupportedPlan(f"expert width {whole} is not {c.expert_tp} parts of {w}")
    first = c.expert_part * w
    out = {}
    for name in ("expert.gate_up.values", "expert.gate_up.scales"):
        gate_up = full[name][:, experts]
        out[name] = np.concatenate([gate_up[..., first: first + w], gate_up[..., whole + first: whole + first + w]], -1)
    try:
        out["expert.down.values"], out["expert.down.scales"] = mxfp4_row_slice(
            full["expert.down.values"][:, experts], full["expert.down.scales"][:, experts], first, w)
    except ValueError as error:
        raise UnsupportedPlan(f"expert down rows {first}..{first + w}: not an MXFP4 slice ({error})") from None
    return out


def _small(full: np.ndarray, one: ModelDims, dev: ModelDims, c: Cut) -> np.ndarray:
    """Packed small-parameter rows [layers, dev.small_cols] of device ``c.rank``."""
    hd, a = dev.kda.head_dim, c.heads
    out = np.zeros((full.shape[0], dev.small_cols), np.float32)
    for kind, (offset, length) in dev.small_offsets.items():
        value = one.small(full, kind)
        if kind == SmallParam.KDA_A_LOG:
            value = value[:, c.first_head: c.first_head + a]
        elif kind == SmallParam.KDA_DT_BIAS:
            value = value[:, c.first_head * hd: (c.first_head + a) * hd]
        elif kind == SmallParam.KDA_CONV:
            taps = value.reshape(full.shape[0], one.kda.conv_kernel, 3, one.kda.width)
            value = taps[..., c.first_head * hd: (c.first_head + a) * hd].reshape(full.shape[0], -1)
        out[:, offset: offset + length] = value[:, :length]
    return out


def weight_shard(full: dict[str, np.ndarray], one: ModelDims, dev: ModelDims, cut: Cut) -> dict[str, np.ndarray]:
    """Device ``cut.rank``'s weights (stacked per layer kind, as :class:`~megakernel.layout.Weights`)."""
    out = {**_attention(full, one, dev, cut), **_mlp(full, one, dev, cut)}
    out["small"] = _small(full["small"], one, dev, cut)
    return out


def state_shard(kda: np.ndarray, conv: np.ndarray, kv: np.ndarray, one: ModelDims, dev: ModelDims,
                cut: Cut) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Device ``cut.rank``'s KDA state [n_kda, B, a, hd, hd], conv window [n_kda, B, K-1, 3·a·hd]
    and KV cache [n_mla, B, T, C + P(R)] from the full (one-device) state."""
    hd, a = dev.kda.head_dim, cut.heads
    heads = slice(cut.first_head, cut.first_head + a)
    blocks = conv.reshape(*conv.shape[:-1], 3, one.kda.width)[..., cut.first_head * hd: (cut.first_head + a) * hd]
    return (np.asarray(kda)[:, :, heads], np.ascontiguousarray(blocks.reshape(*conv.shape[:-1], 3 * a * hd)),
            np.asarray(kv)[..., : dev.mla.kv_cols])
