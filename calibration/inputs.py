"""The built-in calibration inputs and the figures calibrations fit (tests/test_priors.py).

A catalog figure at a path some calibration fits on a chip must not cite the data that
calibration is fitted or judged on: its value would then owe something to that data, and
"before calibration" would be partly fitted already (issue 24).
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.by_parts import E2E_PARAMETERS
from calibration.gpu_stack import FITTED
from calibration.params import CPU_PARAMETERS, TPU_PARAMETERS
from calibration.parts import PART_PARAMETERS
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
    """Every figure path some calibration procedure fits on ``chip``."""
    if chip.kind == "gpu":
        return list(FITTED)
    specs = CPU_PARAMETERS if chip.kind == "cpu" else (
        *TPU_PARAMETERS, *E2E_PARAMETERS, *(s for stage in PART_PARAMETERS.values() for s in stage))
    return list(dict.fromkeys(s.path for s in specs))
