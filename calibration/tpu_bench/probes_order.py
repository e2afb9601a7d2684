"""Probes of what the simulator assumes about the order of work: DMA service and routing.

- ``dma_order``: does a copy issued behind outstanding large copies wait for them (the
  DMA engine serves in issue order), share the bandwidth with them (processor sharing, the
  simulator's :class:`tpusim.engine.hbm.HbmServer`), or pass them? Each of ``R`` iterations
  (``R`` and the rest SMEM scalars, one compile) starts ``F`` copies of 1 MiB, then, when
  ``small`` is 1, one 64 KiB copy it waits for at once; then ``W`` iterations of a
  dependent VPU chain on one (8, 128) f32 tile; then waits the large copies. With the chain
  longer than the large copies (point ``F=0`` gives the chain alone), the iteration lasts
  ``t_small + chain``, so ``t(small=1) - t(small=0)`` over ``R`` is the small copy's time
  behind ``F`` large ones: in issue order ≈ the large copies' time (F MiB at the stream
  rate, ~1.4 µs per MiB), shared ≈ the small copy's latency + (F + 1) x its transfer.
- ``routing``: the megakernel's own top-k selection (:func:`megakernel.kernel_moe.topk`:
  ``top_k`` selection rounds over the scored experts, then the distinct-expert list built as
  vectors and copied to SMEM; records before 2026-12-06 23:00 UTC timed the per-pick walk it
  replaced) at Kimi K3's TP32 per-device widths, batch ``B``,
  repeated ``R`` times on fresh scores; the copies it would start are left out (a no-op
  issue), so this is the routing's compute alone. ``(t(R2) - t(R1)) / (R2 - R1)`` is one
  layer's routing; its growth with ``B`` is what the simulator's ``moe.topk`` must price.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from calibration.tpu_bench.common import Point, Probe
from hwmodels.units import KIB, MIB
from tpusim.schedule.kernel_layout import LANES

Interpret = Any
ROW_BYTES = LANES * 2
BIG_BYTES, SMALL_BYTES = MIB, 64 * KIB
LARGE_COPIES = (0, 2, 8, 16, 32)  # 1 MiB copies ahead; 16 and 32 since 2026-12-07 (k3-ring keeps ~32 in flight)
QUICK_LARGE_COPIES = (0, 2, 8)
ORDER_ITERATIONS = 64
# the longest chain must outlast the most large copies (32 MiB: ~47 us at ~715 GB/s; 4096 steps ~32 us)
CHAIN_ITERATIONS = (0, 512, 4096, 16384)
ROUTING_BATCHES = (1, 2, 4, 8, 16)
ROUTING_REPEATS = (16, 64, 256)


def _spec(space: Any) -> pl.BlockSpec:
    return pl.BlockSpec(memory_space=space)


# ---------------------------------------------------------------- DMA service order


def dma_order_call(n_src: int, interpret: Interpret, max_big: int = max(LARGE_COPIES)) -> Callable[..., Any]:
    """``fn(int32[4] = (R, F, small, W), big u16[n_src, 4096, 128], small u16[256, 128],
    x f32[8, 128]) -> f32[8, 128]`` (the chain's last value plus the small copy's first row);
    ``F`` ≤ ``max_big`` (one VMEM buffer and semaphore each)."""
    big_rows, small_rows = BIG_BYTES // ROW_BYTES, SMALL_BYTES // ROW_BYTES

    def kernel(s_ref: Any, big: Any, small: Any, x_ref: Any, out: Any, big_buf: Any, small_buf: Any,
               sem: Any) -> None:
        r, f, with_small, w = s_ref[0], s_ref[1], s_ref[2], s_ref[3]

        def big_copy(i: Any, k: Any) -> Any:
            src = lax.rem(i * max_big + k, n_src)
            return pltpu.make_async_copy(big.at[src], big_buf.at[k], sem.at[k])

        small_copy = pltpu.make_async_copy(small, small_buf, sem.at[max_big])

        def iteration(i: Any, acc: Any) -> Any:
            def start(k: Any, c: Any) -> Any:
                big_copy(i, k).start()
                return c
            lax.fori_loop(0, f, start, 0)

            @pl.when(with_small == 1)
            def _() -> None:
                small_copy.start()
                small_copy.wait()

            acc = lax.fori_loop(0, w, lambda _j, a: a * 0.999 + x_ref[...], acc)

            def wait(k: Any, c: Any) -> Any:
                big_copy(i, k).wait()
                return c
            lax.fori_loop(0, f, wait, 0)
            return acc

        acc = lax.fori_loop(0, r, iteration, jnp.zeros((8, LANES), jnp.float32))
        out[...] = acc + small_buf[0:8, :].astype(jnp.float32) * 0.0

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, LANES), jnp.float32),
        in_specs=[_spec(pltpu.SMEM), _spec(pl.ANY), _spec(pl.ANY), _spec(pltpu.VMEM)],
        out_specs=_spec(pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((max_big, big_rows, LANES), jnp.uint16),
                        pltpu.VMEM((small_rows, LANES), jnp.uint16),
                        pltpu.SemaphoreType.DMA((max_big + 1,))],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=max_big * BIG_BYTES + 16 * MIB,
                                             has_side_effects=True),
        interpret=interpret)
    return jax.jit(call)


def dma_order_probe(interpret: Interpret, quick: bool) -> Probe:
    counts = QUICK_LARGE_COPIES if quick else LARGE_COPIES
    max_big = max(counts)
    n_src = 2 * max_big if quick else 8 * max_big
    iterations = 2 if quick else ORDER_ITERATIONS
    chains = (0, 4) if quick else CHAIN_ITERATIONS
    big_rows, small_rows = BIG_BYTES // ROW_BYTES, SMALL_BYTES // ROW_BYTES

    def make() -> list[jax.Array]:
        kb, ks = jax.random.split(jax.random.key(11))
        return [jax.random.bits(kb, (n_src, big_rows, LANES), dtype=jnp.uint16),
                jax.random.bits(ks, (small_rows, LANES), dtype=jnp.uint16),
                jnp.full((8, LANES), 0.001, jnp.float32)]

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        _r, _f, _small, w = point.scalars
        acc = np.zeros((8, LANES), np.float32)
        for _ in range(_r * w if _r * w < 200_000 else 0):
            acc = acc * np.float32(0.999) + np.float32(0.001)
        if _r * w >= 200_000:  # the chain's fixed point, reached long before
            acc[:] = np.float32(0.001) / np.float32(0.001)
        ok = np.allclose(np.asarray(out), acc, rtol=1e-3, atol=1e-6)
        return None if ok else "the VPU chain's value differs from numpy"

    points = []
    for f in counts:
        for with_small in (0, 1):
            for w in chains:
                params = {"iterations": iterations, "large_copies": f, "large_bytes": BIG_BYTES,
                          "small_copy": with_small, "small_bytes": SMALL_BYTES, "chain_iterations": w}
                points.append(Point(params, (iterations, f, with_small, w),
                                    bytes=iterations * (f * BIG_BYTES + with_small * SMALL_BYTES)))
    return Probe(
        name="dma_order", params={"dtype": "uint16"}, fn=dma_order_call(n_src, interpret, max_big),
        input_shapes=[jax.ShapeDtypeStruct((n_src, big_rows, LANES), jnp.uint16),
                      jax.ShapeDtypeStruct((small_rows, LANES), jnp.uint16),
                      jax.ShapeDtypeStruct((8, LANES), jnp.float32)],
        make_inputs=make, points=points, n_scalars=4, check=check, repeats=20,
        extra={"what": "whole-call seconds of R iterations: start F 1 MiB copies, [start+wait one 64 KiB copy], "
                       "W-step VPU chain, wait the F; t(small=1) - t(small=0) over R: the small copy's time "
                       "behind F large ones"})


# ---------------------------------------------------------------- routing (the kernel's top-k)


def routing_dims() -> Any:
    """Kimi K3's TP32 per-device MoE widths, as the K3-shard kernel runs them."""
    from megakernel.dims import model_dims
    from tpusim.workload.format_choice import formats_for_chip
    from tpusim.workload.model_catalog import load_model, shard_plan

    model = formats_for_chip(load_model("kimi-k3"), None, "tpu")[0]
    return model_dims(model, shard_plan(model, "k3-tp32"))


def routing_call(batch: int, interpret: Interpret, dims: Any) -> Callable[..., Any]:
    """``fn(int32[1] = (R,), scores f32[2, B, S], bias f32[1, S]) -> int32[1, 128]`` (lane 0:
    the distinct-expert count of the last repetition; lanes 1..: its list)."""
    from megakernel import kernel_moe
    from megakernel.kernel_dma import N_NEXT, SMEM_WORDS
    from tpusim.workload.registry.names import SmallParam

    e = dims.moe
    picks = e.top_k * batch
    entries = min(e.scored_experts, e.local_experts, picks)  # the kernel's n_max

    def kernel(s_ref: Any, scores_ref: Any, bias_ref: Any, out: Any, smem: Any, route: Any,
               experts: Any, expert_rows: Any, list_sem: Any) -> None:
        def when(cond: Any, fn: Callable[[], None]) -> None:
            pl.when(cond)(fn)

        ctx = SimpleNamespace(
            dims=dims, batch=batch, link=None, when=when, expert_cap=None,
            scratch={"smem": smem, "route": route, "experts": experts, "expert_rows": expert_rows,
                     "list_sem": list_sem},
            geo=SimpleNamespace(expert_issue="during_selection",
                                rings={"expert": SimpleNamespace(buffers=4)}),
            small=lambda layer, kind: bias_ref[...] if kind == SmallParam.ROUTER_BIAS else None)

        def body(i: Any, c: Any) -> Any:
            kernel_moe.topk(ctx, i, scores_ref[lax.bitwise_and(i, 1)], lambda _j: None)
            return c
        lax.fori_loop(0, s_ref[0], body, 0)
        lanes = lax.broadcasted_iota(jnp.int32, (1, LANES), 1)
        row = jnp.where(lanes == 0, smem[N_NEXT], 0)
        for j in range(min(entries, LANES - 1)):
            row = jnp.where(lanes == j + 1, experts[j], row)
        out[...] = row

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((1, LANES), jnp.int32),
        in_specs=[_spec(pltpu.SMEM), _spec(pltpu.VMEM), _spec(pltpu.VMEM)],
        out_specs=_spec(pltpu.VMEM),
        scratch_shapes=[pltpu.SMEM((SMEM_WORDS,), jnp.int32),
                        pltpu.VMEM((2 * e.top_k, max(8, batch), LANES), jnp.float32),
                        *kernel_moe.expert_list_scratch(entries).values()],
        interpret=interpret)
    return jax.jit(call)


def _routing_reference(scores: np.ndarray, bias: np.ndarray, top_k: int) -> list[int]:
    """Distinct experts of the picks in round-major order (the kernel's list)."""
    key = scores + bias
    order = np.argsort(-key, axis=1, kind="stable")[:, :top_k]  # [B, k]
    seen: list[int] = []
    for r in range(top_k):
        for b in range(scores.shape[0]):
            if int(order[b, r]) not in seen:
                seen.append(int(order[b, r]))
    return seen


def routing_probes(interpret: Interpret, quick: bool) -> list[Probe]:
    dims = routing_dims()
    e = dims.moe
    scored = e.scored_experts
    batches = (1, 2) if quick else ROUTING_BATCHES
    repeats = (1, 2) if quick else ROUTING_REPEATS
    probes = []
    for batch in batches:
        def make(batch: int = batch) -> list[jax.Array]:
            ks, kb = jax.random.split(jax.random.key(100 + batch))
            scores = jax.nn.sigmoid(jax.random.normal(ks, (2, batch, scored), jnp.float32))
            return [scores, 0.01 * jax.random.normal(kb, (1, scored), jnp.float32)]

        def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
            slot = (point.scalars[0] - 1) % 2
            want = _routing_reference(np.asarray(inputs[0][slot]), np.asarray(inputs[1]), e.top_k)
            got = np.asarray(out)[0]
            listed = [int(v) for v in got[1:1 + min(len(want), LANES - 1)]]
            ok = int(got[0]) == len(want) and listed == want[:LANES - 1]
            return None if ok else f"routing: {int(got[0])} experts listed, numpy {len(want)}"

        points = [Point({"repeats_in_kernel": r}, (r,), elements=r * batch * e.top_k) for r in repeats]
        probes.append(Probe(
            name="routing", params={"batch": batch, "top_k": e.top_k, "scored_experts": scored,
                                    "model": "kimi-k3", "shard_of": "k3-tp32"},
            fn=routing_call(batch, interpret, dims),
            input_shapes=[jax.ShapeDtypeStruct((2, batch, scored), jnp.float32),
                          jax.ShapeDtypeStruct((1, scored), jnp.float32)],
            make_inputs=make, points=points, n_scalars=1, check=check, repeats=30,
            extra={"what": "whole-call seconds of R runs of the megakernel's top-k selection and expert list "
                           "(kernel_moe.topk, copies not started); difference two R: one layer's routing"}))
    return probes
