"""The ops of the multi-device decode kernel: the single-device kernel's math on one shard.

:class:`DecodeOps` runs one op of the simulator's program (by its name) on this device's
operands. Values flow between ops of a layer in ``values``; an op that issues a collective
leaves its payload there under the collective's name, and a collective's wait leaves its
result there under the same name (:class:`megakernel.multi_device_decode.DecodeKernel`
moves them). Shapes: activations f32[B, n]; ``a`` heads per device, ``hd`` head dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from megakernel import layer_ops, math_kda, math_mla, math_moe, residual
from megakernel.dims import ModelDims
from megakernel.math_common import mm, rmsnorm
from megakernel.quant import dequant_fp8_b256, dequant_mxfp4
from tpusim.workload.registry.names import (
    Collective,
    HeadTensor,
    KdaTensor,
    MlaTensor,
    MlpTensor,
    MoeTensor,
    SmallParam,
    expert_index,
    is_expert_op,
)

# The operands holding a KDA layer's state (layer_ops kinds): read from ``ins``, written to ``states``
_STATE_OPERANDS = {layer_ops.CONV: "L{layer}.conv", layer_ops.RECURRENT: "L{layer}.kda_state"}


class DecodeOps:
    """Op bodies of one kernel invocation (``ins``/``states`` operand refs, ``scratch``): the
    shared bodies of :mod:`megakernel.layer_ops` on this device's operands (it is their
    :class:`~megakernel.layer_ops.LayerIo`), the collectives' payloads and results in ``values``."""

    def __init__(self, kernel: Any, ctx: Any, ins: dict[str, Any], states: dict[str, Any], logits: Any) -> None:
        self.k, self.ctx, self.ins, self.states, self.logits = kernel, ctx, ins, states, logits
        self.d = kernel.dims
        self.values: dict[str, jax.Array] = {}
        self.position = ins["position"][0]
        # the residual stream as traced values (every VMEM access is an interpreter callback)
        zero = jnp.zeros((kernel.batch, self.d.hidden), jnp.float32)
        self.blocks = [ins["x0"][...]] + [zero] * (self.d.block_slots - 1)
        self.partial = zero

    # ------------------------------------------------------------------ helpers

    def weight(self, layer: int | None, name: str) -> jax.Array:
        """A weight matrix of ``layer`` (None: not per layer), its column chunks side by side."""
        prefix = f"{name}." if layer is None else f"L{layer}.{name}."
        parts = [self.ins[k][...] for k in sorted((k for k in self.ins if k.startswith(prefix)),
                                                  key=lambda k: int(k.rsplit(".", 1)[1]))]
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)

    # ------------------------------------------------------------------ operands (layer_ops.LayerIo)

    @property
    def dims(self) -> ModelDims:
        return self.d

    def product(self, tensor: str, layer: int, x: jax.Array) -> jax.Array:
        return mm(x, self.weight(layer, tensor))

    def resident(self, tensor: str, layer: int) -> jax.Array:
        return self.weight(layer, tensor)

    def small(self, layer: int, kind: str) -> jax.Array:
        offset, length = self.d.small_offsets[kind]
        return self.ins[f"L{layer}.small"][:, offset: offset + length]

    def state_in(self, kind: str, layer: int) -> None:
        """The state is an operand of the call: nothing to copy in."""

    def state(self, kind: str, layer: int) -> jax.Array:
        return self.ins[_STATE_OPERANDS[kind].format(layer=layer)][...]

    def keep_state(self, kind: str, layer: int, value: jax.Array) -> None:
        self.states[_STATE_OPERANDS[kind].format(layer=layer)][...] = value

    def run(self, name: str, layer: int) -> None:
        if is_expert_op(name):
            if expert_index(name) == 0 or "routed" not in self.values:
                self.experts(layer)
            return
        getattr(self, name.replace(".", "_"))(layer)

    # ------------------------------------------------------------------ residual

    def add_to_residual(self, out: jax.Array) -> None:
        self.partial = self.partial + out

    def mix_norm(self, layer: int, sublayer: str) -> jax.Array:
        return layer_ops.mix_norm(self, layer, sublayer, jnp.stack(self.blocks), self.partial)

    def finish_mlp(self, layer: int) -> None:
        """Add layer ``layer``'s MLP output (its collectives just completed) and, at a block
        end, snapshot the block."""
        if layer == 0:
            self.add_to_residual(self.values.pop(Collective.MLP_ALLREDUCE))
        else:  # the shared output: waited at moe.combine / latent_up, or here (a deferred wait)
            shared = self.values.pop("shared") if "shared" in self.values else self.values.pop(Collective.MOE_SHARED_REDUCE)
            self.add_to_residual(self.values.pop(Collective.MOE_OUTPUT_ALLGATHER) + shared)
        if residual.block_ends_after(layer, self.d.block_layers):
            self.blocks[1 + layer // self.d.block_layers] = self.partial
            self.partial = jnp.zeros_like(self.partial)

    def attn_mix_norm(self, layer: int) -> None:
        if layer > 0:
            self.finish_mlp(layer - 1)
        self.values["x"] = self.mix_norm(layer, "attn")

    def mlp_mix_norm(self, layer: int) -> None:
        self.values.pop(Collective.ATTN_PARTIAL_REDUCE, None)
        self.add_to_residual(self.values.pop(Collective.ATTN_HALF_GATHER))
        self.values["x"] = self.mix_norm(layer, "mlp")

    # ------------------------------------------------------------------ KDA

    def kda_qkvgb(self, layer: int) -> None:
        self.values["qkv"], self.values["gate"], self.values["beta"] = layer_ops.kda_qkvgb(self, layer, self.values["x"])

    def kda_decay(self, layer: int) -> None:
        self.values["g"] = layer_ops.kda_decay(self, layer, self.values["x"])

    def kda_core(self, layer: int) -> None:
        outs = layer_ops.kda_core(self, layer, self.values.pop("qkv"), self.values.pop("g"), self.values.pop("beta"))
        self.values[Collective.ATTN_HEAD_EXCHANGE] = math_kda.output_gate(outs, self.values.pop("gate"), self.d.eps)

    def project_heads(self, layer: int, name: str) -> None:
        """The pair's head outputs (the exchange's result) onto this device's hidden half, over
        its replica's part of the pair's rows (:mod:`megakernel.decode_shards`)."""
        heads, w = self.values.pop(Collective.ATTN_HEAD_EXCHANGE), self.weight(layer, name)
        part = w.shape[0]
        if part != heads.shape[1]:  # head replicas: part rank // head_slots of the pair's rows
            start = self.ctx.rank // self.k.head_slots * part
            heads = jax.lax.dynamic_slice_in_dim(heads, start, part, axis=1)
        self.values[Collective.ATTN_PARTIAL_REDUCE] = mm(heads, w)

    def kda_o(self, layer: int) -> None:
        self.project_heads(layer, KdaTensor.OUT)

    # ------------------------------------------------------------------ MLA

    def mla_q_a(self, layer: int) -> None:
        self.values["cq"] = layer_ops.mla_q_a(self, layer, self.values["x"])

    def mla_kv_a(self, layer: int) -> None:
        self.values["entry"] = layer_ops.mla_kv_a(self, layer, self.values["x"], self.position.astype(jnp.float32))

    def mla_q_b(self, layer: int) -> None:
        pos = self.position.astype(jnp.float32)
        self.values["q_nope"], self.values["q_rope"] = layer_ops.mla_q_b(self, layer, self.values.pop("cq"), pos)

    def mla_kv_b(self, layer: int) -> None:
        self.values["q_lat"], _ = layer_ops.mla_kv_b(self, layer, self.values.pop("q_nope"))

    def mla_core(self, layer: int) -> None:
        """Attention over the cache and this token, the cache write, then this device's heads'
        output gate (``mla.gate``'s math: the exchange carries gated heads)."""
        md, b = self.d.mla, self.k.batch
        cache = self.ins[f"L{layer}.kv"][...]  # [B, T, C + P(R)]
        entry, q_lat, q_rope = self.values.pop("entry"), self.values.pop("q_lat"), self.values.pop("q_rope")
        carry = math_mla.attend_parts(math_mla.attend_init(b, md), q_lat, q_rope, cache, 0, self.position, md)
        o = layer_ops.mla_fold_entry(carry, q_lat, q_rope, entry, self.weight(layer, MlaTensor.KV_B), self.d)
        out = self.states[f"L{layer}.kv"]
        out[...] = cache
        out[:, pl_ds(self.position), :] = entry[:, None, :]
        self.values[Collective.ATTN_HEAD_EXCHANGE] = layer_ops.mla_gate(self, layer, self.values["x"], o[:b])

    def mla_gate(self, layer: int) -> None:
        """Applied at the end of ``mla.core`` (see there)."""

    def mla_o(self, layer: int) -> None:
        self.project_heads(layer, MlaTensor.OUT)

    # ------------------------------------------------------------------ MLP and MoE

    def mlp_gate_up(self, layer: int) -> None:
        """Layer 0's dense MLP (both ops: the partial is issued at ``mlp.down``)."""
        self.values[Collective.MLP_ALLREDUCE] = math_moe.gated_mlp(self.values.pop("x"), self.weight(layer, MlpTensor.GATE_UP),
                                                          self.weight(layer, MlpTensor.DOWN))

    def mlp_down(self, layer: int) -> None:
        """Computed with ``mlp.gate_up`` (see there)."""

    def moe_router(self, layer: int) -> None:
        self.values[Collective.MOE_ROUTER_EXCHANGE] = layer_ops.moe_router(self, layer, self.values["x"])

    def moe_topk(self, layer: int) -> None:
        e = self.d.moe
        scores = self.values.pop(Collective.MOE_ROUTER_EXCHANGE)[:, : e.num_experts]
        bias = self.small(layer, SmallParam.ROUTER_BIAS)[:, : e.num_experts]
        self.values["route"] = math_moe.select_topk(scores, bias, e.top_k, e.routed_scaling)
        self.states[f"L{layer}.route"][...] = jnp.concatenate(self.values["route"][0], axis=1)
        self.states[f"L{layer}.router_keys"][...] = scores + bias  # what select_topk ranks (diagnostics)

    def moe_latent_down(self, layer: int) -> None:
        self.values[Collective.MOE_LATENT_ALLGATHER] = mm(self.values["x"], self.weight(layer, MoeTensor.LATENT_DOWN))

    def moe_shared_gate_up(self, layer: int) -> None:
        """The shared experts' channels of this device (both ops; issued at ``shared_down``)."""
        act = layer_ops.gate_up(self, MoeTensor.SHARED_GATE_UP, layer, self.values.pop("x"), self.d.moe.shared_width)
        self.values[Collective.MOE_SHARED_REDUCE] = self.product(MoeTensor.SHARED_DOWN, layer, act)

    def moe_shared_down(self, layer: int) -> None:
        """Computed with ``moe.shared_gate_up`` (see there)."""

    def experts(self, layer: int) -> None:
        """This device's part of its group's experts on the gathered latent, weighted by the
        routing (0 if not chosen): a partial of each expert's output when expert TP splits it."""
        e, plan = self.d.moe, self.k.plan
        lat = rmsnorm(self.values.pop(Collective.MOE_LATENT_ALLGATHER), self.small(layer, SmallParam.LATENT_NORM), self.d.eps)
        ids, weights = self.values.pop("route")
        group_first = self.ctx.rank // plan.expert_tp * e.local_experts  # plan.group_of_device, traced
        acc = jnp.zeros((self.k.batch, e.latent), jnp.float32)
        for j in range(e.local_experts):
            w_gu = dequant_fp8_b256(self.ins[f"L{layer}.expert.gate_up.values.{j}"][...],
                                    self.ins[f"L{layer}.expert.gate_up.scales.{j}"][...])
            w_dn = dequant_mxfp4(self.ins[f"L{layer}.expert.down.values.{j}"][...],
                                 self.ins[f"L{layer}.expert.down.scales.{j}"][...])
            y = math_moe.gated_mlp(lat, w_gu, w_dn)
            acc = acc + math_moe.row_weight(ids, weights, group_first + j) * y
        self.values["routed"] = acc

    def moe_combine(self, layer: int) -> None:
        """The routed partial sum is ready. Fused expert reduction: the payload is the shared
        partial (hidden) then the routed partial (latent), one row per token. Otherwise the
        shared result, unless its wait is deferred to the next layer's first op."""
        routed = self.values.pop("routed")
        if Collective.MOE_FUSED_REDUCE in self.k.index:
            self.values[Collective.MOE_FUSED_REDUCE] = jnp.concatenate(
                [self.values.pop(Collective.MOE_SHARED_REDUCE), routed], axis=1)
            return
        if Collective.MOE_SHARED_REDUCE in self.values:  # waited here (not deferred)
            self.values["shared"] = self.values.pop(Collective.MOE_SHARED_REDUCE)
        self.values[Collective.MOE_ROUTED_REDUCE] = routed

    def moe_latent_up(self, layer: int) -> None:
        if Collective.MOE_FUSED_REDUCE in self.values:  # the summed [shared | routed]
            both = self.values.pop(Collective.MOE_FUSED_REDUCE)
            self.values["shared"], routed = both[:, : self.d.hidden], both[:, self.d.hidden:]
        else:
            routed = self.values.pop(Collective.MOE_ROUTED_REDUCE)
        self.values[Collective.MOE_OUTPUT_ALLGATHER] = mm(routed, self.weight(layer, MoeTensor.LATENT_UP))

    # ------------------------------------------------------------------ head

    def head_norm(self, layer: int) -> None:
        self.finish_mlp(layer - 1)
        self.values["x"] = layer_ops.head_norm(self.d, jnp.stack(self.blocks), self.partial)

    def head_lm_head(self, layer: int) -> None:
        self.logits[...] = mm(self.values.pop("x"), self.weight(None, HeadTensor.LM_HEAD))


def pl_ds(start: Any) -> Any:
    from jax.experimental import pallas as pl

    return pl.ds(start, 1)
