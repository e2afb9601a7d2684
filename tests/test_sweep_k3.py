"""Kimi K3 on 16 TPU v7 chips: the sweep's choice is never predicted slower than ``published``.

The full-size claim (≥ 1000 candidates, default budget, batch 1 and 8, ≤ 120 s with
``--jobs 2``) is ``benchmarks/bench_sweep.py``; here a small sweep of the same workload checks
the invariants in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hwmodels.catalog import make_system
from tpusim.sweep import default_space, run_sweep
from tpusim.workload.model_catalog import load_model, plan_for


@pytest.mark.parametrize(("batch", "jobs"), [(1, 1), (8, 2)])
def test_k3_sweep_beats_or_matches_published(tmp_path: Path, batch: int, jobs: int) -> None:
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    space = default_space().model_copy(update={"samples": 20, "neighbours": False})
    result = run_sweep(model, plan, system, batch, out_dir=tmp_path, budget=5, jobs=jobs, seed=0,
                       quiet=True, space=space, screen_factor=2, plots=False)
    assert result.engine and result.simulated == 5
    assert result.considered == result.pruned + result.simulated + result.estimated
    published = result.published_row
    assert published is not None and published["status"] == "simulated"
    assert result.best_row["status"] == "simulated"
    assert result.best_row["predicted_ms"] <= published["predicted_ms"]
    assert result.published_rank is not None and result.published_rank <= result.simulated
