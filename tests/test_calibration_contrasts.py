"""Format contrasts (calibration.sources.format_contrasts): measured vs simulated differences between two
formats of one configuration, and the flag for a miss that varies with batch."""

from __future__ import annotations

import pytest

from calibration.sources.format_contrasts import contrast_lines, contrasts_json, format_contrasts
from calibration.sources.measurements import Measurement

BATCHES = (1, 2, 4, 8)


def record(fmt: str, batch: int, ms: float, context: int = 215) -> Measurement:
    return Measurement(model=f"muse-spark@{fmt}", system="tpu-v7x4", batch=batch, context=context,
                       backend="tpu7x (published)", ms_per_step_median=ms)


def table(measured: dict[str, list[float]], simulated: dict[str, list[float]]) -> tuple[list, dict]:
    records = [record(fmt, b, ms) for fmt, values in measured.items() for b, ms in zip(BATCHES, values, strict=True)]
    sims = {record(fmt, b, 1.0).key(): ms / 1e3 for fmt, values in simulated.items()
            for b, ms in zip(BATCHES, values, strict=True)}
    return records, sims


def test_a_miss_that_grows_with_batch_is_flagged_and_a_constant_one_is_not() -> None:
    # the published Muse pattern: nvfp4 - int4 grows with batch; the model predicts ~0 everywhere
    records, sims = table({"int4+bf16": [3.59, 3.71, 3.91, 4.29], "nvfp4+bf16": [3.57, 4.07, 4.63, 4.86]},
                          {"int4+bf16": [3.60, 3.70, 3.90, 4.30], "nvfp4+bf16": [3.63, 3.73, 3.93, 4.33]})
    (pair,) = format_contrasts(records, sims)
    assert (pair.base, pair.other, pair.batches) == ("int4+bf16", "nvfp4+bf16", BATCHES)
    assert pair.missed_s == pytest.approx((-0.05e-3, 0.33e-3, 0.69e-3, 0.54e-3))
    assert pair.varies_with_batch()  # spread 0.74 ms > 5 % of the 4.1 ms mean step
    assert pair.error_floor_s == pytest.approx(0.74e-3 / 4)
    # a constant miss of 0.3 ms at every batch: the fitted figures can absorb it
    records, sims = table({"int4+bf16": [3.6, 3.7, 3.9, 4.3], "nvfp4+bf16": [3.9, 4.0, 4.2, 4.6]},
                          {"int4+bf16": [3.6, 3.7, 3.9, 4.3], "nvfp4+bf16": [3.6, 3.7, 3.9, 4.3]})
    (pair,) = format_contrasts(records, sims)
    assert pair.missed_s == pytest.approx((0.3e-3,) * 4)
    assert not pair.varies_with_batch() and pair.error_floor_s == pytest.approx(0.0, abs=1e-12)


def test_only_records_of_one_configuration_at_common_batches_pair_up() -> None:
    records = [record("int4+bf16", 1, 3.6), record("int4+bf16", 2, 3.7),
               record("nvfp4+bf16", 1, 3.6, context=1024), record("nvfp4+bf16", 2, 3.7, context=1024),
               record("nvfp4+int8", 2, 3.6), record("nvfp4+int8", 4, 4.2)]  # one common batch with int4
    sims = {r.key(): r.step_s for r in records}
    assert format_contrasts(records, sims) == []
    records.append(record("nvfp4+int8", 1, 3.2))
    sims = {r.key(): r.step_s for r in records}
    (pair,) = format_contrasts(records, sims)
    assert (pair.base, pair.other, pair.batches) == ("int4+bf16", "nvfp4+int8", (1, 2))


def test_the_json_block_and_its_lines_say_what_they_are() -> None:
    records, sims = table({"int4+bf16": [3.59, 3.71, 3.91, 4.29], "nvfp4+bf16": [3.57, 4.07, 4.63, 4.86]},
                          {"int4+bf16": [3.60, 3.70, 3.90, 4.30], "nvfp4+bf16": [3.63, 3.73, 3.93, 4.33]})
    block = contrasts_json(records, sims)
    (pair,) = block
    assert pair["measured_delta_ms"] == pytest.approx([-0.02, 0.36, 0.72, 0.57])
    assert pair["label"].startswith("derived")
    (line,) = contrast_lines(block)
    assert "nvfp4+bf16 − int4+bf16" in line and "varies with batch" in line
