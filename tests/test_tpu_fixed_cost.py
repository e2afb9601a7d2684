"""The kernel's fixed-cost probe (:mod:`calibration.sources.tpu_fixed_cost`).

- The rule recovers planted figures: the committed capped runs re-timed as the engine would
  time them with the dequant rates x 0.8 and 50 µs a layer; the rule, started from the
  micro-probe chip, must find 0.8 and 50 µs again.
- The committed runs give what the module says, per decoder (the kernel as it is now,
  ``words32``: 22-24 µs an expert, 55-80 µs a layer; the earlier ``bytes``: 42-44 µs, 45-75 µs)
  and the decodes are not among them (caps below top_k only).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.sources.tpu_fixed_cost import (
    CAPS,
    FIXED_COST_PATH,
    _ms,
    _with,
    capped_runs,
    committed_fixed_cost,
    fixed_cost,
)
from calibration.sources.tpu_probes import CALIBRATION_DECODER, probe_chip, record_decoder
from hwmodels.catalog import load_chip

# every test fits or re-times the capped runs with the engine (~10-25 s each)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def probes():  # type: ignore[no-untyped-def]
    return probe_chip(load_chip("tpu-v5e", calibrated=False))


def _planted(tmp_path: Path, chip, factor: float, per_layer_s: float, **extra) -> Path:  # type: ignore[no-untyped-def]
    """The committed capped runs with their times replaced by the simulator's on ``chip`` at
    ``factor`` and ``per_layer_s`` (fields ``extra`` added to each), in a file of their own."""
    runs = capped_runs()
    by_key = {run.key: ms for run, ms in zip(runs, _ms(runs, _with(chip, factor, per_layer_s)), strict=True)}
    rows = []
    for line in FIXED_COST_PATH.read_text().splitlines():
        row = json.loads(line)
        row["routing"] = f"trace:{(FIXED_COST_PATH.parent / row['routing'].removeprefix('trace:')).resolve()}"
        key = f"{row['schedule']}@b{row['batch']}/cap{row['expert_cap']}"
        if key in by_key and record_decoder(row) == CALIBRATION_DECODER:  # the runs capped_runs() read
            rows.append({**row, "ms_per_step_median": by_key[key], **extra})
    path = tmp_path / "fixed-cost.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_rule_recovers_planted_figures(tmp_path: Path, probes) -> None:  # type: ignore[no-untyped-def]
    found = fixed_cost(probes, _planted(tmp_path, probes, 0.8, 50e-6))
    assert found is not None
    assert found.dequant_factor == pytest.approx(0.8, rel=0.01)
    assert found.per_layer_s == pytest.approx(50e-6, rel=0.05)


@pytest.mark.parametrize("decoder, us_per_expert, per_layer_s", [
    ("words32", (22.0, 24.0), (45e-6, 60e-6)),  # set v5e-p; 52 µs since the probe pairs are per session (67 before)
    # the earlier kernel (set v5e-k), kept reachable; its per-layer figure moves with the latest probe
    # session's rates (44.9 µs after set v5e-ah's probes, 2026-12-06)
    ("bytes", (42.0, 44.0), (35e-6, 75e-6)),  # 37.6 µs since the per-layer cost is paid through the layer (each_op)
])
def test_the_committed_runs(decoder: str, us_per_expert: tuple[float, float],
                            per_layer_s: tuple[float, float]) -> None:
    runs = capped_runs(decoder=decoder)
    assert runs and {run.expert_cap for run in runs} <= set(CAPS) and max(CAPS) < 16  # K3's top_k: no decode read
    # fixed_cost on the catalog chip with the decoder's micro-probes and the committed runs, remembered
    # per process: the reports (and the tpu-v5e decoder and record tests) read the same result
    found = committed_fixed_cost(decoder)
    assert found is not None
    assert us_per_expert[0] <= found.slope_ms_per_expert * 1e3 <= us_per_expert[1]
    assert per_layer_s[0] <= found.per_layer_s <= per_layer_s[1]


def test_a_decoders_own_runs_give_its_figures_and_no_others(tmp_path: Path) -> None:
    """The committed capped runs relabelled as another decoder's (``bytes``), their times
    planted on that decoder's micro-probe chip: its figures come back, and the default
    decoder finds no runs there."""
    other = "bytes" if CALIBRATION_DECODER != "bytes" else "words32"
    chip = probe_chip(load_chip("tpu-v5e", calibrated=False), decoder=other)
    path = _planted(tmp_path, chip, 1.1, 40e-6, decoder=other)
    assert capped_runs(path) == []
    found = fixed_cost(chip, path, other)
    assert found is not None
    assert found.dequant_factor == pytest.approx(1.1, rel=0.01)
    assert found.per_layer_s == pytest.approx(40e-6, rel=0.05)


@pytest.mark.slow  # the K3 shard's capped runs through the engine (~40 s)
def test_the_unrolled_kernels_own_runs_are_copy_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set v5e-aa (pairs-fold, panel loops 4/2): 9.17 µs a routed expert, under what halved
    decoders give in the simulator, so the factor keeps the static-schedule rates (1, not the
    0.05 the slope rule extrapolated to) and the per-layer cost is fitted alone; only that
    build's runs are read (the one-panel cap-4 run of set v5e-x is left out). The fit checked is
    the one ``build_chip`` makes for that build (recorded as it runs, so the engine fits it once)."""
    from calibration.reports import tpu_v5e_plan
    from megakernel.quant_pairs import KERNEL_DECODER

    runs = capped_runs(decoder=KERNEL_DECODER, panel_unroll=(4, 2))
    assert {(r.schedule, r.expert_cap) for r in runs} == {("published", 4), ("published", 8), ("published", 12),
                                                          ("naive", 4)}
    assert len(capped_runs(decoder=KERNEL_DECODER)) > len(runs)  # the one-panel run is there, and filtered out
    fits = []

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = fixed_cost(*args, **kwargs)
        fits.append((args, kwargs, found))
        return found

    monkeypatch.setattr(tpu_v5e_plan, "fixed_cost", recorded)
    _, label = tpu_v5e_plan.build_chip(KERNEL_DECODER, (4, 2))
    assert len(fits) == 1, [(args[1:], kwargs) for args, kwargs, _ in fits]  # its own build's runs had a fit
    (args, kwargs, found), = fits
    # fixed_cost(planned_chip(KERNEL_DECODER, 2), decoder=KERNEL_DECODER, panel_unroll=(4, 2)) at batch 1,
    # the runs of its own expert-list build (the walk: the 4/2 build never ran the vector list)
    assert args[1:] == (FIXED_COST_PATH, KERNEL_DECODER, (4, 2), 1, "walk") and not kwargs
    assert args[0] == tpu_v5e_plan.planned_chip(KERNEL_DECODER, 2)
    assert found is not None and found.dequant_factor == 1.0
    assert 9.0 <= found.slope_ms_per_expert * 1e3 <= 9.4
    assert 35e-6 <= found.per_layer_s <= 60e-6
    assert "refit" in label and "this build's own" in label and f"{found.per_layer_s * 1e6:.1f} µs a layer" in label


def test_decoders_that_move_no_slope_are_hidden_not_divided_by(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vector-list build's own capped runs (2026-12-07): its expert slope is the copies', the
    decoders at full and half cost give the same simulated slope, and the factor's ratio had divided
    by ~0 (a negative dequant rate). The rule must call them hidden (factor 1) and fit the per-layer
    cost alone: here the simulated step is the measured one less 1 ms plus 1 ms per µs of per-layer
    cost above 40 µs, so the fit lands at 41 µs."""
    import numpy as np

    import calibration.sources.tpu_fixed_cost as fixed
    from calibration.sources.tpu_chip_records import ChipRecord

    runs = [ChipRecord(model="kimi-k3", shard_of="k3-tp32", schedule="published", schedule_path="x.json",
                       batch=1, context=1024, routing="trace:x", ms_median=10.0 + cap, ms_spread=0.0, runs=1,
                       expert_cap=cap) for cap in (4, 8, 12)]
    target = np.array([r.ms_median for r in runs])

    def simulated(runs_: list[ChipRecord], chip) -> np.ndarray:  # type: ignore[no-untyped-def]
        per_layer = chip.execution.per_layer_overhead_s.value
        return target - 1.0 + (per_layer - 40e-6) * 1e6

    monkeypatch.setattr(fixed, "capped_runs", lambda *a, **k: runs)
    monkeypatch.setattr(fixed, "_ms", simulated)
    # the chip's slope 1.1 ms an expert cap, the simulator's 1.0 whatever the decoders cost
    monkeypatch.setattr(fixed, "_slope", lambda runs_, ms: float(np.polyfit([4, 8, 12], ms, 1)[0])
                        * (1.1 if np.array_equal(ms, target) else 1.0))
    found = fixed.fixed_cost(load_chip("tpu-v5e", calibrated=False))
    assert found is not None and found.dequant_factor == 1.0
    assert found.per_layer_s == pytest.approx(41e-6, rel=1e-4)
