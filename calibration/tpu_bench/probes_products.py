"""Expert-part probes: one K3 TP32 expert slice's decode *and* products, as the kernel runs them.

The dequantisation probes (:mod:`calibration.tpu_bench.probes_compute`) time a decoder alone;
what the kernel pays per routed expert is the decoder and the MXU products together, panel by
panel. ``expert_product`` runs the kernel's own panel loop over one expert part — a
``fori_loop`` over its 128-column panels, each decoded in VMEM and multiplied by the batch's
activations, f32 out — for each decoder (``params.decoder``):

- ``words32`` (:func:`megakernel.quant.dequant_fp8_words` / ``dequant_mxfp4_words``): the
  whole panel decoded to bf16 (scales applied per weight), then one ``jnp.dot``;
- ``pairs`` (:func:`megakernel.quant_pairs.fp8_pairs_product` / ``mxfp4_pairs_product``): two bf16
  values per u32 operation, one product per scale block, scales and folds applied to the
  products (the MXFP4 form reads e2m1's 0.5 as a bf16 subnormal: 0 on the v5e MXU);
- ``fold`` (down only, :func:`megakernel.quant.dequant_mxfp4_fold`): the kernel's MXFP4 form,
  the scale added into the exponent field, no select, then one product.
- ``fp8-mxu`` (:mod:`megakernel.quant_mxu`, for a chip whose MXU takes FP8: TPU7x): no decode,
  FP8 (or MXFP4 widened to FP8) straight to the MXU, scales on the block products; not in
  :data:`PRODUCT_DECODERS` (the v5e runs, whose MXU takes no FP8), compiled for ``tpu7x`` by
  :mod:`calibration.tpu_bench.static_counts`.

``part``: ``gate_up`` (FP8, values ``u16[12, 1792, 128]``, bf16 scales ``u16[12, 14, 128]``)
or ``down`` (MXFP4, ``u16[28, 192, 128]``, E8M0 ``u16[28, 12, 128]``); ``rows`` = batch rows
of the activations (1 and 8). The same ``R``-difference as every compute probe: repetition
``i`` reads slot ``i mod 2`` of the activations; ``(t(R2) - t(R1)) / (R2 - R1)`` is one
expert part. ``elements`` = weights. The check compares the output with a float64 numpy
product of the ml_dtypes-decoded weights (relative to the output's largest value).

``mxu_subnormal``: does the v5e MXU keep bf16 *subnormal* weights? (The ``pairs`` decoders
place e4m3's subnormal codes and e2m1's 0.5 on bf16 subnormals.) ``x`` bf16[8, 128] of
2^64-scaled values times ``w`` bf16[128, 128] whose every weight is a subnormal, f32 out; the
check is ``ok`` when the product is the exact one and :data:`FLUSHED` when it is 0 (measured
on tpu-v5e, 2026-12-06: flushed; XLA on a CPU flushes too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from calibration.tpu_bench.common import Point, Probe
from calibration.tpu_bench.probes_compute import LATENT, SLICE_WIDTH, SLOTS, _call, _slot
from megakernel import quant, quant_mxu, quant_pairs
from tpusim.schedule.kernel_layout import LANES

Interpret = Any
PRODUCT_REPEATS = (1, 64, 256)  # at 16 a part (~4-15 µs) sat inside the call's ±70 µs jitter (set v5e-aa)
PRODUCT_ROWS = (1, 8)
PARTS: dict[str, tuple[int, int]] = {"gate_up": (LATENT, 2 * SLICE_WIDTH), "down": (SLICE_WIDTH, LATENT)}
FOLD = "fold"  # MXFP4 by :func:`megakernel.quant.dequant_mxfp4_fold`, then one product (down only)
PRODUCT_DECODERS = (quant.WORDS32_DECODER, quant_pairs.PAIRS_DECODER, FOLD)
MXU_DECODERS = (quant_mxu.MXU_FP8_PRODUCTS,)  # chips whose MXU takes FP8 only
FLUSHED = "flushed: every bf16 subnormal weight read as 0"  # mxu_subnormal's check when the unit flushes
PRODUCT_TOLERANCE = 2e-5  # f32 accumulation over K <= 3584 exact-in-bf16 products


def _geometry(part: str) -> tuple[int, int, int, int]:
    """(panels, K, value word rows, scale word rows) per panel."""
    k, n = PARTS[part]
    if part == "gate_up":
        return n // LANES, k, k // 2, k // quant.FP8_BLOCK_ROWS
    return n // LANES, k, k // 4, k // (2 * quant.MXFP4_BLOCK_ROWS)


def panel_product(part: str, decoder: str) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
    """``(x bf16[B, K], value words u16[r, 128], scale words u16[s, 128]) -> f32[B, 128]``:
    one panel as the kernel computes it with ``decoder``."""
    fp8 = part == "gate_up"
    if decoder == quant_mxu.MXU_FP8_PRODUCTS:
        return quant_mxu.fp8_mxu_product if fp8 else quant_mxu.mxfp4_mxu_product
    if decoder == FOLD:
        if fp8:
            raise ValueError("the fold decoder is MXFP4's (down)")

        def fold(x: jax.Array, v: jax.Array, s: jax.Array) -> jax.Array:
            return quant_pairs.mxfp4_panel_product(x, v, s)
        return fold
    if decoder == quant.WORDS32_DECODER:
        def words32(x: jax.Array, v: jax.Array, s: jax.Array) -> jax.Array:
            w = (quant.dequant_fp8_words(v[None], quant.words_to_bf16(s)[None]) if fp8
                 else quant.dequant_mxfp4_words(v[None], s[None]))[0]
            return jnp.dot(x, w, preferred_element_type=jnp.float32)
        return words32

    def pairs(x: jax.Array, v: jax.Array, s: jax.Array) -> jax.Array:
        if fp8:
            return quant_pairs.fp8_pairs_product(x, v, quant.words_to_bf16(s).astype(jnp.float32))
        return quant_pairs.mxfp4_pairs_product(x, v, quant.decode_e8m0(quant.split_words(s, axis=0)))
    return pairs


def product_call(part: str, decoder: str, rows: int, interpret: Interpret) -> Callable[..., Any]:
    """``fn(int32[1] = (R,), x bf16[2, rows, K], values u16[P, r, 128], scales u16[P, s, 128])
    -> f32[P, rows, 128]``."""
    panels, k, rv, rs = _geometry(part)
    product = panel_product(part, decoder)

    def kernel(s_ref: Any, x_ref: Any, v_ref: Any, sc_ref: Any, o_ref: Any) -> None:
        def body(i: Any, c: Any) -> Any:
            x = x_ref[_slot(i)]
            if decoder == quant_pairs.PAIRS_DECODER:
                x = quant_pairs.prescale_activations(x)

            def panel(p: Any, c2: Any) -> Any:
                o_ref[p] = product(x, v_ref[p], sc_ref[p])
                return c2
            lax.fori_loop(0, panels, panel, 0)
            return c
        lax.fori_loop(0, s_ref[0], body, 0)

    vmem = 2 * (SLOTS * rows * k + panels * (rv + rs) * LANES) + 4 * panels * rows * LANES
    vmem += 8 * k * LANES * 4  # one panel's decoded temporaries
    out = jax.ShapeDtypeStruct((panels, rows, LANES), jnp.float32)
    return _call(kernel, out, 3, vmem, interpret)


def product_inputs(part: str, rows: int, seed: int) -> tuple[list[jax.Array], np.ndarray, np.ndarray]:
    """(device inputs, x f64[2, rows, K], weights f64[K, N]) for one expert part: weights
    quantised by the checkpoint's own rules (:func:`megakernel.quant.quantize_fp8_b256`,
    ``quantize_mxfp4``) from a heavy-tailed draw, so subnormal codes and zeros occur."""
    panels, k, _, _ = _geometry(part)
    n = panels * LANES
    rng = np.random.default_rng(seed)
    w = rng.standard_t(4, (k, n)).astype(np.float32) * 0.02
    x = rng.standard_normal((SLOTS, rows, k)).astype(np.float32).astype(ml_dtypes.bfloat16)
    by_panel = lambda a: np.ascontiguousarray(a.reshape(a.shape[0], panels, LANES).transpose(1, 0, 2))  # noqa: E731
    if part == "gate_up":
        codes, scales = quant.quantize_fp8_b256(w)
        dense = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        dense *= np.repeat(scales.astype(np.float64), quant.FP8_BLOCK_ROWS, axis=0)
        words = {quant.WORDS32_DECODER: quant.pack_fp8_words(by_panel(codes)),
                 quant_pairs.PAIRS_DECODER: quant_pairs.pack_fp8_pairs(by_panel(codes)),
                 quant_mxu.MXU_FP8_PRODUCTS: quant_mxu.pack_fp8_rows(by_panel(codes))}
        scale_words = quant.bf16_to_words(by_panel(scales.astype(np.float32)))
    else:
        packed, exps = quant.quantize_mxfp4(w)
        nibbles = np.concatenate([packed & 0xF, packed >> 4], axis=0)
        dense = (nibbles.view(np.uint8) & 0xF).astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
        dense *= np.repeat(np.exp2(exps.astype(np.float64) - quant.E8M0_BIAS), quant.MXFP4_BLOCK_ROWS, axis=0)
        words = {quant.WORDS32_DECODER: quant.pack_mxfp4_words(by_panel(packed)),
                 FOLD: quant.pack_mxfp4_words(by_panel(packed)),
                 quant_pairs.PAIRS_DECODER: quant_pairs.pack_mxfp4_pairs(by_panel(packed)),
                 quant_mxu.MXU_FP8_PRODUCTS: quant_mxu.pack_mxfp4_rows(by_panel(packed))}
        scale_words = quant.pack_bytes_to_words(by_panel(exps))
    arrays = {name: jnp.asarray(v) for name, v in words.items()}
    return [jnp.asarray(x), arrays, jnp.asarray(scale_words)], x.astype(np.float64), dense  # type: ignore[list-item]


def product_probes(interpret: Interpret, quick: bool) -> list[Probe]:
    """Both parts, both decoders, rows 1 and 8 (``quick``: gate/up at rows 1, tiny repeats)."""
    probes = []
    parts = ("gate_up",) if quick else tuple(PARTS)
    for part in parts:
        for rows in ((1,) if quick else PRODUCT_ROWS):
            for decoder in PRODUCT_DECODERS:
                if decoder == FOLD and part != "down":
                    continue
                probes.append(_product_probe(part, decoder, rows, (1, 2) if quick else PRODUCT_REPEATS, interpret))
    return probes


def _product_probe(part: str, decoder: str, rows: int, repeats: tuple[int, ...], interpret: Interpret) -> Probe:
    panels, k, rv, rs = _geometry(part)
    weights = k * panels * LANES
    cache: dict[str, Any] = {}

    def make() -> list[jax.Array]:
        inputs, x, dense = product_inputs(part, rows, seed=k + rows)
        cache["x"], cache["dense"] = x, dense
        return [inputs[0], inputs[1][decoder], inputs[2]]  # type: ignore[index]

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        x = cache["x"][(point.scalars[0] - 1) % SLOTS]
        want = (x @ cache["dense"]).reshape(rows, panels, LANES).transpose(1, 0, 2)
        err = float(np.abs(np.asarray(out, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))
        return None if err < PRODUCT_TOLERANCE else f"expert_product {part}/{decoder}: relative error {err:.3g}"

    points = [Point({"repeats_in_kernel": r}, (r,), elements=weights * r) for r in repeats]
    return Probe(
        name="expert_product",
        params={"part": part, "decoder": decoder, "rows": rows, "panels": panels, "k": k,
                "value_word_rows": rv, "scale_word_rows": rs, "weights": weights},
        fn=product_call(part, decoder, rows, interpret),
        input_shapes=[jax.ShapeDtypeStruct((SLOTS, rows, k), jnp.bfloat16),
                      jax.ShapeDtypeStruct((panels, rv, LANES), jnp.uint16),
                      jax.ShapeDtypeStruct((panels, rs, LANES), jnp.uint16)],
        make_inputs=make, points=points, n_scalars=1, check=check,
        extra={"what": "whole-call seconds of R expert parts (decode + products); difference two R"})


# ---------------------------------------------------------------- MXU: subnormal weights


def subnormal_call(interpret: Interpret) -> Callable[..., Any]:
    def kernel(s_ref: Any, x_ref: Any, w_ref: Any, o_ref: Any) -> None:
        def body(i: Any, c: Any) -> Any:
            o_ref[...] = jnp.dot(x_ref[_slot(i)], w_ref[...], preferred_element_type=jnp.float32)
            return c
        lax.fori_loop(0, s_ref[0], body, 0)
    return _call(kernel, jax.ShapeDtypeStruct((8, LANES), jnp.float32), 2, 1 << 20, interpret)


def subnormal_inputs() -> tuple[list[jax.Array], np.ndarray]:
    rng = np.random.default_rng(7)
    x = (rng.integers(1, 8, (SLOTS, 8, LANES)) * 2.0**64).astype(ml_dtypes.bfloat16)
    bits = rng.integers(1, 0x80, (LANES, LANES)).astype(np.uint16) | (rng.integers(0, 2, (LANES, LANES)) << 15).astype(np.uint16)
    w = bits.view(ml_dtypes.bfloat16)  # exponent field 0: every weight subnormal
    want = x.astype(np.float64) @ w.astype(np.float64)
    return [jnp.asarray(x), jnp.asarray(w)], want


def subnormal_probe(interpret: Interpret) -> Probe:
    cache: dict[str, np.ndarray] = {}

    def make() -> list[jax.Array]:
        inputs, cache["want"] = subnormal_inputs()
        return inputs

    def check(point: Point, inputs: list[jax.Array], out: Any) -> str | None:
        want = cache["want"][(point.scalars[0] - 1) % SLOTS]
        got = np.asarray(out, np.float64)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        if err < 1e-6:
            return None  # kept: the product is the exact one
        if not np.abs(got).max():
            return FLUSHED  # a finding, not a fault: every subnormal weight read as 0
        return f"mxu_subnormal: relative error {err:.3g}, neither kept nor flushed"

    return Probe(name="mxu_subnormal", params={"rows": 8, "k": LANES, "n": LANES, "weights": "bf16 subnormal"},
                 fn=subnormal_call(interpret),
                 input_shapes=[jax.ShapeDtypeStruct((SLOTS, 8, LANES), jnp.bfloat16),
                               jax.ShapeDtypeStruct((LANES, LANES), jnp.bfloat16)],
                 make_inputs=make, points=[Point({"repeats_in_kernel": 1}, (1,))], n_scalars=1, check=check,
                 extra={"what": "does the MXU keep bf16 subnormal weights"})

