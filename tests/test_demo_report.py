"""The demo's report renderer: opens with the TPU-v7-against-GB200 table, labels, failures."""

from __future__ import annotations

from calibration.commands.demo_report import render_report
from calibration.commands.demo_run import DemoConfig, DemoRun
from hwmodels.units import MIB


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
    calibrated = {**_row("tpu-v7:16", "megakernel", 4.8), "batch": 2, "label": "calibrated",
                  "step_ms_low": 4.58, "step_ms_high": 5.089}
    compare.data = [_row("tpu-v7:16", "megakernel", 5.4), calibrated, _row("gb200:16", "serving stack", 13.1),
                    _row("gb200:4", "serving stack", None, fits=False)]
    failed = run.step("floor")
    failed.ok, failed.error = False, "RuntimeError: boom"
    text = render_report(run)
    assert text.startswith("# Kimi K3 decode: TPU v7 x 16 against GB200 x 16")
    assert "| tpu-v7:16 | megakernel | 1 | — | 5.400 | — | 185.2 | simulated, published figures |" in text
    assert "| tpu-v7:16 | megakernel | 2 | — | 4.800 | 4.580–5.089 | 208.3 | calibrated |" in text
    # a row that does not fit ran nothing: its label is the capacity check, not "calibrated" or "simulated"
    assert ("| gb200:4 | serving stack | 1 | — | does not fit | — | — | not simulated (no chip figures used) | "
            "needs 608 GB/device") in text
    assert "**FAILED**: `RuntimeError: boom`" in text
    assert "| floor | 0.0 | 0.0 | FAILED: RuntimeError: boom |" in text
    assert not run.ok


def _simulated(calibrated: bool) -> dict:
    return {"schedule": "published", "step_ms": 5.0, "tokens_per_s": 200.0, "exposed_dma_ms": 1.0,
            "vmem_peak_bytes": 40 << 20, "busy_fraction": {"hbm": 0.5}, "calibrated": calibrated,
            # simulate always writes "published figures" into the source: the label must not read it
            "source": "simulated (hardware tpu-v7: calibrated on 12 points; published figures ...)"}


def test_simulated_figures_are_labelled_calibrated_from_the_chip_property(tmp_path) -> None:
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    run.step("simulate").data = {"best": _simulated(True), "naive": _simulated(False)}
    text = render_report(run)
    assert "| best (`published`) | 5.000 | 200.0 | 1.000 | 40.0 | 50 % | calibrated |" in text
    assert "| naive (`published`) | 5.000 | 200.0 | 1.000 | 40.0 | 50 % | simulated |" in text


def test_unconverged_calibration_is_said(tmp_path) -> None:
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    run.step("calibrate tpu-v7").data = {"success": False, "message": "maximum evaluations", "mape_loo": 0.5}
    text = render_report(run)
    assert "**did not converge** (maximum evaluations)" in text
    assert "| leave-one-out, points fitted | — | 50.0 % |" in text


def test_a_second_demo_forgets_the_first_runs_overlays(tmp_path) -> None:
    from calibration.commands.demo_steps import _forget_previous_overlays

    folder = tmp_path / "local" / "calibrated"
    folder.mkdir(parents=True)
    (folder / "tpu-v7.yaml").write_text("chip: tpu-v7\n")
    said: list[str] = []
    _forget_previous_overlays(tmp_path / "local", said.append)
    assert not (folder / "tpu-v7.yaml").exists()
    assert len(said) == 1 and "tpu-v7.yaml" in said[0]


def test_calibrated_rows_say_on_what_and_where_they_extrapolate(tmp_path) -> None:
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    row = dict(_row("tpu-v7:16", "megakernel", 5.4), label="calibrated",
               calibrated_on="calibrated on 8 points: muse-spark b1..8 on tpu-v7x4 (6 figures: ...)",
               calibration_warnings=["kimi-k3 was not among the fitted models (muse-spark)"])
    run.step("compare").data = [row]
    text = render_report(run)
    assert "- tpu-v7:16: calibrated on 8 points: muse-spark" in text
    assert "- warning: tpu-v7:16: kimi-k3 was not among the fitted models (muse-spark)" in text


def test_a_part_by_part_calibration_is_written_up(tmp_path) -> None:
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    step = run.step("calibrate tpu-v7")
    step.data = {
        "chip": "tpu-v7", "procedure": "part by part", "holdout": "format=int4+bf16",
        "errors_by_measurement_set": {"link_copies": {"points": 4, "mape_before": 0.269, "mape_after": 0.01}},
        "mape_e2e_published": 0.062, "mape_e2e_parts_only": 0.072, "mape_calibration": 0.071, "mape_holdout": 0.061,
        "parameters": {"links.ici.latency_s": {"value": 2.5e-6, "uncertainty": 2.3e-7, "fitted_on": "links"}},
        "unidentifiable_held": {"links.ici.message_issue_s": "1σ above half its value; held"},
        "interval_samples": 24,
        "e2e_fit": {"points": [{"key": "muse b1", "set": "holdout", "measured_ms": 3.59, "measured_label": "tpu7x",
                                "simulated_uncalibrated_ms": 3.906, "simulated_calibrated_ms": 3.876}]},
    }
    text = render_report(run)
    assert "| link_copies | 4 | 26.9 % | 1.0 % |" in text
    assert "| the parts' values, not fitted on the step times | 7.2 % |" in text
    assert "| after fitting, points held out (format=int4+bf16) | 6.1 % |" in text
    # the catalog column comes from the catalog file (tpu-v7's ICI latency: 1 µs, assumed there)
    assert "| `links.ici.latency_s` | 1e-06 | 2.5e-06 | 2.3e-07 | links |" in text
    assert "- `links.ici.message_issue_s`: 1σ above half its value; held" in text
    assert "| muse b1 | holdout | 3.590 (tpu7x) | 3.906 | 3.876 |" in text


def test_the_deployment_search_reports_the_winner_with_its_interval_and_p_best(tmp_path) -> None:
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    best = {"plan": "base=published,expert_groups=4,expert_tp=8", "collectives": "", "predicted_ms": 3.7,
            "tokens_per_s": 270.3}
    published = {"plan": "auto", "collectives": "", "predicted_ms": 4.1, "tokens_per_s": 243.9}
    run.step("joint b1").data = {
        "best": best, "published": published, "speedup": 4.1 / 3.7, "simulated": 60, "trials": 300,
        "robust": {"calibrated": True, "source": "calibrated on 12 points", "p_beats_published": 0.96,
                   "winner": {**best, "tokens_per_s_low": 200.0, "tokens_per_s_high": 330.0},
                   "published": {**published, "tokens_per_s_low": None}}}
    text = render_report(run)
    assert ("| best found | `base=published,expert_groups=4,expert_tp=8` | as the plan | 3.700 | 270.3 "
            "(200.0–330.0) | simulated, calibrated |") in text
    assert "| published | `auto` | as the plan | 4.100 | 243.9 (no interval) | simulated, calibrated |" in text
    assert "**1.108x**" in text and "**0.96**" in text and "calibrated on 12 points" in text
    failed = DemoRun(DemoConfig(out_dir=tmp_path))
    step = failed.step("joint b1")
    step.ok, step.error = False, "RuntimeError: no plan"
    assert "**FAILED**: `RuntimeError: no plan`" in render_report(failed)


def test_compile_checks_and_the_compiled_winner_are_reported(tmp_path) -> None:
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    run.step("joint b1").data = {"best": {"plan": "auto", "collectives": "", "predicted_ms": 4.0, "tokens_per_s": 250.0},
                                 "published": {}, "speedup": 1.0, "simulated": 8, "trials": 8, "robust": {}}
    assert "not run here: libtpu is not installed" in render_report(run)
    run.step("compile joint b1").data = {
        "compile": {"ok": True, "topology": "tpu7x:2x2x4", "seconds": 11.0, "kind": None, "error": None},
        "scratch_total_bytes": 50.93 * MIB, "accounting_total_bytes": 50.93 * MIB}
    run.step("sweep b1").data = {"counts": {"considered": 9, "pruned": 1, "simulated": 8}, "best": {"predicted_ms": 4.1},
                                 "compile_checks": [{"name": "sample-1", "accepted": True,
                                                     "note": "compile-checked: Mosaic compiled it in 10.5 s"}]}
    run.step("sweep b8").data = {"counts": {"considered": 9, "pruned": 1, "simulated": 8}, "best": {"predicted_ms": 8.1}}
    text = render_report(run)
    assert "Mosaic **compiled** the winner at full K3 size on 32 TPU7x devices (tpu7x:2x2x4) in 11.0 s" in text
    assert "batch 1: `best.json` (sample-1) compile-checked: Mosaic compiled it in 10.5 s." in text
    assert "Not compile-checked here: batch 8" in text


def test_host_cpu_figures_are_labelled_probed_not_published(tmp_path) -> None:
    """The issue's case: host-CPU figures probed on this machine sat under a 'published' header."""
    run = DemoRun(DemoConfig(out_dir=tmp_path))
    run.step("calibrate host-cpu").data = {
        "chip": "host-cpu", "success": True, "message": "ok", "points": [],
        "parameters": {"compute.peak_flops_per_s": {"published": 1e11, "value": 2e11, "uncertainty": 1e10}}}
    text = render_report(run)
    assert "| parameter | probed on this host | calibrated | ± (1σ) |" in text
    assert "| point | set | measured ms | simulated (probed on this host figures) ms |" in text
    run.step("calibrate tpu-v7").data = {"chip": "tpu-v7", "success": True, "message": "ok", "points": [],
                                         "parameters": {}}
    assert "| parameter | published | calibrated | ± (1σ) |" in render_report(run)


def test_measured_on_a_real_tpu_section_labels_every_figure(tmp_path) -> None:
    from calibration.commands.demo_measured import STEP, measured_section

    run = DemoRun(DemoConfig(out_dir=tmp_path))
    step = run.step(STEP)
    row = {"schedule": "published", "batch": 1, "measured_ms": 78.0, "probes_ms": 76.0, "heldout_ms": 77.0,
           "fold": "A", "new": False, "half_width": 0.05, "inside": True}
    ranking = [{"batch": 1, "schedules": 7, "tau": 0.71, "pick": "published", "best": "published-slots2",
                "regret": 0.0003}]
    step.data = {"rows": [row], "documented_mape": 0.036, "mape": {"b": 0.041, "c": 0.036, "c_new": None},
                 "coverage": {"inside": 10, "points": 11, "mean_width_rel": 0.153}, "fitted": ["hbm.x"],
                 "rankings": {"b": ranking, "c": ranking}, "plot": "measured-tpu-v5e.png"}
    text = "\n".join(measured_section(run))
    assert "## 8. Measured on a real TPU" in text
    assert "| published | 1 | 78.00 | 76.00 | 77.00 (-1.3 %, fold A) | ±5.0 % | yes |" in text
    assert "10/11 held-out records inside, mean width 15.3 %" in text
    assert "Kendall τ +0.71 over 7 schedules" in text and "batch 8: no records" in text
    assert "![predicted vs measured on tpu-v5e](measured-tpu-v5e.png)" in text
    failed = DemoRun(DemoConfig(out_dir=tmp_path))
    bad = failed.step(STEP)
    bad.ok, bad.error = False, "InputError: gone"
    assert "**Failed**: InputError: gone" in "\n".join(measured_section(failed))
