"""The words32 kernel's chip runs, predicted from probes alone: the documented error holds."""

from __future__ import annotations

import pytest

from calibration.reports.tpu_v5e_decoders import decoder_rows
from megakernel.quant import KERNEL_DECODER

DOCUMENTED_MAPE = 0.018  # way (b), docs/tpu-v5e-decoders.md (10 records, 2026-12-06)
MARGIN = 0.02


@pytest.mark.slow  # 24 engine runs of the K3 shard (~15 s)
def test_the_words32_runs_stay_within_the_documented_out_of_sample_error() -> None:
    rows = decoder_rows()
    assert len(rows) >= 10 and {r.batch for r in rows} >= {1, 8}
    errors = [abs(r.predicted_b_ms / r.measured_ms - 1.0) for r in rows]
    assert sum(errors) / len(errors) <= DOCUMENTED_MAPE + MARGIN, f"{KERNEL_DECODER} way (b) errors {errors}"
    # the decoder change is predicted as a speed-up wherever both kernels ran
    assert all(r.before_predicted_ms > r.predicted_b_ms for r in rows if r.before_predicted_ms is not None)
