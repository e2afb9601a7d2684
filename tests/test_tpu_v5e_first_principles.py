"""The first-principles chip reads no kernel run: its per-layer cost is the empty layer loop's
(micro-probe), its decoders' rates the static schedule's, nothing from the capped runs."""

from __future__ import annotations

import pytest

from calibration.reports.tpu_v5e_first_principles import first_principles_chip, summary
from calibration.reports.tpu_v5e_plan import FORMAT_OF_PART, static_figure
from calibration.sources.tpu_probes import PER_LAYER, dequant_path
from hwmodels.overlay import iter_figures


def test_no_figure_comes_from_a_kernel_run() -> None:
    figures = dict(iter_figures(first_principles_chip()))
    layer = figures[PER_LAYER]
    assert layer.label == "measured" and "layer_loop" in layer.source and layer.value < 1e-6
    assert not any("fixed-cost" in (f.source or "") for f in figures.values())
    assert figures[dequant_path(FORMAT_OF_PART["gate_up"])].value == pytest.approx(static_figure("gate_up", "pairs")[0])
    assert figures[dequant_path(FORMAT_OF_PART["down"])].value == pytest.approx(static_figure("down", "fold")[0])


def test_summary_counts_hand_made_errors() -> None:
    rows = [("a", 1, 10.0, 11.0), ("b", 1, 20.0, 19.2), ("c", 1, 30.0, 30.6), ("d", 8, 40.0, 40.0)]
    # errors +10 %, -4 %, +2 %, 0: MAPE 4 %, max 10 %, three within 5 %; at batch 1 the order is kept
    assert summary(rows) == "4 decodes: MAPE 4.0%, max 10.0%, 3 within 5 %; Kendall tau b1 1.00"
