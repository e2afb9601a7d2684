"""The plain-JAX/XLA decode step a user would write instead of the megakernel: same weights,
same bytes, compiled by XLA (the baseline the kernel's chip timings stand next to).

What a JAX user serving this model on one chip writes without Pallas: one ``jax.jit`` of
the whole step, the layers in a ``lax.fori_loop`` over weights stacked with a leading layer
axis, XLA's own fusions, and an MoE that reads **only the chosen experts**: a loop over the
layer's distinct routed experts (dynamic trip count) that slices each expert's FP8 gate/up
and MXFP4 down weights out of HBM, dequantises them to bf16 and runs its rows through the
MXU. So the weight bytes per step are the kernel's (every dense weight once per layer, each
distinct chosen expert once: ``megakernel.step_bytes``); what differs is who schedules the
copies (XLA's, one layer's work after another, no cross-layer prefetch) and the fusions.

Everything but the MoE is :func:`megakernel.reference.decode_step_with_routing` itself (the
reference's layer loop and math), so the baseline's numerics are the reference's: experts
are summed in the same order (distinct experts by first appearance, round-major).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from megakernel import math_moe
from megakernel.dims import ModelDims
from megakernel.math_common import mm, situ
from megakernel.quant import dequant_fp8_b256, dequant_mxfp4
from megakernel.reference import DecodeState, Params, decode_step_with_routing
from tpusim.workload.registry.names import MoeTensor, SmallParam

GATE_UP_VALUES, GATE_UP_SCALES = "expert.gate_up.values", "expert.gate_up.scales"
DOWN_VALUES, DOWN_SCALES = "expert.down.values", "expert.down.scales"


def distinct_in_order(picks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``picks`` i32[n] -> (the distinct values first, in order of first appearance, then the
    repeats; how many are distinct). Static shapes: the loop below runs ``count`` of them."""
    new = math_moe.first_appearance(picks)
    order = jnp.argsort(~new, stable=True)  # first appearances keep their order
    return picks[order], jnp.sum(new.astype(jnp.int32))


def streamed_moe(dims: ModelDims, p: Params, experts: Params, small: jax.Array,
                 x: jax.Array, expert_cap: int | None = None) -> tuple[jax.Array, jax.Array]:
    """One MoE sublayer reading only the chosen experts (signature of
    :func:`megakernel.reference.latent_moe`): ``x`` f32[B, H] -> (out f32[B, H], ids i32[B, k]).
    ``expert_cap``: run at most the first this many distinct experts (0: none; the step's
    non-expert work), as the kernel's fixed-cost probe does; not the model's decode."""
    e = dims.moe
    scores = jax.nn.sigmoid(mm(x, p[MoeTensor.ROUTER])[:, : e.scored_experts])
    bias = dims.small(small, SmallParam.ROUTER_BIAS)[None, : e.scored_experts]
    ids, weights = math_moe.select_topk(scores, bias, e.top_k, e.routed_scaling)
    lat = math_moe.latent_input(dims, mm(x, p[MoeTensor.LATENT_DOWN]), dims.small(small, SmallParam.LATENT_NORM)[None])
    chosen, count = distinct_in_order(jnp.concatenate(ids, axis=0)[:, 0])  # round-major, as the kernel

    def one_expert(t: jax.Array, routed: jax.Array) -> jax.Array:
        eid = chosen[t]
        take = partial(lax.dynamic_index_in_dim, index=eid, keepdims=False)
        gate_up = dequant_fp8_b256(take(experts[GATE_UP_VALUES]), take(experts[GATE_UP_SCALES]))
        down = dequant_mxfp4(take(experts[DOWN_VALUES]), take(experts[DOWN_SCALES]))
        h = mm(lat, gate_up)
        y = mm(situ(h[:, : e.slice_width], h[:, e.slice_width:]), down)
        return routed + math_moe.row_weight(ids, weights, eid) * y

    if expert_cap is not None:
        count = jnp.minimum(count, expert_cap)
    routed = lax.fori_loop(0, count, one_expert, jnp.zeros((x.shape[0], e.latent), jnp.float32))
    out = math_moe.moe_output(dims, mm(routed, p[MoeTensor.LATENT_UP]))
    shared = math_moe.gated_mlp(x, p[MoeTensor.SHARED_GATE_UP], p[MoeTensor.SHARED_DOWN])
    return out + shared, jnp.concatenate(ids, axis=1)


@partial(jax.jit, static_argnums=(0, 4))
def xla_decode_step(dims: ModelDims, p: Params, state: DecodeState,
                    tokens: jax.Array, expert_cap: int | None = None) -> tuple[jax.Array, DecodeState]:
    """``tokens`` i32[B] -> (logits f32[B, V], next state): the whole step, one XLA program
    (``expert_cap``: see :func:`streamed_moe`)."""
    moe = streamed_moe if expert_cap is None else partial(streamed_moe, expert_cap=expert_cap)
    logits, next_state, _ = decode_step_with_routing(dims, p, state, tokens, moe)
    return logits, next_state
