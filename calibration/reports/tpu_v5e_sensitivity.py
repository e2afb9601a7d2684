"""How far each input figure of the v5e prediction moves the predicted decodes (issue 46, item 3).

``python -m calibration.reports.tpu_v5e_sensitivity [--all] [--doc docs/tpu-v5e-measured.md]``

Way (b) of :mod:`calibration.reports.tpu_v5e` predicts the K3-shard decodes from the chip's
micro-probe figures (:func:`calibration.sources.tpu_probes.probe_chip`) and two figures the
kernel's fixed-cost probe fits on capped runs (:mod:`calibration.sources.tpu_fixed_cost`: a
factor on the dequant rates and the per-layer cost). For each numeric figure the engine reads
on that chip, and for the capped runs' measured times, the figure is raised by
:data:`STEP` (+10 %) and the predicted ms of a few decodes re-simulated, two ways:

1. **refitted**: the figure raised on the micro-probe chip, then the fixed-cost rules run again
   (what the pipeline does when a probe record changes): how much of the change reaches a
   prediction once the capped runs have absorbed what they can;
2. **held**: the figure raised on way (b)'s chip, every other figure as it is (the derived
   dequant rates and per-layer cost included): what the figure itself weighs in the step.

Records: :data:`REPRESENTATIVE` (``published`` and ``naive`` at batch 1 and 8 of the calibration
decoder's decode records: the overlapped and the fully exposed schedule at the two batches the
study ranks); ``--all`` runs every decode record (slower: about 11 s an engine sweep of 22
records, against 5 s). A refit costs about 17 s (the fixed-cost rules re-simulate the capped
runs), so it runs only for the figures that move a prediction with the others held, and for
the capped runs. The guards that catch the inputs found sensitive, and the planted-error tests
that prove they can fail: :mod:`calibration.reports.tpu_v5e_guards`.

The table goes into ``docs/tpu-v5e-measured.md`` between :data:`BEGIN` and :data:`END`
(``--doc``); the study's report keeps that block when it rewrites the page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from calibration.sources.tpu_chip_records import ChipRecord, ChipRecordPredictor, load_chip_records
from calibration.sources.tpu_fixed_cost import (
    FIXED_COST_PATH,
    _with,
    capped_runs,
    committed_fixed_cost,
    fixed_cost,
    kernel_probe_chip,
)
from calibration.sources.tpu_probes import (
    CALIBRATION_DECODER,
    DEQUANT_PROBES,
    dequant_path,
    probe_chip,
)
from hwmodels.atomic import write_text_atomic
from hwmodels.catalog import load_chip
from hwmodels.overlay import _figure_slot, iter_figures
from hwmodels.records.jsonl import record_line, write_lines
from hwmodels.schema import Chip

STEP = 0.10  # each input raised by this fraction
THRESHOLD = 0.02  # a move above this (either way) needs a guard that can fail
REPRESENTATIVE = (("published", 1), ("naive", 1), ("published", 8), ("naive", 8))
CAPPED_RUNS = "capped runs' measured ms"  # the fixed-cost probe's input, not a chip figure
DEQUANT_BOTH = "dequant factor (both formats)"  # the fixed-cost rule's output on the two dequant rates
SKIPPED = ("capacity",)  # sizes, not times: they decide feasibility, which these records pass
COMMAND = "JAX_PLATFORMS=cpu .venv/bin/python -m calibration.reports.tpu_v5e_sensitivity --doc docs/tpu-v5e-measured.md"
BEGIN = "<!-- sensitivity: begin (python -m calibration.reports.tpu_v5e_sensitivity --doc) -->"
END = "<!-- sensitivity: end -->"
ANCHOR = "## Where the probe model goes wrong"  # the section the block goes before


@dataclass(frozen=True)
class Row:
    """One input: its value on way (b)'s chip, its label, and the relative move of each
    record's prediction at +:data:`STEP` (None where that way does not apply)."""

    name: str
    value: float | None
    label: str
    refitted: tuple[float, ...] | None
    held: tuple[float, ...] | None

    def worst(self) -> float:
        moves = [*(self.refitted or ()), *(self.held or ())]
        return max((abs(m) for m in moves), default=0.0)


def scaled(chip: Chip, path: str, factor: float) -> Chip:
    """``chip`` with the figure at ``path`` (or, for :data:`DEQUANT_BOTH`, both dequant rates)
    multiplied by ``factor``; label and source kept (only the value is planted)."""
    data = chip.model_dump(mode="python")
    paths = [dequant_path(f) for f in DEQUANT_PROBES.values()] if path == DEQUANT_BOTH else [path]
    for each in paths:
        parent, name = _figure_slot(data, each)
        parent[name] = {**parent[name], "value": parent[name]["value"] * factor}
    return Chip.model_validate(data)


def way_b_chip(probes: Chip, capped_path: Path | str = FIXED_COST_PATH) -> Chip:
    """Way (b)'s chip built from the micro-probe chip ``probes`` in memory: the fixed-cost rules
    run on it (:func:`calibration.sources.tpu_fixed_cost.fixed_cost`) and their two figures laid
    over it, the values :func:`~calibration.sources.tpu_fixed_cost.kernel_probe_chip` gives."""
    found = fixed_cost(probes, capped_path)
    if found is None:
        raise ValueError(f"{capped_path}: too few capped runs for the fixed-cost rules")
    return _with(probes, found.dequant_factor, found.per_layer_s)


def planted_capped_runs(folder: Path, factor: float) -> Path:
    """The committed capped runs of the calibration decoder with their measured ms x ``factor``,
    written to ``folder`` (routing traces made absolute): the fixed-cost rules' input planted."""
    keys = {run.key for run in capped_runs()}
    rows = []
    for line in FIXED_COST_PATH.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        key = f"{row['schedule']}@b{row['batch']}/cap{row.get('expert_cap')}"
        if key in keys and str(row.get("decoder") or "bytes") == CALIBRATION_DECODER:
            trace = (FIXED_COST_PATH.parent / str(row["routing"]).removeprefix("trace:")).resolve()
            rows.append({**row, "routing": f"trace:{trace}", "ms_per_step_median": row["ms_per_step_median"] * factor})
    path = folder / "fixed-cost.jsonl"
    write_lines(path, (record_line(r) for r in rows))
    return path


def representative_records(every: bool = False) -> list[ChipRecord]:
    """The decode records the table re-predicts: :data:`REPRESENTATIVE`, or every one."""
    records = [r for r in load_chip_records(decoder=CALIBRATION_DECODER) if r.panel_unroll == (1, 1)]
    if every:
        return records
    by_key = {(r.schedule, r.batch): r for r in records}
    return [by_key[key] for key in REPRESENTATIVE]


def inputs(chip: Chip) -> list[str]:
    """The figures the table varies: every figure of ``chip`` with a value, capacities aside."""
    return [path for path, _ in iter_figures(chip) if not any(word in path for word in SKIPPED)]


def sensitivity(records: Sequence[ChipRecord], progress: Callable[[str], None] | None = None) -> list[Row]:
    """One :class:`Row` per input (module docstring); the refit runs only where ``held`` moves
    any record by more than 0.05 %, the capped runs always."""
    catalog = load_chip("tpu-v5e", calibrated=False)
    probes = probe_chip(catalog)
    chip = kernel_probe_chip(catalog)  # the committed way (b): the values way_b_chip(probes) gives, labelled
    predictor = ChipRecordPredictor(list(records))
    indices = range(len(records))
    base = predictor.predict_many(chip, indices)

    def moves(other: Chip) -> tuple[float, ...]:
        return tuple(p / b - 1.0 for p, b in zip(predictor.predict_many(other, indices), base, strict=True))

    figures = dict(iter_figures(chip))
    rows = []
    for path in [*inputs(chip), DEQUANT_BOTH]:
        held = moves(scaled(chip, path, 1.0 + STEP))
        refitted = None
        if path != DEQUANT_BOTH and max(abs(m) for m in held) > 5e-4:
            refitted = moves(way_b_chip(scaled(probes, path, 1.0 + STEP)))
        figure = figures.get(path)
        found = committed_fixed_cost()
        value = figure.value if figure else (found.dequant_factor if found else None)
        rows.append(Row(path, value, figure.label if figure else "derived", refitted, held))
        if progress:
            progress(f"{path}: held {move_cells(held)}; refitted {move_cells(refitted)}")
    with tempfile.TemporaryDirectory() as folder:
        refitted = moves(way_b_chip(probes, planted_capped_runs(Path(folder), 1.0 + STEP)))
    rows.append(Row(CAPPED_RUNS, None, "measured", refitted, None))
    return rows


def move_cells(moves: tuple[float, ...] | None) -> str:
    return "—" if moves is None else " / ".join(f"{100 * m:+.2f}" for m in moves)


ABSORBED = ("refitted: absorbed exactly (the fit's one factor on both rates returns a +10 % rate as factor / 1.1; "
            "no decode can see it)")
NOTES = {
    "hbm.sustained_bandwidth_bytes_per_s": "`exposed_dma_check` fails (refitted: the `dma_stream` records planted, "
                                          "b1 copy time -6 %; held: the figure planted)",
    dequant_path("fp8_e4m3_b256"): f"the fit's value (micro-probe x factor). Held: `decode_check` fails; {ABSORBED}",
    dequant_path("mxfp4"): f"the fit's value (micro-probe x factor). Held: `decode_check` fails; {ABSORBED}",
    DEQUANT_BOTH: "the fit's output, held: `decode_check` fails",
    "execution.per_layer_overhead_s": "held: the fit's 67 µs; refitted: the `layer_loop` probe's 0.07 µs, which the "
                                      "fit replaces",
    "dma.concurrency_penalty_per_dma": "0 on v5e (8 copies in flight move as fast as 4): +10 % of 0 moves nothing",
    "hbm.peak_bandwidth_bytes_per_s": "not read by the engine's TPU step (the sustained figure is)",
    CAPPED_RUNS: "all capped runs x 1.1, refitted: `decode_check` fails",
}


def markdown(rows: Sequence[Row], records: Sequence[ChipRecord], seconds: float,
             notes: dict[str, str] | None = None) -> str:
    notes = NOTES if notes is None else notes
    names = " / ".join(f"{r.schedule} b{r.batch}" for r in records)
    lines = [BEGIN, "## Sensitivity: each input +10 %", "", "Generated by:", "", "```bash", COMMAND, "```", "",
             f"({datetime.date.today().isoformat()}, {seconds:.0f} s on the shared 2-core CPU host.) Each input of "
             f"way (b) raised by {100 * STEP:.0f} %; the cells are the moves of the predicted ms of {names} "
             f"(the calibration decoder's decodes, `{CALIBRATION_DECODER}`; `--all` for every record), in %. "
             "*Refitted*: the figure raised on the micro-probe chip and the fixed-cost rules run again, as the "
             "pipeline does (only where *held* moves anything). *Held*: the figure raised on way (b)'s chip, every "
             "other figure as it is. Inputs moving a prediction by more than "
             f"{100 * THRESHOLD:.0f} % either way have a guard, and a test plants the change and sees the guard fail "
             "(`calibration.reports.tpu_v5e_guards`, `tests/test_tpu_v5e_guards.py`). Not varied: capacities (sizes: "
             "feasibility, not time) and `dma.service` (not a number: `in_order`, the `dma_order` probe). The values are "
             "the committed files' on the date above (the study's tables on this page may predate later probe "
             "records).", "",
             "| input | value | label | refitted (%) | held (%) | over 2 % | guard |",
             "| --- | ---: | --- | --- | --- | --- | --- |"]
    return "\n".join([*lines, *table_rows(rows, notes), "", END]) + "\n"


def table_rows(rows: Sequence[Row], notes: dict[str, str]) -> list[str]:
    """One markdown row per input: value, label, both ways' moves, over the threshold, its note."""
    out = []
    for row in rows:
        value = "—" if row.value is None else f"{row.value:.4g}"
        over = "yes" if row.worst() > THRESHOLD else "no"
        out.append(f"| `{row.name}` | {value} | {row.label} | {move_cells(row.refitted)} | {move_cells(row.held)} | "
                   f"{over} | {notes.get(row.name, '—')} |")
    return out


def put_block(page: str, block: str, begin: str = BEGIN, end: str = END, anchor: str = ANCHOR) -> str:
    """``page`` with its block between ``begin`` and ``end`` (default: the sensitivity table's
    :data:`BEGIN` … :data:`END`) replaced by ``block``; without one, ``block`` goes before the
    section ``anchor`` (or at the end)."""
    if begin in page and end in page:
        head, rest = page.split(begin, 1)
        return head + block.rstrip("\n") + rest.split(end, 1)[1]
    if anchor in page:
        head, rest = page.split(anchor, 1)
        return head + block + "\n" + anchor + rest
    return page.rstrip("\n") + "\n\n" + block


def kept_block(page: str, begin: str = BEGIN, end: str = END) -> str | None:
    """The block of ``page`` between ``begin`` and ``end`` (what the study's report carries
    over), or None."""
    if begin in page and end in page:
        return begin + page.split(begin, 1)[1].split(end, 1)[0] + end + "\n"
    return None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--all", action="store_true", help="every decode record, not the representative four")
    parser.add_argument("--doc", type=Path, default=None, help="put the table into this page (its marked block)")
    args = parser.parse_args(argv)
    records = representative_records(args.all)
    start = time.perf_counter()
    rows = sensitivity(records, progress=lambda line: sys.stderr.write(line + "\n"))
    text = markdown(rows, records, time.perf_counter() - start)
    if args.doc:
        write_text_atomic(args.doc, put_block(args.doc.read_text(), text))
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
