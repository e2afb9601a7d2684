"""The near-tie rule of megakernel.decode_ties on hand-made router keys (4 experts, top 2;
bf16 payloads: keys may differ by 2^-7 of the largest, 0.9 here, = 7.03e-3)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from megakernel.decode_ties import matches_up_to_near_ties, routing_flips

REF_KEYS = np.array([[[0.90, 0.500, 0.499, 0.10]]], np.float32)  # [1 MoE layer, 1 row, 4 experts]
REF_IDS = np.array([[[0, 1]]], np.int32)
BF16 = ml_dtypes.bfloat16


def test_same_sets_in_another_order_are_no_flip():
    assert routing_flips(np.array([[[1, 0]]]), REF_KEYS, REF_IDS, REF_KEYS, BF16) == []


def test_a_swap_across_a_gap_below_the_key_deviation_is_a_near_tie():
    kernel_keys = REF_KEYS + np.array([[[0.0, -0.001, 0.001, 0.0]]], np.float32)
    (flip,) = routing_flips(np.array([[[0, 2]]]), kernel_keys, REF_IDS, REF_KEYS, BF16)
    assert flip["layer"] == 1 and flip["row"] == 0  # MoE layer 0 is model layer 1 (layer 0 is dense)
    assert flip["reference_margin"] == pytest.approx(0.001, abs=1e-6)
    assert flip["key_deviation"] == pytest.approx(0.001, abs=1e-6)
    assert flip["key_tolerance"] == pytest.approx(0.9 / 128, rel=1e-6)
    assert flip["near_tie"]


def test_keys_off_by_more_than_the_payload_tolerance_are_not():
    kernel_keys = REF_KEYS + np.array([[[0.0, 0.0, 0.008, 0.0]]], np.float32)  # 8e-3 > 7.03e-3
    (flip,) = routing_flips(np.array([[[0, 2]]]), kernel_keys, REF_IDS, REF_KEYS, BF16)
    assert not flip["near_tie"]


def test_f32_payloads_hold_the_keys_to_the_f32_tolerance():
    kernel_keys = REF_KEYS + np.array([[[0.0, 0.0, 0.006, 0.0]]], np.float32)  # within 2^-7, not 5e-3 x 0.9
    assert routing_flips(np.array([[[0, 2]]]), kernel_keys, REF_IDS, REF_KEYS, BF16)[0]["near_tie"]
    assert not routing_flips(np.array([[[0, 2]]]), kernel_keys, REF_IDS, REF_KEYS, np.float32)[0]["near_tie"]


def test_a_swap_the_key_deviation_cannot_explain_is_not():
    """Keys within tolerance, but the kernel picked expert 3, 0.4 below expert 1."""
    kernel_keys = REF_KEYS + np.float32(0.001)
    (flip,) = routing_flips(np.array([[[0, 3]]]), kernel_keys, REF_IDS, REF_KEYS, BF16)
    assert flip["reference_margin"] == pytest.approx(0.4, abs=1e-6) and not flip["near_tie"]


def _step(tokens_equal: bool = True, within: bool = True, flips: tuple[bool, ...] = ()) -> dict[str, object]:
    return {"tokens_equal": tokens_equal, "within_tolerance": within,
            "routing_flips": [{"near_tie": near} for near in flips]}


@pytest.mark.parametrize(("steps", "want"), [
    ([_step(), _step()], True),
    ([_step(), _step(within=False, flips=(True,)), _step(within=False)], True),  # logits free after a near tie
    ([_step(within=False), _step(flips=(True,))], False),  # off before any flip
    ([_step(), _step(within=False, flips=(True, False))], False),  # one flip not a near tie
    ([_step(), _step(tokens_equal=False, flips=(True,))], False),  # tokens always count
])
def test_matches_up_to_near_ties(steps, want):
    assert matches_up_to_near_ties(steps) is want


def test_nan_keys_and_an_expert_id_out_of_range_are_no_near_tie():
    """A missing wait can leave NaN keys: top-k then returns the sentinel id E."""
    kernel_keys = np.full_like(REF_KEYS, np.nan)
    (flip,) = routing_flips(np.array([[[0, 4]]]), kernel_keys, REF_IDS, REF_KEYS, BF16)
    assert not flip["near_tie"]
