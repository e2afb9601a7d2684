"""Joint sweeps at several batch sizes and one report over them (``tpusim sweep --space joint --batches``).

    tpusim sweep --model kimi-k3 --hardware tpu-v7 --chips 16 --space joint --batches 1,2,4,8 \\
        --budget 150 --out DIR

Steps of :func:`run_joint_batches`:

1. **One joint sweep per batch** (:func:`tpusim.sweep.joint.run_joint_sweep`) into
   ``DIR/batch-<N>`` with ``--budget`` full-step simulations each; every sub-folder is a
   complete joint sweep (``sweep.csv``, ``best.json``, ``summary.md``, the journal) and
   ``--resume`` resumes each one. Each batch's study first asks the winning parameters of
   the batches searched before it (``source: seeded``); once all are searched, a batch that
   has not evaluated the winner of a batch searched after it resumes for one more round
   (``ASK_BATCH`` simulations past ``--budget``) that asks those winners first. Why: a
   search with a modest budget misses at one batch what it finds at another (K3 on tpu-v7
   x16, calibrated, budget 500 per batch: batch 1's winner was 1.135x at batch 2, batch 2's
   own search 1.098x; with the seeding forward only, batch 8's winner was 1.130x at batch 2
   and 1.093x at batch 4, against their own 1.108x and 1.088x). Each winner carries its robust choice
   (:mod:`tpusim.sweep.joint_robust`: interval, P(faster than published)).
2. **The report** ``DIR/report.md``: per batch the best deployment, its tokens/s with
   interval, the published design's, the speedup, P(best faster than published); then per
   batch what changed (plan, collective algorithms, schedule knobs: published → best) and
   the engine's time breakdown of both side by side (``SimResult.breakdown_s``: compute per
   phase, collectives, fixed overheads, exposed copies, drain; they sum to the step), with
   what limits the winner (its largest share) and where its gain comes from (the largest
   reductions).
3. **Cross-batch check**: every batch's winner is simulated at every other batch (the
   same workload otherwise, the centre chip; ``len(batches)²`` full steps at most). A
   search with a modest budget can miss at one batch what it found at another; the table
   says so (a winner from batch ``j`` faster at batch ``i`` than batch ``i``'s own), with
   the speedup over batch ``i``'s published design. Such an entry has no interval (it was
   not re-simulated on the samples) and does not replace ``batch-i/best.json``.
4. **The plot** ``DIR/pareto.png``: every simulated candidate of every batch, tokens/s
   (simulated, log scale) against static VMEM, coloured by plan, one marker per batch, the
   published design of each batch as a star.

Every time is *simulated* on the chip the sweeps were given (its calibrated overlay unless
``--uncalibrated``); intervals and P(best) are over the calibration's parameter samples, or
absent on prior figures, and the report says which.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hwmodels import values
from hwmodels.errors import InputError
from tpusim.report.figures import distinct_colours, save_png
from tpusim.sweep.joint import ASK_BATCH, JointResult, run_joint_sweep, winner_params
from tpusim.sweep.joint_report import _changes
from tpusim.sweep.joint_robust import interval_text, terms_text
from tpusim.sweep.outputs import write_text_atomic

COMPUTE = ("attention", "moe", "mlp", "head")
ROWS = (*COMPUTE, "collectives", "fixed_overheads", "exposed_dma", "drain", "step")
WHAT = {"compute": "compute (attention + MoE + MLP + head)", "collectives": "collectives (blocking and waits)",
        "exposed_dma": "exposed weight copies", "fixed_overheads": "fixed overheads (per step, per layer)",
        "drain": "drain (copies and collectives finishing after the last op)"}


def parse_batches(text: str) -> list[int]:
    """``1,2,4,8`` → ``[1, 2, 4, 8]`` (distinct positive integers, in the order given)."""
    batches = [int(b) for b in values.number_list(text, "--batches", kind=int, minimum=1)]
    if len(set(batches)) != len(batches):
        raise InputError(f"--batches {text!r}: expected distinct positive integers, e.g. 1,2,4,8")
    return batches


def run_joint_batches(model: Any, system: Any, batches: list[int], *, out_dir: Path | str, command: str = "",
                      plots: bool = True, **kwargs: Any) -> list[JointResult]:
    """Steps 1-3 of the module docstring; ``kwargs`` go to every :func:`run_joint_sweep`."""
    out = Path(out_dir)
    results: list[JointResult] = []
    for batch in batches:  # each batch's study asks the winners found before it first
        results.append(run_joint_sweep(model, system, batch, out_dir=out / f"batch-{batch}", plots=plots,
                                       seed_trials=_winners(results, set()), **kwargs))
    for index, batch in enumerate(batches):  # ... and then the winners found after it
        later = _winners(results[index + 1:], {row["hash"] for row in results[index].rows})
        if later:  # one more round of this batch's study, the later winners first
            options = {**kwargs, "resume": True, "budget": kwargs.get("budget", 2000) + ASK_BATCH}
            results[index] = run_joint_sweep(model, system, batch, out_dir=out / f"batch-{batch}", plots=plots,
                                             seed_trials=later, **options)
    header = {"model": model.name, "hardware": system.chip.name, "chips": system.chips, "devices": system.devices}
    cross = cross_batch(model, system, batches, results, kwargs)
    write_text_atomic(out / "report.md", batches_report(results, batches, header, command, cross))
    if plots:
        pareto_over_batches(results, batches, out / "pareto.png", header)
    return results


def _winners(results: list[JointResult], seen: set[str]) -> list[dict[str, Any]]:
    """The winning parameters of ``results`` (trials only), once per winner, bar those in ``seen``."""
    out: dict[str, dict[str, Any]] = {}
    for result in results:
        params = winner_params(result)
        if params is not None and result.best_row["hash"] not in seen:
            out.setdefault(result.best_row["hash"], params)
    return list(out.values())


def cross_batch(model: Any, system: Any, batches: list[int], results: list[JointResult],
                options: dict[str, Any]) -> dict[tuple[int, int], float | str]:
    """Step 3: ``{(batch, winner's batch): step ms (simulated) or why it does not run}``."""
    from tpusim.engine import simulate
    from tpusim.schedule.issue_plan import UnsupportedIssuePlan
    from tpusim.schedule.vmem import InfeasibleSchedule
    from tpusim.sweep.joint import JointWorkload
    from tpusim.workload.routing import RoutingModel

    out: dict[tuple[int, int], float | str] = {}
    for batch, result in zip(batches, results, strict=True):
        workload = JointWorkload(model, system, batch, options.get("context_tokens", 1024),
                                 options.get("routing") or RoutingModel("uniform"), options.get("seed", 0),
                                 options.get("sequences"))
        out[(batch, batch)] = result.best_row["predicted_ms"]
        for other, winner in zip(batches, results, strict=True):
            if other == batch:
                continue
            schedule = winner.best
            try:
                program = workload.program(workload.plan(schedule.deployment))
                out[(batch, other)] = simulate(program, schedule, system.chip).step_s * 1e3
            except (InfeasibleSchedule, UnsupportedIssuePlan, InputError, ValueError) as error:
                out[(batch, other)] = f"does not run: {str(error).splitlines()[0][:80]}"
    return out


def split(breakdown: dict[str, float]) -> dict[str, float]:
    """The breakdown in the report's five parts (ms): compute, collectives, exposed DMA, fixed, drain."""
    return {"compute": sum(breakdown.get(k, 0.0) for k in COMPUTE),
            **{k: breakdown.get(k, 0.0) for k in ("collectives", "exposed_dma", "fixed_overheads", "drain")}}


def limits(breakdown: dict[str, float]) -> str:
    """``collectives 52 %, compute 30 %, ...``: the winner's step by part, largest first."""
    parts = split(breakdown)
    step = sum(parts.values()) or 1.0
    return ", ".join(f"{WHAT[k].split(' (')[0]} {100 * v / step:.0f} %"
                     for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v > 0)


def gains(winner: dict[str, float], published: dict[str, float]) -> str:
    """Where the winner's step is shorter than the published one's, largest reductions first."""
    a, b = split(published), split(winner)
    diffs = sorted(((a[k] - b[k], k) for k in a), reverse=True)
    saved = [f"{WHAT[k].split(' (')[0]} −{d:.3f} ms" for d, k in diffs if d > 1e-6]
    lost = [f"{WHAT[k].split(' (')[0]} +{-d:.3f} ms" for d, k in diffs if d < -1e-6]
    text = ", ".join(saved) or "nothing shorter"
    return text + (f"; longer: {', '.join(lost)}" if lost else "")


def published_reason(result: JointResult) -> str:
    """Why the published design has no simulated row (its ``sweep.csv`` reason), or ''."""
    if result.published_row is not None:
        return ""
    row = next((r for r in result.rows if r["source"] == "builtin" and r["name"] == "published"), None)
    return str(row.get("reason") or row["status"]) if row else "not in the sweep"


def batches_report(results: list[JointResult], batches: list[int], header: dict[str, Any], command: str,
                   cross: dict[tuple[int, int], float | str] | None = None) -> str:
    """``report.md``: the table over batches, then per batch what changed and the breakdowns."""
    robust = [r.robust or {} for r in results]
    source = robust[0].get("source", "unknown") if robust else "unknown"
    lines = [f"# Joint search: {header['model']} on {header['hardware']} x{header['chips']} "
             f"({header['devices']} devices), batches {', '.join(map(str, batches))}", ""]
    if command:
        lines += ["Produced by:", "", "```bash", command, "```", ""]
    calibrated = bool(robust and robust[0].get("calibrated"))
    lines += [f"Chip figures: {source}. Every time is simulated (the engine, full step, every layer); "
              + ("intervals are 90 % (parameter spread over the calibration's samples and its model error: "
                 f"{terms_text(robust[0])}); P(best) is paired over the same samples." if calibrated else
                 "no interval and no P(best): prior figures state no spread (calibrate the chip first)."), "",
              "| batch | best plan | collectives | best tokens/s (simulated) | published tokens/s (simulated) "
              "| speedup | P(best faster than published) | winner limited by | full simulations |",
              "| ---: | --- | --- | --- | --- | ---: | ---: | --- | ---: |"]
    for batch, result, rob in zip(batches, results, robust, strict=True):
        best, pub = result.best_row, result.published_row
        win_text = interval_text(rob["winner"]) if rob else f"{best['tokens_per_s']:.1f}"
        pub_text = (interval_text(rob["published"]) if rob and rob.get("published") else
                    f"{pub['tokens_per_s']:.1f}" if pub else "does not run (below)")
        p = rob.get("p_beats_published")
        p_text = f"{p:.2f}" if p is not None else ("– (winner = published)" if pub and pub["hash"] == best["hash"]
                                                   else "– (no samples)")
        speed = f"{result.speedup:.3f}x" if result.speedup is not None else "–"
        limit = limits(rob["breakdown_ms"]["winner"]).split(",")[0] if rob.get("breakdown_ms") else "–"
        lines.append(f"| {batch} | {best['plan']} | {best['collectives'] or 'as the plan'} | {win_text} | {pub_text} "
                     f"| {speed} | {p_text} | {limit} | {result.simulated} |")
    if cross and len(batches) > 1:
        lines += ["", "### Cross-batch check: each batch's winner at every batch (ms/step, simulated, centre chip)",
                  "", "| at batch | published | " + " | ".join(f"winner of batch {b}" for b in batches)
                  + " | fastest vs published |", "| ---: | ---: | " + " | ".join("---:" for _ in batches) + " | --- |"]
        for batch, result in zip(batches, results, strict=True):
            cells = [cross[(batch, other)] for other in batches]
            numbers = {other: v for other, v in zip(batches, cells, strict=True) if isinstance(v, float)}
            fastest = min(numbers, key=lambda b, own=batch: (numbers[b], b != own))  # a tie: the batch's own
            pub_ms = result.published_row["predicted_ms"] if result.published_row else None
            note = f"winner of batch {fastest}" + (f": {pub_ms / numbers[fastest]:.3f}x" if pub_ms else
                                                   " (no published row)")
            if fastest != batch:
                note += f" (the batch-{batch} search missed it)"
            lines.append(f"| {batch} | {pub_ms:.4f} | " if pub_ms else f"| {batch} | – | ")
            lines[-1] += " | ".join(f"{v:.4f}" if isinstance(v, float) else v for v in cells) + f" | {note} |"
    for batch, result, rob in zip(batches, results, robust, strict=True):
        best, pub = result.best_row, result.published_row
        lines += ["", f"## Batch {batch}", "",
                  f"Best: plan `{best['plan']}`, collectives {best['collectives'] or 'as the plan'}, "
                  f"schedule `batch-{batch}/best.json` ({best['predicted_ms']:.4f} ms/step simulated"
                  + (f" vs published {pub['predicted_ms']:.4f} ms: {result.speedup:.3f}x)." if pub else ").")]
        if pub is None:
            lines += ["", f"The published design does not run at batch {batch}: {published_reason(result)}. "
                      "There is no speedup to state; the best is compared with nothing."]
        changed = _changes(best, pub)
        lines += ["", "What changed (published → best):", ""]
        lines += ([f"- {c}" for c in changed] if changed else
                  ["- nothing: the published design is the best found"] if pub else ["- (no published row)"])
        breakdown = rob.get("breakdown_ms", {})
        if "winner" in breakdown and "published" in breakdown:
            w, p_ = breakdown["winner"], breakdown["published"]
            lines += ["", "| ms per step (simulated) | published | best | best − published |",
                      "| --- | ---: | ---: | ---: |"]
            for key in ROWS:
                lines.append(f"| {key} | {p_.get(key, 0.0):.4f} | {w.get(key, 0.0):.4f} "
                             f"| {w.get(key, 0.0) - p_.get(key, 0.0):+.4f} |")
            lines.append(f"| HBM busy (share of the step) | {100 * p_['hbm_busy_fraction']:.0f} % "
                         f"| {100 * w['hbm_busy_fraction']:.0f} % | |")
            lines += ["", f"Why it helps: {gains(w, p_)}.", f"What limits the best: {limits(w)} of its step."]
    lines += ["", "![tokens/s against static VMEM, coloured by plan](pareto.png)", ""]
    return "\n".join(lines)


def pareto_over_batches(results: list[JointResult], batches: list[int], path: Path, header: dict[str, Any]) -> Path:
    """Step 3 of the module docstring."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    markers = "os^Dvp<>h*"
    plans = sorted({r["plan"] for result in results for r in result.rows if r["status"] == "simulated"})
    colours = distinct_colours(plans)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for k, (batch, result) in enumerate(zip(batches, results, strict=True)):
        rows = [r for r in result.rows if r["status"] == "simulated" and r.get("vmem_static_mib") is not None]
        for plan in plans:
            mine = [r for r in rows if r["plan"] == plan]
            if mine:
                ax.scatter([r["vmem_static_mib"] for r in mine], [r["tokens_per_s"] for r in mine], s=12,
                           color=colours[plan], marker=markers[k % len(markers)], alpha=0.6)
        pub = result.published_row
        if pub:
            ax.scatter([pub["vmem_static_mib"] or 0], [pub["tokens_per_s"]], marker="*", s=160, color="red",
                       edgecolor="k", zorder=5)
        best = result.best_row
        gain = f"{result.speedup:.2f}x" if result.speedup is not None else "(no published row)"
        ax.annotate(f"b{batch} best {gain}", (best["vmem_static_mib"] or 0, best["tokens_per_s"]),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color=colours[p], label=p) for p in plans]
    handles += [Line2D([], [], ls="", marker=markers[k % len(markers)], color="grey", label=f"batch {b}")
                for k, b in enumerate(batches)]
    handles.append(Line2D([], [], ls="", marker="*", color="red", markersize=10, label="published"))
    ax.set_yscale("log")
    ax.set_xlabel("static VMEM, MiB (the one accounting)")
    ax.set_ylabel("tokens/s (simulated, log scale)")
    ax.set_title(f"{header['model']} on {header['hardware']} x{header['chips']}: joint search, colour = plan, "
                 "marker = batch", fontsize=9)
    ax.legend(handles=handles, fontsize=6, loc="best")
    save_png(fig, path)
    return path
