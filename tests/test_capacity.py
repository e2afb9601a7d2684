"""HBM capacity checks and system specs for `tpusim compare`."""

from __future__ import annotations

import pytest

from hwmodels.catalog import make_system
from hwmodels.errors import InputError
from tpusim.compare.rows import parse_systems, with_execution
from tpusim.workload.capacity import capacity_report, check_capacity, resident_weight_bytes
from tpusim.workload.model_catalog import load_model, plan_for


def _plan(model, system):
    intra = "nvlink" if system.chip.kind == "gpu" else "ici"
    return plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip, intra_link=intra)


def test_k3_experts_resident_per_rank_match_reference() -> None:
    """≈ 72.2 GB of expert slices per rank (92 layers x 112 slices) in the TP32 plan."""
    model = load_model("kimi-k3")
    plan = plan_for(model, 32, devices_per_chip=2)
    _, experts = resident_weight_bytes(model, plan)
    assert experts / 1e9 == pytest.approx(72.2, rel=0.01)


def test_k3_on_4_gb200_is_rejected_and_fits_on_16() -> None:
    model = load_model("kimi-k3")
    small = make_system("gb200", 4)
    with pytest.raises(InputError, match=r"kimi-k3 does not fit on 4 x gb200: each device needs \d+\.\d GB"):
        check_capacity(model, _plan(model, small), small.chip, chips=4, batch=8, context_tokens=4096)
    large = make_system("gb200", 16)
    report = check_capacity(model, _plan(model, large), large.chip, chips=16, batch=8, context_tokens=4096)
    assert report.fits and report.total_bytes < 186e9


def test_kv_cache_grows_with_batch_and_context() -> None:
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    plan = _plan(model, system)
    small = capacity_report(model, plan, system.chip, batch=1, context_tokens=1024)
    large = capacity_report(model, plan, system.chip, batch=8, context_tokens=8192)
    assert large.kv_bytes > 8 * small.kv_bytes * 0.9
    assert large.weight_bytes == small.weight_bytes


def test_parse_systems() -> None:
    specs = parse_systems("tpu-v7:16, gb200:16:megakernel,h200:8:graphs")
    assert [s.label for s in specs] == ["tpu-v7:16", "gb200:16:megakernel", "h200:8:graphs"]
    for bad in ("tpu-v7", "gb200:x", "gb200:16:warp", "gb200:0"):
        with pytest.raises(InputError):
            parse_systems(bad)


def test_execution_switch_keeps_published_values() -> None:
    chip = make_system("gb200", 16).chip
    mega = with_execution(chip, "megakernel")
    graphs = with_execution(chip, "graphs")
    assert mega.execution.mode == "megakernel" and chip.execution.mode == "per_op_launch"
    assert graphs.execution.launch_overhead_s.value < chip.execution.launch_overhead_s.value
    assert mega.hbm == chip.hbm
