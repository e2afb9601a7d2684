"""Probes of the attention cores: the megakernel's own code for each, alone, on the chip.

- ``mla_core``: :func:`megakernel.kernel_attention._attend_cache` — the kernel's KV-tile loop
  (``kv_buffers`` tiles of ``kv_tile_tokens`` in flight (2, and 4 at 1 and 16 rows), each waited, folded in
  :data:`megakernel.math_mla.KV_FOLD_TOKENS`-token parts and its buffer refilled after the
  fold) — at Kimi K3's TP32 per-device MLA widths, ``B`` cache rows, ``position`` cached
  tokens (SMEM scalars: one compile a batch), repeated ``R`` times, each repetition followed by
  the softmax's normalisation into the output. When ``F`` > 0, each repetition first starts
  ``F`` copies of 1 MiB (the weights a layer has in flight when its core runs) and waits for
  them after the core: in issue order the first tile waits behind them. ``(t(R2) - t(R1)) /
  (R2 - R1)`` is one layer's core; its slope over the tiles is what a KV tile costs at ``B``
  rows, the figure the static schedule's bundles (``calibration.sources.tpu_layer_static``)
  price at 1/2 … 1/4 of the measured decodes' context cost (docs/tpu-v5e-measured.md).
- ``mla_core_env``: the same loop at 16 rows in a kernel as large as the megakernel (straight-line
  code run once before the repetitions, VMEM scratch beside the core's, both;
  :func:`core_env_probes`): does the kernel around the loop make it slower?
- ``kda_core``: :func:`megakernel.layer_ops.kda_core` — a KDA layer's delta rule over its
  recurrent state f32[B, h, hd, hd], the state copied in from HBM (started and waited at once,
  after the previous layer's write-back) and written back — at K3's TP32 per-device KDA widths,
  ``B`` rows, ``R`` repetitions (one layer each, the state of stack entry ``i mod 2``), after
  ``F`` 1 MiB copies started (waited at the end): in issue order the state's copy waits behind
  them. ``(t(R2) - t(R1)) / (R2 - R1)`` is one KDA layer's core with its state copies; its growth
  with ``B`` is the per-row cost the capped decodes at batch 16 hold beyond the simulator's.
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
from hwmodels.units import MIB
from tpusim.schedule.kernel_layout import LANES

Interpret = Any
# (rows, KV buffers): the schedule's default 2 buffers at every batch the v5e sets run, and 4 at
# the two ends (were the loop paced by each refill's latency, more buffers in flight would hide it)
CORE_BUILDS = ((1, 2), (4, 2), (8, 2), (16, 2), (1, 4), (16, 4))
CORE_TILES = (1, 2, 4, 8)
CORE_REPEATS = (4, 20)  # 2 and 6 on 2026-12-07 14:10 UTC: too close to resolve a tile at 1 row
CORE_AHEAD = (0, 8)  # 1 MiB copies in flight before the core
TILE_TOKENS = 128  # the schedule's default (tpusim.schedule.schema)
BIG_ROWS = MIB // (LANES * 2)
ENV_PROBE = "mla_core_env"
# (straight-line rounds, VMEM MiB) around the 16-row loop: 2,600 rounds make a 64,952-bundle kernel
# on v5e (compiled here; the megakernel's ~79k at 16 rows), the loop unchanged; 56 MiB, about its weight slots
ENV_PADS = ((2600, 0), (0, 56), (2600, 56))
ENV_TILES = (1, 8)
PAD_ROWS = 256  # the code_size probe's u32[256, 128]: enough independent vregs to fill the VALU slots


def core_dims() -> Any:
    """Kimi K3's TP32 per-device MLA widths (:class:`megakernel.math_mla.MlaDims`)."""
    from calibration.tpu_bench.probes_order import routing_dims

    return routing_dims().mla


def core_call(batch: int, buffers: int, capacity: int, n_big: int, interpret: Interpret, md: Any,
              pad_rounds: int = 0, pad_vmem_mib: int = 0) -> Callable[..., Any]:
    """``fn(int32[3] = (R, position, F), q_lat f32[B, h, C], q_rope f32[B, h, r], kv bf16[1, B,
    capacity, cols] (HBM), big u16[n_big, 4096, 128] (HBM)) -> f32[B, h, C]`` (the last
    repetition's attention over the latent, normalised). ``pad_rounds`` > 0: the kernel also
    holds that many rounds of the ``code_size`` probe's straight-line code, run once before the
    repetitions (a kernel as large as the megakernel, ~24 bundles a round on v5e);
    ``pad_vmem_mib``: that much VMEM scratch allocated beside the core's (the megakernel's weight
    slots), touched once."""
    from calibration.tpu_bench.probes_code import _round
    from megakernel import kernel_attention

    def kernel(s_ref: Any, q_lat_ref: Any, q_rope_ref: Any, kv_hbm: Any, big: Any, out: Any,
               kv_tiles: Any, kv_sem: Any, big_buf: Any, big_sem: Any, *pads: Any) -> None:
        r, position, f = s_ref[0], s_ref[1], s_ref[2]
        if pads:  # the pad's result reaches the output only when R < 0 (never): not dead code
            # distinct in every lane and row (32 independent vregs, as code_size's input): nothing to share
            x = (lax.broadcasted_iota(jnp.uint32, (PAD_ROWS, LANES), 0) * LANES
                 + lax.broadcasted_iota(jnp.uint32, (PAD_ROWS, LANES), 1) + position.astype(jnp.uint32))
            for k in range(pad_rounds):
                x = _round(x, k)
            pads[0][0:PAD_ROWS, :] = x

            @pl.when(r < 0)
            def _() -> None:
                every_row = lax.bitcast_convert_type(pads[0][0:PAD_ROWS, :], jnp.int32).astype(jnp.float32)
                first_lanes = slice(0, LANES)
                out[0, 0:1, first_lanes] = jnp.sum(every_row, axis=0, keepdims=True)  # every round's every vreg is live

        def when(cond: Any, fn: Callable[[], None]) -> None:
            if isinstance(cond, bool):
                if cond:
                    fn()
                return
            pl.when(cond)(fn)

        ctx = SimpleNamespace(
            dims=SimpleNamespace(mla=md), batch=batch, when=when, fori=lax.fori_loop,
            event=lambda *a, **k: None, outs={"state.kv": kv_hbm},
            scratch={"kv_tiles": kv_tiles, "kv_sem": kv_sem},
            geo=SimpleNamespace(kv_tile_tokens=TILE_TOKENS, kv_buffers=buffers))

        def big_copy(i: Any, k: Any) -> Any:
            return pltpu.make_async_copy(big.at[lax.rem(i * n_big + k, n_big)], big_buf.at[k], big_sem.at[k])

        def repetition(i: Any, c: Any) -> Any:
            def start(k: Any, c: Any) -> Any:
                big_copy(i, k).start()
                return c

            def wait(k: Any, c: Any) -> Any:
                big_copy(i, k).wait()
                return c

            lax.fori_loop(0, f, start, 0)
            _m, denom, acc = kernel_attention._attend_cache(ctx, 0, 0, position, q_lat_ref[...], q_rope_ref[...])
            out[...] = acc / denom
            lax.fori_loop(0, f, wait, 0)
            return c

        lax.fori_loop(0, r, repetition, 0)

    cols = md.kv_cols
    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((batch, md.heads, md.kv_lora), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pltpu.VMEM),
                  pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pl.ANY),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((buffers, batch, TILE_TOKENS, cols), jnp.bfloat16),
                        pltpu.SemaphoreType.DMA((buffers,)),
                        pltpu.VMEM((n_big, BIG_ROWS, LANES), jnp.uint16),
                        pltpu.SemaphoreType.DMA((n_big,)),
                        *([pltpu.VMEM((max(PAD_ROWS, pad_vmem_mib * MIB // (4 * LANES)), LANES), jnp.uint32)]
                          if pad_rounds or pad_vmem_mib else [])],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=(64 + pad_vmem_mib) * MIB, has_side_effects=True),
        interpret=interpret)
    return jax.jit(call)


def core_reference(q_lat: np.ndarray, q_rope: np.ndarray, kv: np.ndarray, position: int, md: Any) -> np.ndarray:
    """Softmax attention over tokens [0, position) in float64: sum_t p_t latent_t / sum_t p_t."""
    latent = kv[0, :, :position, : md.kv_lora].astype(np.float64)
    k_rope = kv[0, :, :position, md.kv_lora: md.kv_lora + md.rope].astype(np.float64)
    scores = (np.einsum("bhc,btc->bht", q_lat.astype(np.float64), latent)
              + np.einsum("bhr,btr->bht", q_rope.astype(np.float64), k_rope)) * md.scale
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return np.einsum("bht,btc->bhc", p, latent) / p.sum(axis=-1)[..., None]


def _core_probe(batch: int, buffers: int, tiles: tuple[int, ...], repeats: tuple[int, ...],
                ahead: tuple[int, ...], interpret: Interpret, md: Any, pad_rounds: int = 0,
                pad_vmem_mib: int = 0) -> Probe:
    capacity, n_big = TILE_TOKENS * max(tiles), max(max(ahead), 1)

    def make() -> list[jax.Array]:
        kq, kr, kk, kb = jax.random.split(jax.random.key(200 + batch), 4)
        return [0.05 * jax.random.normal(kq, (batch, md.heads, md.kv_lora), jnp.float32),
                0.05 * jax.random.normal(kr, (batch, md.heads, md.rope), jnp.float32),
                jax.random.normal(kk, (1, batch, capacity, md.kv_cols), jnp.float32).astype(jnp.bfloat16),
                jax.random.bits(kb, (n_big, BIG_ROWS, LANES), dtype=jnp.uint16)]

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        position = point.scalars[1]
        kv = np.asarray(inputs[2].astype(jnp.float32))
        want = core_reference(np.asarray(inputs[0]), np.asarray(inputs[1]), kv, position, md)
        err = float(np.max(np.abs(np.asarray(out) - want)))
        return None if err < 1e-3 else f"mla_core: max |kernel - float64| {err:.2e} at {position} tokens"

    tile_bytes = batch * TILE_TOKENS * md.kv_cols * 2
    points = [Point({"repeats_in_kernel": r, "tiles": t, "tokens": t * TILE_TOKENS, "large_copies": f},
                    (r, t * TILE_TOKENS, f), bytes=r * (t * tile_bytes + f * MIB))
              for f in ahead for t in tiles for r in repeats]
    padded = pad_rounds or pad_vmem_mib
    params = {"batch": batch, "heads": md.heads, "kv_lora": md.kv_lora, "rope": md.rope,
              "kv_cols": md.kv_cols, "kv_tile_tokens": TILE_TOKENS, "kv_buffers": buffers,
              "tile_bytes": tile_bytes, "large_bytes": MIB, "model": "kimi-k3", "shard_of": "k3-tp32"}
    if padded:
        params |= {"pad_rounds": pad_rounds, "pad_vmem_mib": pad_vmem_mib}
    return Probe(
        name=ENV_PROBE if padded else "mla_core", params=params,
        fn=core_call(batch, buffers, capacity, n_big, interpret, md, pad_rounds, pad_vmem_mib),
        input_shapes=[jax.ShapeDtypeStruct((batch, md.heads, md.kv_lora), jnp.float32),
                      jax.ShapeDtypeStruct((batch, md.heads, md.rope), jnp.float32),
                      jax.ShapeDtypeStruct((1, batch, capacity, md.kv_cols), jnp.bfloat16),
                      jax.ShapeDtypeStruct((n_big, BIG_ROWS, LANES), jnp.uint16)],
        make_inputs=make, points=points, n_scalars=3, check=check, repeats=20,
        extra={"what": "whole-call seconds of R repetitions of the megakernel's MLA core KV loop "
                       "(kernel_attention._attend_cache) over `tokens` cached tokens at `batch` rows, "
                       "after F 1 MiB copies started; difference two R: one layer's core"
                       + ("; the kernel padded as the megakernel is (pad_rounds of straight-line code run once "
                          "before the repetitions, pad_vmem_mib of VMEM scratch)" if padded else "")})


def core_probes(interpret: Interpret, quick: bool) -> list[Probe]:
    md = core_dims()
    builds = ((2, 2),) if quick else CORE_BUILDS
    tiles = (3,) if quick else CORE_TILES  # quick: one point that refills a buffer (3 tiles, 2 buffers)
    repeats = (2,) if quick else CORE_REPEATS  # quick: one point, two repetitions behind copies ahead
    ahead = (2,) if quick else CORE_AHEAD
    return [_core_probe(batch, buffers, tiles, repeats, ahead, interpret, md) for batch, buffers in builds]


def core_env_probes(interpret: Interpret, quick: bool) -> list[Probe]:
    """``mla_core_env``: the same loop at 16 rows in a kernel as large as the megakernel (code,
    VMEM, both): the batch-16 capped runs pay ~8 us a 128 tokens a MLA layer more than
    ``mla_core`` alone for the same compiled loop (docs/megakernel-on-tpu.md); does the
    kernel's size or its VMEM use make that loop slower?"""
    md = core_dims()
    if quick:  # interpret mode: the smallest pads, one point each (the same code path)
        return [_core_probe(1, 2, (1,), (1,), (0,), interpret, md, pad_rounds=8, pad_vmem_mib=1)]
    return [_core_probe(16, 2, ENV_TILES, CORE_REPEATS, (0,), interpret, md, pad_rounds=rounds, pad_vmem_mib=mib)
            for rounds, mib in ENV_PADS]


# ---------------------------------------------------------------- the KDA core (delta rule + state copies)

KDA_BATCHES = (1, 4, 8, 16)
KDA_REPEATS = (8, 40)
KDA_AHEAD = (0, 8)


def kda_core_call(batch: int, n_big: int, interpret: Interpret, d: Any) -> Callable[..., Any]:
    """``fn(int32[2] = (R, F), q/k/v f32[3, h, B, hd], g f32[B, W], beta f32[B, h], state f32[2, B,
    h, hd, hd] (HBM), big u16[n_big, 4096, 128] (HBM)) -> f32[B, W]`` (the last repetition's
    per-head outputs side by side)."""
    from megakernel import layer_ops

    kd = d.kda

    def kernel(s_ref: Any, qkv_ref: Any, g_ref: Any, beta_ref: Any, state_hbm: Any, big: Any, out: Any,
               state_out: Any, state_buf: Any, sem: Any, big_buf: Any, big_sem: Any) -> None:
        r, f = s_ref[0], s_ref[1]

        def copy(i: Any, direction: str) -> Any:
            # read from the input's entry, written back to the output's: every repetition starts
            # from the state the call was given (the check's reference), at the kernel's cost
            if direction == "in":
                return pltpu.make_async_copy(state_hbm.at[lax.rem(i, 2)], state_buf, sem.at[0])
            return pltpu.make_async_copy(state_buf, state_out.at[lax.rem(i, 2)], sem.at[1])

        class Io:  # the kernel's KernelIo for the recurrent state of repetition i
            dims = d

            def __init__(self, i: Any) -> None:
                self.i = i

            def state_in(self, kind: str, layer: Any) -> None:
                @pl.when(self.i > 0)
                def _() -> None:
                    copy(self.i - 1, "out").wait()  # the previous layer's write-back
                copy(self.i, "in").start()
                copy(self.i, "in").wait()

            def state(self, kind: str, layer: Any) -> Any:
                return state_buf[...]

            def keep_state(self, kind: str, layer: Any, value: Any) -> None:
                state_buf[...] = value
                copy(self.i, "out").start()

        def big_copy(i: Any, k: Any) -> Any:
            return pltpu.make_async_copy(big.at[lax.rem(i * n_big + k, n_big)], big_buf.at[k], big_sem.at[k])

        def start(k: Any, c: Any) -> Any:
            big_copy(0, k).start()
            return c

        def wait(k: Any, c: Any) -> Any:
            big_copy(0, k).wait()
            return c

        lax.fori_loop(0, f, start, 0)

        def repetition(i: Any, c: Any) -> Any:
            qkv = tuple([qkv_ref[j, h] for h in range(kd.heads)] for j in range(3))
            outs = layer_ops.kda_core(Io(i), 0, qkv, g_ref[...], beta_ref[...])
            out[...] = jnp.concatenate(outs, axis=1)
            return c

        lax.fori_loop(0, r, repetition, 0)
        copy(r - 1, "out").wait()
        lax.fori_loop(0, f, wait, 0)

    w = kd.heads * kd.head_dim
    call = pl.pallas_call(
        kernel, out_shape=(jax.ShapeDtypeStruct((batch, w), jnp.float32),
                           jax.ShapeDtypeStruct((2, batch, kd.heads, kd.head_dim, kd.head_dim), jnp.float32)),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), *[pl.BlockSpec(memory_space=pltpu.VMEM)] * 3,
                  pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pl.ANY)),
        scratch_shapes=[pltpu.VMEM((batch, kd.heads, kd.head_dim, kd.head_dim), jnp.float32),
                        pltpu.SemaphoreType.DMA((2,)),
                        pltpu.VMEM((n_big, BIG_ROWS, LANES), jnp.uint16),
                        pltpu.SemaphoreType.DMA((n_big,))],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=64 * MIB, has_side_effects=True),
        interpret=interpret)
    return jax.jit(call)


def kda_core_probes(interpret: Interpret, quick: bool) -> list[Probe]:
    from calibration.tpu_bench.probes_order import routing_dims
    from megakernel import math_kda

    d = routing_dims()
    kd = d.kda
    w = kd.heads * kd.head_dim
    batches = (2,) if quick else KDA_BATCHES
    repeats = (2,) if quick else KDA_REPEATS  # quick: one point, two layers behind copies ahead
    ahead = (2,) if quick else KDA_AHEAD
    n_big = max(ahead)
    probes = []
    for batch in batches:
        def make(batch: int = batch) -> list[jax.Array]:
            kq, kg, kb, ks, kbig = jax.random.split(jax.random.key(300 + batch), 5)
            qkv = 0.1 * jax.random.normal(kq, (3, kd.heads, batch, kd.head_dim), jnp.float32)
            return [qkv, -0.1 * jnp.abs(jax.random.normal(kg, (batch, w), jnp.float32)),
                    jax.nn.sigmoid(jax.random.normal(kb, (batch, kd.heads), jnp.float32)),
                    0.01 * jax.random.normal(ks, (2, batch, kd.heads, kd.head_dim, kd.head_dim), jnp.float32),
                    jax.random.bits(kbig, (n_big, BIG_ROWS, LANES), dtype=jnp.uint16)]

        def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
            r = point.scalars[0]  # the last repetition read the given state's entry (R - 1) mod 2
            qkv, g, beta, state = (np.asarray(x, np.float64) for x in inputs[:4])
            st = state[(r - 1) % 2]
            outs = []
            for h in range(kd.heads):
                o, _ = math_kda.delta_rule_head(jnp.asarray(st[:, h]), jnp.asarray(qkv[0, h]), jnp.asarray(qkv[1, h]),
                                                jnp.asarray(qkv[2, h]), jnp.asarray(g[:, h * kd.head_dim:(h + 1) * kd.head_dim]),
                                                jnp.asarray(beta[:, h: h + 1]))
                outs.append(np.asarray(o))
            err = float(np.max(np.abs(np.asarray(out[0]) - np.concatenate(outs, axis=1))))
            return None if err < 1e-4 else f"kda_core: max |kernel - reference| {err:.2e}"

        state_bytes = batch * kd.heads * kd.head_dim * kd.head_dim * 4
        points = [Point({"repeats_in_kernel": r, "large_copies": f}, (r, f), bytes=2 * r * state_bytes + f * MIB)
                  for f in ahead for r in repeats]
        probes.append(Probe(
            name="kda_core", params={"batch": batch, "heads": kd.heads, "head_dim": kd.head_dim,
                                     "state_bytes": state_bytes, "large_bytes": MIB, "model": "kimi-k3",
                                     "shard_of": "k3-tp32"},
            fn=kda_core_call(batch, n_big, interpret, d),
            input_shapes=[jax.ShapeDtypeStruct((3, kd.heads, batch, kd.head_dim), jnp.float32),
                          jax.ShapeDtypeStruct((batch, w), jnp.float32),
                          jax.ShapeDtypeStruct((batch, kd.heads), jnp.float32),
                          jax.ShapeDtypeStruct((2, batch, kd.heads, kd.head_dim, kd.head_dim), jnp.float32),
                          jax.ShapeDtypeStruct((n_big, BIG_ROWS, LANES), jnp.uint16)],
            make_inputs=make, points=points, n_scalars=2, check=check, repeats=20,
            extra={"what": "whole-call seconds of R KDA cores (layer_ops.kda_core: the state copied in, the delta "
                           "rule, the state written back) at `batch` rows after F 1 MiB copies started; "
                           "difference two R: one KDA layer's core with its state copies"}))
    return probes
