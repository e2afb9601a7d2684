"""Compute probes: MXU matmuls at the megakernel's shapes, VPU dequantisation and norms.

Every probe here is one grid-less ``pallas_call`` whose operands are VMEM inputs (copied in
by the call before the body runs) and whose body repeats the work ``R`` times in a
``lax.fori_loop`` (``R`` an SMEM scalar, so all ``R`` share a compile). Each point records
the whole-call seconds at one ``R``; ``(t(R2) - t(R1)) / (R2 - R1)`` is the seconds of one
repetition with the launch and the operand copy-in differenced out. Repetition ``i`` reads
its activation/input from slot ``i mod 2`` of a 2-slot leading axis, so the work cannot be
hoisted out of the loop, and stores its result to the output ref.

- ``matmul`` ``x[rows, K] @ W[K, N]``, bf16 operands, f32 accumulation, W resident in VMEM.
  ``form="panel_loop"``: W in the kernel's panel layout ``bf16[N/128, K, 128]``
  (``megakernel.kernel_products``), a ``fori_loop`` over the N/128 panels of
  ``dot(x, W[p])``; the kernel's own ``einsum("bk,pkn->bpn")`` over all panels at once took
  66 s to compile at K=7168, N=1664 (libtpu 0.0.42, here), too slow for a probe set.
  ``form="dot"``: one ``jnp.dot`` with W ``bf16[K, N]`` (rows 8 and 128 only). Shapes are
  Kimi K3's TP32 per-device projections (:data:`MATMUL_SHAPES`); rows in {8, 16, 32, 64, 128}.
  ``flops = 2 · rows · K · N · R``. TPU v5e has no fp8 MXU path: the kernel dequantises FP8
  and MXFP4 experts to bf16 in VMEM first (the dequant probes below).
- ``dequant_fp8_gate_up``: :func:`megakernel.quant.dequant_fp8_words` on one K3 TP32 expert
  slice's gate/up as :func:`megakernel.kernel_moe.expert_loop` reshapes it: values
  ``u16[12, 1792, 128]`` (2·768/128 panels, 3584/2 word rows), scales
  ``words_to_bf16(u16[12, 14, 128])`` -> ``bf16[12, 3584, 128]``. ``form`` says whether
  the whole slice is one expression (as ``expert_loop`` writes it) or a ``fori_loop`` over
  the 12 panels (one panel per iteration). ``elements`` = bf16 weights produced.
- ``dequant_mxfp4_down``: :func:`megakernel.quant.dequant_mxfp4_words` on the slice's down
  projection, values ``u16[28, 192, 128]``, scales ``u16[28, 12, 128]`` ->
  ``bf16[28, 768, 128]``; same two forms.
- Both dequant probes run each decoder ``params.decoder``: ``words32`` (the kernel's,
  :mod:`megakernel.quant`, since 2026-12-06) and ``bytes`` (the one it replaced: split the
  16-bit words into bytes, decode each to f32 with selects, round to bf16), side by side in
  one run. Records without ``decoder`` ran the ``bytes`` form.
- ``rmsnorm_silu``: ``rmsnorm(x, w) * silu(g)`` (:mod:`megakernel.math_common`) over
  ``f32[8, 7168]``; ``elements`` = 8·7168·R.
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
from megakernel.math_common import rmsnorm, silu
from megakernel.quant import (
    FP8_BLOCK_ROWS,
    MXFP4_BLOCK_ROWS,
    WORDS32_DECODER,
    decode_e2m1,
    decode_e4m3,
    decode_e8m0,
    dequant_fp8_words,
    dequant_mxfp4_fold,
    dequant_mxfp4_words,
    repeat_rows,
    split_words,
    words_to_bf16,
)
from megakernel.quant_pairs import FP8_PAIRS_DECODER, KERNEL_DECODER, dequant_fp8_pairs
from tpusim.schedule.kernel_layout import LANES
from tpusim.workload.registry.names import Family

Interpret = Any
SLOTS = 2  # input slots, indexed by repetition parity
MATMUL_SHAPES: dict[str, tuple[int, int]] = {  # Kimi K3, TP32, one device: (K, N)
    Family.KDA_PROJ: (7168, 1664),
    Family.ROUTER: (7168, 512),
    "expert_gate_up": (3584, 1536),  # latent 3584 x 2*768
    "expert_down": (768, 3584),
    "shared_gate_up": (7168, 384),
}
MATMUL_ROWS = (8, 16, 32, 64, 128)
MATMUL_REPEATS = (1, 8, 64)
LATENT, SLICE_WIDTH, HIDDEN = 3584, 768, 7168  # K3 TP32 expert slice
DEQUANT_REPEATS = (1, 4, 16)
NORM_ROWS = 8
NORM_REPEATS = (1, 64, 512)
EPS = 1e-6


def _vmem(*specs: Any) -> list[pl.BlockSpec]:
    return [pl.BlockSpec(memory_space=s) for s in specs]


def _params(vmem_bytes: int) -> pltpu.CompilerParams:
    limit = min(110 * MIB, max(32 * MIB, int(vmem_bytes * 1.5) + 16 * MIB))
    return pltpu.CompilerParams(vmem_limit_bytes=limit)


def _call(kernel: Callable[..., None], out: jax.ShapeDtypeStruct, n_in: int, vmem_bytes: int,
          interpret: Interpret) -> Callable[..., Any]:
    call = pl.pallas_call(
        kernel, out_shape=out, in_specs=_vmem(pltpu.SMEM, *[pltpu.VMEM] * n_in),
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM), compiler_params=_params(vmem_bytes),
        interpret=interpret)
    return jax.jit(call)


def _slot(i: Any) -> Any:
    return lax.bitwise_and(i, SLOTS - 1)


def _last_slot(point: Point) -> int:
    return (point.scalars[0] - 1) % SLOTS


# ---------------------------------------------------------------- MXU


def matmul_call(rows: int, k: int, n: int, form: str, interpret: Interpret) -> Callable[..., Any]:
    """``fn(int32[1] = (R,), x bf16[2, rows, K], w) -> out``: ``panel_loop``: w
    ``bf16[N/128, K, 128]``, out ``f32[N/128, rows, 128]``, a ``fori_loop`` over panels of
    ``dot(x, w[p])``; ``dot``: w ``bf16[K, N]``, out ``f32[rows, N]``, one ``jnp.dot``."""
    panels = n // LANES

    def kernel(s_ref: Any, x_ref: Any, w_ref: Any, o_ref: Any) -> None:
        def body(i: Any, c: Any) -> Any:
            x = x_ref[_slot(i)]
            if form == "dot":
                o_ref[...] = jnp.dot(x, w_ref[...], preferred_element_type=jnp.float32)
                return c

            def panel(p: Any, c2: Any) -> Any:
                o_ref[p] = jnp.dot(x, w_ref[p], preferred_element_type=jnp.float32)
                return c2
            lax.fori_loop(0, panels, panel, 0)
            return c
        lax.fori_loop(0, s_ref[0], body, 0)

    vmem = 2 * (SLOTS * rows * k + k * n) + 2 * 4 * rows * n
    out = (rows, n) if form == "dot" else (panels, rows, LANES)
    return _call(kernel, jax.ShapeDtypeStruct(out, jnp.float32), 2, vmem, interpret)


def _weights(k: int, n: int, form: str) -> tuple[int, ...]:
    return (k, n) if form == "dot" else (n // LANES, k, LANES)


def _memo(want: Callable[[list[jax.Array], int], np.ndarray]) -> Callable[[list[jax.Array], int], np.ndarray]:
    """Cache the expected output of each input slot (one probe's points share inputs)."""
    cache: dict[tuple[int, int], np.ndarray] = {}

    def get(inputs: list[jax.Array], slot: int) -> np.ndarray:
        key = (id(inputs[0]), slot)
        if key not in cache:
            if any(k[0] != key[0] for k in cache):  # another run's inputs
                cache.clear()
            cache[key] = want(inputs, slot)
        return cache[key]
    return get


def _check_matmul(form: str) -> Callable[[Point, list[jax.Array], Any], str | None]:
    def expected(inputs: list[jax.Array], slot: int) -> np.ndarray:
        x = np.asarray(inputs[0][slot].astype(jnp.float32))
        w = np.asarray(inputs[1].astype(jnp.float32))
        return x @ w if form == "dot" else np.matmul(x[None], w)

    want_of = _memo(expected)

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        want = want_of(inputs, _last_slot(point))
        ok = np.allclose(np.asarray(out), want, rtol=2e-2, atol=1e-2 * float(np.abs(want).max() + 1))
        return None if ok else f"matmul ({form}) result differs from numpy"
    return check


def matmul_probes(interpret: Interpret, quick: bool, form: str = "panel_loop") -> list[Probe]:
    """``form="panel_loop"``: every shape at every row count; ``form="dot"``: rows 8 and 128
    only (its compile is slower: about 4x at K=7168)."""
    shapes = {"quick": (256, 256)} if quick else MATMUL_SHAPES
    rows_set = (8,) if quick else MATMUL_ROWS if form == "panel_loop" else (8, 128)
    repeats = (1, 2) if quick else MATMUL_REPEATS
    probes = []
    for name, (k, n) in shapes.items():
        for rows in rows_set:
            def make(rows: int = rows, k: int = k, n: int = n) -> list[jax.Array]:
                kx, kw = jax.random.split(jax.random.key(rows + k + n))
                x = jax.random.normal(kx, (SLOTS, rows, k), jnp.float32).astype(jnp.bfloat16)
                w = jax.random.normal(kw, _weights(k, n, form), jnp.float32) / np.sqrt(k)
                return [x, w.astype(jnp.bfloat16)]
            points = [Point({"repeats_in_kernel": r}, (r,), flops=2 * rows * k * n * r) for r in repeats]
            probes.append(Probe(
                name="matmul", params={"shape": name, "rows": rows, "k": k, "n": n, "dtype": "bf16",
                                       "accumulate": "f32", "form": form, "weight_bytes": 2 * k * n},
                fn=matmul_call(rows, k, n, form, interpret),
                input_shapes=[jax.ShapeDtypeStruct((SLOTS, rows, k), jnp.bfloat16),
                              jax.ShapeDtypeStruct(_weights(k, n, form), jnp.bfloat16)],
                make_inputs=make, points=points, n_scalars=1, check=_check_matmul(form),
                extra={"what": "whole-call seconds of R matmuls on VMEM-resident W; difference two R"}))
    return probes


# ---------------------------------------------------------------- VPU: dequantisation


def _fp8(v: jax.Array, s: jax.Array) -> jax.Array:
    return dequant_fp8_words(v, words_to_bf16(s))


def _fp8_bytes(v: jax.Array, s: jax.Array) -> jax.Array:
    """The decoder the kernel ran until 2026-12-06 (bytes split out, decoded with selects)."""
    scale = repeat_rows(words_to_bf16(s).astype(jnp.float32), FP8_BLOCK_ROWS, axis=1)
    return (decode_e4m3(split_words(v, axis=1)) * scale).astype(jnp.bfloat16)


def _mxfp4_bytes(v: jax.Array, s: jax.Array) -> jax.Array:
    """The MXFP4 decoder the kernel ran until 2026-12-06."""
    w = v.astype(jnp.uint32)
    nibbles = jnp.concatenate([w & 0xF, (w >> 8) & 0xF, (w >> 4) & 0xF, (w >> 12) & 0xF], axis=1)
    scale = repeat_rows(decode_e8m0(split_words(s, axis=1)), MXFP4_BLOCK_ROWS, axis=1)
    return (decode_e2m1(nibbles) * scale).astype(jnp.bfloat16)


DECODERS: dict[str, dict[str, Callable[[jax.Array, jax.Array], jax.Array]]] = {
    KERNEL_DECODER: {"dequant_fp8_gate_up": dequant_fp8_pairs, "dequant_mxfp4_down": dequant_mxfp4_fold},
    FP8_PAIRS_DECODER: {"dequant_fp8_gate_up": dequant_fp8_pairs, "dequant_mxfp4_down": dequant_mxfp4_words},
    WORDS32_DECODER: {"dequant_fp8_gate_up": _fp8, "dequant_mxfp4_down": dequant_mxfp4_words},
    "bytes": {"dequant_fp8_gate_up": _fp8_bytes, "dequant_mxfp4_down": _mxfp4_bytes},
}
DEQUANT: dict[str, tuple[int, int, int]] = {
    # name: (panels, value word rows, scale word rows) for one K3 TP32 expert slice
    "dequant_fp8_gate_up": (2 * SLICE_WIDTH // LANES, LATENT // 2, LATENT // 256),
    "dequant_mxfp4_down": (LATENT // LANES, SLICE_WIDTH // 4, SLICE_WIDTH // 64),
}
OUT_ROWS = {"dequant_fp8_gate_up": 2, "dequant_mxfp4_down": 4}  # logical rows per value word row


def dequant_call(name: str, panels: int, rv: int, rs: int, per_panel: bool, interpret: Interpret,
                 decoder: str = KERNEL_DECODER) -> Callable[..., Any]:
    """``fn(int32[1] = (R,), values u16[2, P, rv, 128], scales u16[2, P, rs, 128]) -> bf16[P, rows, 128]``."""
    decode = DECODERS[decoder][name]
    out_rows = rv * OUT_ROWS[name]

    def kernel(s_ref: Any, v_ref: Any, sc_ref: Any, o_ref: Any) -> None:
        def body(i: Any, c: Any) -> Any:
            if per_panel:
                def panel(p: Any, c2: Any) -> Any:
                    o_ref[pl.ds(p, 1)] = decode(v_ref[_slot(i), pl.ds(p, 1)], sc_ref[_slot(i), pl.ds(p, 1)])
                    return c2
                lax.fori_loop(0, panels, panel, 0)
            else:
                o_ref[...] = decode(v_ref[_slot(i)], sc_ref[_slot(i)])
            return c
        lax.fori_loop(0, s_ref[0], body, 0)

    vmem = 2 * SLOTS * panels * (rv + rs) * LANES + 2 * panels * out_rows * LANES
    vmem += 3 * 4 * (panels if not per_panel else 1) * out_rows * LANES  # u32/f32 temporaries
    out = jax.ShapeDtypeStruct((panels, out_rows, LANES), jnp.bfloat16)
    return _call(kernel, out, 2, vmem, interpret)


def _dequant_inputs(panels: int, rv: int, rs: int, fp8: bool, seed: int) -> list[jax.Array]:
    kv, ks = jax.random.split(jax.random.key(seed))
    values = jax.random.bits(kv, (SLOTS, panels, rv, LANES), dtype=jnp.uint16)
    if fp8:  # bf16 powers of two 2^-8 .. 2^7, as their bit patterns
        e = jax.random.randint(ks, (SLOTS, panels, rs, LANES), -8, 8)
        scales = lax.bitcast_convert_type(jnp.exp2(e.astype(jnp.float32)).astype(jnp.bfloat16), jnp.uint16)
    else:  # two E8M0 exponent bytes (120 .. 134) per word
        e = jax.random.randint(ks, (2, SLOTS, panels, rs, LANES), 120, 135).astype(jnp.uint32)
        scales = (e[0] | (e[1] << 8)).astype(jnp.uint16)
    return [values, scales]


def _check_dequant(name: str, decoder: str) -> Callable[[Point, list[jax.Array], Any], str | None]:
    decode = jax.jit(DECODERS[decoder][name])
    want_of = _memo(lambda inputs, slot: np.asarray(decode(inputs[0][slot], inputs[1][slot]).astype(jnp.float32)))

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        ok = np.array_equal(np.asarray(out.astype(jnp.float32)), want_of(inputs, _last_slot(point)))
        return None if ok else f"{name}: kernel output differs from the same decoder run by XLA"
    return check


def dequant_probes(interpret: Interpret, quick: bool) -> list[Probe]:
    """The kernel's decoder first, then the one it replaced (``params.decoder``)."""
    repeats = (1, 2) if quick else DEQUANT_REPEATS
    probes = []
    for decoder in DECODERS:
        for name, (panels, rv, rs) in DEQUANT.items():
            if quick:  # 2 panels, the smallest row counts the decoders accept
                panels, rv, rs = 2, (128 if name == "dequant_fp8_gate_up" else 16), 1
            probes += [_dequant_probe(name, decoder, panels, rv, rs, per_panel, repeats, interpret)
                       for per_panel in (False, True)]
    return probes


def _dequant_probe(name: str, decoder: str, panels: int, rv: int, rs: int, per_panel: bool,
                   repeats: tuple[int, ...], interpret: Interpret) -> Probe:
    elements = panels * rv * OUT_ROWS[name] * LANES

    def make() -> list[jax.Array]:
        return _dequant_inputs(panels, rv, rs, name.startswith("dequant_fp8"), seed=panels + rv)
    points = [Point({"repeats_in_kernel": r}, (r,), elements=elements * r) for r in repeats]
    return Probe(
        name=name, params={"panels": panels, "value_word_rows": rv, "scale_word_rows": rs,
                           "form": "per_panel_loop" if per_panel else "whole_slice",
                           "decoder": decoder, "out_bytes": 2 * elements},
        fn=dequant_call(name, panels, rv, rs, per_panel, interpret, decoder),
        input_shapes=[jax.ShapeDtypeStruct((SLOTS, panels, rv, LANES), jnp.uint16),
                      jax.ShapeDtypeStruct((SLOTS, panels, rs, LANES), jnp.uint16)],
        make_inputs=make, points=points, n_scalars=1, check=_check_dequant(name, decoder),
        extra={"what": "whole-call seconds of R dequantisations of one expert slice; difference two R"})


# ---------------------------------------------------------------- VPU: RMSNorm + SiLU gate


def norm_call(rows: int, width: int, interpret: Interpret) -> Callable[..., Any]:
    """``fn(int32[1] = (R,), x f32[2, rows, W], g f32[2, rows, W], w f32[1, W]) -> f32[rows, W]``."""

    def kernel(s_ref: Any, x_ref: Any, g_ref: Any, w_ref: Any, o_ref: Any) -> None:
        def body(i: Any, c: Any) -> Any:
            o_ref[...] = rmsnorm(x_ref[_slot(i)], w_ref[...], EPS) * silu(g_ref[_slot(i)])
            return c
        lax.fori_loop(0, s_ref[0], body, 0)

    vmem = 4 * (5 * rows * width + width)
    return _call(kernel, jax.ShapeDtypeStruct((rows, width), jnp.float32), 3, vmem, interpret)


def norm_probe(interpret: Interpret, quick: bool) -> Probe:
    width = 512 if quick else HIDDEN
    repeats = (1, 2) if quick else NORM_REPEATS

    def make() -> list[jax.Array]:
        kx, kg, kw = jax.random.split(jax.random.key(3), 3)
        return [jax.random.normal(kx, (SLOTS, NORM_ROWS, width), jnp.float32),
                jax.random.normal(kg, (SLOTS, NORM_ROWS, width), jnp.float32),
                1.0 + 0.1 * jax.random.normal(kw, (1, width), jnp.float32)]

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        slot = _last_slot(point)
        x, g, w = (np.asarray(a, np.float64) for a in (inputs[0][slot], inputs[1][slot], inputs[2]))
        want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w * (g / (1.0 + np.exp(-g)))
        ok = np.allclose(np.asarray(out), want, rtol=5e-3, atol=1e-3)
        return None if ok else "rmsnorm*silu differs from numpy"

    shape = jax.ShapeDtypeStruct((SLOTS, NORM_ROWS, width), jnp.float32)
    return Probe(
        name="rmsnorm_silu", params={"rows": NORM_ROWS, "width": width, "dtype": "f32"},
        fn=norm_call(NORM_ROWS, width, interpret),
        input_shapes=[shape, shape, jax.ShapeDtypeStruct((1, width), jnp.float32)],
        make_inputs=make, n_scalars=1, check=check,
        points=[Point({"repeats_in_kernel": r}, (r,), elements=NORM_ROWS * width * r) for r in repeats],
        extra={"what": "whole-call seconds of R RMSNorm*SiLU(gate) over [8, W] f32; difference two R"})
