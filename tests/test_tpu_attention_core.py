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
