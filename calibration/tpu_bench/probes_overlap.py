"""Overlap probe: do a stream of HBM->VMEM copies and a loop of MXU panel products overlap?

The unrolled kernel's step at 0 routed experts (set v5e-aa's capped runs, extended to no
expert) is the sum of its non-expert copies at the streaming rate and its dense products at
the ``matmul`` probe's cost, not their maximum. This probe asks the chip directly, outside
the kernel: one grid-less ``pallas_call`` runs ``n`` iterations; iteration ``k`` (when
``do_copy``) waits copy ``k`` of ``size`` bytes HBM->VMEM and starts copy ``k + F`` into the
freed slot (``F`` in flight, as ``dma_stream``), and (when ``do_products``) issues ``m``
panel products ``x[8, 256] @ w[p]`` (bf16, f32 accumulation, ``w`` a VMEM-resident
``bf16[P, 256, 128]``: one 256-row chunk by one 128-column panel, the kernel's dense product)
in a ``fori_loop`` unrolled by the kernel's dense :data:`PANEL_UNROLL`. Three points per
compile share the scalars ``(n, F, do_copy, do_products)``:

- ``copies``: the stream alone (``do_products`` 0);
- ``products``: the products alone (``do_copy`` 0), the same ``n x m`` of them;
- ``both``: the two interleaved as the kernel interleaves them.

With the empty call subtracted, ``both`` near ``copies + products`` means the chip runs them
one after the other (the kernel's finding); near ``max`` means they overlap. ``m`` is static
per compile (16: the kernel's ratio, one 1 MiB slab of bf16 weights feeds 16 products of
64 KiB; 48: products about as long as the copy). The check compares the products' last
results with numpy and the slots' first rows with the source tiles that landed last.
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
from hwmodels.units import MIB
from tpusim.schedule.kernel_layout import LANES, PANEL_UNROLL, TILE_ROWS

ROW_BYTES = LANES * 2
COPY_BYTES = MIB  # a dense slab's copy
IN_FLIGHT = 4
SOURCES = 16  # 16 MiB of HBM the copies cycle over
CHUNK_ROWS = 256  # a product's contraction rows (the kernel's chunk)
X_ROWS = 8  # batch 1's activation rows, padded to a sublane tile
PANELS = 16  # distinct resident panels the products cycle over
PRODUCTS_PER_COPY = (16, 48)
ITERATIONS = 512
QUICK_ITERATIONS = 4

Interpret = Any


def overlap_call(m: int, rows: int, interpret: Interpret) -> Callable[..., Any]:
    """``fn(int32[4] = (n, F, do_copy, do_products), src u16[SOURCES, rows, 128] (HBM),
    x bf16[2, 8, 256], w bf16[PANELS, 256, 128]) -> (f32[PANELS, 8, 128], u16[F, 16, 128])``."""

    def kernel(s_ref: Any, src: Any, x_ref: Any, w_ref: Any, o_ref: Any, c_ref: Any, buf: Any, sem: Any) -> None:
        n, f, do_copy, do_products = s_ref[0], s_ref[1], s_ref[2], s_ref[3]

        def copy(k: Any) -> Any:
            slot = lax.rem(k, f)
            return pltpu.make_async_copy(src.at[lax.rem(k, SOURCES)], buf.at[slot], sem.at[slot])

        @pl.when(do_copy == 1)
        def _() -> None:
            def prologue(k: Any, c: Any) -> Any:
                copy(k).start()
                return c
            lax.fori_loop(0, jnp.minimum(f, n), prologue, 0)

        def body(k: Any, c: Any) -> Any:
            @pl.when(do_copy == 1)
            def _() -> None:
                copy(k).wait()

                @pl.when(k + f < n)
                def _() -> None:
                    copy(k + f).start()

            @pl.when(do_products == 1)
            def _() -> None:
                x = x_ref[lax.bitwise_and(k, 1)]

                def product(j: Any, c2: Any) -> Any:
                    p = lax.rem(j, PANELS)
                    o_ref[p] = jnp.dot(x, w_ref[p], preferred_element_type=jnp.float32)
                    return c2
                lax.fori_loop(0, m, product, 0, unroll=PANEL_UNROLL)
            return c

        lax.fori_loop(0, n, body, 0)
        c_ref[...] = buf[:, :TILE_ROWS, :]

    out_shape = (jax.ShapeDtypeStruct((PANELS, X_ROWS, LANES), jnp.float32),
                 jax.ShapeDtypeStruct((IN_FLIGHT, TILE_ROWS, LANES), jnp.uint16))
    vmem = IN_FLIGHT * rows * ROW_BYTES + PANELS * CHUNK_ROWS * LANES * 2
    call = pl.pallas_call(
        kernel, out_shape=out_shape,
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY),
                  pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.VMEM)),
        scratch_shapes=[pltpu.VMEM((IN_FLIGHT, rows, LANES), jnp.uint16), pltpu.SemaphoreType.DMA((IN_FLIGHT,))],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=max(32 * MIB, vmem + 16 * MIB),
                                             has_side_effects=True),
        interpret=interpret)
    return jax.jit(call)


def _inputs(rows: int, seed: int) -> Callable[[], list[jax.Array]]:
    def make() -> list[jax.Array]:
        ks, kx, kw = jax.random.split(jax.random.key(seed), 3)
        src = jax.random.bits(ks, (SOURCES, rows, LANES), dtype=jnp.uint16)
        x = jax.random.normal(kx, (2, X_ROWS, CHUNK_ROWS), jnp.float32).astype(jnp.bfloat16)
        w = (jax.random.normal(kw, (PANELS, CHUNK_ROWS, LANES), jnp.float32) / 16).astype(jnp.bfloat16)
        return [src, x, w]
    return make


def _check(m: int) -> Callable[[Point, list[jax.Array], Any], str | None]:
    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        n, f, do_copy, do_products = point.scalars
        products, copied = (np.asarray(o) for o in out)
        src, x, w = (np.asarray(a.astype(jnp.float32)) if a.dtype == jnp.bfloat16 else np.asarray(a) for a in inputs)
        if do_products:
            want = np.einsum("rk,pkn->prn", x[(n - 1) & 1], w)
            written = sorted({j % PANELS for j in range(m)})
            error = float(np.max(np.abs(products[written] - want[written])))
            if error > 1e-2 * float(np.max(np.abs(want[written]))):
                return f"products differ from numpy by {error:.3g}"
        if do_copy:
            for slot in range(min(f, n)):
                k_last = slot + f * ((n - 1 - slot) // f)
                if not np.array_equal(copied[slot], src[k_last % SOURCES][:TILE_ROWS]):
                    return f"slot {slot}: destination differs from source tile {k_last % SOURCES}"
        return None
    return check


def overlap_probes(interpret: Interpret, quick: bool) -> list[Probe]:
    """One compile per products-per-copy ``m``; points: copies alone, products alone, both."""
    rows = COPY_BYTES // ROW_BYTES if not quick else 2 * TILE_ROWS
    n = QUICK_ITERATIONS if quick else ITERATIONS
    probes = []
    for m in PRODUCTS_PER_COPY[:1] if quick else PRODUCTS_PER_COPY:
        points = [Point({"part": part, "iterations": n, "in_flight": IN_FLIGHT, "products_per_copy": m,
                         "copy_bytes": rows * ROW_BYTES}, (n, IN_FLIGHT, copy, products),
                        bytes=n * rows * ROW_BYTES * copy, flops=2 * X_ROWS * CHUNK_ROWS * LANES * n * m * products)
                  for part, copy, products in (("copies", 1, 0), ("products", 0, 1), ("both", 1, 1))]
        probes.append(Probe(
            name="copy_under_products", params={"products_per_copy": m, "panel_unroll": PANEL_UNROLL,
                                                "chunk_rows": CHUNK_ROWS, "x_rows": X_ROWS},
            fn=overlap_call(m, rows, interpret),
            input_shapes=[jax.ShapeDtypeStruct((SOURCES, rows, LANES), jnp.uint16),
                          jax.ShapeDtypeStruct((2, X_ROWS, CHUNK_ROWS), jnp.bfloat16),
                          jax.ShapeDtypeStruct((PANELS, CHUNK_ROWS, LANES), jnp.bfloat16)],
            make_inputs=_inputs(rows, seed=m), points=points, n_scalars=4, check=_check(m),
            extra={"what": "whole-call seconds of n iterations: copies alone, products alone, both interleaved; "
                           "subtract empty_call; both ~ copies + products: no overlap, ~ max: overlap"}))
    return probes
