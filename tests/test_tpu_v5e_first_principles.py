"""The first-principles chip reads no kernel run: its per-layer cost is the static schedule's
layer loop less the engine's own ops, its decoders' rates the static schedule's, nothing from
the capped runs."""

from __future__ import annotations

import pytest

from calibration.reports.tpu_v5e_first_principles import first_principles_chip, summary
from calibration.reports.tpu_v5e_plan import FORMAT_OF_PART, static_figure
from calibration.sources.tpu_probes import PER_LAYER, dequant_path
from hwmodels.overlay import iter_figures


def test_no_figure_comes_from_a_kernel_run() -> None:
    figures = dict(iter_figures(first_principles_chip()))
    layer = figures[PER_LAYER]
    assert layer.label == "derived" and "a layer of the loop issues" in layer.source and "static schedule" in layer.source
    assert not any("fixed-cost" in (f.source or "") for f in figures.values())
    assert figures[dequant_path(FORMAT_OF_PART["gate_up"])].value == pytest.approx(static_figure("gate_up", "pairs")[0])
    assert figures[dequant_path(FORMAT_OF_PART["down"])].value == pytest.approx(static_figure("down", "fold")[0])


def test_summary_counts_hand_made_errors() -> None:
    rows = [("a", 1, 10.0, 11.0), ("b", 1, 20.0, 19.2), ("c", 1, 30.0, 30.6), ("d", 8, 40.0, 40.0)]
    # errors +10 %, -4 %, +2 %, 0: MAPE 4 %, max 10 %, three within 5 %; at batch 1 the order is kept
    assert summary(rows) == "4 decodes: MAPE 4.0%, max 10.0%, 3 within 5 %; Kendall tau b1 1.00"


@pytest.mark.slow  # three engine runs of the capped K3 shard (~10 s)
def test_the_capped_runs_are_held_out_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capped runs are a check of the decomposition: changing what they measured changes
    their errors, not what the first-principles chip simulates for them."""
    from dataclasses import replace

    from calibration.reports import tpu_v5e_first_principles as report

    def chip(batch: int, schedule: str):
        return first_principles_chip(batch=batch, schedule=schedule)

    before = report.capped_errors(chip, (8, 2))
    assert [cap for _, cap, _, _ in before] == [4, 4, 8, 8, 12, 12]  # each cap at batch 1 (v5e-ag) and 16 (v5e-ah)
    real = report.capped_runs
    monkeypatch.setattr(report, "capped_runs", lambda *a, **k: [replace(r, ms_median=r.ms_median * 1.1) for r in real(*a, **k)])
    after = report.capped_errors(chip, (8, 2))
    assert [sim for *_, sim in after] == pytest.approx([sim for *_, sim in before])
    assert [ms for _, _, ms, _ in after] == pytest.approx([ms * 1.1 for _, _, ms, _ in before])


def test_every_build_with_decodes_is_reported_once() -> None:
    from calibration.reports.tpu_v5e_first_principles import builds

    found = builds()
    assert len(found) == len(set(found))
    assert ((8, 2), "vector") in found and ((8, 2), "walk") in found and ((4, 2), "walk") in found
