"""One answer per question in the demo report: every step time it shows, keyed by question.

A *question* is (model, system, batch, chip figures): K3 on ``tpu-v7:16`` at batch 1 on the
published figures is one; the same on the figures calibrated in step 5 is another. The demo
answers questions several times (the schedule sweep, ``simulate`` of its winner and the
built-ins, the deployment search, ``compare``), and a *best-of* figure (a sweep's or a
search's best) must be no slower than any other figure the report shows for its question:
a search whose winner is beaten by a configuration shown elsewhere has missed a candidate,
and the report refuses to print it as "best" (:func:`conflicts`; the renderer replaces the
row with the refusal, and the demo fails).

:func:`figures` collects, from a finished :class:`~calibration.commands.demo_run.DemoRun`:

| step | figures | best-of |
| --- | --- | --- |
| ``sweep bN`` | the best schedule; ``published`` | the best (on the published plan) |
| ``simulate`` | each schedule simulated at batch 1 | no |
| ``joint b1`` | the best deployment; the published one | the best (over plans too) |
| ``compare`` | each TPU row without speculation that fits | no |

Chip figures are named as the rows name them (``published figures`` or the overlay's
``calibrated on ...`` note): two figures are the same question only when both say the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.commands.demo_run import DemoRun

MODEL = "kimi-k3"
K3_SYSTEM = "tpu-v7:16"  # the system every K3_TPU step of the demo runs
RELATIVE_TOLERANCE = 1e-9  # the same simulation reached twice may differ by float summation order only


@dataclass(frozen=True)
class Figure:
    """One step time the report shows."""

    question: tuple[str, str, int, str]  # model, system, batch, chip figures
    what: str  # where in the report, in words
    step_ms: float
    best_of: bool
    auto_plan: bool = True  # on the model's published plan (every demo step but a search's winner)
    over_plans: bool = False  # a best-of over plans too (the deployment search), not schedules alone


def figures_key(text: str | None) -> str:
    """``published figures`` or the ``calibrated on ...`` note, without the chip's name."""
    if not text or "calibrated on" not in text:
        return "published figures"
    return text[text.index("calibrated on"):]


def figures(run: DemoRun) -> list[Figure]:
    """Every step time of the report, by question (module docstring)."""
    found: list[Figure] = []
    for step in run.steps:
        if not step.ok or not step.data:
            continue
        data = step.data
        if step.name.startswith("sweep b"):
            batch = int(step.name.removeprefix("sweep b"))
            question = (MODEL, K3_SYSTEM, batch, figures_key(data.get("figures")))
            found.append(Figure(question, f"schedule sweep at batch {batch}: best", data["best"]["predicted_ms"], True))
            if data.get("published"):
                found.append(Figure(question, f"schedule sweep at batch {batch}: published",
                                    data["published"]["predicted_ms"], False))
        elif step.name == "simulate":
            for name, result in data.items():
                question = (MODEL, K3_SYSTEM, int(result["batch"]), figures_key(result.get("figures")))
                found.append(Figure(question, f"simulate: {name}", result["step_ms"], False))
        elif step.name == "joint b1":
            question = (MODEL, K3_SYSTEM, 1, figures_key(data.get("figures")))
            found.append(Figure(question, "deployment search: best found", data["best"]["predicted_ms"], True,
                                auto_plan=data["best"].get("plan") == "auto" and not data["best"].get("collectives"),
                                over_plans=True))
            if data.get("published"):
                found.append(Figure(question, "deployment search: published", data["published"]["predicted_ms"],
                                    False))
        elif step.name == "compare":
            for row in data:
                if row["system"] != K3_SYSTEM or row["acceptance_length"] is not None or not row.get("fits", True):
                    continue
                question = (MODEL, row["system"], int(row["batch"]), figures_key(row.get("calibrated_on")))
                found.append(Figure(question, f"comparison: {row['system']} batch {row['batch']}", row["step_ms"],
                                    False))
    return found


def conflicts(run: DemoRun) -> list[str]:
    """Each best-of figure slower than another figure of its question, in words (empty: none)."""
    shown = figures(run)
    problems = []
    for best in (f for f in shown if f.best_of):
        # a schedule sweep answers "the best schedule on the published plan": a search's winner
        # on another plan is not its question; the deployment search answers over plans too
        rivals = [f for f in shown if f.question == best.question and (best.over_plans or f.auto_plan)]
        for other in rivals:
            if other.step_ms < best.step_ms * (1 - RELATIVE_TOLERANCE):
                problems.append(f"{best.what} ({best.step_ms:.3f} ms) is slower than {other.what} "
                                f"({other.step_ms:.3f} ms) for the same question ({_question(best.question)})")
    return problems


def refused(run: DemoRun, what: str) -> list[str]:
    """The conflicts of the best-of figure ``what`` (the renderer prints these instead of it)."""
    return [problem for problem in conflicts(run) if problem.startswith(what)]


def _question(question: tuple[str, str, int, str]) -> str:
    model, system, batch, chip_figures = question
    return f"{model} on {system}, batch {batch}, {chip_figures}"



def short_figures(note: str | None) -> str:
    """``published figures`` or ``calibrated on <what>`` (the overlay's note without its list)."""
    return figures_key(note).split(" (")[0]
