"""TPU7x priced by its compiler (calibration.reports.tpu_v7_compiler_priced): the interval is the
v5e first-principles residuals' order statistics, the expert parts' figures come from the static
records, and `tpusim compare` prints the lines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from calibration.reports import tpu_v7_compiler_priced as priced
from calibration.sources.tpu_layer_static import layer_issue
from hwmodels.catalog import load_chip
from hwmodels.errors import InputError
from megakernel.kernel_moe import EXPERT_LIST_BUILD
from tpusim.app.cli import main
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL

# 19 planted relative residuals (simulated / measured - 1): the fewest a 90 % interval takes
PLANTED = [-0.10 + 0.01 * i for i in range(19)]  # -0.10 .. +0.08


def test_the_interval_is_the_residuals_order_statistics_and_moves_with_them() -> None:
    interval = priced.residual_interval(PLANTED, 0.90)
    assert (interval.r_low, interval.r_high) == pytest.approx((-0.10, 0.08))
    low, high = interval.bounds_ms(10.0)
    assert (low, high) == pytest.approx((10.0 / 1.08, 10.0 / 0.90))  # measured = simulated / (1 + r)
    moved = priced.residual_interval([*PLANTED[:-1], 0.30], 0.90)  # plant a worse over-prediction
    assert moved.r_high == pytest.approx(0.30) and moved.bounds_ms(10.0)[0] == pytest.approx(10.0 / 1.30)
    assert priced.residual_interval([*PLANTED, *PLANTED], 0.80).r_low > -0.10  # more points: inner ranks


def test_too_few_residuals_for_the_level_are_refused() -> None:
    with pytest.raises(InputError, match="18 residuals cannot bound a 90% interval"):
        priced.residual_interval(PLANTED[:18], 0.90)


def test_another_program_than_the_compiled_one_is_refused() -> None:
    with pytest.raises(ValueError, match="price kimi-k3 on 16 chips only"):
        priced.CompilerPricedConfig(chips=8)


def _records(tmp_path: Path, **changes: int) -> Path:
    """The committed TPU7x static records, with ``part_rows=bundles`` planted."""
    lines = priced.TPU7X_STATIC_PATH.read_text().splitlines()
    out = []
    for line in lines:
        record = json.loads(line)
        if record["probe"] == "layer_body":  # the layer loop's records: ``layer_<batch>`` plants its bundles
            if (key := f"layer_{record['params']['batch']}") in changes:
                record["issued_bundles"] = changes[key]
        elif record["params"]["decoder"] == priced.MXU_DECODER \
                and (key := f"{record['params']['part']}_{record['params']['rows']}") in changes:
            record["panel_bundles"] = changes[key]
        out.append(json.dumps(record))
    path = tmp_path / "static.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def test_expert_parts_are_priced_from_the_static_records_at_the_derived_clock(tmp_path: Path) -> None:
    base = load_chip("tpu-v7", calibrated=False)
    clock_hz, source = priced.tpu7x_clock_hz(base, priced.static_records())
    assert clock_hz == pytest.approx(32 / 20e-9) and "20 ns" in source  # 32 vreg pushes a bf16 256x256 tile
    chip, rows = priced.compiler_priced_chip(base, 1)
    down = chip.vector_unit.dequant_s_per_element["mxfp4"]
    assert rows == 1 and down.label == "derived" and "rows 1" in down.source
    planted, _ = priced.compiler_priced_chip(base, 1, _records(tmp_path, down_1=710))
    assert planted.vector_unit.dequant_for("mxfp4") == pytest.approx(10 * down.value)  # 71 -> 710 bundles
    assert priced.compiler_priced_chip(base, 4)[1] == 8  # one product per block above 2 rows: the rows-8 record
    assert priced.compiler_priced_chip(base, 2)[1] == 2  # row by row at 2: its own record


@pytest.mark.slow  # lowers K3's per-device program for the engine's share (~5 s)
def test_the_layer_is_priced_from_the_tpu7x_layer_loop(tmp_path: Path) -> None:
    base = load_chip("tpu-v7", calibrated=False)
    chip, _ = priced.compiler_priced_chip(base, 1)
    layer = chip.execution.per_layer_overhead_s
    assert layer.label == "derived" and "(tpu7x)" in layer.source and "1.600 G bundles/s" in layer.source
    assert "cycles a loop iteration, the v5e's (code_size probe" in layer.source
    # the kernel as it is: the record of its expert-list build (the older walk build's stays beside it)
    issued = layer_issue(1, (PANEL_UNROLL, EXPERT_PANEL_UNROLL), priced.TPU7X_STATIC_PATH, EXPERT_LIST_BUILD).issued_bundles
    assert f"({EXPERT_LIST_BUILD} expert list)" in layer.source
    planted, _ = priced.compiler_priced_chip(base, 1, _records(tmp_path, layer_1=issued + 16_000))
    # 16,000 more bundles a layer at the derived 1.6 GHz: 10 µs more, the engine's share unchanged
    assert planted.execution.per_layer_overhead_s.value - layer.value == pytest.approx(10e-6, rel=1e-9)


def test_the_clock_is_refused_when_a_push_is_not_one_vreg(tmp_path: Path) -> None:
    lines = [json.loads(line) for line in priced.TPU7X_STATIC_PATH.read_text().splitlines()]
    for record in lines:
        if record["probe"] == "expert_product":
            record["panel_units"]["MXU"] = 2 * record["panel_units"].get("MXU", 0)
    path = tmp_path / "static.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(InputError, match="a push is not one vreg"):
        priced.tpu7x_clock_hz(load_chip("tpu-v7", calibrated=False), priced.static_records(path))


@pytest.fixture
def planted_residuals(monkeypatch: pytest.MonkeyPatch) -> None:
    """The v5e residuals replaced by :data:`PLANTED` (their own 19 engine runs are not the point)."""
    monkeypatch.setattr(priced, "v5e_residuals", lambda: tuple(("planted", 1, r) for r in PLANTED))


def test_the_row_reports_its_interval_and_width(planted_residuals: None) -> None:
    (row,) = priced.predict(priced.CompilerPricedConfig(batches=(1,)))
    assert row.step_ms_low == pytest.approx(row.step_ms / 1.08) and row.step_ms_high == pytest.approx(row.step_ms / 0.90)
    assert row.width_rel == pytest.approx((row.step_ms_high - row.step_ms_low) / row.step_ms)
    assert row.catalog_ms < row.step_ms and "compiler-priced (simulated" in row.label


def test_compare_prints_the_compiler_priced_lines(planted_residuals: None, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compare", "--model", "kimi-k3", "--systems", "tpu-v7:16", "--batch", "1", "--schedule", "published",
                 "--format", "table"])
    out = capsys.readouterr().out
    assert code == 0
    assert "tpu-v7:16 compiler-priced (simulated, TPU7x static schedule; interval from the v5e first-principles" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("batch 1:"))
    assert f"(width {1 / 0.90 - 1 / 1.08:.1%})" in line  # the planted residuals' extremes
    assert "order statistics 1 and 19 of 19" in out


def test_compare_prints_none_for_another_program() -> None:
    args = argparse.Namespace(model="kimi-k3-mini", formats=None, plan=None, context=1024, routing="uniform", seed=0)
    from calibration.commands.compare_notes import compiler_priced_notes
    from tpusim.compare.rows import parse_systems

    assert compiler_priced_notes(args, parse_systems("tpu-v7:16"), [1]) == []
    args.model = "kimi-k3"
    assert compiler_priced_notes(args, parse_systems("tpu-v7:1,gb200:16"), [1]) == []


def test_the_demo_report_shows_the_compiler_priced_table(tmp_path: Path) -> None:
    from calibration.commands.demo_report import render_report
    from calibration.commands.demo_run import DemoConfig, DemoRun
    from calibration.commands.demo_steps import COMPILER_PRICED_STEP

    run = DemoRun(DemoConfig(out_dir=tmp_path))
    run.step("compare").data = []
    row = {"batch": 8, "step_ms": 15.0, "step_ms_low": 14.9, "step_ms_high": 17.7, "width_rel": 0.187}
    run.step(COMPILER_PRICED_STEP).data = {"rows": [row], "interval": "90% interval: planted"}
    text = render_report(run)
    assert "TPU v7 x 16 priced by its compiler" in text
    assert "| 8 | 15.000 | 14.900–17.700 | 18.7% |" in text and "- 90% interval: planted" in text
