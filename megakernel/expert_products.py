"""How the routed experts' quantised panels are multiplied on the target chip (one owner).

K3's routed experts are FP8 (gate/up) and MXFP4 (down) (:mod:`megakernel.quant`). Two ways:

| products | chip (catalog: the MXU's ``native_weight_dtypes``) | gate/up | down | activations |
| --- | --- | --- | --- | --- |
| ``pairs-fold`` (:data:`DECODE`) | no FP8 (tpu-v5e, tpu-v6e) | decoded to bf16 on the VPU by pairs (:mod:`megakernel.quant_pairs`) | decoded to bf16 by fold | bf16 x 2^64 (gate/up) |
| ``fp8-mxu`` (:data:`MXU_FP8`) | takes FP8 (tpu-v7) | FP8 straight to the MXU | e2m1 -> e4m3 (exact), then the MXU | bf16 |

Both apply the FP8 block scales after each 256-row chunk's product; ``fp8-mxu`` applies the
E8M0 scales after each 32-row block's (:mod:`megakernel.quant_mxu`). Each packs its own HBM
word order (the bytes and shapes are the same), so a kernel and its packed weights must use
the same products: the kernel holds one, :func:`megakernel.hbm.pack_hbm` takes it.
The choice is made from the hardware catalog (:func:`expert_products_for`), never from a
chip's name in the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from hwmodels.catalog import load_chip
from megakernel import quant_mxu, quant_pairs
from megakernel.quant import pack_mxfp4_words

Product = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]  # x [B, R], words, scale words -> f32[B, 128]


@dataclass(frozen=True)
class ExpertProducts:
    """One way to multiply a routed expert's parts, panel by panel."""

    name: str  # recorded as the kernel's decoder
    gate_up: Product  # FP8 panel: activations from ``gate_up_input``
    down: Product  # MXFP4 panel: bf16 activations
    gate_up_input: Callable[[jax.Array], jax.Array]  # the latent f32[B, L] -> what ``gate_up`` takes
    pack_gate_up: Callable[[np.ndarray], np.ndarray]  # uint8[..., R, C] e4m3 -> u16[..., R/2, C]
    pack_down: Callable[[np.ndarray], np.ndarray]  # uint8[..., R/2, C] MXFP4 -> u16[..., R/4, C]


DECODE = ExpertProducts(quant_pairs.KERNEL_DECODER, quant_pairs.fp8_panel_product, quant_pairs.mxfp4_panel_product,
                        quant_pairs.prescale_activations, quant_pairs.pack_fp8_pairs, pack_mxfp4_words)
MXU_FP8 = ExpertProducts(quant_mxu.MXU_FP8_PRODUCTS, quant_mxu.fp8_mxu_product, quant_mxu.mxfp4_mxu_product,
                         quant_mxu.bf16_activations, quant_mxu.pack_fp8_rows, quant_mxu.pack_mxfp4_rows)
BY_NAME = {p.name: p for p in (DECODE, MXU_FP8)}


def expert_products_for(chip_name: str) -> ExpertProducts:
    """:data:`MXU_FP8` where the catalog says ``chip_name``'s matrix unit takes FP8 weights as
    stored (tpu-v7), else :data:`DECODE` (tpu-v5e, tpu-v6e)."""
    return MXU_FP8 if load_chip(chip_name).matrix_unit.takes_weights("fp8") else DECODE
