"""Kimi K3 on 16 TPU v7 chips: what the sweep finds beyond the built-in schedules.

The full-size claim (≥ 1000 candidates, default budget, batch 1 and 8, ≤ 120 s with
``--jobs 2``) is ``benchmarks/bench_sweep.py``; here a small sweep of the same workload checks
the invariants in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hwmodels.catalog import make_system
from tpusim.schedule.schema import load_schedule
from tpusim.sweep import SweepSpace, default_space, run_sweep
from tpusim.sweep.space import FamilySpace
from tpusim.workload.model_catalog import load_model, plan_for


def space_around_published(max_dmas: list[int]) -> SweepSpace:
    """A space whose every knob is fixed at ``published``'s value except the DMA limit, so the
    only candidates beyond the built-ins are ``published`` with another ``max_dmas_in_flight``."""
    published = load_schedule("published")
    families = {
        name: FamilySpace(distances=[f.prefetch_distance_ops], chunk_bytes=[f.chunk_bytes], buffers=[f.buffers])
        for name, f in published.families.items()
    }
    return default_space().model_copy(update={
        "families": {**default_space().families, **families}, "max_dmas_in_flight": max_dmas,
        "expert_issue": [published.expert_issue], "kv_tile_tokens": [published.kv_tile_tokens],
        "kv_buffers": [published.kv_buffers], "samples": 0, "neighbours": True})


@pytest.mark.slow  # a whole K3 sweep (batch 1: ~3.7 s; batch 8 on 2 workers: ~8 s on the loaded machine)
@pytest.mark.parametrize(("batch", "jobs"), [(1, 1), (8, 2)])
def test_k3_sweep_accounts_for_every_candidate(tmp_path: Path, batch: int, jobs: int) -> None:
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    space = default_space().model_copy(update={"samples": 20, "neighbours": False})
    result = run_sweep(model, plan, system, batch, out_dir=tmp_path, budget=5, jobs=jobs, seed=0,
                       quiet=True, space=space, screen_factor=2, plots=False)
    assert result.simulated == 5
    assert result.considered == result.pruned + result.simulated + result.estimated
    published = result.published_row
    assert published is not None and published["status"] == "simulated"
    assert result.best_row["status"] == "simulated"
    assert result.published_rank is not None and result.published_rank <= result.simulated


@pytest.mark.slow
def test_k3_sweep_finds_a_faster_dma_limit_than_published(tmp_path: Path) -> None:
    """The published kernel keeps 4 expert DMAs in flight because 4 beat 8 on TPU7x (the DMA
    engine round-robins among outstanding copies). Offered ``published`` with 4 and 16 DMAs in
    flight, the search must find a schedule beyond the built-ins, simulated faster than
    ``published`` itself (which allows 16)."""
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    assert load_schedule("published").max_dmas_in_flight == 16
    result = run_sweep(model, plan, system, 1, out_dir=tmp_path, budget=4, jobs=1, seed=0, quiet=True,
                       space=space_around_published([4, 16]), screen_factor=2, plots=False)
    assert result.best_row["source"] != "builtin"
    assert "max_dmas" in result.best_row["name"]
    assert result.best_row["predicted_ms"] < 0.97 * result.published_row["predicted_ms"]
