"""The verdict on teacher-forced chip numerics (:func:`megakernel.chip_numerics.verdict`): every
committed v5e record passes, and records with a planted kernel error fail (shallow: over the
independent tolerance or a token flipped; deep: further from the chip's reference than the
exact-f32 CPU evaluation of the same model). Also: the VMEM limit a run gives Mosaic is the
chip's catalog VMEM on a TPU (the v5e's 128 MiB, not TPU v7's 64 MiB)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from hwmodels.units import MIB
from megakernel import chip_numerics, runner
from megakernel.commands import chip_numerics as chip_numerics_command
from megakernel.vmem_limit import PUBLISHED_KERNEL_CHIP, vmem_limit_for

RECORDS = Path(__file__).resolve().parents[1] / "calibration" / "data" / "tpu-v5e-numerics.jsonl"


def _records() -> list[dict]:
    return [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]


def test_committed_chip_records_pass_and_cover_shallow_and_deep():
    records = _records()
    assert {r["layers"] <= chip_numerics.INDEPENDENT_DEPTH for r in records} == {True, False}
    for record in records:
        ok, why = chip_numerics.verdict(record)
        assert ok, why


def test_shallow_record_fails_over_tolerance_or_on_a_flipped_token():
    shallow = next(r for r in _records() if r["layers"] <= chip_numerics.INDEPENDENT_DEPTH)
    over = copy.deepcopy(shallow)
    over["steps"][3]["kernel"] = 2e-2
    assert not chip_numerics.verdict(over)[0]
    flipped = copy.deepcopy(shallow)
    flipped["steps"][-1]["kernel_token_equal"] = False
    assert not chip_numerics.verdict(flipped)[0]


def test_deep_record_fails_when_the_kernel_is_off_by_more_than_the_reference_spread():
    for deep in (r for r in _records() if r["layers"] > chip_numerics.INDEPENDENT_DEPTH):
        broken = copy.deepcopy(deep)
        for step in broken["steps"]:
            step["kernel"] = 1.0  # what a wrong expert or a stale buffer gives
        ok, why = chip_numerics.verdict(broken)
        assert not ok, why


def test_verdicts_cli_exit_codes(tmp_path, capsys):
    assert chip_numerics_command.main(["--verdicts", str(RECORDS)]) == 0
    bad = _records()[0]
    bad["steps"][0]["kernel"] = 1.0
    planted = tmp_path / "planted.jsonl"
    planted.write_text(json.dumps(bad) + "\n")
    assert chip_numerics_command.main(["--verdicts", str(planted)]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert chip_numerics_command.main(["--verdicts", str(tmp_path / "missing.jsonl")]) == 2


@pytest.mark.parametrize(("chip", "mib"), [("tpu-v5e", 128), ("tpu-v7", 64)])
def test_vmem_limit_on_a_tpu_is_the_chips_catalog_vmem(monkeypatch, chip, mib):
    monkeypatch.setattr(runner, "device_chip", lambda _backend: chip)
    assert runner.vmem_limit_on("tpu") == mib * MIB
    assert runner.vmem_limit_on("interpret") == vmem_limit_for(PUBLISHED_KERNEL_CHIP) == 64 * MIB


@pytest.mark.parametrize(("chip", "fp8"), [("tpu-v5e", False), ("tpu-v6e", False), ("tpu-v7", True), ("tpu v9", False)])
def test_expert_products_on_a_tpu_are_the_chips(monkeypatch, chip, fp8):
    """The lent v5e decodes (its kernel unchanged); a TPU7x would feed FP8 to the MXU; a TPU the
    catalog does not name, and interpret mode, decode."""
    from megakernel.expert_products import DECODE, MXU_FP8

    monkeypatch.setattr(runner, "device_chip", lambda _backend: chip)
    assert runner.expert_products_on("tpu") is (MXU_FP8 if fp8 else DECODE)
    assert runner.expert_products_on("interpret") is DECODE
