"""Analytic floors and `tpusim floor`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwmodels.catalog import make_system
from hwmodels.units import MIB
from tpusim.app.cli import main
from tpusim.report.floor import floor_report
from tpusim.workload.floors import floors
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.routing import RoutingModel, parse_routing


def run_json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_k3_bytes_per_device_match_reference(capsys) -> None:
    report = run_json(capsys, ["floor", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16",
                               "--batch", "1", "--json"])
    assert report["bytes_per_device"] == pytest.approx(6.94e9, rel=0.03)
    for key in ("bytes_per_device", "hbm_floor_ms", "compute_floor_ms", "collective_floor_ms",
                "floor_ms", "tokens_per_s_at_floor", "breakdown", "source"):
        assert key in report
    families = report["breakdown"]["bytes_by_family"]
    assert families["kda_proj"] / MIB == pytest.approx(69 * 29.84375)
    assert families["mla_proj"] / MIB == pytest.approx(24 * 43.25)
    assert families["router"] / MIB == pytest.approx(92 * 7.0)
    assert families["routed_expert"] == pytest.approx(92 * 2 * 7_010_304)
    assert report["tokens_per_s_at_floor"] == pytest.approx(1000 / report["floor_ms"])
    assert "analytic floor" in report["source"]


@pytest.mark.parametrize(("variant", "gb"), [("int4+bf16", 7.02), ("nvfp4+int8", 4.70)])
def test_muse_spark_bytes_per_core(capsys, variant: str, gb: float) -> None:
    report = run_json(capsys, ["floor", "--model", f"muse-spark@{variant}", "--hardware", "tpu-v7", "--chips", "4",
                               "--batch", "1", "--routing", "identical", "--context", "200", "--json"])
    assert report["bytes_per_device"] / 1e9 == pytest.approx(gb, rel=0.03)


def test_floor_components_and_batch_scaling() -> None:
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    plan = plan_for(model, 32, devices_per_chip=2)
    b1 = floor_report(model, plan, system, batch=1, context_tokens=1024, routing=RoutingModel("uniform"))
    b8 = floor_report(model, plan, system, batch=8, context_tokens=1024, routing=RoutingModel("uniform"))
    assert b8["bytes_per_device"] > b1["bytes_per_device"]
    assert b8["routed_experts_per_device_per_layer"] == pytest.approx(112 * (1 - (1 - 16 / 896) ** 8))
    assert b8["tokens_per_s_at_floor"] > b1["tokens_per_s_at_floor"]
    program = build_program(model, plan, batch=1)
    fl = floors(program, system.chip)
    assert fl.floor_s >= fl.hbm_floor_s and fl.floor_s >= fl.compute_floor_s
    assert fl.hbm_floor_s == pytest.approx(program.hbm_bytes / 3.70e12)


def test_floor_routing_models_run(capsys) -> None:
    for routing in ("identical", "zipf:1.1"):
        report = run_json(capsys, ["floor", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16",
                                   "--batch", "4", "--routing", routing, "--json"])
        assert report["routing"] == parse_routing(routing).label


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "nope", "--hardware", "tpu-v7", "--chips", "16"], "unknown model 'nope'"),
        (["--model", "kimi-k3", "--hardware", "tpu-v99", "--chips", "16"], "tpu-v99"),
        (["--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", "--routing", "weird"], "unknown routing model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv: list[str], message: str) -> None:
    assert main(["floor", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_batch_zero_is_rejected(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["floor", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", "--batch", "0"])
    assert exit_info.value.code == 2
    assert "--batch: must be >= 1" in capsys.readouterr().err


def test_bad_hardware_yaml_names_file_and_field(tmp_path, monkeypatch, capsys) -> None:
    from hwmodels.catalog import load_chip_file
    from hwmodels.errors import InputError

    text = Path("hwmodels/catalog/tpu-v7.yaml").read_text().replace("value: 3.70e12", "value: -3.70e12")
    path = tmp_path / "neg.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=r"neg.yaml: hbm.peak_bandwidth_bytes_per_s.value"):
        load_chip_file(path)
