"""How fast the v5e core issues libtpu's bundles, measured: the ``code_size`` probe.

libtpu's static schedule counts the bundles a loop body issues when nothing stalls
(:mod:`calibration.sources.compiler_schedule`); turning bundles into seconds needs the rate
the core really issues them at, and whether anything the count does not hold is paid per
bundle of code or per loop iteration. The ``code_size`` probe
(:mod:`calibration.tpu_bench.probes_code`) runs the same VALU rounds written out (0.8k–49k
bundles of distinct code a repetition) and looped in a 222-bundle body, and
:func:`calibration.tpu_bench.static_counts.count_code` reads, from libtpu's schedule compiled
here, each form's bundles a repetition and its loop iterations (the repetition loop's back
edge, plus ``rounds / 8`` in the looped form).

Rule (:func:`code_issue`): per (form, rounds), the seconds of one repetition is the slope of
the whole-call time over ``R`` (:func:`calibration.core.fitting.fit_line` over every record
with ``R ≥ 2``, all sessions: the ``R = 1`` points sit at the launch floor and caught a probe
compiling beside them on the host twice in the first run); then one least-squares fit through
the origin over the eight (form, rounds) slopes, ``seconds = bundles · s_per_bundle +
iterations · loop_iteration_s`` (:func:`calibration.core.fitting.fit_through_origin`). The
first is the static schedule's seconds per bundle as the chip runs it (its inverse replaces the
clock derived from the MXU's peak, 1.5 GHz), the second what a taken loop iteration costs
beyond its bundles. Both are ``measured on tpu-v5e`` (fitted on probe records only, never on
a kernel step). The straight forms issue at one rate from 0.8k to 49k bundles of code: no
instruction-fetch stall the code's size would show (:func:`straight_rates` prints them).
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.core.fitting import fit_line, fit_through_origin
from calibration.sources.tpu_layer_static import STATIC_PATH
from calibration.sources.tpu_probes import PROBES_PATH, _date, load_probes

PROBE = "code_size"


@dataclass(frozen=True)
class CodeForm:
    """One (form, rounds) of the probe: measured seconds a repetition, static bundles and iterations."""

    form: str
    rounds: int
    seconds: float
    bundles: int
    iterations: int
    records: int


@dataclass(frozen=True)
class CodeIssue:
    """The core's issue on libtpu's bundles (module docstring)."""

    s_per_bundle: float
    loop_iteration_s: float
    forms: tuple[CodeForm, ...]
    date: str

    @property
    def bundles_per_s(self) -> float:
        return 1.0 / self.s_per_bundle

    @property
    def source(self) -> str:
        return (f"measured on tpu-v5e (probe {PROBE}, {self.date}): least squares through the origin over "
                f"{len(self.forms)} forms (straight-line code of 0.8k-49k bundles, the same rounds looped), "
                f"seconds a repetition = bundles x {self.s_per_bundle * 1e12:.1f} ps "
                f"({self.bundles_per_s / 1e9:.3f} G bundles/s) + loop iterations x {self.loop_iteration_s * 1e9:.1f} ns; "
                "bundles and iterations from libtpu's static schedule of the probe")


def _static(path: Path | str) -> dict[tuple[str, int], dict[str, Any]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return {(r["params"]["form"], r["params"]["rounds"]): r for r in rows
            if r.get("probe") == PROBE and r.get("chip") == "tpu-v5e"}


def code_forms(probe_path: Path | str = PROBES_PATH, static_path: Path | str = STATIC_PATH) -> list[CodeForm]:
    """Each (form, rounds) with both a static count and records at two or more ``R ≥ 2``."""
    static = _static(static_path)
    points: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for record in load_probes(probe_path):
        if record["probe"] != PROBE or record["params"]["repeats_in_kernel"] < 2:
            continue
        key = (record["params"]["form"], record["params"]["rounds"])
        points.setdefault(key, []).append((record["params"]["repeats_in_kernel"], record["seconds_median"]))
    forms = []
    for (form, rounds), pts in sorted(points.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if (form, rounds) not in static or len({r for r, _ in pts}) < 2:
            continue
        slope = fit_line([r for r, _ in pts], [t for _, t in pts]).slope
        record = static[(form, rounds)]
        forms.append(CodeForm(form, rounds, slope, record["repetition_bundles"], record["loop_iterations"], len(pts)))
    return forms


def code_issue(probe_path: Path | str = PROBES_PATH, static_path: Path | str = STATIC_PATH) -> CodeIssue | None:
    """The two figures (module docstring), or None when the records hold no straight and looped
    pair. Remembered per file contents (the first-principles chip asks once a batch)."""
    stamps = tuple((str(p), Path(p).stat().st_mtime_ns, Path(p).stat().st_size) for p in (probe_path, static_path))
    return _code_issue(*stamps)


@functools.lru_cache(maxsize=8)
def _code_issue(probes: tuple[str, int, int], static: tuple[str, int, int]) -> CodeIssue | None:
    probe_path, static_path = probes[0], static[0]
    forms = code_forms(probe_path, static_path)
    if len({f.form for f in forms}) < 2:
        return None
    s_per_bundle, loop_s = fit_through_origin([[f.bundles for f in forms], [f.iterations for f in forms]],
                                              [f.seconds for f in forms])
    dates = [r for r in load_probes(probe_path) if r["probe"] == PROBE]
    return CodeIssue(s_per_bundle, loop_s, tuple(forms), _date(dates))


def straight_rates(issue: CodeIssue) -> dict[int, float]:
    """Bundles a second each straight form reached (rounds -> G bundles/s, its own loop edge included)."""
    return {f.rounds: f.bundles / f.seconds / 1e9 for f in issue.forms if f.form == "straight"}


def table(issue: CodeIssue) -> list[str]:
    """The forms beside the fit, as markdown lines."""
    lines = ["| form | rounds | bundles a repetition (static) | loop iterations | measured µs | G bundles/s | fit µs |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for f in issue.forms:
        fit = f.bundles * issue.s_per_bundle + f.iterations * issue.loop_iteration_s
        lines.append(f"| {f.form} | {f.rounds} | {f.bundles} | {f.iterations} | {f.seconds * 1e6:.3f} | "
                     f"{f.bundles / f.seconds / 1e9:.3f} | {fit * 1e6:.3f} |")
    return lines


def main() -> int:
    """``python -m calibration.sources.tpu_code_issue``: the forms and the two figures."""
    issue = code_issue()
    if issue is None:
        sys.stderr.write("no code_size records with both forms\n")
        return 1
    sys.stdout.write("\n".join([*table(issue), issue.source]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
