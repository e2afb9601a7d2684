"""A prefill that does not fit at the default row tile steps the tile down (as serving does)
and says so, instead of a dead end (``tpusim simulate --phase prefill``)."""

from __future__ import annotations

import json

import pytest

from tpusim.app.cli import main


@pytest.mark.slow  # K3 prefill simulations (~4-6 s)
def test_the_issue_case_steps_the_tile_down_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """``simulate --phase prefill --tokens 16384 --model kimi-k3 --hardware tpu-v7 --chips 16``
    was "infeasible" for every built-in schedule; the 32-row tile needs 89.6 MiB of 58 MiB VMEM."""
    assert main(["simulate", "--phase", "prefill", "--tokens", "16384", "--model", "kimi-k3", "--hardware", "tpu-v7",
                 "--chips", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prefill_row_tile"] < 32 and data["batch"] == 16384
    assert f"row tile stepped down from 32 to {data['prefill_row_tile']} rows" in data["source"]


def test_a_prefill_that_fits_keeps_the_default_tile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--phase", "prefill", "--tokens", "64", "--model", "kimi-k3-nano", "--hardware",
                 "tpu-v7", "--chips", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prefill_row_tile"] == 32 and "stepped down" not in data["source"]
