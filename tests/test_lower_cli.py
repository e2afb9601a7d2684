"""`tpusim lower` lowers the kernel for TPU at full size from this CPU and compares VMEM;
what cannot run or lower is said in words a user understands."""

from __future__ import annotations

import json

import pytest

from tpusim.app.cli import main


@pytest.mark.slow  # traces all 93 layers at K3 TP32 sizes on 32 virtual devices (~8 s of CPU)
def test_lower_full_k3_published(capsys) -> None:
    assert main(["lower", "--model", "kimi-k3", "--schedule", "published", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lowered"] and data["devices"] == 32 and data["plan"] == "k3-tp32"
    assert data["collectives"] and data["remote_copies_per_layer"] > 0
    assert data["scratch_bytes"]["collectives"] > 0
    assert data["scratch_total_bytes"] == pytest.approx(data["accounting_total_bytes"], rel=0.01)
    assert data["fits"]


@pytest.mark.slow  # lowers the whole kimi-k3-mini kernel (~7 s, loaded machine)
def test_lower_mini_prints_the_vmem_comparison(capsys) -> None:
    assert main(["lower", "--model", "kimi-k3-mini", "--schedule", "published"]) == 0
    out = capsys.readouterr().out
    assert "traced to MLIR only: not compiled (Pallas -> Mosaic tpu_custom_call)" in out
    assert "(simulator accounting)" in out and "usable VMEM on tpu-v7" in out


@pytest.mark.slow  # traces the kernel until the lowering fails (~8.5 s, loaded machine)
def test_unlowerable_schedule_says_why(capsys) -> None:
    assert main(["lower", "--model", "kimi-k3", "--schedule", "published", "--devices", "4"]) == 2
    err = capsys.readouterr().err
    assert "mla.kv_b is 6.00 MiB per device" in err and "chunk_bytes to at least 6291456" in err


def test_run_kernel_on_a_model_too_large_points_to_lower(capsys) -> None:
    assert main(["run-kernel", "--model", "kimi-k3", "--schedule", "published", "--backend", "interpret"]) == 2
    err = capsys.readouterr().err
    assert "does not fit one device" in err
    assert "tpusim lower --model kimi-k3 --schedule published" in err
