"""`tpusim lower` lowers the kernel for TPU at full size from this CPU and compares VMEM;
what cannot run or lower is said in words a user understands."""

from __future__ import annotations

import json

import pytest

from hwmodels.units import MIB
from tpusim.app.cli import main


# heavy (suite time: ~5-8 s of CPU): the same lowering (K3 TP32, published, batch 1, its scratch against the
# accounting) runs by default in tests/test_megakernel_collectives.py (test_full_k3_tp32_lowers_with_collectives_
# vmem_and_order_match_the_simulator[1]), and the CLI's ``lower --json`` of K3 TP32 in tests/test_vmem_truth.py
@pytest.mark.heavy  # traces all 93 layers at K3 TP32 sizes on 32 virtual devices (~8 s of CPU)
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


def test_a_vmem_refusal_prints_the_compilers_figure_beside_the_accounting(capsys, monkeypatch) -> None:
    """The compiler's own figure (here from its refusal, "Used X of Y") beside the accounting, and
    the accounting plus the catalog's compiler reserve (tpu-v7: 64 - 58 MiB) as a share of it."""
    from megakernel import mosaic_compile
    from megakernel.commands import lower

    report = {"model": "kimi-k3", "plan": "k3-tp32", "devices": 32, "schedule": "published", "batch": 8,
              "lowered": True, "scratch_bytes": {"all": 57.61 * MIB}, "accounting_bytes": {"all": 57.61 * MIB},
              "collectives": True, "remote_copies_per_layer": 143, "scratch_tiled_bytes": 57.96 * MIB,
              "deployment": None, "plan_collectives": {},
              "compile": {"topology": "tpu7x:2x2x4", "ok": False, "seconds": 22.5, "kind": "vmem",
                          "error": "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem. Used 66.10M of "
                                   "64.00M vmem. Exceeded vmem capacity by 2.10M."}}
    monkeypatch.setattr(mosaic_compile, "libtpu_available", lambda: True)
    monkeypatch.setattr(lower, "_lower_on_mesh", lambda *args, **kwargs: report)
    assert main(["lower", "--hardware", "tpu-v7", "--model", "kimi-k3", "--schedule", "published",
                 "--batch", "8"]) == 1
    out = capsys.readouterr().out
    assert "the compiler's figure:     66.10 MiB (measured: Mosaic's own, its refusal above" in out
    assert "plus 8.14 MiB of spill slots" in out and "-12.84 % of it" in out
    assert "63.61 MiB" in out and "-3.77 % of the compiler's figure" in out
