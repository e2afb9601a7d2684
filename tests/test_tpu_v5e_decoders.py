"""The words32 kernel's chip runs against the earlier bytes kernel's, predicted from probes alone:
the documented error holds, and the decoder change is predicted as the speed-up it measured.

The guard (:func:`guard_failures`) is proven able to fail on planted rows (no engine run);
the slow test applies it to the committed records."""

from __future__ import annotations

import pytest

from calibration.reports.tpu_v5e_decoders import EARLIER_DECODER, DecoderRow, decoder_rows
from megakernel.quant import WORDS32_DECODER as KERNEL_DECODER

DOCUMENTED_MAPE = 0.017  # way (b), docs/tpu-v5e-decoders.md (22 records, 2026-12-06)
MARGIN = 0.02
SPEEDUP_GAP = 0.1  # the predicted speed-up within 0.1x of the measured one (documented: 0.04x at most)
MIN_RECORDS = 22  # the committed words32 K3-shard decodes (sets v5e-n … v5e-r)


def guard_failures(rows: list[DecoderRow]) -> list[str]:
    """What the page's figures would no longer hold for ``rows``: empty when they hold."""
    failures = []
    if len(rows) < MIN_RECORDS or not {r.batch for r in rows} >= {1, 8}:
        failures.append(f"{len(rows)} records over batches {sorted({r.batch for r in rows})}")
    errors = [abs(r.predicted_b_ms / r.measured_ms - 1.0) for r in rows]
    if not errors or sum(errors) / len(errors) > DOCUMENTED_MAPE + MARGIN:
        failures.append(f"{KERNEL_DECODER} way (b) MAPE above {DOCUMENTED_MAPE + MARGIN:.3f}: {errors}")
    pairs = [(r, r.before_ms / r.measured_ms, r.before_predicted_ms / r.predicted_b_ms) for r in rows
             if r.before_ms is not None and r.before_predicted_ms is not None]
    if len(pairs) < len(rows):  # every words32 run has its bytes counterpart in the committed file
        failures.append(f"{len(rows) - len(pairs)} rows without an {EARLIER_DECODER} record to compare with")
    for r, measured, predicted in pairs:
        if predicted <= 1.0 or abs(predicted - measured) > SPEEDUP_GAP:
            failures.append(f"{r.schedule} b{r.batch}: speed-up measured {measured:.2f}x, predicted {predicted:.2f}x")
    return failures


def _row(batch: int, measured: float = 50.0, predicted_b: float = 50.5, before: float | None = 78.0,
         before_predicted: float | None = 78.5) -> DecoderRow:
    return DecoderRow("published", batch, measured, 0.1, 45.0, predicted_b, before, before_predicted)


def test_the_guard_fails_on_planted_rows() -> None:
    good = [_row(1 if i % 2 else 8) for i in range(MIN_RECORDS)]
    assert guard_failures(good) == []
    assert guard_failures(good[:10])  # records gone
    assert guard_failures([_row(r.batch, predicted_b=55.0) for r in good])  # way (b) 10 % off
    assert guard_failures([_row(r.batch, before=None, before_predicted=None) for r in good])  # no earlier kernel
    assert guard_failures([_row(r.batch, before_predicted=r.predicted_b_ms) for r in good])  # no speed-up predicted
    assert guard_failures([_row(r.batch, before_predicted=100.0) for r in good])  # the wrong speed-up


def test_the_earlier_decoder_is_not_the_kernels() -> None:
    assert EARLIER_DECODER != KERNEL_DECODER


@pytest.mark.slow  # 44 engine runs of the K3 shard (~24 s)
def test_the_words32_runs_stay_within_the_documented_out_of_sample_error() -> None:
    assert guard_failures(decoder_rows(micro=False)) == []
