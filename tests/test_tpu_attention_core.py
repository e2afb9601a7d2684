"""The ``mla_core`` probe's figures: a tile's seconds from planted records, and the committed run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.sources.tpu_attention_core import attention_core_probe, core_tiles, tile_seconds

LAUNCH_S = 600e-6


def _records(per_tile: dict[int, float], core_s: float = 4e-6, buffers: int = 2, ahead: int = 0) -> list[dict]:
    """Whole-call seconds = launch + R x (core + tiles x per_tile[batch]), at R 4 and 20, 1-8 tiles."""
    out = []
    for batch, tile_s in per_tile.items():
        for tiles in (1, 2, 4, 8):
            for r in (4, 20):
                out.append({"kind": "probe", "probe": "mla_core", "check": "ok", "date": "2026-12-07T14:00:00",
                            "seconds_median": LAUNCH_S + r * (core_s + tiles * tile_s),
                            "params": {"batch": batch, "kv_buffers": buffers, "large_copies": ahead,
                                       "kv_tile_tokens": 128, "tiles": tiles, "repeats_in_kernel": r}})
    return out


def _write(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "probes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_tile_and_the_core_beyond_it_come_back_from_the_records(tmp_path: Path) -> None:
    path = _write(tmp_path, _records({1: 5e-6, 16: 12e-6}) + _records({16: 30e-6}, buffers=4)
                  + _records({16: 50e-6}, ahead=8))
    builds = {(b.batch, b.buffers, b.large_copies): b for b in core_tiles(path)}
    assert set(builds) == {(1, 2, 0), (16, 2, 0), (16, 4, 0), (16, 2, 8)}
    assert builds[(1, 2, 0)].tile_s == pytest.approx(5e-6, rel=1e-9)
    assert builds[(16, 2, 0)].tile_s == pytest.approx(12e-6, rel=1e-9)
    assert builds[(16, 2, 0)].core_s == pytest.approx(4e-6, rel=1e-6)
    # the engine's figure reads only the default buffers with nothing ahead
    assert tile_seconds(16, path)[0] == pytest.approx(12e-6, rel=1e-9)


def test_between_and_beyond_the_probed_rows_the_tile_is_linear_in_the_rows(tmp_path: Path) -> None:
    path = _write(tmp_path, _records({1: 5e-6, 4: 5.6e-6, 16: 12e-6}))
    assert tile_seconds(2, path)[0] == pytest.approx(5.2e-6, rel=1e-9)
    assert tile_seconds(8, path)[0] == pytest.approx(5.6e-6 + 6.4e-6 / 3, rel=1e-9)
    assert tile_seconds(32, path)[0] == pytest.approx(12e-6 + 16 * 6.4e-6 / 12, rel=1e-9)


def test_the_engine_figures_keep_the_static_tile_and_spread_the_rest_over_the_tokens(tmp_path: Path) -> None:
    path = _write(tmp_path, _records({1: 5e-6, 16: 12e-6}))
    token_s, tile_s, source = attention_core_probe(1, static_tile_s=0.2e-6, probe_path=path)
    assert tile_s == 0.2e-6
    assert tile_s + 128 * token_s == pytest.approx(5e-6, rel=1e-9)
    assert source.startswith("measured on tpu-v5e (probe mla_core")


def test_one_build_is_no_figure(tmp_path: Path) -> None:
    assert tile_seconds(1, _write(tmp_path, _records({1: 5e-6}))) is None


def test_the_committed_run_prices_a_tile_above_the_loops_bundles_and_growing_with_the_rows() -> None:
    """Measured on tpu-v5e (2026-12-07): 5.4 / 5.4 / 7.3 / 12.6 us a tile at 1 / 4 / 8 / 16 rows;
    libtpu's bundles for the same loop issue ~1.6 us at one row and ~11 at sixteen."""
    at = {b: tile_seconds(b)[0] for b in (1, 4, 8, 16)}
    assert 3e-6 < at[1] < 8e-6 and 9e-6 < at[16] < 16e-6
    assert at[1] <= at[8] <= at[16]


def test_a_kda_core_is_the_slope_over_the_repetitions_beside_its_bundles(tmp_path: Path) -> None:
    from calibration.sources.tpu_attention_core import kda_cores, kda_table

    probes = [{"kind": "probe", "probe": "kda_core", "check": "ok", "date": "2026-12-07T14:30:00",
               "seconds_median": LAUNCH_S + r * 16e-6 + f * 1e-6,
               "params": {"batch": 16, "repeats_in_kernel": r, "large_copies": f, "state_bytes": 3_000_000}}
              for r in (8, 40) for f in (0, 8)]
    static = tmp_path / "static.jsonl"
    static.write_text(json.dumps({"probe": "kda_core", "chip": "tpu-v5e", "params": {"batch": 16},
                                  "repetition_bundles": 7000}) + "\n")
    (core,) = kda_cores(_write(tmp_path, probes), static)
    assert (core.batch, core.bundles, core.state_bytes) == (16, 7000, 3_000_000)
    assert core.seconds == pytest.approx(16e-6, rel=1e-9)
    row = kda_table([core], 1e-9, 1e12)[-1]  # 7 us of bundles, 6 us of copies: 3 us left
    assert row.endswith("| +3.00 |")


def _capped(batch: int) -> list:
    from calibration.sources.tpu_fixed_cost import FIXED_COST_PATH, capped_runs
    from megakernel.quant_pairs import KERNEL_DECODER

    return [r for r in capped_runs(FIXED_COST_PATH, KERNEL_DECODER, batch=batch)
            if r.schedule == "published" and r.expert_cap == 4 and r.expert_list == "vector"]


def test_the_kernels_context_cost_is_the_slope_over_the_context_per_mla_layer() -> None:
    """Planted: each committed batch-1 capped run's step set to 10 ms + 3 us a cached token; K3
    has 24 MLA layers (every 4th from layer 3, and layer 92), so a 128-token slice of one MLA
    layer's cache costs 128 x 3 / 24 = 16 us."""
    import dataclasses

    from calibration.sources.tpu_attention_core import context_table, kernel_context_costs

    runs = [dataclasses.replace(r, ms_median=10.0 + 3e-3 * r.context) for r in _capped(1)]
    assert len({r.context for r in runs}) >= 2
    (cost,) = kernel_context_costs(runs)
    assert (cost.batch, cost.expert_cap, cost.kv_tile_tokens) == (1, 4, 128)
    assert cost.kernel_s == pytest.approx(16e-6, rel=1e-9)
    assert cost.probe_s == pytest.approx(tile_seconds(1)[0], rel=1e-9)
    assert context_table([cost])[-1].startswith("| published | u8x2 vector list | 1 | 4 |")
    assert kernel_context_costs(runs[:1]) == []  # one context: no slope


def test_the_committed_capped_runs_put_the_batch_16_gap_in_the_kernels_kv_loop() -> None:
    """Measured on tpu-v5e: at one row the kernel's cache costs what the mla_core probe's loop
    does alone (5.3 us a 128 tokens a layer); at sixteen, ~8 us more than the probe's 12.6."""
    from calibration.sources.tpu_attention_core import kernel_context_costs

    (one,) = kernel_context_costs(_capped(1))
    (sixteen,) = kernel_context_costs(_capped(16))
    assert abs(one.kernel_s - one.probe_s) < 0.5e-6
    assert 5e-6 < sixteen.kernel_s - sixteen.probe_s < 11e-6
