"""``report.md`` of ``tpusim demo``: every table of the run, every number labelled.

Labels: *analytic floor*, *simulated*, *calibrated* (simulated with a calibrated overlay),
*measured on <backend>*, *published*. The report opens with the K3 TPU-v7-against-GB200
table, then gives the floor, the sweep, the simulated schedules, the kernel run, both
calibrations and the wall time of every step.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.commands.demo_consistency import refused, short_figures
from hwmodels.textfile import read_user_jsonl
from hwmodels.units import MIB

if TYPE_CHECKING:
    from calibration.commands.demo_run import DemoRun, StepRecord


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _step(run: DemoRun, name: str) -> StepRecord | None:
    return next((s for s in run.steps if s.name == name), None)


NOT_BY_DEFAULT = "not run by the default demo (minutes): `tpusim demo --full` runs it (about ten minutes)"


def _failed(step: StepRecord | None) -> str | None:
    if step is None:
        return NOT_BY_DEFAULT
    if not step.ok:
        return f"**FAILED**: `{step.error}`"
    return None


def _compare_section(run: DemoRun) -> list[str]:
    step = _step(run, "compare")
    lines = ["# Kimi K3 decode: TPU v7 x 16 against GB200 x 16", ""]
    problem = _failed(step)
    if problem:
        return [*lines, problem, ""]
    assert step is not None
    lines += [
        "Every time below is **simulated** by the tpusim engine (label `calibrated` where the chip",
        "carried a calibrated overlay from step 5). Tokens/s are aggregate over the batch; with",
        "speculative decoding they are *accepted* tokens/s (acceptance length a = accepted draft",
        "tokens + 1 bonus; K3's drafter, DSpark, proposes 7 tokens in one forward over an anchor + 7",
        "rows; the target verifies 8 rows per sequence). GPU rows name their stack and plan. A",
        "calibrated row carries a 90 % interval: the spread of re-simulating it on each parameter set",
        "the calibration stored, combined with the model error measured out of sample (wider where",
        "the row lies outside the fit; its `interval_includes` says what); an uncalibrated row has none (—).",
        "",
        "| system | execution | batch | acceptance | step ms | 90 % interval ms | tokens/s | label | schedule |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for row in step.data:
        accept = "—" if row["acceptance_length"] is None else f"{row['acceptance_length']:g}"
        if row.get("fits", True):
            low, high = row.get("step_ms_low"), row.get("step_ms_high")
            interval = "—" if low is None or high is None else f"{low:.3f}–{high:.3f}"
            lines.append(f"| {row['system']} | {row['execution']} | {row['batch']} | {accept} | "
                         f"{row['step_ms']:.3f} | {interval} | {row['tokens_per_s']:.1f} | {_row_label(row)} | "
                         f"{row.get('schedule_choice', '')} |")
        else:  # nothing was simulated, so no chip figures were used: no "calibrated" label
            lines.append(f"| {row['system']} | {row['execution']} | {row['batch']} | {accept} | does not fit | — | — | "
                         f"not simulated (no chip figures used) | {row.get('short_note', '')} |")
    from tpusim.app.cli.compare import calibration_notes

    notes = calibration_notes(step.data)
    lines += ["", *(f"- {note}" for note in notes), *([""] if notes else []),
              "![TPU v7 against GB200, simulated](compare.png)", ""]
    lines += _compiler_priced_lines(run)
    gpu_rows = [r for r in step.data if r.get("fits") and r["batch"] == 1 and r["acceptance_length"] is None]
    if gpu_rows:
        lines += ["Where a batch-1 step goes (simulated, ms):", "",
                  "| system | execution | compute | launches | kernel fixed time | collectives | exposed copies "
                  "| other overheads |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in gpu_rows:
            where = row["breakdown"].get("where_ms", {})
            lines.append(f"| {row['system']} | {row['execution']} | {_fmt(where.get('compute'))} | "
                         f"{_fmt(where.get('launches'))} | {_fmt(where.get('kernel_fixed'))} | "
                         f"{_fmt(where.get('collectives'))} | "
                         f"{_fmt(where.get('exposed_dma'))} | {_fmt(where.get('other_overheads'))} |")
        lines.append("")
    return lines


def _compiler_priced_lines(run: DemoRun) -> list[str]:
    """TPU v7 x 16 priced by its compiler (the demo's ``compiler-priced tpu-v7`` step)."""
    step = _step(run, "compiler-priced tpu-v7")
    if step is None:
        return []
    lines = ["TPU v7 x 16 priced by its compiler (`published` schedule; the routed experts' panel loops and the "
             "layer loop from libtpu's TPU7x static schedule, the components fitted on the TPU7x reference "
             "measurements; docs/tpu-v5e-to-v7.md):", ""]
    if not step.ok:
        return [*lines, f"**FAILED**: `{step.error}`", ""]
    lines += ["| batch | step ms (simulated) | 90 % interval ms (derived) | width |", "| ---: | ---: | ---: | ---: |"]
    for row in step.data["rows"]:
        lines.append(f"| {row['batch']} | {row['step_ms']:.3f} | {row['step_ms_low']:.3f}–{row['step_ms_high']:.3f} | "
                     f"{row['width_rel']:.1%} |")
    return [*lines, "", f"- {step.data['interval']}", ""]


def _row_label(row: dict[str, Any]) -> str:
    """A compare row's label with the chip figures it used (published, or calibrated on what)."""
    if row.get("calibrated_on"):
        return short_figures(row["calibrated_on"])
    return f"{row['label']}, published figures" if row["label"] == "simulated" else row["label"]


def _refusal(run: DemoRun, what: str) -> str | None:
    """The report's refusal to print a best-of figure beaten elsewhere in it (one answer per question)."""
    problems = refused(run, what)
    if not problems:
        return None
    run.refusals.extend(problems)
    return "**refused** (a bug: the search missed a candidate): " + "; ".join(problems)


def _floor_section(run: DemoRun) -> list[str]:
    step = _step(run, "floor")
    lines = ["## 1. Analytic floor: K3 on tpu-v7 x 16, batch 1", ""]
    problem = _failed(step)
    if problem:
        return [*lines, problem, ""]
    assert step is not None
    data = step.data
    lines += [
        "| quantity | value | label |", "| --- | ---: | --- |",
        f"| bytes per device per step (expected device) | {data['bytes_per_device'] / 1e9:.3f} GB | analytic |",
        f"| bytes per device, critical device | {data['bytes_per_device_critical'] / 1e9:.3f} GB | analytic (sampled routing) |",
        f"| HBM floor | {data['hbm_floor_ms']:.3f} ms | analytic floor |",
        f"| compute floor | {data['compute_floor_ms']:.3f} ms | analytic floor |",
        f"| collective floor | {data['collective_floor_ms']:.3f} ms | analytic floor |",
        f"| floor | {data['floor_ms']:.3f} ms ({data['bound_by']}-bound) | analytic floor |",
        f"| tokens/s at floor | {data['tokens_per_s_at_floor']:.1f} | analytic floor |",
        "",
    ]
    return lines


def _sweep_section(run: DemoRun) -> list[str]:
    lines = ["## 2. Schedule sweep: K3 on tpu-v7 x 16", "",
             "| batch | considered | pruned | simulated | best ms | published ms (rank) | speed-up | label |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    notes = []
    batches = sorted(int(step.name.removeprefix("sweep b")) for step in run.steps if step.name.startswith("sweep b"))
    for batch in batches:  # every batch the demo swept (the README's list), not a fixed pair
        step = _step(run, f"sweep b{batch}")
        problem = _failed(step)
        if problem:
            notes.append(f"- batch {batch}: {problem}")
            continue
        assert step is not None
        data = step.data
        counts = data["counts"]
        published = data.get("published") or {}
        refusal = _refusal(run, f"schedule sweep at batch {batch}: best")
        if refusal:
            notes.append(f"- batch {batch}: {refusal}")
            continue
        lines.append(
            f"| {batch} | {counts['considered']} | {counts['pruned']} | {counts['simulated']} | "
            f"{_fmt(data['best'].get('predicted_ms'))} | {_fmt(published.get('predicted_ms'))} "
            f"({_fmt(data.get('published_rank'))}) | {_fmt(data.get('speedup_vs_published'))}x | "
            f"simulated, {short_figures(data.get('figures'))} |")
    folders = ", ".join(f"`sweep-b{batch}/`" for batch in batches)
    lines += ["", *notes, *_compile_check_lines(run, batches), "",
              f"Outputs: {folders} (`sweep.csv`, `best.json`, `summary.md`, `pareto.png`, "
              "`sensitivity.png`).", "", "![pareto, batch 1](sweep-b1/pareto.png)", ""]
    return lines


def _compile_check_lines(run: DemoRun, batches: list[int]) -> list[str]:
    """Which sweep picks Mosaic compiled (``--compile-check``), and which were not checked."""
    checked, unchecked = [], []
    for batch in batches:
        step = _step(run, f"sweep b{batch}")
        checks = (step.data or {}).get("compile_checks") if step is not None and step.ok else None
        if not checks:
            unchecked.append(str(batch))
            continue
        accepted = next((c for c in checks if c["accepted"]), None)
        checked.append(f"batch {batch}: " + (f"`best.json` ({accepted['name']}) {accepted['note']}" if accepted
                                              else "no schedule compiled: " + checks[0]["note"]))
    lines = [f"- Compiled with Mosaic (`tpusim sweep --compile-check`): {line}." for line in checked]
    if unchecked:
        full = run.config.full
        lines.append(f"- Not compile-checked here: batch {', '.join(unchecked)} (at batch 8 the simulated best "
                     "is refused on VMEM and the check sweeps again within what the compiler leaves, minutes "
                     "beyond this demo's budget: docs/sweep.md" + ("" if checked else "; or libtpu is not installed"
                                                                   if full else "; `tpusim demo --full` compiles "
                                                                   "batch 1's pick with Mosaic") + ").")
    return lines


def _compiled_winner_line(run: DemoRun) -> str:
    """The joint winner compiled with Mosaic for 32 TPU7x devices (``tpusim lower --hardware tpu-v7``)."""
    step = _step(run, "compile joint b1")
    if step is None:
        return ("`tpusim lower --hardware tpu-v7 --schedule joint-b1/best.json` compiles the winner with Mosaic at "
                "full K3 size on 32 TPU7x devices (not run here: libtpu is not installed).")
    if not step.ok:
        return f"Compiling the winner with Mosaic for 32 TPU7x devices **FAILED**: `{step.error}`."
    data = step.data
    compiled = data.get("compile") or {}
    head = (f"`tpusim lower --hardware tpu-v7 --schedule joint-b1/best.json`: Mosaic **compiled** the winner at full K3 "
            f"size on 32 TPU7x devices ({compiled.get('topology')}) in {compiled.get('seconds', 0):.1f} s"
            if compiled.get("ok") else
            f"`tpusim lower --hardware tpu-v7 --schedule joint-b1/best.json`: Mosaic **refused** the winner "
            f"({compiled.get('kind')}: `{(compiled.get('error') or '')[:200]}`)")
    return (head + f" (compiled on this machine beside the comparison, no TPU; its VMEM scratch {data['scratch_total_bytes'] / MIB:.2f} MiB, "
            f"the simulator's accounting {data['accounting_total_bytes'] / MIB:.2f} MiB).")


def _joint_section(run: DemoRun) -> list[str]:
    """The deployment search: winner vs published, interval and paired P(best) when calibrated."""
    step = _step(run, "joint b1")
    lines = ["## 7. Deployment search: plan x collective algorithms x schedule (K3 on tpu-v7 x 16, batch 1)", ""]
    problem = _failed(step)
    if problem:
        return [*lines, problem, ""]
    assert step is not None
    data = step.data
    best, published, robust = data["best"], data.get("published") or {}, data.get("robust") or {}
    winner = robust.get("winner") or {}
    pub = robust.get("published") or {}

    def interval(entry: dict[str, Any], row: dict[str, Any]) -> str:
        if entry.get("tokens_per_s_low") is None:
            return f"{_fmt(row.get('tokens_per_s'), 1)} (no interval)"
        return (f"{_fmt(entry.get('tokens_per_s'), 1)} ({_fmt(entry['tokens_per_s_low'], 1)}–"
                f"{_fmt(entry['tokens_per_s_high'], 1)})")

    label = f"simulated, {short_figures(data.get('figures'))}" if data.get("figures") else (
        "simulated, calibrated" if robust.get("calibrated") else "simulated")
    refusal = _refusal(run, "deployment search: best found")
    if refusal:
        return [*lines, refusal, ""]
    lines += ["| design | plan | collectives | ms/step | tokens/s (90 % interval) | label |",
              "| --- | --- | --- | ---: | ---: | --- |",
              f"| best found | `{best['plan']}` | {best.get('collectives') or 'as the plan'} | "
              f"{_fmt(best['predicted_ms'])} | {interval(winner, best)} | {label} |"]
    if published:
        lines.append(f"| published | `{published['plan']}` | as the plan | {_fmt(published['predicted_ms'])} | "
                     f"{interval(pub, published)} | {label} |")
    p_pub = robust.get("p_beats_published")
    lines += ["", f"Speed-up of the best over the published design: **{_fmt(data.get('speedup'))}x** ({label}); "
              f"{data['simulated']} full-step simulations, {data['trials']} trials (Optuna TPE for half the budget, "
              "then coordinate descent around the best; invalid ones pruned by the one VMEM accounting and the "
              "kernel rule before anything runs)."
              + (f" P(faster than published) over the calibration's parameter samples (paired): "
                 f"**{p_pub:.2f}**." if p_pub is not None else ""),
              f"Figures from: {robust.get('source', 'the chip as given')}.", "",
              "The search keeps only deployments the multi-device kernel runs. " + _compiled_winner_line(run)
              + " `tpusim run-kernel --devices 8 --layers 4 --schedule joint-b1/best.json` runs it in interpret "
              "mode on kimi-k3-nano (its expert split scaled to 8 devices; nano's experts widened when that split "
              "needs wider slices) against the one-device reference (45–90 s; not run by the demo).",
              "Outputs: `joint-b1/` (`sweep.csv`, `best.json`, `summary.md`, `pareto.png`).", "",
              "![joint search, batch 1](joint-b1/pareto.png)", ""]
    return lines


def _simulate_section(run: DemoRun) -> list[str]:
    step = _step(run, "simulate")
    lines = ["## 3. One decode step simulated: the sweep's best against the built-ins (batch 1)", ""]
    problem = _failed(step)
    if problem:
        return [*lines, problem, ""]
    assert step is not None
    lines += ["| schedule | step ms | tokens/s | exposed DMA ms | VMEM peak MiB | HBM busy | label |",
              "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, data in step.data.items():
        label = "calibrated" if data.get("calibrated") else "simulated"
        if data.get("figures"):
            label = f"simulated, {short_figures(data['figures'])}"
        lines.append(f"| {name} (`{data.get('schedule', '')}`) | {data['step_ms']:.3f} | {data['tokens_per_s']:.1f} | "
                     f"{data['exposed_dma_ms']:.3f} | {data['vmem_peak_bytes'] / MIB:.1f} | "
                     f"{100 * data['busy_fraction'].get('hbm', 0.0):.0f} % | {label} |")
    lines += ["", "Trace of the best schedule: `trace.json` (open in ui.perfetto.dev).", "",
              "![timeline of three layers, simulated](timeline.png)", ""]
    return lines


def _kernel_section(run: DemoRun) -> list[str]:
    step = _step(run, "run-kernel")
    lines = ["## 4. The Pallas megakernel with the chosen schedule (kimi-k3-mini, all 93 layers)", ""]
    problem = _failed(step)
    if problem:
        return [*lines, problem, ""]
    path = run.config.out_dir / "measurements.jsonl"
    records = [record for _line, record in read_user_jsonl(path)] if path.exists() else []
    if not records:
        return [*lines, "No measurement record was written.", ""]
    record = records[-1]
    backend = record.get("backend", "?")
    lines += [
        f"- backend: `{backend}` — " + ("**not a TPU timing** (TPU interpret mode on a CPU: it checks "
                                        "correctness and DMA/semaphore semantics; the interpreter has no clock)"
                                        if "interpret" in backend else "measured natively"),
        f"- ms per step (median of {record.get('steps', '?')}): {_fmt(record.get('ms_per_step_median'))} "
        f"(measured on {backend})",
        f"- schedule hash `{record.get('schedule_hash', '?')}`; checked against the pure-JAX reference: "
        f"max abs error {_fmt(record.get('max_abs_error'), 5)}",
        "",
    ]
    return lines


def _calibration_section(run: DemoRun, name: str, title: str) -> list[str]:
    step = _step(run, name)
    lines = [title, ""]
    problem = _failed(step)
    if problem:
        return [*lines, problem, ""]
    assert step is not None
    data = step.data
    if data.get("procedure") == "part by part":
        return [*lines, *_parts_lines(data),
                *_points_lines(data, data.get("e2e_fit", {}).get("points", []), run.config.out_dir)]
    kept = [r["reason"] for r in data.get("refusals", []) if r.get("overridden")]
    if kept:
        lines += ["Kept despite failed checks (the demo passes " + ", ".join(sorted(
            {r["override"] for r in data["refusals"] if r.get("overridden")})) + "): " + "; ".join(kept) + ".", ""]
    if data.get("success", True):
        lines.append(f"Solver: converged ({data.get('message', '')}).")
    else:
        lines.append(f"Solver: **did not converge** ({data.get('message', '')}); the demo keeps the overlay "
                     "(`--allow-unconverged`), so treat the calibrated figures below with suspicion.")
    lines += [
        "",
        "| error (MAPE) | before calibration | after calibration |", "| --- | ---: | ---: |",
        f"| points fitted | {_pct(data.get('mape_before_calibration'))} | {_pct(data.get('mape_calibration'))} |",
        f"| points held out ({data.get('holdout') or 'none'}) | {_pct(data.get('mape_before_holdout'))} | "
        f"{_pct(data.get('mape_holdout'))} |",
        f"| leave-one-out, points fitted | — | {_pct(data.get('mape_loo'))} |",
        "",
        f"| parameter | {_catalog_word(data)} | calibrated | ± (1σ) |", "| --- | ---: | ---: | ---: |",
    ]
    for path, parameter in data.get("parameters", {}).items():
        sigma = parameter.get("uncertainty")
        sigma_text = "—" if sigma is None else f"{sigma:.3g}"
        lines.append(f"| `{path}` | {parameter['published']:.4g} | {parameter['value']:.4g} | {sigma_text} |")
    return lines + _points_lines(data, data.get("points", []), run.config.out_dir)


def _catalog_word(data: dict[str, Any]) -> str:
    """What the catalog's figures are for the calibrated chip: the host CPU's were probed on this
    machine (measured), every other chip's are published."""
    return "probed on this host" if str(data.get("chip", data.get("hardware", ""))).startswith("host") else "published"


def _points_lines(data: dict[str, Any], points: list[dict[str, Any]], out_dir: Path) -> list[str]:
    lines = ["", f"| point | set | measured ms | simulated ({_catalog_word(data)} figures) ms | "
             "simulated (calibrated) ms |",
             "| --- | --- | ---: | ---: | ---: |"]
    for point in points:
        lines.append(f"| {point['key']} | {point['set']} | {point['measured_ms']:.3f} ({point['measured_label']}) | "
                     f"{point['simulated_uncalibrated_ms']:.3f} | {point['simulated_calibrated_ms']:.3f} |")
    report = data.get("report")
    if report:
        lines += ["", f"Full report: `{_relative(Path(report), out_dir)}`"]
    lines.append("")
    return lines


def _parts_lines(data: dict[str, Any]) -> list[str]:
    """A part-by-part calibration (:mod:`calibration.sources.tpu_calibration`): each part's error on its own
    measurements, the end-to-end error before and after fitting on the step times, the
    parameters with the data that pinned them, and those held as unidentifiable."""
    lines = ["Procedure: part by part (each part fitted on its own measurements, then the step times).", "",
             "| measurement set | points | MAPE before | MAPE after |", "| --- | ---: | ---: | ---: |"]
    for name, errors in data.get("errors_by_measurement_set", {}).items():
        lines.append(f"| {name} | {errors.get('points', '?')} | {_pct(errors.get('mape_before'))} | "
                     f"{_pct(errors.get('mape_after'))} |")
    lines += [
        "", "| end-to-end error (MAPE) | value |", "| --- | ---: |",
        f"| {_catalog_word(data)} figures | {_pct(data.get('mape_e2e_published'))} |",
        f"| the parts' values, not fitted on the step times | {_pct(data.get('mape_e2e_parts_only'))} |",
        f"| after fitting on the step times, points fitted | {_pct(data.get('mape_calibration'))} |",
        f"| after fitting, points held out ({data.get('holdout') or 'none'}) | {_pct(data.get('mape_holdout'))} |",
        "", f"| parameter | catalog figure ({_catalog_word(data)}, or assumed) | calibrated | ± (1σ) | fitted on |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    published = _published_figures(str(data.get("chip", "")))
    for path, parameter in data.get("parameters", {}).items():
        sigma = parameter.get("uncertainty")
        before = published.get(path)
        lines.append(f"| `{path}` | {'—' if before is None else f'{before:.4g}'} | {parameter['value']:.4g} | "
                     f"{'—' if sigma is None else f'{sigma:.3g}'} | {parameter.get('fitted_on', '')} |")
    held = data.get("unidentifiable_held", {})
    if held:
        lines += ["", "Held at their published values (the data cannot pin them):", ""]
        lines += [f"- `{path}`: {why}" for path, why in held.items()]
    if data.get("interval_samples"):
        lines += ["", f"Interval samples stored in the overlay: {data['interval_samples']} "
                      f"({data.get('interval_method', '')})."]
    folds = [f["fold"] for f in data.get("leave_one_group_out", [])]
    if data.get("holdout_dimensions"):
        lines += ["", f"Model error from the leave-one-group-out refits over {', '.join(data['holdout_dimensions'])} "
                      f"only ({', '.join(folds)}; the quick demo skips the other dimensions' refits to stay in its "
                      "budget: fewer out-of-sample residuals behind the intervals than a full calibration)."]
    return lines


def _published_figures(chip_name: str) -> dict[str, float]:
    """Path -> catalog value (published, measured or assumed, as labelled there) of every figure of ``chip_name`` (empty if it is unknown)."""
    from hwmodels.catalog import published_chip
    from hwmodels.overlay import iter_figures

    try:
        chip = published_chip(chip_name)
    except Exception:  # a report renders what it has: no published column for an unknown chip
        return {}
    return {path: figure.value for path, figure in iter_figures(chip)}


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def render_report(run: DemoRun, *, reuse: str = "") -> str:
    """The report; ``reuse`` (:func:`calibration.commands.demo_steps.reuse_line`) follows the calibrations."""
    lines = _compare_section(run)
    lines += _floor_section(run)
    lines += _sweep_section(run)
    lines += _simulate_section(run)
    lines += _kernel_section(run)
    lines += _calibration_section(run, "calibrate tpu-v7",
                                  "## 5. Calibration of tpu-v7 on the published TPU7x measurements (Muse Spark)")
    lines += _calibration_section(run, "calibrate host-cpu",
                                  "## 6. The CPU closed loop: host model against XLA-compiled decode steps on this machine")
    lines += _joint_section(run)
    from calibration.commands.demo_measured import measured_section

    lines += measured_section(run)
    if reuse:
        lines += ["", reuse[0].upper() + reuse[1:] + ".", ""]
    lines += ["## Steps", "", "| step | wall s | CPU s | status |", "| --- | ---: | ---: | --- |"]
    for step in run.steps:
        lines.append(f"| {step.name} | {step.wall_s:.1f} | {step.cpu_s:.1f} | "
                     f"{'ok' if step.ok else 'FAILED: ' + step.error} |")
    total = sum(step.wall_s for step in run.steps)
    cpu = sum(step.cpu_s for step in run.steps)
    lines += ["", f"Total: {total:.1f} s wall, {cpu:.1f} s CPU on this machine (CPU: this process and its "
              "sweep workers; wall also counts waiting for a core when other jobs share the machine).", ""]
    return "\n".join(lines)
