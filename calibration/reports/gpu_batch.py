"""The GPU batch-growth fit as tables, its transfer to Kimi K3, and the overlays it feeds.

``python -m calibration.reports.gpu_batch`` prints (Markdown) what docs/gpu-batch.md records:

0. the frozen split (file, date, rule, sides), fit and held-out TPOT error with and without
   the mechanisms found on held-out rows, and each sweep's level from the priors (no anchor);
   then TTFT under load (:mod:`calibration.sources.gpu_batch_ttft`): fit and held-out TTFT
   error, anchored and level, against the prompt's prefill alone, and per point; then the
   per-distinct-expert check (:mod:`calibration.sources.gpu_batch_experts`, refits on held-out
   rows: a diagnostic); then speculative decoding at batch
   (:mod:`calibration.sources.gpu_batch_speculative`: S1a's MTP rows, the draft + verify rule
   against the plain-step prediction, fit and held-out sides by the split's rule);
1. the fitted figures (:mod:`calibration.sources.gpu_batch_sweeps`, through the core's one
   solver entry) and the model error (the core's split-conformal rule on the held-out fold);
2. per sweep, predicted vs measured TPOT by concurrency, before (the engine as it was: no
   batch terms) and after, and the held-out summary (MAPE, max error, points, sweeps, GPUs)
   of the core's leave-one-group-out fold ``role=held-out``;
3. with ``--k3``: Kimi K3 (MXFP4, the GPU format) on 8 B300 (TP8, SGLang's K3 recipe) and on
   16 GB200 (attention TP16 + experts TP4 x EP4, the plan ``tpusim compare`` picks) at batch
   1-64, context 8192 + 512: the step before and after, the serving TPOT with the prefill
   stall of 8k prompts (SGLang: prefill steps between decode steps), and the time breakdown.

``--write-overlays`` lays the fitted figures (the TTFT figures too: ``tpusim serving`` adds the
request overhead to every TTFT) and the model error into the calibrated overlays
of ``b200`` (where most sweeps ran) and ``b300`` (GB200 / GB300 take b300's figures as
*derived*, ``execution.gpu.stack_figures_from``); an existing overlay keeps its parameters.
The model error is written for predictions in and out of the fit's range alike
(:data:`calibration.sources.gpu_batch_ttft.OVERLAY_NOTE`), not the core's default doubling outside it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from calibration.core import ModelError
from calibration.core.overlay_builder import write_overlay
from calibration.core.parameters import chip_with
from calibration.sources import gpu_batch_data as data
from calibration.sources import gpu_batch_experts as experts
from calibration.sources import gpu_batch_mechanisms as mechanisms
from calibration.sources import gpu_batch_speculative as speculative
from calibration.sources import gpu_batch_sweeps as sweeps
from calibration.sources import gpu_batch_ttft as ttft
from hwmodels.catalog import load_chip
from tpusim.engine import simulate
from tpusim.engine.gpu import gpu_breakdown, gpu_variant
from tpusim.engine.gpu_batch import batch_terms, prefill_step_s
from tpusim.schedule.schema import load_schedule
from tpusim.serving.first_token import first_token_wait_s
from tpusim.serving.interference import prefill_stall_s
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.prefill import build_prefill_program
from tpusim.workload.program import build_program

K3_MODEL = "kimi-k3@mxfp4"
K3_CONTEXT = 8192 + 1024 // 2
K3_INPUT, K3_OUTPUT = 8192, 1024
K3_SYSTEMS = (("b300", 8, "tp=8,expert_groups=1,expert_tp=8"), ("gb200", 16, "tp=16,expert_groups=4,expert_tp=4"))
K3_BATCHES = (1, 2, 4, 8, 16, 32, 64)
# K3's nearest public relative at the same 8k/1k: Kimi-K2.5 NVFP4 on B200 (S1b rows 21-25, S1c 41-45)
K25_SWEEPS = ("k25-b200-tp4ep4", "k25-b200-tp4")


def k3_chip(name: str, values: dict[str, float] | None) -> Any:
    """``name`` as published, its K3 stack, the K3-on-B300 batch-1 figures and ``values``."""
    figures = {**data.BATCH1_FIGURES}
    if values:
        figures |= {f.path: values[f.name] for f in sweeps.PARAMETERS}
    return gpu_variant(chip_with(load_chip(name, calibrated=False), figures, fitted_on=data.MEASUREMENT), "stack")


def k3_transfer(values: dict[str, float]) -> list[dict[str, Any]]:
    """K3 step and serving TPOT by batch on each system: before (no batch terms, the engine's
    prefill), main (:data:`sweeps.MAIN_FIGURES`, the engine's prefill) and after (``values``)."""
    model = load_model(K3_MODEL)
    figures = ttft.calibrate_ttft().values
    overhead_s, turnaround_s = figures[ttft.OVERHEAD.name], figures[ttft.TURNAROUND.name]
    out = []
    for name, chips, spec in K3_SYSTEMS:
        plan = plan_for(model, chips, devices_per_chip=1, intra_link="nvlink", choice=spec)
        chip, main_chip = k3_chip(name, values), k3_chip(name, sweeps.MAIN_FIGURES)
        prefill = build_prefill_program(model, plan, tokens=K3_INPUT, prefix_tokens=0)
        engine_prefill = simulate(prefill, load_schedule("naive"), chip)
        prefill_s, main_prefill_s = prefill_step_s(chip, engine_prefill), engine_prefill.step_s
        host_s = engine_prefill.launch_count * values[sweeps.HOST_FIGURE.name]
        for batch in K3_BATCHES:
            program = build_program(model, plan, batch=batch, context_tokens=K3_CONTEXT, sequences=batch)
            result = simulate(program, load_schedule("naive"), chip)
            terms = sum(result.batch_terms_s.values())
            main_step = result.step_s - terms + sum(batch_terms(main_chip, program).values())  # the terms are serial
            stall = prefill_stall_s(batch, prefill_s, K3_OUTPUT)
            stall_before = prefill_stall_s(batch, main_prefill_s, K3_OUTPUT)
            wait_s = first_token_wait_s(concurrency=batch, decode_step_s=result.step_s,
                                        prefill_gpu_s=engine_prefill.step_s, prefill_host_s=host_s,
                                        prompt_tokens=K3_INPUT, output_tokens=K3_OUTPUT,
                                        tpot_s=result.step_s + stall, turnaround_s=turnaround_s)
            out.append({"system": f"{name}:{chips}", "plan": spec, "batch": batch,
                        "step_before_ms": (result.step_s - terms) * 1e3, "step_main_ms": main_step * 1e3,
                        "step_after_ms": result.step_s * 1e3, "prefill_ms": prefill_s * 1e3,
                        "tpot_before_ms": (result.step_s - terms + stall_before) * 1e3,
                        "tpot_main_ms": (main_step + stall_before) * 1e3, "tpot_after_ms": (result.step_s + stall) * 1e3,
                        "ttft_no_load_ms": (overhead_s + prefill_s) * 1e3, "ttft_ms": (overhead_s + wait_s) * 1e3,
                        "breakdown_ms": {k: v * 1e3 for k, v in gpu_breakdown(result).items()}})
    return out


def write_overlays(values: dict[str, float], model_error: ModelError) -> list[str]:
    """The fitted figures + model error into the overlays of
    :data:`calibration.sources.gpu_batch_ttft.OVERLAY_CHIPS` (kept parameters of an existing
    overlay stay), built by the source and written by the one writer."""
    return [str(write_overlay(overlay)) for overlay in ttft.batch_overlays(values, model_error)]


def sweep_markdown(rows: list[dict[str, Any]], held_out: dict[str, Any]) -> str:
    """Per sweep, the table's rows; then the held-out summary before (no batch terms) and after
    (``held_out``: the core's held-out fold)."""
    lines = []
    for key in dict.fromkeys(r["sweep"] for r in rows):
        these = [r for r in rows if r["sweep"] == key]
        lines += [f"**{key}** ({these[0]['gpu']})", "",
                  "| conc | role | measured ms | before ms | error | main ms | error | after ms | error |",
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['concurrency']} | {r['role']} | {r['measured_ms']:.2f} | {r['before_ms']:.2f} | "
                  f"{r['before_error']:+.1%} | {r['main_ms']:.2f} | {r['main_error']:+.1%} | {r['after_ms']:.2f} | "
                  f"{r['after_error']:+.1%} |" for r in these]
        lines.append("")
    summaries = (("before", sweeps.held_out_summary(rows, "before_error")),
                 ("main", sweeps.held_out_summary(rows, "main_error")), ("after", held_out))
    lines += ["| held out | MAPE | max abs error | worst point | points | sweeps | GPU types |",
              "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for name, s in summaries:
        column = f"{name}_error"
        worst = max((r for r in rows if r["role"] == "held-out"), key=lambda r: abs(r[column]))
        lines.append(f"| {name} | {s['mape']:.1%} | {s['max_abs_error']:.1%} | {worst['sweep']}@{worst['concurrency']} "
                     f"{worst[column]:+.1%} | {s['points']} | {s['sweeps']} | {', '.join(s['gpu_types'])} |")
    return "\n".join(lines) + "\n"


def split_markdown() -> str:
    """The frozen split (file, date, rule, sides), fit and held-out TPOT error with and without
    the mechanisms found on held-out rows, and each sweep's level from the priors (no anchor)."""
    split = sweeps.load_split()
    lines = [f"Split: `{data.SPLIT_FILE.relative_to(data.DATA_DIR.parents[1])}`, frozen on {split['frozen_on']}",
             "", f"- rule: {split['rule']}", f"- fit sweeps: {', '.join(split['fit_sweeps'])}",
             f"- held-out sweeps: {', '.join(split['held_out_sweeps'])}", "",
             "Mechanisms added while looking at held-out rows (of the earlier split):", ""]
    lines += [f"- {m['name']} ({m['commit']}, `{m['where']}`): found on {m['found_by']}; without: {m['without']}"
              for m in split["mechanisms_found_on_held_out_rows"]]
    lines += ["", "| mechanisms | fit MAPE | fit max | fit points | held-out MAPE | held-out max | held-out points "
              "| sweeps | GPU types | grouped_gemm_expert_s us |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: "
              "| ---: | --- | ---: |"]
    for variant in mechanisms.MECHANISM_VARIANTS:
        s = sweeps.split_summary(variant)
        fit, held = s["fit"], s["held-out"]
        lines.append(f"| {variant.label} | {fit['mape']:.1%} | {fit['max_abs_error']:.1%} | {fit['points']} | "
                     f"{held['mape']:.1%} | {held['max_abs_error']:.1%} | {held['points']} | {held['sweeps']} | "
                     f"{', '.join(held['gpu_types'])} | {s['values']['grouped_gemm_expert_s'] * 1e6:.3f} |")
    fitted = sweeps.calibrate().values
    priors, after = sweeps.level_rows(), {r["sweep"]: r for r in sweeps.level_rows(fitted)}
    lines += ["", "Level: each sweep's lowest-concurrency TPOT with no anchor (model(C0) from the declared priors; "
              "and with the fitted figures)", "",
              "| sweep | side | GPU | conc | measured ms | from priors ms | error | fitted ms | error |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['sweep']} | {r['side']} | {r['gpu']} | {r['concurrency']} | {r['measured_ms']:.2f} | "
              f"{r['predicted_ms']:.2f} | {r['error']:+.1%} | {after[r['sweep']]['predicted_ms']:.2f} | "
              f"{after[r['sweep']]['error']:+.1%} |" for r in priors]
    for side in ("fit", "held-out"):
        errors = [abs(r["error"]) for r in priors if r["side"] == side]
        lines.append(f"\nLevel from priors, {side} sweeps: MAPE {sum(errors) / len(errors):.1%}, "
                     f"max {max(errors):.1%} ({len(errors)} sweeps)")
    return "\n".join(lines) + "\n"


def ttft_markdown() -> str:
    """TTFT under load: the fitted figures, fit and held-out MAPE (anchored / level / no load) and
    every point, each column labelled."""
    summary = ttft.ttft_summary()
    values = summary["values"]
    lines = ["TTFT under load (SGLang's scheduler, tpusim.serving.first_token; S4 medians: published; "
             "predictions: simulated from the engine's cached prefill and decode steps and the TPOT fit). "
             "Fitted (calibration core) on the fit side's TTFT rows only (DeepSeek-R1, 9 points): "
             f"`{ttft.OVERHEAD.path}` {values[ttft.OVERHEAD.name] * 1e3:.1f} ms, "
             f"`{ttft.TURNAROUND.path}` {values[ttft.TURNAROUND.name] * 1e3:.2f} ms "
             f"(prior {float(ttft.TURNAROUND.prior or 0.0) * 1e3:.0f} ms; bounds "
             f"{ttft.TURNAROUND.bound('gpu').text()} s)", "",
             "| side | form | points | TTFT MAPE | max abs error |", "| --- | --- | ---: | ---: | ---: |"]
    forms = (("anchored", "anchored on concurrency 1, concurrency > 1"),
             ("no_load", "anchored, the prompt's prefill alone (before), concurrency > 1"),
             ("level", "level (no anchor), every point"), ("level_loaded", "level, concurrency > 1"))
    for side in ("fit", "held-out"):
        for key, label in forms:
            s = summary[side][key]
            lines.append(f"| {side} | {label} | {s['points']} | {s['mape']:.1%} | {s['max_abs_error']:.1%} |")
    fold = summary["held-out"]["level_fold"]
    lines += ["", f"Held-out level, the core's fold role=held-out (refit without them): MAPE {fold['mape']:.1%} over "
              f"{fold['points']} points. TPOT (above) is unchanged by this rule.", "",
              "| sweep | conc | side | measured ms (median) | no load ms | error | anchored ms | error | level ms | "
              "error |", "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['sweep']} | {r['concurrency']} | {r['role']} | {r['measured_ms']:.1f} | {r['no_load_ms']:.1f} | "
              f"{r['no_load_error']:+.1%} | {r['anchored_ms']:.1f} | {r['anchored_error']:+.1%} | "
              f"{r['level_ms']:.1f} | {r['level_error']:+.1%} |" for r in ttft.ttft_rows(values)]
    return "\n".join(lines) + "\n"


def experts_markdown() -> str:
    """Per family, the per-distinct-expert figure its points ask for beside one expert's copy time."""
    lines = ["Per distinct expert beyond its bytes (diagnostic: `grouped_gemm_expert_s` refitted per model family "
             "on its non-anchor points, held-out rows included; the other figures at the shipped fit; *calibrated* "
             "figures, *published* chip bandwidth; nothing here enters the shipped model)", "",
             "| family | points | figure us (per grouped GEMM) | 1σ us | per expert us (2 GEMMs) | TPOT MAPE | "
             "most extra expert GEMMs per step | largest expert slice MB | its copy us |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for f in experts.family_fits():
        sigma = "at bound" if f.at_bound else f"{f.sigma_s * 1e6:.3f}"
        lines.append(f"| {f.family} | {f.points} | {f.value_s * 1e6:.3f} | {sigma} | {f.per_expert_s * 1e6:.3f} | "
                     f"{f.mape:.1%} | {f.extra_expert_gemms:.0f} | {f.expert_slice_bytes / 1e6:.1f} | "
                     f"{f.expert_copy_s * 1e6:.2f} |")
    return "\n".join(lines) + "\n"


def speculative_markdown(values: dict[str, float]) -> str:
    """Speculative decoding at batch: S1a's MTP TPOT (published, per accepted token) against the
    draft + verify rule and the plain-step prediction, per side, per k, and every point."""
    summaries = {k: speculative.spec_summary(values, k) for k in speculative.SENSITIVITY_DRAFT_TOKENS}
    main = summaries[speculative.MTP_DRAFT_TOKENS]
    lines = ["Speculative decoding at batch (S1a: DeepSeek-R1 NVFP4, Dynamo + TensorRT-LLM, MTP on, disaggregated; "
             "TPOT per accepted token: *published*; predictions: *simulated*, anchored on each segment's lowest "
             "concurrency, batch figures of the shipped TPOT fit; acceptance length *fitted* on the fit side's "
             "S1a B200 points only; sides by the frozen split's rule: B200 fit, GB200 held out; MTP steps k "
             "*assumed*, not published)", "",
             "| k (assumed) | acceptance a (fitted, B200) | implied at anchor (derived) | side | points | "
             "rule MAPE | rule max | plain-step MAPE | plain-step max |",
             "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for k, s in summaries.items():
        bound = " (at bound k+1)" if s["acceptance"] >= k + 1 - 1e-9 else ""
        implied = ", ".join(f"{key} {a:.2f}" for key, a in s["implied_acceptance"].items())
        for side in ("fit", "held-out"):
            rule, plain = s[side]["rule"], s[side]["plain"]
            lines.append(f"| {k} | {s['acceptance']:.2f}{bound} | {implied} | {side} | {rule['points']} | "
                         f"{rule['mape']:.1%} | {rule['max_abs_error']:.1%} | {plain['mape']:.1%} | "
                         f"{plain['max_abs_error']:.1%} |")
    lines += ["", f"Per point (k = {main['draft_tokens']}, a = {main['acceptance']:.2f}):", "",
              "| segment | GPU | conc | rows / worker | role | measured ms | rule ms | error | plain-step ms | error |",
              "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['sweep']} | {r['gpu']} | {r['concurrency']} | {r['rows']} | {r['role']} | {r['measured_ms']:.2f} | "
              f"{r['rule_ms']:.2f} | {r['rule_error']:+.1%} | {r['plain_ms']:.2f} | {r['plain_error']:+.1%} |"
              for r in main["rows"]]
    lines += ["", "Not judged: S3 (DeepSeek-V4 not modelled; server configuration changes with the speculative "
              "setting), S7 (MTP on/off quoted in different tok/s/user bands, tok/s/GPU only: no pair at one "
              "operating point), S1a rows 6-9 and 18-20 (deployment changes per point). The plain TPOT figures "
              "above do not use these rows."]
    return "\n".join(lines) + "\n"


def k3_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| system | batch | step before ms | step main ms | step after ms | TPOT before ms | TPOT main ms | "
             "TPOT after ms |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['system']} | {r['batch']} | {r['step_before_ms']:.2f} | {r['step_main_ms']:.2f} | "
              f"{r['step_after_ms']:.2f} | {r['tpot_before_ms']:.2f} | {r['tpot_main_ms']:.2f} | "
              f"{r['tpot_after_ms']:.2f} |" for r in rows]
    lines.append("")
    for system in dict.fromkeys(r["system"] for r in rows):
        these = [r for r in rows if r["system"] == system and r["batch"] in (1, 16, 64)]
        lines.append(f"- {system} TTFT (simulated: the fitted request overhead + the TTFT rule; closed loop, "
                     f"{K3_INPUT}/{K3_OUTPUT}) at " + ", ".join(
                         f"{r['batch']}: {r['ttft_ms']:.0f} ms (prefill alone {r['ttft_no_load_ms']:.0f})"
                         for r in these))
    lines.append("- K3 on 8 B300, published (SGLang, MXFP4, concurrency 1): TTFT 378 ms")
    lines.append("")
    measured = sweeps.load_rows()
    for system in dict.fromkeys(r["system"] for r in rows):
        tpot = {r["batch"]: r["tpot_after_ms"] for r in rows if r["system"] == system}
        main = {r["batch"]: r["tpot_main_ms"] for r in rows if r["system"] == system}
        lines.append(f"- {system}: TPOT 16/1 {tpot[16] / tpot[1]:.2f} (main {main[16] / main[1]:.2f}), "
                     f"64/1 {tpot[64] / tpot[1]:.2f} (main {main[64] / main[1]:.2f}); 16/4 "
                     f"{tpot[16] / tpot[4]:.2f} (main {main[16] / main[4]:.2f}), 64/4 {tpot[64] / tpot[4]:.2f} "
                     f"(main {main[64] / main[4]:.2f})")
    for key in K25_SWEEPS:
        sweep = next(s for s in sweeps.SWEEPS if s.key == key)
        tpot = {measured[i]["concurrency"]: measured[i]["tpot_ms"] for i in sweep.rows}
        lines.append(f"- Kimi-K2.5 on B200 ({key}, measured): 16/4 {tpot[16] / tpot[4]:.2f}, 64/4 {tpot[64] / tpot[4]:.2f}")
    lines += ["", "Breakdown after (ms):", "", "| system | batch | " + " | ".join(rows[0]["breakdown_ms"]) + " |",
              "| --- | ---: |" + " ---: |" * len(rows[0]["breakdown_ms"])]
    lines += [f"| {r['system']} | {r['batch']} | " + " | ".join(f"{v:.2f}" for v in r["breakdown_ms"].values()) + " |"
              for r in rows if r["batch"] in (1, 16, 64)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m calibration.reports.gpu_batch", description=__doc__.split("\n")[0])
    parser.add_argument("--k3", action="store_true", help="also the K3 transfer (minutes)")
    parser.add_argument("--write-overlays", action="store_true", help="write the b200 / b300 overlays")
    args = parser.parse_args(argv)
    result = sweeps.calibrate()
    values = result.values
    rows = sweeps.table(values)
    error = result.model_error
    paths = result.solution.problem.paths
    at_bound = dict(zip(paths, result.solution.at_bound.tolist(), strict=True))
    sigma = dict(zip(paths, result.solution.sigma.tolist(), strict=True))

    def how(path: str) -> str:
        if path == sweeps.HOST_FIGURE.path:
            implied = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in sweeps.ttft_host_op_s().items())
            return f"held at what the concurrency-1 TTFTs imply: {implied}"
        if path in sweeps.HELD:
            return "prior, held"
        if at_bound[path]:
            return "fitted, at a bound"
        return f"fitted, 1σ {sigma[path] * 1e6:.3f} us"

    out = [split_markdown(), ttft_markdown(), experts_markdown(), speculative_markdown(values), "Fitted (calibration core, " + data.MEASUREMENT + "):", ""]
    out += [f"- `{f.path}`: {values[f.name] * 1e6:.3f} us ({how(f.path)}; prior {float(f.prior or 0.0) * 1e6:.3f} us)"
            for f in sweeps.PARAMETERS]
    out += ["", f"Model error (split-conformal 90 %, held-out fold {result.held_out.name}): {error.in_range_rel:.1%} "
            f"over {error.points} points{'' if error.exact else ' (not exact: too few points)'}", "",
            sweep_markdown(rows, sweeps.fold_summary(result.held_out))]
    if args.k3:
        out.append(k3_markdown(k3_transfer(values)))
    if args.write_overlays:
        out += ["Overlays written: " + ", ".join(write_overlays(values, error))]
    sys.stdout.write("\n".join(out) + "\n")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())

__all__ = ["k3_transfer", "main", "write_overlays"]
