"""MLP phase of the megakernel: routing, the latent MoE with streamed experts, the layer-0
dense MLP and the head.

``moe.topk`` runs ``top_k`` selection rounds (:func:`megakernel.math_moe.topk_round`), then
builds the distinct-expert list (first appearance, round-major order) as vectors and copies it
to SMEM (:func:`write_expert_list`); the copies of list entries ``j < slots`` that the plan
issues at ``moe.topk`` start once it is there (``after_routing`` and ``during_selection``
alike: the rounds end before the list is built). The
expert loop of the next window (``lax.fori_loop`` over the dynamic count ``n``) runs
``expert[j]``: refill entry ``j + slots - 1`` into the slot ``expert[j-1]`` freed, wait for
entry ``j``, multiply its FP8 gate/up and MXFP4 down panel by panel (decoded to bf16 in VMEM,
or fed to the MXU as FP8 where the chip takes it: :mod:`megakernel.expert_products`), and
accumulate the weighted output in f32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel import layer_ops, math_moe, residual
from megakernel.kernel_attention import Begin, KernelIo, add_to_residual, mix_norm
from megakernel.kernel_dma import N_NEXT, Ctx, idiv, imod
from megakernel.math_common import situ
from tpusim.schedule.kernel_layout import LANES, expert_list_rows, expert_list_stage_rows
from tpusim.workload.registry.names import (
    Collective,
    HeadOp,
    HeadTensor,
    MlpOp,
    MlpTensor,
    MoeOp,
    MoeTensor,
    SmallParam,
)

WORK_LATENT, WORK_SHARED, WORK_ACC, WORK_NORM = 0, 1, 2, 3
# How ``moe.topk`` builds the expert list, written into run and static-schedule records: "vector"
# (:func:`write_expert_list`); records without it ran "walk" (a scalar store and branch per pick)
EXPERT_LIST_BUILD = "vector"  # rows of the "work" scratch


def moe_pre_experts(ctx: Ctx, layer: Any, begin: Begin, issue_at_topk: Callable[[Any], None]) -> None:
    """``mlp.mix_norm`` .. ``moe.shared_down``: routing and the shared expert of ``layer``.

    ``issue_at_topk(j)`` starts list entry ``j``'s copies if the plan issues them at topk."""
    d, e, b = ctx.dims, ctx.dims.moe, ctx.batch
    begin(MlpOp.MIX_NORM)
    x = mix_norm(ctx, layer, "mlp")
    link = ctx.link
    begin(MoeOp.ROUTER)
    scores = layer_ops.moe_router(KernelIo(ctx), layer, x)
    if link is not None:
        link.issue(ctx, Collective.MOE_ROUTER_EXCHANGE, layer, scores)  # this device's router columns
    begin(MoeOp.LATENT_DOWN)  # before the top-k: its all-gather overlaps the selection
    down = ctx.matmul(MoeTensor.LATENT_DOWN, layer, x)
    if link is not None:
        link.issue(ctx, Collective.MOE_LATENT_ALLGATHER, layer, down)
        link.keep_latent_norm(ctx, ctx.small(layer, SmallParam.LATENT_NORM))
    else:
        lat = math_moe.latent_input(d, down, ctx.small(layer, SmallParam.LATENT_NORM))
        ctx.scratch["work"][WORK_LATENT, :b, : e.latent] = lat
    begin(MoeOp.TOPK)
    if link is not None:
        scores = link.wait(ctx, Collective.MOE_ROUTER_EXCHANGE, layer)
    topk(ctx, layer, scores[:, : e.scored_experts], issue_at_topk)
    begin(MoeOp.SHARED_GATE_UP)
    act = layer_ops.gate_up(KernelIo(ctx), MoeTensor.SHARED_GATE_UP, layer, x, e.shared_width)
    begin(MoeOp.SHARED_DOWN)
    shared = ctx.matmul(MoeTensor.SHARED_DOWN, layer, act)
    if link is not None and not link.fused_experts:
        link.issue(ctx, Collective.MOE_SHARED_REDUCE, layer, shared)
    else:  # one device, or the shared partial waits for the fused reduction at moe.combine
        ctx.scratch["work"][WORK_SHARED, :b, : d.hidden] = shared


def topk(ctx: Ctx, layer: Any, scores: jax.Array, issue_at_topk: Callable[[Any], None]) -> None:
    """Select, write the distinct-expert list and its length to SMEM, keep ids/weights in VMEM.

    The list is built as vectors: the ``k*B`` picks in round-major order are compared all-pairs;
    a pick is new when no earlier pick has its id, its list entry the number of new picks before
    it; entry ``p`` of the list is the id of the new pick whose entry is ``p`` (a masked sum over
    the picks, one 128-lane row per 128 entries). The rows are staged in VMEM and copied to SMEM
    by one local DMA each: no scalar work per pick (a vector-to-scalar move, an SMEM store and a
    branch per pick were ~1,800 bundles a layer at batch 1 and ~19,300 at 16). The first
    ``slots`` entries' copies start once the list is in SMEM, in either ``expert_issue`` mode:
    the walk that interleaved them with the picks is gone."""
    e, b = ctx.dims.moe, ctx.batch
    smem = ctx.scratch["smem"]
    bias = ctx.small(layer, SmallParam.ROUTER_BIAS)[:, : e.scored_experts]
    key = scores + bias
    ids, picked = [], []
    for _ in range(e.top_k):
        idx, score, key = math_moe.topk_round(key, scores)
        ids.append(idx)
        picked.append(score)
    weights = math_moe.renormalise(picked, e.routed_scaling)
    if ctx.link is not None:  # global ids -> this group's local ids (others fall outside 0..local-1)
        ids = [idx - ctx.link.group_first(ctx) for idx in ids]
    route = jnp.concatenate([x.astype(jnp.float32) for x in ids] + weights, axis=1)  # [B, 2k]
    ctx.scratch["route"][:, :b, :] = jnp.broadcast_to(route.T[:, :, None], (2 * e.top_k, b, LANES))
    picks = e.top_k * b
    seq = jnp.concatenate(ids, axis=0)  # [k*B, 1] round-major
    earlier = lax.broadcasted_iota(jnp.int32, (picks, picks), 1) < lax.broadcasted_iota(jnp.int32, (picks, picks), 0)
    same = seq == seq.reshape(1, picks)
    new = jnp.logical_not(jnp.any(same & earlier, axis=1, keepdims=True))  # [k*B, 1]
    if ctx.link is not None:  # only experts of this device's group are listed (and loaded)
        new = new & (seq >= 0) & (seq < e.local_experts)
    slot = jnp.sum(jnp.where(earlier & new.reshape(1, picks), 1, 0), axis=1, keepdims=True)  # [k*B, 1]
    entry = jnp.where(new, slot, -1)  # a repeat pick matches no entry
    write_expert_list(ctx, seq, entry)
    n = jnp.sum(jnp.where(new, 1, 0))
    if ctx.link is not None:
        # No expert of this device's group chosen: still run one expert op (local expert 0, routing
        # weight 0: the list's unmatched entry 0 holds 0), because the schedule starts copies
        # inside the expert loop.
        n = jnp.maximum(n, 1)
    if ctx.expert_cap is not None:  # a fixed-cost probe: the first ``expert_cap`` experts of the list
        n = jnp.minimum(n, ctx.expert_cap)
    smem[N_NEXT] = n
    for j in range(ctx.geo.rings["expert"].buffers):
        ctx.when(j < n, lambda j=j: issue_at_topk(j))


def expert_list_scratch(list_entries: int) -> dict[str, Any]:
    """The list's scratch for ``list_entries`` entries: its SMEM rows (``experts``), their VMEM
    staging (``expert_rows``, whole 8-row tiles) and one DMA semaphore a row (``list_sem``)."""
    rows = expert_list_rows(list_entries)
    return {"experts": pltpu.SMEM((rows * LANES,), jnp.int32),
            "expert_rows": pltpu.VMEM((expert_list_stage_rows(list_entries), LANES), jnp.int32),
            "list_sem": pltpu.SemaphoreType.DMA((rows,))}


def write_expert_list(ctx: Any, seq: jax.Array, entry: jax.Array) -> None:
    """``experts[p]`` (SMEM) = the id of the pick whose list entry is ``p`` (0 where none):
    ``seq``, ``entry``: int32[picks, 1] (entry -1: not listed). One masked sum per 128 entries,
    staged in ``expert_rows`` (VMEM) and copied to SMEM (waited before it returns)."""
    rows = ctx.scratch["expert_rows"]
    experts, sems = ctx.scratch["experts"], ctx.scratch["list_sem"]
    count = experts.shape[0] // LANES
    lanes = lax.broadcasted_iota(jnp.int32, (1, LANES), 1)
    copies = []
    for r in range(count):
        hit = entry == lanes + r * LANES  # [picks, 128]
        rows[r: r + 1, :] = jnp.sum(jnp.where(hit, seq, 0), axis=0, keepdims=True)
        copy = pltpu.make_async_copy(rows.at[r], experts.at[pl.ds(r * LANES, LANES)], sems.at[r])
        copy.start()
        copies.append(copy)
    for copy in copies:
        copy.wait()


def expert_loop(ctx: Ctx, layer: Any, n: Any, begin_expert: Callable[[Any], None]) -> None:
    """``expert[0..n-1]`` of ``layer``: weighted expert outputs summed in f32 (loop carry)."""
    e, b = ctx.dims.moe, ctx.batch
    if ctx.link is not None:  # the whole latent: consumed by expert[0], waited before the loop
        ctx.link.gather_latent(ctx, layer)
    es = ctx.geo.expert_slot
    gu_panels, dn_panels = 2 * e.slice_width // LANES, e.latent // LANES
    # what the chip's FP8 products take (megakernel.expert_products): on v5e/v6e the latent times
    # 2^64 (exact), so the decoded tiny weights' products stay normal; on TPU7x bf16 as it is
    products = ctx.expert_products
    lat = products.gate_up_input(ctx.scratch["work"][WORK_LATENT, :b, : e.latent])
    route = ctx.scratch["route"][:, :b, :1]  # [2k, B, 1]: ids then weights (one load)
    ids = [route[r].astype(jnp.int32) for r in range(e.top_k)]
    weights = [route[e.top_k + r] for r in range(e.top_k)]

    def body(j: Any, acc: jax.Array) -> jax.Array:
        begin_expert(j)
        ctx.wait_expert(layer, j)
        row = ctx.expert_row(j)
        # Panel by panel in runtime loops (a 128-column panel decoded in VMEM and multiplied):
        # Mosaic unrolls vector code, and the whole K3 slice at once is ~10^5 vector ops.
        h = ctx.panel_products(row, es.gate_up_rows, gu_panels, e.latent // 2, es.gate_up_scale_rows, lat,
                               products.gate_up)
        act = situ(h[:, : e.slice_width], h[:, e.slice_width:])
        y = ctx.panel_products(row + es.gate_up_total, es.down_rows, dn_panels, e.slice_width // 4,
                               es.down_scale_rows, act.astype(jnp.bfloat16), products.down)
        eid = ctx.scratch["experts"][j]
        return acc + math_moe.row_weight(ids, weights, eid) * y

    acc = ctx.fori(0, n, body, jnp.zeros((b, e.latent), jnp.float32))
    ctx.scratch["work"][WORK_ACC, :b, : e.latent] = acc


def moe_post_experts(ctx: Ctx, layer: Any, begin: Begin) -> None:
    """``moe.combine``, ``moe.latent_up``: back to the hidden size, add to the residual."""
    d, e, b = ctx.dims, ctx.dims.moe, ctx.batch
    begin(MoeOp.COMBINE)
    if ctx.link is not None:
        ctx.link.moe_output(ctx, layer, begin)
        return
    acc = ctx.scratch["work"][WORK_ACC, :b, : e.latent]
    begin(MoeOp.LATENT_UP)
    out = math_moe.moe_output(d, ctx.matmul(MoeTensor.LATENT_UP, layer, acc))
    add_to_residual(ctx, out + ctx.scratch["work"][WORK_SHARED, :b, : d.hidden])
    end_of_layer(ctx, layer)


def end_of_layer(ctx: Ctx, layer: Any) -> None:
    """At a block end, snapshot ``partial`` into its block slot and clear it."""
    block_layers = ctx.dims.block_layers

    def snapshot() -> None:
        ctx.scratch["blocks"][1 + idiv(layer, block_layers)] = ctx.scratch["partial"][...]
        ctx.scratch["partial"][...] = jnp.zeros_like(ctx.scratch["partial"])

    if isinstance(layer, int):
        if residual.block_ends_after(layer, block_layers):
            snapshot()
    else:
        ctx.when(imod(layer + 1, block_layers) == 0, snapshot)


def dense_mlp(ctx: Ctx, begin: Begin) -> None:
    """Layer 0: ``mlp.mix_norm``, ``mlp.gate_up``, ``mlp.down``."""
    width = ctx.dims.dense_width
    begin(MlpOp.MIX_NORM)
    x = mix_norm(ctx, 0, "mlp")
    begin(MlpOp.GATE_UP)
    gu = ctx.matmul(MlpTensor.GATE_UP, 0, x)
    begin(MlpOp.DOWN)
    out = ctx.matmul(MlpTensor.DOWN, 0, situ(gu[:, :width], gu[:, width:]))
    if ctx.link is not None:  # added at layer 1's attn.mix_norm, where the all-reduce is consumed
        ctx.link.issue(ctx, Collective.MLP_ALLREDUCE, 0, out)
        return
    add_to_residual(ctx, out)
    end_of_layer(ctx, 0)


def head(ctx: Ctx, begin: Begin) -> None:
    """``head.norm`` (plain residual sum, RMSNorm) and ``head.lm_head`` -> logits."""
    d, b = ctx.dims, ctx.batch
    begin(HeadOp.NORM)
    if ctx.link is not None:
        ctx.link.finish_mlp(ctx, d.num_layers)
    x = layer_ops.head_norm(d, ctx.scratch["blocks"][:, :b, :], ctx.scratch["partial"][:b, :])
    begin(HeadOp.LM_HEAD)
    ctx.outs["logits"][...] = ctx.matmul(HeadTensor.LM_HEAD, d.num_layers, x)
