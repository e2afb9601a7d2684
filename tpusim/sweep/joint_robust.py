"""Robust choice for the joint sweep: the winner's interval and P(best) over the calibration's samples.

The joint sweep (:mod:`tpusim.sweep.joint`) picks the simulated row with the smallest step on
the chip it was given (its calibrated overlay unless ``--uncalibrated``). A calibrated chip
stores parameter sets drawn from the fit's uncertainty (:mod:`tpusim.report.intervals`);
this module asks whether the choice survives them, as the schedule sweep's rows do
(:mod:`tpusim.sweep.intervals`):

1. **Rows.** The ``TOP`` fastest simulated rows and the published design (``leading_rows``:
   ``published`` appended when it is not among them). Each row's schedule is rebuilt with
   its deployment (plan + collective algorithms) and checked against the row's hash.
2. **Re-simulate** every row on every sampled chip, each row with its own plan's program
   (a deployment changes the program): ``len(rows) x samples`` full-step simulations, plus
   the winner and the published design once on the centre chip for their time breakdowns.
3. **Intervals** per row from :func:`tpusim.report.intervals.step_fields`: parameter spread
   (the row's own re-simulations) combined with the overlay's out-of-sample model error
   (extrapolated outside the fit, and the text says why).
4. **P(best)**, paired (the same sampled chip for every row):
   ``p_beats_published`` = the share of samples on which the winner's step is *strictly*
   shorter than the published design's; ``p_best`` per leader = the share on which it is
   the fastest of the leaders (a tie goes to the better-ranked row). Model error is common
   to both designs of a pair and is not sampled: P(best) is over parameter uncertainty only.

Without samples there is nothing to pair: a chip with a model error only gets intervals
from it and no P(best); a chip without a calibrated overlay runs on its *prior* figures
(the catalog's, which state no spread), so no interval and no P(best) are printed and the
``source`` says so (as the schedule sweep does). Nothing here changes which row wins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tpusim.report.intervals import interval_terms, no_interval, outside_fit, step_fields
from tpusim.schedule.schema import Deployment, Schedule, load_schedule
from tpusim.sweep.intervals import TOP, leading_rows

MS_PER_S = 1000.0
Suggest = Callable[..., Any]  # tpusim.sweep.joint._suggest: (trial, space, validator, families) -> Proposal


def samples_source(chip: Any) -> str:
    """Which figures the samples come from, in words (calibrated overlay or prior)."""
    if chip.calibration is not None:
        return chip.calibration.note()
    return f"prior: the catalog's {chip.name} figures (no calibration overlay applied; they state no spread)"


def row_schedule(row: dict[str, Any], study: Any, rebuild: tuple[Any, ...], suggest: Suggest) -> Schedule:
    """The schedule (with its deployment) a joint-sweep row ran, checked against its hash:
    a built-in on the row's plan, or the trial's parameters drawn again by ``suggest``
    (:func:`tpusim.sweep.joint._suggest`, passed in: that module imports this one)."""
    if row["source"] in ("builtin", "given"):  # a built-in or a --baseline file, named in the row
        schedule = load_schedule(row["name"]).model_copy(update={"deployment": Deployment(plan=row["plan"])})
    else:
        import optuna

        trial = int(row["trial"])
        proposal = suggest(optuna.trial.FixedTrial(study.get_trials(deepcopy=False)[trial].params, trial), *rebuild)
        if proposal.schedule is None:
            raise AssertionError(f"trial {trial} no longer draws a valid schedule")
        schedule = proposal.schedule
    if schedule.content_hash() != row["hash"]:
        raise AssertionError(f"row {row['hash']} does not rebuild ({schedule.content_hash()})")
    return schedule


def robust_choice(result: Any, workload: Any, study: Any, rebuild: tuple[Any, ...], suggest: Suggest,
                  top: int = TOP) -> dict[str, Any]:
    """Steps 1-4 of the module docstring for a :class:`~tpusim.sweep.joint.JointResult`:
    a JSON-ready dict (``source``, ``samples``, ``winner``, ``published``,
    ``p_beats_published``, ``leaders``, ``breakdown_ms``, ``notes``)."""
    from tpusim.engine import simulate

    chip = workload.system.chip
    rows = leading_rows(result, top)
    terms = interval_terms(chip)
    outside = outside_fit(chip, workload.model.name, workload.system.chips, workload.batch)
    schedules = {r["hash"]: row_schedule(r, study, rebuild, suggest) for r in rows}
    programs: dict[str, Any] = {}

    def program(schedule: Schedule) -> Any:
        deployment = schedule.deployment or Deployment()
        key = f"{deployment.plan}|{sorted(deployment.collectives.items())}"
        if key not in programs:
            programs[key] = workload.program(workload.plan(deployment))
        return programs[key]

    winner, published = result.best_row, result.published_row
    breakdown = {}
    for label, row in (("winner", winner), ("published", published)):
        if row is not None:
            sim = simulate(program(schedules[row["hash"]]), schedules[row["hash"]], chip)
            breakdown[label] = {**{k: v * MS_PER_S for k, v in sim.breakdown_s.items()},
                                "step": sim.step_s * MS_PER_S, "exposed_dma_total": sim.exposed_dma_s * MS_PER_S,
                                "hbm_busy_fraction": sim.busy_fraction.get("hbm", 0.0)}
    notes: list[str] = []
    p_best: list[float | None] = [None] * len(rows)
    p_pub: float | None = None
    if not terms:
        reason = ("uncalibrated figures (prior)" if not chip.is_calibrated
                  else "the overlay stores no samples and no model error")
        fields = [no_interval(reason) for _ in rows]
        notes.append(f"no interval and no P(best): {reason}")
    elif not terms.chips:
        fields = [step_fields(r["predicted_ms"] / MS_PER_S, [], workload.batch, terms.model_error, outside)
                  for r in rows]
        notes.append("no P(best): the overlay stores no parameter samples to pair the designs on")
    else:
        steps = np.array([[simulate(program(schedules[r["hash"]]), schedules[r["hash"]], sample).step_s
                           for sample in terms.chips] for r in rows])
        fields = [step_fields(r["predicted_ms"] / MS_PER_S, steps[i], workload.batch, terms.model_error, outside)
                  for i, r in enumerate(rows)]
        wins = np.bincount(steps.argmin(axis=0), minlength=len(rows))
        p_best = [float(w / len(terms.chips)) for w in wins]
        if published is not None and published["hash"] != winner["hash"]:
            i_win = next(i for i, r in enumerate(rows) if r["hash"] == winner["hash"])
            i_pub = next(i for i, r in enumerate(rows) if r["hash"] == published["hash"])
            p_pub = float(np.mean(steps[i_win] < steps[i_pub]))
        elif published is not None:
            notes.append("the winner is the published design: nothing to compare it with")
    ranked = [r["hash"] for r in sorted((r for r in result.rows if r["status"] == "simulated"),
                                        key=lambda r: (r["predicted_ms"], r["hash"]))]
    entries = [_entry(ranked.index(r["hash"]) + 1, r, f, p) for r, f, p in zip(rows, fields, p_best, strict=True)]
    by_hash = {e["hash"]: e for e in entries}
    return {
        "source": samples_source(chip), "calibrated": chip.is_calibrated, "samples": len(terms.chips),
        "model_error": None if terms.model_error is None else terms.model_error.model_dump(mode="json"),
        "outside_fit": outside, "winner": by_hash[winner["hash"]],
        "published": None if published is None else by_hash[published["hash"]],
        "p_beats_published": p_pub, "leaders": entries, "breakdown_ms": breakdown, "notes": notes,
    }


def _entry(rank: int, row: dict[str, Any], fields: dict[str, Any], p_best: float | None) -> dict[str, Any]:
    return {"rank": rank, "hash": row["hash"], "name": row["name"], "plan": row["plan"],
            "collectives": row["collectives"] or "", "predicted_ms": row["predicted_ms"],
            "tokens_per_s": row["tokens_per_s"], **fields, "p_best": p_best}


def interval_text(entry: dict[str, Any]) -> str:
    """``412.3 (90 % interval 380.1–445.0)`` tokens/s, or the point with ``no interval``."""
    if entry.get("tokens_per_s_low") is None:
        return f"{entry['tokens_per_s']:.1f} (no interval)"
    return (f"{entry['tokens_per_s']:.1f} (90 % interval {entry['tokens_per_s_low']:.1f}–"
            f"{entry['tokens_per_s_high']:.1f})")


def terms_text(robust: dict[str, Any]) -> str:
    """What the intervals include, in one short clause (the full text is each row's ``interval``)."""
    parts = [f"{robust['samples']} re-simulations over the fit's parameter uncertainty" if robust["samples"] >= 2
             else "no parameter spread"]
    error = robust["model_error"]
    if error is not None:
        q = error["extrapolated_rel"] if robust["outside_fit"] else error["in_range_rel"]
        parts.append(f"{'extrapolated ' if robust['outside_fit'] else ''}model error ±{100 * q:.1f} %")
    return " and ".join(parts)


def robust_markdown(robust: dict[str, Any]) -> list[str]:
    """The ``summary.md`` section: where the samples come from, the winner's and the published
    design's intervals, P(winner beats published), the leaders' P(best)."""
    lines = ["## Robust choice (over the calibration's parameter samples)", "",
             f"Samples: {robust['samples']} parameter sets; figures: {robust['source']}."]
    if robust["outside_fit"]:
        lines.append("Outside the fit (extrapolated model error): " + "; ".join(robust["outside_fit"]) + ".")
    win, pub = robust["winner"], robust["published"]
    lines += ["", f"- winner: {interval_text(win)} tokens/s (simulated; 90 % interval: {terms_text(robust)})"
             if win.get("tokens_per_s_low") is not None else f"- winner: {interval_text(win)} tokens/s (simulated)"]
    if pub is not None:
        lines.append(f"- published: {interval_text(pub)} tokens/s (simulated)")
    if robust["p_beats_published"] is not None:
        lines.append(f"- P(winner faster than published), paired over {robust['samples']} samples: "
                     f"**{robust['p_beats_published']:.2f}**")
    lines += [f"- {note}" for note in robust["notes"]]
    lines += ["", "| rank | plan | collectives | tokens/s (simulated) | P(best among these) |",
              "| ---: | --- | --- | --- | ---: |"]
    for e in robust["leaders"]:
        p = "–" if e["p_best"] is None else f"{e['p_best']:.2f}"
        lines.append(f"| {e['rank']} | {e['plan']} | {e['collectives'] or 'as the plan'} | {interval_text(e)} | {p} |")
    return lines


def robust_lines(robust: dict[str, Any]) -> list[str]:
    """The terminal's lines: the winner's interval, P(winner beats published), the source."""
    win, pub = robust["winner"], robust["published"]
    lines = [f"robust choice over {robust['samples']} parameter samples ({robust['source']}):",
             f"  winner {interval_text(win)} tokens/s (simulated)"]
    if pub is not None and pub["hash"] != win["hash"]:
        lines.append(f"  published {interval_text(pub)} tokens/s (simulated)")
    if robust["p_beats_published"] is not None:
        lines.append(f"  P(winner faster than published, paired) = {robust['p_beats_published']:.2f}")
    return [*lines, *[f"  {note}" for note in robust["notes"]]]
