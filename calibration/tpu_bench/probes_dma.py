"""DMA and fixed-cost probes: HBM→VMEM copy streams, the empty call, empty layers.

- ``dma_stream`` (one compile per copy size): one grid-less ``pallas_call`` that issues
  ``n`` async copies ``src_hbm[k mod n_src] -> buf[k mod F]`` of ``size`` bytes each
  (uint16 ``[size/256, 128]`` tiles, rows a multiple of 16), keeping ``F`` in flight: copies
  ``0..F-1`` start first, then for each ``k`` the kernel waits copy ``k`` and starts copy
  ``k+F`` into the freed slot. ``n`` and ``F`` are SMEM scalars (powers of two), so every
  in-flight depth shares the compile. Seconds are whole-call wall time (launch included:
  subtract ``empty_call``); ``bytes = n * size``, the HBM bytes read (= VMEM bytes
  written). The source cycles over at most 64 MiB of HBM; TPU v5e has no cache between HBM
  and VMEM, so re-reading a source tile is an HBM read. The kernel ends by copying the first
  and last 16 rows of every slot to its output; the check compares them with the source
  tiles that landed last (a wrong or missing copy fails it).
- ``dma_issue``: the same kernel at 4 KiB (one (16, 128) 16-bit tile) with ``F`` 8 and 16:
  seconds per copy at saturation = ``(t - empty) / n``.
- ``dma_latency``: 4 KiB with ``F = 1``: each copy is started and waited before the next,
  so ``(t - empty) / n`` is one DMA round trip (issue, transfer, semaphore wait).
- ``empty_call``: a ``pallas_call`` with the same kinds of inputs (SMEM scalars, an HBM ref
  it never touches) that writes one (8, 128) f32 tile: the launch + dispatch + sync cost
  every sample of every probe pays.
- ``layer_loop``: ``lax.fori_loop`` over ``L`` "empty layers" (``L`` an SMEM scalar), each
  one SMEM scalar read, a 4 KiB DMA start + wait, and one (16, 128) f32 multiply-add;
  ``L`` in {0, 1, 8, 32, 93} (93 = Kimi K3's layers). The caller fits seconds = a + b·L.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from calibration.tpu_bench.common import Point, Probe
from hwmodels.units import KIB, MIB
from tpusim.schedule.kernel_layout import LANES, TILE_ROWS  # TILE_ROWS: a 16-bit (16, 128) tile

ROW_BYTES = LANES * 2  # one 128-lane row of 16-bit words
SOURCE_BYTES = 64 * MIB  # HBM the copy source cycles over
STREAM_BYTES = 512 * MIB  # target bytes per call at large sizes
MAX_COPIES = 32768  # small sizes: enough copies for a call of a few ms
MIN_COPIES = 16
SLOT_VMEM_BYTES = 32 * MIB  # at most this much VMEM of destination slots
LAYER_COUNTS = (0, 1, 8, 32, 93)

Interpret = Any  # pltpu.InterpretParams or None (compile for the TPU)


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _spec(space: Any) -> pl.BlockSpec:
    return pl.BlockSpec(memory_space=space)


def _params(vmem_bytes: int) -> pltpu.CompilerParams:
    limit = max(32 * MIB, vmem_bytes + 16 * MIB)
    return pltpu.CompilerParams(vmem_limit_bytes=limit, has_side_effects=True)


def _source(n_src: int, rows: int, seed: int) -> Callable[[], list[jax.Array]]:
    def make() -> list[jax.Array]:
        key = jax.random.key(seed)
        return [jax.random.bits(key, (n_src, rows, LANES), dtype=jnp.uint16)]
    return make


def dma_stream_call(rows: int, slots: int, n_src: int, interpret: Interpret) -> Callable[..., Any]:
    """``fn(scalars int32[2] = (n, F), src u16[n_src, rows, 128]) -> u16[slots, 2, 16, 128]``."""
    assert rows % TILE_ROWS == 0 and n_src & (n_src - 1) == 0

    def kernel(s_ref: Any, src: Any, out: Any, buf: Any, sem: Any) -> None:
        n, f = s_ref[0], s_ref[1]

        def copy(k: Any) -> Any:
            slot = lax.bitwise_and(k, f - 1)
            return pltpu.make_async_copy(src.at[lax.bitwise_and(k, n_src - 1)], buf.at[slot], sem.at[slot])

        def prologue(k: Any, c: Any) -> Any:
            copy(k).start()
            return c

        lax.fori_loop(0, jnp.minimum(f, n), prologue, 0)

        def body(k: Any, c: Any) -> Any:
            copy(k).wait()

            @pl.when(k + f < n)
            def _() -> None:
                copy(k + f).start()
            return c

        lax.fori_loop(0, n, body, 0)
        out[:, 0] = buf[:, :TILE_ROWS, :]
        out[:, 1] = buf[:, rows - TILE_ROWS:, :]

    vmem = slots * rows * ROW_BYTES
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((slots, 2, TILE_ROWS, LANES), jnp.uint16),
        in_specs=[_spec(pltpu.SMEM), _spec(pl.ANY)],
        out_specs=_spec(pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((slots, rows, LANES), jnp.uint16), pltpu.SemaphoreType.DMA((slots,))],
        compiler_params=_params(vmem),
        interpret=interpret,
    )
    return jax.jit(call)


def _check_stream(n_src: int, rows: int) -> Callable[[Point, list[jax.Array], Any], str | None]:
    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        n, f = point.scalars[:2]
        got = np.asarray(out)
        for slot in range(min(f, n)):
            k_last = slot + f * ((n - 1 - slot) // f)
            src = inputs[0][k_last % n_src]
            want_first = np.asarray(src[:TILE_ROWS])
            want_last = np.asarray(src[rows - TILE_ROWS:])
            if not (np.array_equal(got[slot, 0], want_first) and np.array_equal(got[slot, 1], want_last)):
                return f"slot {slot}: destination differs from source tile {k_last % n_src} (copy {k_last})"
        return None
    return check


def dma_sizes(quick: bool) -> list[int]:
    if quick:
        return [4 * KIB, 8 * KIB]
    return [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB]


def dma_probes(interpret: Interpret, quick: bool) -> list[Probe]:
    """One probe per copy size; its points are the in-flight depths (and, at 4 KiB, the
    issue-cost and latency points)."""
    probes = []
    for size in dma_sizes(quick):
        rows = size // ROW_BYTES
        max_f = 16 if size <= 4 * KIB else 8
        slots = min(max_f, _pow2_floor(SLOT_VMEM_BYTES // size))
        if quick:
            n, n_src, slots = 12, 8, 4  # n not a multiple of n_src: the source cycles
        else:
            n = max(MIN_COPIES, min(MAX_COPIES, STREAM_BYTES // size))
            n_src = _pow2_floor(min(n, max(1, SOURCE_BYTES // size)))
        points = []
        for f in (1, 2, 4, 8, 16):
            if f > slots:
                break
            params = {"size_bytes": size, "in_flight": f, "copies": n, "source_bytes": n_src * size}
            kind = "dma_stream"
            if size <= 4 * KIB:
                kind = "dma_latency" if f == 1 else "dma_issue" if f >= 8 else kind
            points.append(Point(params, (n, f), bytes=n * size, name=kind))
        probes.append(Probe(
            name="dma_stream", params={"dtype": "uint16", "tile_rows": rows},
            fn=dma_stream_call(rows, slots, n_src, interpret),
            input_shapes=[jax.ShapeDtypeStruct((n_src, rows, LANES), jnp.uint16)],
            make_inputs=_source(n_src, rows, seed=size), points=points, n_scalars=2,
            check=_check_stream(n_src, rows),
            extra={"what": "whole-call seconds of n copies HBM->VMEM, F in flight; subtract empty_call; "
                           "4 KiB, F=1: per-copy round trip (latency); 4 KiB, F>=8: per-copy issue cost"}))
    return probes


# ---------------------------------------------------------------- the empty call


def empty_call(interpret: Interpret) -> Callable[..., Any]:
    def kernel(s_ref: Any, src: Any, out: Any) -> None:
        del src
        out[...] = jnp.full(out.shape, s_ref[0].astype(jnp.float32), jnp.float32)

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, LANES), jnp.float32),
        in_specs=[_spec(pltpu.SMEM), _spec(pl.ANY)], out_specs=_spec(pltpu.VMEM),
        interpret=interpret)
    return jax.jit(call)


def empty_probe(interpret: Interpret, position: str = "first") -> Probe:
    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        ok = np.all(np.asarray(out) == point.scalars[0])
        return None if ok else "empty call wrote the wrong value"

    return Probe(
        name="empty_call", params={"position": position}, fn=empty_call(interpret), repeats=100,
        input_shapes=[jax.ShapeDtypeStruct((1, TILE_ROWS, LANES), jnp.uint16)],
        make_inputs=_source(1, TILE_ROWS, seed=0), points=[Point({}, (7,))], n_scalars=1,
        check=check, extra={"what": "launch + dispatch + sync of one pallas_call that does nothing"})


# ---------------------------------------------------------------- empty layers


LAYER_SCALARS = 8  # per-layer SMEM multipliers, read as s_ref[1 + (l & 7)]


def layer_loop_call(n_src: int, interpret: Interpret) -> Callable[..., Any]:
    """``fn(scalars int32[9] = (L, m_0..m_7), src bf16[n_src, 16, 128]) -> f32[16, 128]``:
    ``out = sum_l m_(l&7) * src[l mod n_src]``."""

    def kernel(s_ref: Any, src: Any, out: Any, buf: Any, sem: Any) -> None:
        out[...] = jnp.zeros(out.shape, jnp.float32)

        def layer(i: Any, c: Any) -> Any:
            m = s_ref[1 + lax.bitwise_and(i, LAYER_SCALARS - 1)]
            cp = pltpu.make_async_copy(src.at[lax.bitwise_and(i, n_src - 1)], buf, sem.at[0])
            cp.start()
            cp.wait()
            out[...] += buf[...].astype(jnp.float32) * m.astype(jnp.float32)
            return c

        lax.fori_loop(0, s_ref[0], layer, 0)

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((TILE_ROWS, LANES), jnp.float32),
        in_specs=[_spec(pltpu.SMEM), _spec(pl.ANY)], out_specs=_spec(pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((TILE_ROWS, LANES), jnp.bfloat16), pltpu.SemaphoreType.DMA((1,))],
        compiler_params=_params(0), interpret=interpret)
    return jax.jit(call)


def layer_probe(interpret: Interpret, quick: bool) -> Probe:
    n_src = 4 if quick else 128
    counts = (0, 1, 3) if quick else LAYER_COUNTS
    mults = tuple(range(1, LAYER_SCALARS + 1))

    def make() -> list[jax.Array]:
        vals = jax.random.randint(jax.random.key(1), (n_src, TILE_ROWS, LANES), -8, 8)
        return [vals.astype(jnp.bfloat16)]

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        layers = point.scalars[0]
        src = np.asarray(inputs[0]).astype(np.float32)
        want = np.zeros((TILE_ROWS, LANES), np.float32)
        for i in range(layers):
            want += src[i % n_src] * mults[i % LAYER_SCALARS]
        return None if np.array_equal(np.asarray(out), want) else "layer loop sum differs"

    points = [Point({"layers": n}, (n, *mults), bytes=n * TILE_ROWS * LANES * 2) for n in counts]
    return Probe(
        name="layer_loop", params={"dma_bytes_per_layer": TILE_ROWS * LANES * 2}, fn=layer_loop_call(n_src, interpret),
        input_shapes=[jax.ShapeDtypeStruct((n_src, TILE_ROWS, LANES), jnp.bfloat16)],
        make_inputs=make, points=points, n_scalars=1 + LAYER_SCALARS, check=check, repeats=30,
        extra={"what": "whole-call seconds of L empty layers (SMEM read, 4 KiB DMA start+wait, one tile FMA); "
                       "fit a + b*L"})
