"""The built-in calibration inputs and the figures calibrations fit (tests/test_priors.py).

A catalog figure at a path some calibration fits on a chip must not cite the data that
calibration is fitted or judged on: its value would then owe something to that data, and
"before calibration" would be partly fitted already (issue 24).
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.core.parameters import PARAMETERS
from hwmodels.schema import Chip


@dataclass(frozen=True)
class CalibrationInput:
    """A measurement set a calibration fits or judges on: the chip, the source tags its data
    carries (``hwmodels/sources.yaml``) and the figure paths calibrations fit on that chip. A
    catalog figure at one of those paths must not cite one of those tags (tests/test_priors.py):
    its value would then owe something to the data it is fitted or judged on."""

    name: str
    chip: str
    tags: tuple[str, ...]
    marks: tuple[str, ...] = ()  # phrases that identify the data when it has no tag


def calibration_inputs() -> list[CalibrationInput]:
    """Every built-in calibration input (published sets)."""
    return [
        CalibrationInput("published:tpu7x-musespark", "tpu-v7", ("INF",), ("Muse",)),
        CalibrationInput("published:tpu7x-components", "tpu-v7", ("INF",), ("Muse",)),
        CalibrationInput("published:b200-vllm-qwen3.5", "b200", (), ("vLLM", "Qwen3.5", "b200 fit")),
        CalibrationInput("published:b200-vllm-qwen3.5", "gb200", (), ("vLLM", "Qwen3.5", "b200 fit")),
    ]


def fitted_paths(chip: Chip) -> list[str]:
    """Every figure path some calibration may fit on ``chip``: the table's figures with bounds
    for its kind (:mod:`calibration.core.parameters`)."""
    return [p.path for p in PARAMETERS if chip.kind in p.bounds]
