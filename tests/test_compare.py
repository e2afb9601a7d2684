"""`tpusim compare`: stable row keys, capacity rows, speculation, GPU modes."""

from __future__ import annotations

import json

import pytest

from tpusim.app.cli import main
from tpusim.compare.rows import compare_rows, parse_systems
from tpusim.workload.speculative import SpeculativeConfig, SpeculativeStep

KEYS = {"system", "chips", "batch", "acceptance_length", "step_ms", "tokens_per_s", "label", "breakdown"}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    systems = parse_systems("tpu-v7:16,gb200:16,gb200:16:megakernel,gb200:4")
    return compare_rows("kimi-k3", systems, [1], acceptance_lengths=[3.0], schedule="published", calibrated=False)


@pytest.mark.slow
def test_rows_have_the_stable_keys(rows: list[dict]) -> None:
    assert len(rows) == 8
    for row in rows:
        assert set(row) >= KEYS
    plain = [r for r in rows if r["acceptance_length"] is None]
    assert [r["system"] for r in plain] == ["tpu-v7:16", "gb200:16", "gb200:16:megakernel", "gb200:4"]
    assert all(r["label"] == "simulated" for r in rows)


@pytest.mark.slow
def test_per_kernel_gpu_is_slower_than_gpu_megakernel_at_batch_1(rows: list[dict]) -> None:
    by_system = {r["system"]: r for r in rows if r["acceptance_length"] is None}
    per_kernel, mega = by_system["gb200:16"], by_system["gb200:16:megakernel"]
    assert per_kernel["step_ms"] > mega["step_ms"]
    where_pk, where_mk = per_kernel["breakdown"]["where_ms"], mega["breakdown"]["where_ms"]
    # the difference is launches first, then exposed copies and collectives
    assert where_pk["launches"] + where_pk["kernel_fixed"] > 10 * where_mk["launches"]
    assert where_pk["launches"] + where_pk["kernel_fixed"] + where_pk["exposed_dma"] > (
        where_mk["launches"] + where_mk["exposed_dma"])
    assert per_kernel["breakdown"]["launch_count"] > 1000 and mega["breakdown"]["launch_count"] == 1


@pytest.mark.slow
def test_four_gb200_do_not_fit(rows: list[dict]) -> None:
    small = [r for r in rows if r["system"] == "gb200:4"]
    assert all(r["fits"] is False and r["step_ms"] is None for r in small)
    assert "does not fit on 4 x gb200" in small[0]["note"]


@pytest.mark.slow
def test_speculation_rows(rows: list[dict]) -> None:
    tpu = {r["acceptance_length"]: r for r in rows if r["system"] == "tpu-v7:16"}
    spec = tpu[3.0]
    assert spec["draft_tokens"] == 7 and spec["drafter"] == "kimi-k3-dspark" and spec["drafter_kind"] == "parallel"
    assert spec["step_ms"] == pytest.approx(spec["draft_ms"] + spec["verify_ms"])
    assert spec["tokens_per_s"] == pytest.approx(1 * 3.0 / (spec["step_ms"] / 1000))
    assert spec["step_ms"] > tpu[None]["step_ms"]


def test_speculative_arithmetic() -> None:
    step = SpeculativeStep(batch=4, draft_forward_s=0.001, verify_step_s=0.01,
                           config=SpeculativeConfig(kind="autoregressive", acceptance_length=6))
    assert step.step_s == pytest.approx(0.017)
    assert step.accepted_tokens_per_s == pytest.approx(4 * 6 / 0.017)


@pytest.mark.slow
def test_compare_cli_json_and_plot(tmp_path, capsys) -> None:
    plot = tmp_path / "cmp.png"
    code = main(["compare", "--systems", "tpu-v7:16,gb200:16", "--batch", "1,2", "--schedule", "published",
                 "--uncalibrated", "--json", "--plot", str(plot)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data) == 4 and all(set(r) >= KEYS for r in data)
    assert plot.stat().st_size > 10_000


def test_compare_bad_systems(capsys) -> None:
    assert main(["compare", "--systems", "tpu-v7", "--schedule", "published"]) == 2
    assert "expected chip:chips" in capsys.readouterr().err
