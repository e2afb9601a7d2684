"""The calibration predictor keeps engine results by what the engine reads of the chip."""

from __future__ import annotations

from calibration.core.parameters import chip_with
from calibration.sources.predict import Predictor, figures_key
from calibration.sources.tpu7x_published import load_published
from hwmodels.catalog import load_chip


def test_figures_key_ignores_labels_and_sees_values() -> None:
    chip = load_chip("tpu-v7", calibrated=False)
    push = chip.matrix_unit.weight_push_s_per_tile
    assert push is not None
    same = chip_with(chip, {"compute.mxu.weight_push_s_per_tile": push.value}, fitted_on="another label")
    assert same.matrix_unit.weight_push_s_per_tile.label == "calibrated"  # relabelled, same value
    assert figures_key(same) == figures_key(chip)
    moved = chip_with(chip, {"compute.mxu.weight_push_s_per_tile": push.value * 1.02})
    assert figures_key(moved) != figures_key(chip)


def test_repeat_evaluation_reuses_the_engine_run() -> None:
    chip = load_chip("tpu-v7", calibrated=False)
    point = load_published()[0]
    predictor = Predictor()
    first = predictor.predict(chip, point)
    relabelled = chip_with(chip, {"hbm.sustained_bandwidth_bytes_per_s": chip.hbm.sustained_bandwidth_bytes_per_s.value})
    assert predictor.predict(relabelled, point) == first
    assert (predictor.calls, predictor.reused) == (1, 1)
    slower = chip_with(chip, {"hbm.sustained_bandwidth_bytes_per_s": 0.8 * chip.hbm.sustained_bandwidth_bytes_per_s.value})
    assert predictor.predict(slower, point) > first
    assert predictor.calls == 2
