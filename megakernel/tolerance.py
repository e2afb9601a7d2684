"""One rule for "within rounding" between a kernel and a reference: the one tolerance table.

The rule: ``max |got - want| <= tolerance · max |want|`` (:func:`relative_error`), the
tolerance chosen by the dtype of the compared array and by the comparison
(:data:`TOLERANCES`), because how far two correct programs drift apart depends on whether
they sum in the same order and over how many layers:

| comparison      | what is compared | f32 | bf16 | measured |
| ---             | ---              | --- | ---  | --- |
| ``independent`` | a kernel vs the independent reference (:mod:`megakernel.reference_jnp`), models of <= 16 layers | 5e-3 | 2^-7 | 13 layers: logits 1.9e-3 with whole-matrix expert products; since the FP8 products go block by block (``fp8-pairs``, a reordered sum) logits take the ``reordered`` row: 0, 3.0e-3, 5.4e-3, 3.2e-3 at steps 0-3; KDA state 7.1e-4, conv window 9.2e-4, bf16 KV cache 0 |
| ``same_order``  | the megakernel vs :mod:`megakernel.reference` at batch 1 with every contraction whole (the same ops in the same order), 93 layers | 1e-6 | 2^-8 | bit-identical (0.0) for every such schedule |
| ``reordered``   | the megakernel vs :mod:`megakernel.reference` otherwise (XLA:CPU's batched matmuls sum in another order than the kernel's panel matmuls; a contraction split in row slabs is summed slab by slab), 93 layers | 3e-2 | 3e-2 | batch 4: logits 0.047 of max 3.25 (1.4 %), KDA state 0.006 of ~1.5, bf16 KV cache 0.05 of ~4 (1-2 bf16 ulps); ring-pool example at batch 1 (kda.qkvgb in 6 slabs): logits 0.043 of max 3.52 (1.2 %) |

Why depth matters: sums in other orders differ at f32 rounding, and every bf16 cast
downstream can turn a 1-ulp f32 difference into a 1-ulp bf16 one, so the gap grows with
depth on random weights (the independent reference at 93 layers: 3-4 %, the same chaos the
``reordered`` row sees), so tight checks use shallow models. :data:`TOLERANCE` is the
``independent`` row, the default of the decode and collective checks.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32, BF16 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)
INDEPENDENT, SAME_ORDER, REORDERED = "independent", "same_order", "reordered"

# comparison -> dtype -> tolerance (the module table)
TOLERANCES: dict[str, dict[np.dtype, float]] = {
    INDEPENDENT: {F32: 5e-3, BF16: 2**-7},
    SAME_ORDER: {F32: 1e-6, BF16: 2**-8},
    REORDERED: {F32: 3e-2, BF16: 3e-2},
}
TOLERANCE = TOLERANCES[INDEPENDENT]  # max |got - want| <= TOLERANCE[dtype] * max |want|, <= 16 layers


def relative_error(got: object, want: object) -> float:
    """max |got - want| / max |want| (f64)."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got64.shape != want64.shape:
        raise ValueError(f"shape {got64.shape} != {want64.shape}")
    return float(np.abs(got64 - want64).max()) / max(float(np.abs(want64).max()), 1e-6)


def within_rounding(got: object, want: object, *, rounded_to: object = None) -> bool:
    """``got`` is within the tolerance of ``want``'s dtype, or of ``rounded_to`` when the
    values passed through that narrower dtype on the way (the multi-device decode: every
    sublayer's output crosses devices as bf16, the plan's payload bytes, where one device
    adds it to the residual in f32)."""
    dtype = np.dtype(np.asarray(want).dtype if rounded_to is None else rounded_to)
    return relative_error(got, want) <= TOLERANCE[dtype]
