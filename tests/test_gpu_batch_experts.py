"""The per-distinct-expert check on the public sweeps (calibration.sources.gpu_batch_experts): one
refit per model family through the core, the expert slices from the engine's program, and the
documented finding (no family asks for a non-byte cost per expert as large as its copy)."""

from __future__ import annotations

import pytest

from calibration.sources import gpu_batch_data as data
from calibration.sources import gpu_batch_experts as experts


def test_one_refit_per_family_and_one_over_all_points():
    fits = {f.family: f for f in experts.family_fits()}
    assert list(fits) == [*experts.FAMILIES, "all"]
    assert sum(fits[name].points for name in experts.FAMILIES) == fits["all"].points == 27
    lower, upper = experts.EXPERT_FIGURE.bound("gpu").lower, experts.EXPERT_FIGURE.bound("gpu").upper
    assert all(lower <= f.value_s <= upper for f in fits.values())


def test_an_expert_slice_is_the_expert_over_its_tensor_parallel_ways():
    by_key = {s.key: s for s in data.SWEEPS}
    whole, _ = experts.expert_slice(by_key["k25-b200-tp4ep4"])  # EP4: whole experts
    sliced, copy_s = experts.expert_slice(by_key["k25-b200-tp4"])  # expert TP4: a quarter of each
    assert sliced == pytest.approx(whole / 4, rel=0.01)
    assert copy_s == pytest.approx(sliced / 8e12, rel=0.05)  # B200 HBM3e, 8 TB/s published


def test_no_family_asks_for_a_per_expert_cost_as_large_as_the_copy():
    for fit in experts.family_fits():
        assert fit.per_expert_s < fit.expert_copy_s, fit.family
