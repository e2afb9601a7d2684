"""The demo's report renderer: opens with the TPU-v7-against-GB200 table, labels, failures."""

from __future__ import annotations

from tpusim.app.demo_report import render_report
from tpusim.app.demo_run import DemoConfig, DemoRun


def _row(system: str, execution: str, step_ms: float | None, fits: bool = True) -> dict:
    return {"system": system, "chips": 16, "batch": 1, "acceptance_length": None, "execution": execution,
            "label": "simulated", "fits": fits, "step_ms": step_ms,
            "tokens_per_s": None if step_ms is None else 1000 / step_ms,
            "schedule_choice": "given", "short_note": "needs 608 GB/device > 186 GB HBM",
            "breakdown": {"where_ms": {"compute": 1.0, "launches": 0.0, "collectives": 1.0,
                                       "exposed_dma": 0.5, "other_overheads": 0.1}} if fits else {}}


def test_report_opens_with_the_comparison_and_reports_failures(tmp_path) -> None:
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    compare = run.step("compare")
    compare.data = [_row("tpu-v7:16", "megakernel", 5.4), _row("gb200:16", "per-kernel launches", 13.1),
                    _row("gb200:4", "per-kernel launches", None, fits=False)]
    failed = run.step("floor")
    failed.ok, failed.error = False, "RuntimeError: boom"
    text = render_report(run)
    assert text.startswith("# Kimi K3 decode: TPU v7 x 16 against GB200 x 16")
    assert "| tpu-v7:16 | megakernel | 1 | — | 5.400 | 185.2 | simulated |" in text
    assert "does not fit" in text and "needs 608 GB/device" in text
    assert "**FAILED**: `RuntimeError: boom`" in text
    assert "| floor | 0.0 | FAILED: RuntimeError: boom |" in text
    assert not run.ok
