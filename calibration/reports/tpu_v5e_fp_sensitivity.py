"""How far each input of the first-principles prediction moves it (issue 46, item 3).

``python -m calibration.reports.tpu_v5e_fp_sensitivity [--doc docs/tpu-v5e-measured.md] [--write]``

The first-principles chip (:func:`calibration.reports.tpu_v5e_first_principles.first_principles_chip`)
is the catalog's tpu-v5e with the micro-probes' figures, the expert decoders' rates and the
layer's own work from libtpu's static schedule; no kernel run. For each numeric figure the
engine reads on it, and for the clock that turns the static schedule's bundles into seconds,
the input is raised by :data:`~calibration.reports.tpu_v5e_sensitivity.STEP` (+10 %) and every
committed decode of the kernel's build (:data:`BUILD`) re-simulated, two ways:

1. **rebuilt**: the figure raised on the micro-probe chip and the first-principles chip built
   again from it (what a changed probe record does: the layer's remainder is the static
   schedule's layer loop *less the engine's compute on that chip*, so an MXU figure moves it);
   the clock: every static-schedule figure at the clock / 1.1 (each bundle 10 % longer); the
   loop iteration's cost likewise (both the ``code_size`` probe's, :mod:`calibration.sources.tpu_code_issue`);
2. **held**: the figure raised on the first-principles chip, every other figure as it is.

The guards (:mod:`calibration.reports.tpu_v5e_guards`: :func:`~calibration.reports.tpu_v5e_guards.drift_check`
against the committed residuals :data:`RESIDUALS_PATH`, written here with ``--write``, and
:func:`~calibration.reports.tpu_v5e_guards.goal_check`, the issue's MAPE/max/τ goals) compare
the chain with the decodes it never read; ``tests/test_tpu_v5e_fp_guards.py`` plants every input
this table marks over 2 % and sees the drift guard fail.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from calibration.reports.tpu_v5e_first_principles import fp_chips, issue_figures
from calibration.reports.tpu_v5e_plan import ChipFor
from calibration.reports.tpu_v5e_sensitivity import (
    STEP,
    THRESHOLD,
    Row,
    inputs,
    move_cells,
    put_block,
    scaled,
    table_rows,
)
from calibration.sources.tpu_chip_records import ChipRecord, ChipRecordPredictor, build_records
from calibration.sources.tpu_code_issue import code_issue
from calibration.sources.tpu_layer_static import PUBLISHED
from calibration.sources.tpu_probes import probe_chip
from hwmodels.atomic import write_text_atomic
from hwmodels.catalog import load_chip
from hwmodels.overlay import iter_figures
from hwmodels.schema import Chip
from megakernel.kernel_moe import EXPERT_LIST_BUILD
from megakernel.quant import WORDS32_DECODER
from megakernel.quant_pairs import KERNEL_DECODER
from tpusim.schedule.kernel_layout import EXPERT_PANEL_UNROLL, PANEL_UNROLL

BUILD = ((PANEL_UNROLL, EXPERT_PANEL_UNROLL), EXPERT_LIST_BUILD)  # the kernel as it is
CLOCK = "static schedule's bundles a second (code_size probe)"  # not a chip figure: static_figure / layer_remainder read it
LOOP = "a loop iteration beyond its bundles, s (code_size probe)"  # likewise
RESIDUALS_PATH = Path(__file__).resolve().parents[1] / "data" / "tpu-v5e-first-principles.json"
COMMAND = "JAX_PLATFORMS=cpu .venv/bin/python -m calibration.reports.tpu_v5e_fp_sensitivity --doc docs/tpu-v5e-measured.md --write"
BEGIN = "<!-- first-principles sensitivity: begin (python -m calibration.reports.tpu_v5e_fp_sensitivity --doc) -->"
END = "<!-- first-principles sensitivity: end -->"
ANCHOR = "## Where the probe model goes wrong"


def probes_chip() -> Chip:
    """The micro-probe chip the first-principles chip starts from (committed probe records)."""
    return probe_chip(load_chip("tpu-v5e", calibrated=False), decoder=WORDS32_DECODER)


def chips(probes: Chip | None = None, clock_hz: float | None = None,
          loop_iteration_s: float | None = None) -> ChipFor:
    """The first-principles chip of :data:`BUILD` per batch and schedule (built once each:
    :func:`calibration.reports.tpu_v5e_first_principles.fp_chips`), from ``probes``;
    ``clock_hz`` / ``loop_iteration_s`` None: the ``code_size`` probe's."""
    probes = probes_chip() if probes is None else probes
    return fp_chips(BUILD[0], BUILD[1], probes=probes, clock_hz=clock_hz, loop_iteration_s=loop_iteration_s)


def held(chip: ChipFor, path: str, factor: float) -> ChipFor:
    """``chip`` with the figure at ``path`` x ``factor`` at every batch, the rest as it is."""
    return lambda batch, schedule: scaled(chip(batch, schedule), path, factor)


class BuildPredictor:
    """The committed decodes of :data:`BUILD`, simulated on a chip per batch (programs built once)."""

    def __init__(self) -> None:
        self.records: list[ChipRecord] = build_records(KERNEL_DECODER, BUILD[0], expert_list=BUILD[1])
        self._predictor = ChipRecordPredictor(self.records)

    def predict(self, chip: ChipFor) -> list[float]:
        """Simulated ms of each record, in :attr:`records` order."""
        out: dict[int, float] = {}
        for batch, schedule in sorted({(r.batch, r.schedule) for r in self.records}):
            at = [i for i, r in enumerate(self.records) if (r.batch, r.schedule) == (batch, schedule)]
            out.update(zip(at, self._predictor.predict_many(chip(batch, schedule), at), strict=True))
        return [out[i] for i in range(len(self.records))]


@dataclass(frozen=True)
class Residual:
    """One committed decode's first-principles prediction (simulated after the run)."""

    schedule: str
    batch: int
    measured_ms: float
    simulated_ms: float

    @property
    def error(self) -> float:
        return self.simulated_ms / self.measured_ms - 1.0


def residuals(predictor: BuildPredictor, predicted_ms: Sequence[float]) -> list[Residual]:
    return [Residual(r.schedule, r.batch, r.ms_median, p) for r, p in zip(predictor.records, predicted_ms, strict=True)]


def write_residuals(rows: Sequence[Residual], path: Path = RESIDUALS_PATH) -> None:
    """The residuals the drift guard compares with (temp file, then rename)."""
    document = {"what": ("first-principles prediction (micro-probes + libtpu's static schedule, no kernel run) of "
                         "every committed decode of the kernel build; simulated after the runs, not a prediction "
                         "recorded before them; measured on tpu-v5e"),
                "command": COMMAND, "date": datetime.date.today().isoformat(),
                "build": {"panel_unroll": list(BUILD[0]), "expert_list": BUILD[1], "decoder": KERNEL_DECODER},
                "records": [{"schedule": r.schedule, "batch": r.batch, "measured_ms": round(r.measured_ms, 4),
                             "simulated_ms": round(r.simulated_ms, 4), "error": round(r.error, 5)} for r in rows]}
    write_text_atomic(path, json.dumps(document, indent=1) + "\n")


def committed_residuals(path: Path = RESIDUALS_PATH) -> dict[tuple[str, int], float]:
    """(schedule, batch) -> committed first-principles error of :data:`RESIDUALS_PATH`."""
    document = json.loads(path.read_text())
    return {(r["schedule"], int(r["batch"])): float(r["error"]) for r in document["records"]}


def sensitivity(predictor: BuildPredictor, progress: Callable[[str], None] | None = None) -> tuple[list[Row], list[float]]:
    """One :class:`~calibration.reports.tpu_v5e_sensitivity.Row` per input (``refitted`` holds
    the *rebuilt* moves), and the baseline predictions."""
    probes = probes_chip()
    chip = chips(probes)
    base = predictor.predict(chip)

    def moves(other: ChipFor) -> tuple[float, ...]:
        return tuple(p / b - 1.0 for p, b in zip(predictor.predict(other), base, strict=True))

    figures = dict(iter_figures(chip(1, PUBLISHED)))
    rows = []
    for path in inputs(chip(1, PUBLISHED)):
        held_moves = moves(held(chip, path, 1.0 + STEP))
        rebuilt = None
        if path in dict(iter_figures(probes)) and figures[path].label != "derived" and max(map(abs, held_moves)) > 5e-4:
            rebuilt = moves(chips(scaled(probes, path, 1.0 + STEP)))
        rows.append(Row(path, figures[path].value, figures[path].label, rebuilt, held_moves))
        if progress:
            progress(f"{path}: rebuilt {move_cells(rebuilt)}; held {move_cells(held_moves)}")
    clock_hz, loop_s = issue_figures()
    label = "measured" if code_issue() is not None else "derived"
    rows.append(Row(CLOCK, clock_hz, label, moves(chips(probes, clock_hz / (1.0 + STEP))), None))
    rows.append(Row(LOOP, loop_s, label, moves(chips(probes, clock_hz, loop_s * (1.0 + STEP))), None))
    return rows, base


NOTES = {
    "hbm.sustained_bandwidth_bytes_per_s": "`drift_check` fails (planted in the `dma_stream` records, rebuilt; and held)",
    CLOCK: "`drift_check` fails (every bundle 10 % longer)",
    LOOP: "the static schedule's loops (the layer's and the decoders' panel loops)",
    "compute.vpu.dequant_s_per_element.fp8_e4m3_b256": "the static schedule's panel loop (the decodes hide under the copies)",
    "compute.vpu.dequant_s_per_element.mxfp4": "the static schedule's panel loop (the decodes hide under the copies)",
    "execution.per_layer_overhead_s": "the static schedule's layer loop less the engine's ops",
    "execution.per_step_overhead_s": "the `empty_call` probe",
    "execution.attention_core_s_per_token": "the `mla_core` probe (the kernel's KV loop alone, a tile's seconds at the batch's rows)",
    "execution.attention_core_s_per_tile": "the static schedule's KV loop (a tile beyond its parts)",
    "dma.concurrency_penalty_per_dma": "the `dma_stream` probe (8 vs 4 in flight): near 0 on v5e, its +10 % moves nothing",
    "hbm.peak_bandwidth_bytes_per_s": "not read by the engine's TPU step (the sustained figure is)",
}


def markdown(rows: Sequence[Row], predictor: BuildPredictor, seconds: float) -> str:
    names = " / ".join(f"{r.schedule} b{r.batch}" for r in predictor.records)
    (dense, expert), listed = BUILD
    lines = [BEGIN, "## Sensitivity of the first-principles prediction: each input +10 %", "", "Generated by:", "",
             "```bash", COMMAND, "```", "",
             f"({datetime.date.today().isoformat()}, {seconds:.0f} s on the shared 2-core CPU host.) Each input of the "
             f"first-principles chip (micro-probes + libtpu's static schedule, no kernel run; build: panel loops "
             f"{dense}/{expert}, {listed} expert list) raised by {100 * STEP:.0f} %; the cells are the moves of the "
             f"simulated ms of {names}, in %. *Rebuilt*: the figure raised on the micro-probe chip and the "
             "first-principles chip built again (the layer's remainder is the static layer loop less the engine's ops "
             "on that chip, so it absorbs part of an MXU figure), only for probe figures that move anything held. "
             "*Held*: the figure raised on the first-principles chip, the rest as it is. Inputs moving a prediction "
             f"by more than {100 * THRESHOLD:.0f} % either way are planted by `tests/test_tpu_v5e_fp_guards.py`, "
             "which sees `drift_check` (each decode's error within 2 points of the committed residual, "
             "`calibration/data/tpu-v5e-first-principles.json`) fail. Not varied: capacities and `dma.service`.", "",
             "| input | value | label | rebuilt (%) | held (%) | over 2 % | guard |",
             "| --- | ---: | --- | --- | --- | --- | --- |"]
    return "\n".join([*lines, *table_rows(rows, NOTES), "", END]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.reports.tpu_v5e_fp_sensitivity",
                                     description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--doc", type=Path, default=None, help="put the table into this page (its marked block)")
    parser.add_argument("--write", action="store_true", help=f"write the baseline residuals to {RESIDUALS_PATH.name}")
    args = parser.parse_args(argv)
    if args.doc is not None and not args.doc.is_file():
        sys.stderr.write(f"--doc {args.doc}: no such page\n")
        return 2
    start = time.perf_counter()
    predictor = BuildPredictor()
    rows, base = sensitivity(predictor, progress=lambda line: sys.stderr.write(line + "\n"))
    text = markdown(rows, predictor, time.perf_counter() - start)
    if args.write:
        write_residuals(residuals(predictor, base))
    if args.doc:
        write_text_atomic(args.doc, put_block(args.doc.read_text(), text, BEGIN, END, ANCHOR))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
