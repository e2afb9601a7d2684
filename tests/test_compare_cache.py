"""The comparison's simulation cache: a repeated simulation is answered as a fresh one would be."""

from __future__ import annotations

import pytest

from hwmodels.catalog import make_system
from tpusim.compare import resimulate
from tpusim.compare.resimulate import SimulationCache
from tpusim.compare.rows import compare_rows, parse_systems
from tpusim.engine import simulate
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.routing import RoutingModel

COMMON = {"context_tokens": 256, "routing": RoutingModel("uniform"), "seed": 0}


def test_a_repeated_step_runs_the_engine_once_and_matches_a_fresh_simulation() -> None:
    system = make_system("tpu-v7", 16, calibrated=False)
    model = load_model("kimi-k3-mini")
    plan = plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip)
    schedule = load_schedule("published")
    cache = SimulationCache()
    first, breakdown = cache.step(model, plan, system.chip, schedule, rows=2, **COMMON)
    again, _ = cache.step(model, plan, system.chip, schedule, rows=2, **COMMON)
    assert (cache.simulated, cache.reused) == (1, 1)
    fresh = simulate(build_program(model, plan, batch=2, **COMMON), schedule, system.chip)
    assert first == again == fresh.step_s
    assert breakdown["exposed_dma_ms"] == fresh.exposed_dma_s * 1e3
    # another chip object (an interval sample) or another row count is another simulation
    slower = system.chip.model_copy(deep=True)
    cache.step(model, plan, slower, schedule, rows=2, **COMMON)
    cache.step(model, plan, system.chip, schedule, rows=4, **COMMON)
    assert cache.simulated == 3


@pytest.mark.slow
def test_acceptance_lengths_share_the_verify_and_drafter_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []
    real = resimulate._simulate

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(resimulate, "_simulate", counted)
    systems = parse_systems("tpu-v7:16")
    one = compare_rows("kimi-k3", systems, [1], acceptance_lengths=[3.0], schedule="published",
                       calibrated=False, context_tokens=256)
    with_one = len(runs)
    runs.clear()
    two = compare_rows("kimi-k3", systems, [1], acceptance_lengths=[3.0, 6.0], schedule="published",
                       calibrated=False, context_tokens=256)
    assert with_one == 3  # the plain step, the verify step, the drafter forward
    assert len(runs) == with_one
    assert two[1]["verify_ms"] == two[2]["verify_ms"] == one[1]["verify_ms"]
    assert two[2]["tokens_per_s"] > two[1]["tokens_per_s"]  # more accepted tokens per step
