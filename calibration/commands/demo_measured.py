"""The demo's "Measured on a real TPU" section: the simulator against the megakernel's own
step times on one TPU v5e, from the committed records (no TPU needed).

:func:`measured_step` re-simulates the committed records with the committed calibration
(:func:`calibration.reports.tpu_v5e_replay.replay`: the probe chip, and each record on the
fitted figures of the fold that held it out; about 25 engine runs, seconds) and draws the
scatter plot; :func:`measured_section` writes it up. The refits themselves are
``tpusim calibrate --hardware tpu-v5e --measurements calibration/data/tpu-v5e-kernel.jsonl``
(minutes), not run by the demo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from calibration.commands.demo_run import DemoRun

STEP = "measured tpu-v5e"
PLOT = "measured-tpu-v5e.png"


def measured_step(out: Path, *, decoders: bool = True) -> dict[str, Any]:
    """The replay and its plot; with ``decoders`` (``--full``) also the decoder table, re-simulated
    (~70 engine runs of the K3 shard, a minute or two): the default demo links the committed page."""
    from calibration.reports.tpu_v5e_decoders import decoder_rows, table_lines
    from calibration.reports.tpu_v5e_replay import replay, scatter
    from calibration.sources.tpu_probes import CALIBRATION_DECODER
    from tpusim.progress_notes import note

    note("re-simulating the committed step times with the held-out fits (1 of 3)")
    data = replay("schedule")
    if decoders:
        note("the kernel's decoders, predicted out of sample (2 of 3)")
        data["decoders"] = table_lines(decoder_rows())  # the kernel today, predicted out of sample
    note("the scatter plot (3 of 3)")
    scatter(data["rows"], out / PLOT, f"K3 TP32 shard on one TPU v5e, the {CALIBRATION_DECODER} kernel\n"
            "predicted vs measured (committed records)")
    data["plot"] = PLOT
    return data


def _pct(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "—"
    return f"{100 * value:+.1f} %" if sign else f"{100 * value:.1f} %"


def _ranking_text(rankings: list[dict[str, Any]], batch: int) -> str:
    found = next((r for r in rankings if r["batch"] == batch), None)
    if found is None:
        return f"batch {batch}: no records"
    resolved = found.get("tau_resolved")
    over = "" if resolved is None else (f" ({resolved:+.2f} over the {found['pairs_resolved']} of {found['pairs']} "
                                        "pairs whose measured gap exceeds their spreads)")
    return (f"batch {batch}: Kendall τ {found['tau']:+.2f} over {found['schedules']} schedules{over}; the simulator "
            f"picks {found['pick']}, measured best {found['best']}, regret {100 * found['regret']:.2f} %")


def measured_section(run: DemoRun) -> list[str]:
    from calibration.reports.tpu_v5e_decoders import EARLIER_DECODER
    from calibration.sources.tpu_probes import CALIBRATION_DECODER
    from megakernel.quant_pairs import KERNEL_DECODER

    now = ": the kernel as it is now" if CALIBRATION_DECODER == KERNEL_DECODER else ""
    step = next((s for s in run.steps if s.name == STEP), None)
    lines = ["## 8. Measured on a real TPU: the K3 shard on one TPU v5e", ""]
    if step is None:
        return []
    if not step.ok:
        return [*lines, f"**Failed**: {step.error}", ""]
    data = step.data
    cover = data["coverage"]
    lines += [
        "The megakernel ran one device's program of K3's TP32 plan (real widths, 93 layers, context 1024) on a "
        "TPU v5e; its median step times are committed (`calibration/data/tpu-v5e-kernel.jsonl`, the "
        f"`{CALIBRATION_DECODER}` kernel's records{now}). Here they are "
        "re-simulated from those records, no TPU needed: **(b)** with the figures the chip's probes measured "
        "and by the kernel's own fixed-cost probe (experts capped; no decode step time read), **(c)** with the figures `tpusim calibrate --hardware tpu-v5e` fitted on the "
        "*other* half of the schedules (each row predicted by a fit that never saw it; the fits themselves are "
        f"committed in `calibration/data/tpu-v5e-heldout.json`, not rerun by the demo). Fitted: "
        f"{', '.join(f'`{p}`' for p in data.get('fitted') or [])}.",
        "",
        "| schedule | batch | measured ms (tpu-v5e) | (b) probes ms | (c) held out ms | 90 % interval | inside |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in data["rows"]:
        error = (row["heldout_ms"] - row["measured_ms"]) / row["measured_ms"]
        fold = "new record, fit on all" if row["new"] else f"fold {row['fold']}"
        lines.append(f"| {row['schedule']} | {row['batch']} | {row['measured_ms']:.2f} | {row['probes_ms']:.2f} | "
                     f"{row['heldout_ms']:.2f} ({_pct(error, True)}, {fold}) | ±{_pct(row['half_width'])} | "
                     f"{'yes' if row['inside'] else 'no'} |")
    lines += [
        "",
        f"- MAPE: (b) probes only {_pct(data['mape']['b'])}; (c) held out {_pct(data['mape']['c'])} (documented "
        f"{_pct(data['documented_mape'])} when the fits were made)"
        + (f"; records added since the fit {_pct(data['mape']['c_new'])}" if data["mape"].get("c_new") else "") + ".",
        f"- 90 % intervals (c): {cover['inside']}/{cover['points']} held-out records inside, mean width "
        f"{_pct(cover['mean_width_rel'])} of the prediction (q: the conformal quantile of the other half's "
        "held-out residuals: their largest while a half holds fewer than 9 records).",
        f"- Ranking (c): {_ranking_text(data['rankings']['c'], 1)}; {_ranking_text(data['rankings']['c'], 8)}.",
        f"- Ranking (b): {_ranking_text(data['rankings']['b'], 1)}; {_ranking_text(data['rankings']['b'], 8)}.",
        "",
        f"![predicted vs measured on tpu-v5e]({data['plot']})",
        "",
        f"**The decoder change** (the kernel's expert decoders rewritten on 2026-12-06, `{EARLIER_DECODER}` -> "
        f"`{KERNEL_DECODER}`, `megakernel/quant.py`): the rows above are the "
        f"`{CALIBRATION_DECODER}` kernel's. The `{KERNEL_DECODER}` kernel's runs again, each predicted from the probes alone (its "
        "decoders' dequant probes and its own fixed-cost probe, experts capped; no decode step time), next "
        f"to the earlier `{EARLIER_DECODER}` kernel's run of the same schedule and batch, measured and "
        "predicted the same way from its own probes:",
        "",
        *data.get("decoders", ["Not re-simulated by the default demo (a minute or two of engine runs): the "
                                "committed table is [docs/tpu-v5e-decoders.md](../docs/tpu-v5e-decoders.md) in the "
                                "repository; `tpusim demo --full` re-simulates it here."]),
        "",
        *xla_lines(),
    ]
    return lines


def xla_lines() -> list[str]:
    """The megakernel next to plain JAX/XLA on the same chip, same weights and bytes (the
    committed :mod:`megakernel.xla_run` records), or nothing when none are committed."""
    from calibration.reports.chip_vs_xla import RECORDS, rows, table

    if not RECORDS.is_file():
        return []
    found = rows(RECORDS)
    if not found:
        return []
    return ["**Against what a user would run instead** (measured on tpu-v5e, each pair in one process on the same "
            "weights, state and tokens): `megakernel.xla_baseline`, the step as one `jax.jit` with the MoE reading "
            "only the chosen experts, so the HBM bytes per step are the kernel's "
            "(`benchmarks/bench_chip_vs_xla.py`).", "", table(found), ""]
