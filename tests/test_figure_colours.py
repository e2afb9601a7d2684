"""tpusim.report.figures.distinct_colours: one colour per label, never repeated in a figure
(the joint sweep's plots have 13 or more plans; tab10 repeated after 10)."""

from __future__ import annotations

from tpusim.report.figures import distinct_colours


def test_plot_colours_never_repeat_within_a_figure() -> None:
    for count in (3, 13, 30):
        colours = distinct_colours([f"plan {i}" for i in range(count)])
        assert len({tuple(c) for c in colours.values()}) == count
