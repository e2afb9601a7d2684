"""The chip-floor benchmark's two tables and the derived prediction of an unrolled kernel,
on small hand-made record files (references computed here by hand, not by the code under test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from calibration.reports.tpu_v5e_derived import published_ms
from hwmodels.records.kernel import record_unroll

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_chip_floor", ROOT / "benchmarks" / "bench_chip_floor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _variant(batch: int, ms: float, **knobs: int) -> dict:
    return {"schedule": "published", "batch": batch, "ms_per_step_median": ms, "kernel_variant": knobs}


def test_published_is_the_expert_variant_plus_the_dense_step_measured_at_batch_1():
    variants = [_variant(1, 30.0, panel_unroll=2), _variant(1, 29.0, panel_unroll=4),
                _variant(1, 27.0, panel_unroll=2, expert_panel_unroll=2),
                _variant(8, 80.0, panel_unroll=2, expert_panel_unroll=2)]
    assert published_ms(1, variants, 4, 2) == pytest.approx(27.0 - 1.0)
    assert published_ms(8, variants, 4, 2) == pytest.approx(80.0 - 1.0)
    assert published_ms(16, variants, 4, 2) is None  # no variant ran there
    assert published_ms(1, variants[:1], 4, 2) is None  # no dense-4 run: nothing to add


def test_nonexpert_table_reads_the_kernel_at_zero_experts_off_its_capped_and_full_runs(tmp_path):
    when = "2026-12-06T11:40:00+00:00"
    full = {"shard_of": "k3-tp32", "batch": 1, "schedule_hash": "h", "ms_per_step_median": 30.0,
            "experts_per_layer": [16, 16], "provenance": f"x date={when} jax"}
    capped = {**full, "ms_per_step_median": 20.0, "expert_cap": 4}
    xla = {"batch": 1, "expert_cap": 0, "ms_per_step_median": 200.0, "stands_next_to": {"schedule_hash": "h"},
           "provenance": f"x date={when} jax"}
    _write(tmp_path / "tpu-v5e-kernel.jsonl", [full])
    _write(tmp_path / "tpu-v5e-fixed-cost.jsonl", [capped])
    _write(tmp_path / "tpu-v5e-xla-capped.jsonl", [xla])
    row = _bench().nonexpert_table(tmp_path)[2]
    # 8 expert-layers -> 20 ms, 32 -> 30 ms: 10/24 ms an expert-layer, so 0 -> 20 - 8 * 10/24
    assert f"| {20 - 8 * 10 / 24:.2f} |" in row
    assert f"{(20 - 8 * 10 / 24) / 200:.3f}" in row


def test_the_floor_table_shows_one_kernel_build():
    bench = _bench()
    now = bench.table(unroll=(4, 2))
    before = bench.table(unroll=(1, 1))
    assert "panel loops 4 (dense) and 2 (experts)" in now[0] and "panel loops 1 (dense) and 1" in before[0]
    assert not set(now[3:]) & set(before[3:])


def test_each_builds_zero_expert_step_from_its_capped_runs_alone(tmp_path: Path) -> None:
    """Three capped runs of one build in one session, on a line in routed expert-layers: the
    intercept (hand-computed) and the latest XLA step with no routed expert beside it."""
    bench = _bench()

    def capped(cap: int, ms: float, minute: int) -> dict:
        return {"shard_of": "k3-tp32", "schedule": "published", "schedule_hash": "h", "batch": 1, "decoder": "pairs-fold",
                "expert_cap": cap, "panel_unroll": [4, 2], "experts_per_layer": [16] * 10,
                "ms_per_step_median": ms, "date": f"2026-12-06T14:{minute:02d}:00+00:00"}

    # 10 layers, caps 4/8/12 -> 40/80/120 expert-layers at 0.1 ms each over 11 ms
    _write(tmp_path / "tpu-v5e-fixed-cost.jsonl", [capped(4, 15.0, 1), capped(8, 19.0, 2), capped(12, 23.0, 3)])
    _write(tmp_path / "tpu-v5e-xla-capped.jsonl", [{"expert_cap": 0, "batch": 1, "ms_per_step_median": 220.0,
                                                     "date": "2026-12-06T09:00:00+00:00"}])
    (line,) = bench.nonexpert_by_caps(tmp_path)
    assert "**11.00 ms** at 0 experts" in line and "100.00 µs a routed expert-layer" in line
    assert "0.050 (XLA's 220.0 ms" in line and "another session" in line


def test_a_build_is_its_rows_of_both_record_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build's decodes are its rows of the kernel file and of the variants file; an old variant
    row names its build only by its knobs (on the one-panel kernel)."""
    from calibration.sources import tpu_chip_records as records

    assert record_unroll({"kernel_variant": {"panel_unroll": 2}}) == (2, 1)
    assert record_unroll({"panel_unroll": [8, 2], "kernel_variant": {"panel_unroll": 8}}) == (8, 2)
    assert record_unroll({}) == (1, 1)
    kernel, variants = (tmp_path / "kernel.jsonl", tmp_path / "variants.jsonl")
    real = [json.loads(line) for line in records.KERNEL_PATH.read_text().splitlines() if line.strip()]
    base = next(r for r in real if r.get("panel_unroll") == [4, 2] and r.get("expert_cap") is None)
    routing = str(records.KERNEL_PATH.parent / base["routing"].removeprefix("trace:"))
    row = {**base, "routing": f"trace:{routing}"}
    _write(kernel, [row, {**row, "batch": 8}])
    _write(variants, [{**row, "panel_unroll": [8, 2], "kernel_variant": {"panel_unroll": 8}, "ms_per_step_median": 20.0},
                      {**row, "panel_unroll": [8, 2], "kernel_variant": {"panel_unroll": 8}, "ms_per_step_median": 22.0}])
    monkeypatch.setattr(records, "KERNEL_PATH", kernel)
    monkeypatch.setattr(records, "VARIANTS_PATH", variants)
    (eight,) = records.build_records(base["decoder"], (8, 2))
    assert (eight.runs, eight.ms_median) == (2, 21.0)  # the two runs of one (schedule, batch, build), merged
    assert len(records.build_records(base["decoder"])) == 3
    assert records.most_measured_build(base["decoder"]) == (4, 2)  # two decodes against one


def test_the_benchmark_shows_the_kernels_own_build_first() -> None:
    """By default the floor benchmark prints the kernel's own build (its default panel loops),
    read from both record files, then the build with the most decodes."""
    import contextlib
    import io

    from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _bench().main([]) == 0
    first = out.getvalue().splitlines()[0]
    assert f"panel loops {PANEL_UNROLL} (dense) and {EXPERT_PANEL_UNROLL} (experts)" in first
