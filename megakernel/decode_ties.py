"""Routing near ties: when the multi-device decode picks other experts than the reference.

The decode sends every sublayer's partial as bf16 (the plan's payload bytes) where the
one-device reference adds it in f32, so its router keys (sigmoid score + correction bias,
what top-k ranks) differ from the reference's by that rounding, carried through the
residual stream and the router projection. Where two experts' keys lie closer than that
difference, the two runs pick different experts, and the logits then differ by far more
than the bf16 tolerance although nothing is wrong. This module says, per layer and row
where the chosen sets differ, whether that is such a near tie.

Rule (a diagnostic; it does not change ``matches_reference``). For a row where the kernel
chose set ``S'`` and the reference ``S``, with the kernel's keys ``k'`` and the reference's
``k`` (f32[E]):

1. ``deviation d = max_e |k'_e - k_e|``: how far the kernel's keys are from the reference's;
2. ``margin m = max(k_a - k_b)`` over ``a`` in ``S - S'``, ``b`` in ``S' - S``: the widest
   reference gap the swap crossed (a swap needs ``m <= 2d`` when both rank by their keys,
   so this part checks that the kernel picked by its own keys);
3. **near tie** iff ``m <= 2d`` and ``d <= TOLERANCE[payload dtype] · max|k|``: the keys
   agree within the same per-dtype tolerance the logits are held to
   (:mod:`megakernel.tolerance`: 2^-7 of the largest value for bf16 payloads), so the swap
   is explained by payload rounding alone. Keys further off mean the router's input really
   differs (a bug, or a divergence upstream): not a near tie.

Measured (8 devices, 4 layers, seed 2, bf16 payloads, step 4, layer 2): ``m`` = 2.1e-3,
``d`` = 3.0e-3 against a tolerance of 6.4e-3 (2^-7 of 0.82): a near tie; on the steps
before it the keys were 2.0e-3 to 4.6e-3 off somewhere (docs/multi-device.md).
"""

from __future__ import annotations

import numpy as np

from megakernel.tolerance import TOLERANCE

NEAR_TIE_RULE = ("megakernel.decode_ties (diagnostic): tokens equal every step, logits within tolerance until "
                 "the first step whose expert sets differ, every such difference a near tie (keys within the "
                 "payload dtype's tolerance of the reference's, the swapped experts' reference keys within "
                 "twice the keys' difference)")


def routing_flips(kernel_ids: np.ndarray, kernel_keys: np.ndarray, ref_ids: np.ndarray, ref_keys: np.ndarray,
                  payload_dtype: object) -> list[dict[str, object]]:
    """Rows whose chosen expert sets differ, with the rule's figures.

    ``kernel_ids``/``ref_ids`` i32[MoE layers, B, k] (chosen experts), ``kernel_keys``/
    ``ref_keys`` f32[MoE layers, B, E]; ``payload_dtype``: what the partials crossed devices
    as (picks the tolerance). Layers are reported as model layers (MoE layer ``i`` is model
    layer ``i + 1``: layer 0 is dense)."""
    tolerance = TOLERANCE[np.dtype(payload_dtype)]
    out: list[dict[str, object]] = []
    for i in range(kernel_ids.shape[0]):
        for row in range(kernel_ids.shape[1]):
            mine, theirs = set(kernel_ids[i, row].tolist()), set(ref_ids[i, row].tolist())
            if mine == theirs:
                continue
            k_ref = np.asarray(ref_keys[i, row], np.float64)
            deviation = float(np.abs(np.asarray(kernel_keys[i, row], np.float64) - k_ref).max())
            if not all(0 <= e < k_ref.size for e in mine):  # no such expert (NaN keys pick none): no tie
                margin = float("inf")
            else:
                margin = float(max(k_ref[a] - k_ref[b] for a in theirs - mine for b in mine - theirs))
            allowed = tolerance * float(np.abs(k_ref).max())
            out.append({"layer": i + 1, "row": row, "reference_margin": margin, "key_deviation": deviation,
                        "key_tolerance": allowed, "near_tie": bool(deviation <= allowed and margin <= 2 * deviation)})
    return out


def matches_up_to_near_ties(steps: list[dict[str, object]]) -> bool:
    """The labelled rule over a run's steps (``decode_check``'s step records: ``tokens_equal``,
    ``within_tolerance``, ``routing_flips``): equal tokens every step, logits within tolerance
    until the first step with a flip (after it the two runs hold other states), every flip a
    near tie."""
    flipped = [i for i, step in enumerate(steps) if step["routing_flips"]]
    before = steps[: flipped[0]] if flipped else steps
    return (all(step["tokens_equal"] for step in steps) and all(step["within_tolerance"] for step in before)
            and all(flip["near_tie"] for step in steps for flip in step["routing_flips"]))  # type: ignore[attr-defined]
