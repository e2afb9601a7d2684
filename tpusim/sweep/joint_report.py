"""The joint sweep's report: ``summary.md`` (best deployment against the published one, what
changed, the leaders) and ``pareto.png`` (tokens/s against static VMEM, coloured by plan).

Every time here is *simulated* (the engine on the full step, on the chip the sweep was given:
its calibrated overlay unless ``--uncalibrated``); the screen is the analytic *estimate*,
shown only as the reason a trial was not simulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpusim.report.figures import distinct_colours, save_png
from tpusim.sweep.outputs import csv_cell

# Arguments are tpusim.sweep.joint's JointResult, JointWorkload and JointSpace (typed Any here:
# that module imports this one, and imports point one way).
JointResult = JointWorkload = JointSpace = Any

SKIP = {"trial", "hash", "name", "source", "status", "reason", "predicted_ms", "predicted_by", "tokens_per_s",
        "exposed_dma_ms", "vmem_static_mib", "vmem_peak_mib", "est_ms"}


def _cell(value: Any) -> str:
    """A row's value as ``sweep.csv`` holds it ('-' for none), so that a row read back on
    ``--resume`` (strings) and one made in this run (0, None) read the same: 0 is a value."""
    return csv_cell(value) or "-"


def _changes(best: dict[str, Any], published: dict[str, Any] | None) -> list[str]:
    if published is None:
        return []
    return [f"{key}: {_cell(published.get(key))} → {_cell(best.get(key))}" for key in best
            if key not in SKIP and _cell(best.get(key)) != _cell(published.get(key))]


def joint_summary(result: JointResult, workload: JointWorkload, space: JointSpace) -> str:
    w = workload.describe()
    best, pub = result.best_row, result.published_row
    statuses: dict[str, int] = {}
    for row in result.rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    screened = sum(str(r.get("reason") or "").startswith("screened out") for r in result.rows)
    lines = [
        f"# Joint sweep: {w['model']} on {w['hardware']} x{w['chips']} ({w['devices']} devices), batch {w['batch']}",
        "",
        f"Searched: plan ({len(space.plans)} choices) x collective algorithm per collective x prefetch schedule, "
        f"by Optuna TPE (seed {w['seed']}) then coordinate descent around the best "
        f"({space.polish_share:.0%} of the budget); screen: "
        + (f"analytic estimate, pruned above the {space.screen_percentile:g}th percentile"
           if space.screen_percentile is not None else "none (every valid trial simulated)")
        + f". {result.trials} trials, {len(result.rows)} rows "
        f"({', '.join(f'{v} {k}' for k, v in sorted(statuses.items()))}; {screened} screened out), "
        f"{result.simulated} full-step simulations; this run (since the start or the last --resume): "
        f"{result.wall_s:.1f} s wall, {result.cpu_s:.1f} s CPU in the client process (workers not counted), "
        f"executor {result.executor}. Chip figures: "
        + ("calibrated overlay" if workload.system.chip.is_calibrated else "published (uncalibrated)") + ".",
        "",
        "| | plan | collectives | ms/step (simulated) | tokens/s (simulated) | static VMEM MiB |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for label, row in (("best", best), ("published", pub)):
        if row is None:
            continue
        lines.append(f"| {label} | {row['plan']} | {row['collectives'] or 'as the plan'} | {row['predicted_ms']:.4f} "
                     f"| {row['tokens_per_s']:.1f} | {row['vmem_static_mib'] or 0:.1f} |")
    if result.speedup is not None:
        lines += ["", f"Speedup of the best over the published design: **{result.speedup:.3f}x** (simulated)."]
    changed = _changes(best, pub)
    if changed:
        lines += ["", "What changed (published → best):", "", *[f"- {c}" for c in changed]]
    if result.robust is not None:
        from tpusim.sweep.joint_robust import robust_markdown

        lines += ["", *robust_markdown(result.robust)]
    lines += ["", "## Leaders (simulated)", "", "| rank | trial | plan | collectives | ms/step | tokens/s |",
              "| ---: | ---: | --- | --- | ---: | ---: |"]
    ranked = sorted((r for r in result.rows if r["status"] == "simulated"),
                    key=lambda r: (r["predicted_ms"], r["hash"]))
    for rank, row in enumerate(ranked[:10], 1):
        lines.append(f"| {rank} | {row['trial']} | {row['plan']} | {row['collectives'] or '-'} | "
                     f"{row['predicted_ms']:.4f} | {row['tokens_per_s']:.1f} |")
    reasons: dict[str, int] = {}
    for row in result.rows:
        if row["status"] == "pruned":
            key = str(row.get("reason") or "").split(":", 1)[0]
            reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        lines += ["", "Not simulated, by rule: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))]
    lines += ["", "`best.json` holds the schedule with its deployment (plan + collective algorithms): "
              "`tpusim simulate --schedule best.json` reproduces the best row's step."]
    return "\n".join(lines) + "\n"


def pareto_by_plan(result: JointResult, path: Path, workload: JointWorkload) -> Path:
    """tokens/s (simulated) against static VMEM (MiB), one colour per plan; the Pareto front drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    rows = [r for r in result.rows if r["status"] == "simulated" and r.get("vmem_static_mib") is not None]
    fig, ax = plt.subplots(figsize=(8, 5))
    plans = sorted({r["plan"] for r in rows})
    colours = distinct_colours(plans)
    for plan in plans:
        mine = [r for r in rows if r["plan"] == plan]
        ax.scatter([r["vmem_static_mib"] for r in mine], [r["tokens_per_s"] for r in mine], s=10, label=plan,
                   alpha=0.7, color=colours[plan])
    front, best = [], -1.0
    for row in sorted(rows, key=lambda r: (r["vmem_static_mib"], -r["tokens_per_s"])):
        if row["tokens_per_s"] > best:
            best = row["tokens_per_s"]
            front.append(row)
    ax.step([r["vmem_static_mib"] for r in front], [r["tokens_per_s"] for r in front], where="post", color="k",
            lw=1, label="Pareto front")
    if result.published_row:
        pub = result.published_row
        ax.scatter([pub["vmem_static_mib"] or 0], [pub["tokens_per_s"]], marker="*", s=150, color="red",
                   label="published", zorder=5)
    w = workload.describe()
    ax.set_xlabel("static VMEM, MiB (the one accounting)")
    ax.set_ylabel("tokens/s (simulated)")
    ax.set_title(f"{w['model']} on {w['hardware']} x{w['chips']}, batch {w['batch']}: joint sweep", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
    save_png(fig, path)
    return path
