"""No catalog figure's source cites the data it is fitted or judged on (issue 24).

Every built-in calibration input names its chip and the source tags (and phrases) its data
carries (:func:`calibration.sources.inputs.calibration_inputs`); every figure a calibration fits on
that chip (:func:`calibration.sources.inputs.fitted_paths`) must cite none of them. Such a figure is a
documented prior (``label: prior``: a spec sheet, another system's measurement, first
principles) or a published spec figure.
"""

from __future__ import annotations

from calibration.sources.inputs import calibration_inputs, fitted_paths
from hwmodels.catalog import load_chip
from hwmodels.overlay import iter_figures
from hwmodels.sources import tags_in


def test_fitted_figures_cite_none_of_the_data_they_are_fitted_or_judged_on() -> None:
    problems = []
    for data in calibration_inputs():
        chip = load_chip(data.chip, calibrated=False)
        figures = dict(iter_figures(chip))
        paths = [p for p in fitted_paths(chip) if p in figures]
        assert paths, data.chip
        for path in paths:
            source = figures[path].source
            cited = set(tags_in(source)) & set(data.tags)
            marked = [mark for mark in data.marks if mark in source]
            if cited or marked:
                problems.append(f"{data.chip} {path} cites {sorted(cited) or marked} ({data.name}): {source}")
    assert not problems, "\n".join(problems)


def test_tpu_v7_priors_are_labelled_prior() -> None:
    figures = dict(iter_figures(load_chip("tpu-v7", calibrated=False)))
    for path in ("compute.mxu.weight_push_s_per_tile_by_dtype.int8", "dma.concurrency_penalty_per_dma",
                 "hbm.sustained_bandwidth_bytes_per_s", "execution.per_step_overhead_s",
                 "links.ici.bandwidth_bytes_per_s_per_direction"):
        assert figures[path].label == "prior", path
    assert figures["compute.mxu.weight_push_s_per_tile_by_dtype.int8"].value == 20e-9  # was 37 ns from the Muse data
    assert figures["dma.concurrency_penalty_per_dma"].value == 0.0  # was 0.14 from the slot sweep
