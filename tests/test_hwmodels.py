"""The chip catalog, its error messages, calibrated overlays and `tpusim hardware`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from hwmodels import catalog
from hwmodels.catalog import BUILTIN_DIR, list_chips, load_chip, load_chip_file, make_system
from hwmodels.errors import InputError
from hwmodels.overlay import (
    CalibratedValue,
    CalibrationOverlay,
    apply_overlay,
    iter_figures,
    load_overlay,
    overlay_path,
    save_overlay,
)
from tpusim.app.cli import main

BUILTIN_FILES = sorted(BUILTIN_DIR.glob("*.yaml"))
EXPECTED_CHIPS = {"tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7", "h100", "h200", "b200", "gb200", "b300", "gb300"}


def _v7_data() -> dict[str, Any]:
    return yaml.safe_load((BUILTIN_DIR / "tpu-v7.yaml").read_text(encoding="utf-8"))


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def _overlay(**parameters: float) -> CalibrationOverlay:
    return CalibrationOverlay(
        chip="tpu-v7",
        fitted_on="unit-test traces",
        parameters={
            key.replace("__", "."): CalibratedValue(value=value, uncertainty=value * 0.01)
            for key, value in parameters.items()
        },
    )


# --------------------------------------------------------------------------- catalog files


def test_catalog_holds_every_expected_chip() -> None:
    assert {path.stem for path in BUILTIN_FILES} == EXPECTED_CHIPS
    assert set(list_chips()) == EXPECTED_CHIPS


@pytest.mark.parametrize("path", BUILTIN_FILES, ids=lambda path: path.stem)
def test_every_catalog_yaml_validates(path: Path) -> None:
    chip = load_chip_file(path)
    assert chip.name == path.stem
    for field_path, figure in iter_figures(chip):
        assert figure.source.strip(), field_path
        assert figure.label != "calibrated", f"{field_path}: published files hold no fits"
        if figure.label == "assumed":
            assert "assumed" in figure.source.lower(), f"{field_path}: say why it is assumed"
        if figure.label == "prior":
            assert figure.source.lower().startswith("prior"), f"{field_path}: say where the prior comes from"
    assert (
        chip.hbm.sustained_bandwidth_bytes_per_s.value <= chip.hbm.peak_bandwidth_bytes_per_s.value
    )


def test_tpu_v7_values_are_per_device() -> None:
    chip = load_chip("tpu-v7")
    assert chip.devices_per_chip == 2
    assert chip.matrix_unit.peak_for("bf16") == pytest.approx(1153e12, rel=2e-3)
    assert chip.hbm.peak_bandwidth_bytes_per_s.value == pytest.approx(3.70e12)
    assert chip.link("sibling").topology == "pair"


@pytest.mark.parametrize("name", ["tpu-v5e", "tpu-v5p", "tpu-v6e"])
def test_older_tpus(name: str) -> None:
    chip = load_chip(name)
    assert chip.kind == "tpu" and chip.devices_per_chip == 1
    assert {tier.name for tier in chip.on_chip} == {"vmem", "smem"}
    assert {unit.name for unit in chip.compute} == {"mxu", "vpu"}
    assert [link.name for link in chip.links] == ["ici"]  # sibling link only on v7
    assert chip.execution.mode == "megakernel"
    sustained = chip.hbm.sustained_bandwidth_bytes_per_s
    assert sustained.label == "assumed"
    assert sustained.value == pytest.approx(
        0.85 * chip.hbm.peak_bandwidth_bytes_per_s.value, rel=2e-3
    )


@pytest.mark.parametrize("name", ["h100", "h200", "b200", "gb200"])
def test_gpus(name: str) -> None:
    chip = load_chip(name)
    assert chip.kind == "gpu" and chip.devices_per_chip == 1 and chip.sm_count
    shared = chip.memory("shared_memory")
    assert shared.per == "sm" and shared.capacity_bytes.value == 228 * 1024
    assert chip.memory("l2").capacity_bytes.value > 0
    tensor = chip.unit("tensor_core")
    assert (tensor.tile_rows, tensor.tile_cols) == (64, 256)
    assert chip.vector_unit.name == "cuda_core"
    nvlink = chip.link("nvlink")
    assert nvlink.topology == "switch"
    assert nvlink.domain_devices == (72 if name == "gb200" else 8)
    assert 1e-6 <= nvlink.collective_stage_latency_s.value <= 20e-6
    execution = chip.execution
    assert execution.mode == "serving_stack"
    assert execution.launch_overhead_s.value == pytest.approx(3e-6)
    assert execution.gpu is not None
    assert execution.gpu.kernel_gap_s.value < execution.launch_overhead_s.value  # a graph gap beats a host launch
    assert execution.per_op_efficiency is not None
    # per-kernel streams at per_op_efficiency x sustained = 0.8 x peak (AIConfigurator's factor, applied once)
    assert execution.per_op_efficiency.value * chip.hbm.sustained_bandwidth_bytes_per_s.value == pytest.approx(
        0.8 * chip.hbm.peak_bandwidth_bytes_per_s.value, rel=1e-3)
    assert chip.power_w is not None


def test_gpu_figures_from_the_reference() -> None:
    assert load_chip("h200").hbm.sustained_bandwidth_bytes_per_s.label == "measured"
    assert load_chip("h200").hbm.sustained_bandwidth_bytes_per_s.value == pytest.approx(4.3e12)
    gb200 = load_chip("gb200")
    assert gb200.hbm.sustained_bandwidth_bytes_per_s.value == pytest.approx(0.9 * 8e12)
    assert gb200.execution.per_op_efficiency is not None
    assert "[AIC]" in gb200.execution.per_op_efficiency.source
    assert gb200.unit("tensor_core").peak_for("fp4") == pytest.approx(10e15)
    assert load_chip("h100").unit("tensor_core").peak_for("bf16") == pytest.approx(989e12)


def test_make_system_counts_devices_and_hosts() -> None:
    v7 = make_system("tpu-v7", 8)
    assert (v7.devices, v7.hosts, v7.name) == (16, 2, "tpu-v7x8")
    assert make_system("gb200", 72).hosts == 18
    assert make_system("h100", 16).hosts == 2
    assert make_system("tpu-v5e", 3).hosts == 1
    with pytest.raises(InputError, match="chips"):
        make_system("tpu-v7", 0)


# --------------------------------------------------------------------------- error messages


def test_negative_bandwidth_names_file_and_field(tmp_path: Path) -> None:
    data = _v7_data()
    data["hbm"]["peak_bandwidth_bytes_per_s"]["value"] = -1.0
    path = _write_yaml(tmp_path / "negative.yaml", data)
    with pytest.raises(InputError) as caught:
        load_chip_file(path)
    message = str(caught.value)
    assert "\n" not in message
    assert "negative.yaml" in message
    assert (
        "hbm.peak_bandwidth_bytes_per_s.value: Input should be greater than or equal to 0"
        in message
    )


def test_missing_field_names_file_and_field(tmp_path: Path) -> None:
    data = _v7_data()
    del data["hbm"]["capacity_bytes"]
    path = _write_yaml(tmp_path / "missing.yaml", data)
    with pytest.raises(InputError) as caught:
        load_chip_file(path)
    message = str(caught.value)
    assert "\n" not in message
    assert "missing.yaml" in message and "missing field hbm.capacity_bytes" in message


def test_list_elements_are_named_in_error_paths(tmp_path: Path) -> None:
    data = _v7_data()
    data["links"][0]["latency_s"]["value"] = -1.0
    path = _write_yaml(tmp_path / "link.yaml", data)
    with pytest.raises(InputError, match=r"links\.ici\.latency_s\.value"):
        load_chip_file(path)


def test_yaml_syntax_error_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nhbm: {capacity_bytes: [1, 2\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_chip_file(path)
    message = str(caught.value)
    assert "\n" not in message and "broken.yaml" in message and "YAML syntax error" in message


def test_unknown_chip_lists_available_names() -> None:
    with pytest.raises(InputError) as caught:
        load_chip("tpu-v99")
    message = str(caught.value)
    assert "tpu-v99" in message
    for name in EXPECTED_CHIPS:
        assert name in message


def test_local_entry_may_not_shadow_a_builtin(local_dir: Path) -> None:
    local_dir.mkdir(parents=True)
    (local_dir / "tpu-v7.yaml").write_bytes((BUILTIN_DIR / "tpu-v7.yaml").read_bytes())
    with pytest.raises(InputError, match="shadow"):
        list_chips()


def test_local_entry_is_listed_and_loaded(local_dir: Path) -> None:
    local_dir.mkdir(parents=True)
    data = _v7_data()
    data["name"] = "my-tpu"
    _write_yaml(local_dir / "my-tpu.yaml", data)
    assert "my-tpu" in list_chips()
    assert load_chip("my-tpu").devices_per_chip == 2
    _write_yaml(local_dir / "other.yaml", data)
    with pytest.raises(InputError, match="does not match the file name"):
        load_chip("other")


# --------------------------------------------------------------------------- overlays


def test_overlay_round_trip(tmp_path: Path) -> None:
    overlay = _overlay(hbm__sustained_bandwidth_bytes_per_s=2.9e12, dma__issue_latency_s=0.5e-6)
    path = save_overlay(overlay, tmp_path / "calibrated" / "tpu-v7.yaml")
    assert load_overlay(path) == overlay


def test_overlay_path_is_in_the_local_dir(local_dir: Path) -> None:
    assert overlay_path("tpu-v7") == local_dir / "calibrated" / "tpu-v7.yaml"


def test_applying_an_overlay_marks_figures_and_keeps_the_published_file() -> None:
    published_file = BUILTIN_DIR / "tpu-v7.yaml"
    before = published_file.read_bytes()
    overlay = _overlay(
        hbm__sustained_bandwidth_bytes_per_s=2.9e12,
        links__ici__collective_stage_latency_s=4.1e-6,
        execution__per_layer_overhead_s=2.0e-6,
        compute__mxu__weight_push_s_per_tile=22e-9,
        dma__concurrency_penalty_per_dma=0.05,
    )
    save_overlay(overlay)  # default path: the local dir's calibrated/tpu-v7.yaml
    assert published_file.read_bytes() == before

    calibrated = load_chip("tpu-v7")
    published = load_chip("tpu-v7", calibrated=False)
    assert published_file.read_bytes() == before
    sustained = calibrated.hbm.sustained_bandwidth_bytes_per_s
    assert sustained.value == 2.9e12 and sustained.label == "calibrated"
    assert sustained.uncertainty == pytest.approx(2.9e10)
    assert "calibrated overlay" in sustained.source and "published 3.33e+12" in sustained.source
    stage = calibrated.link("ici").collective_stage_latency_s
    assert (stage.value, stage.label) == (4.1e-6, "calibrated")
    assert calibrated.link("sibling").collective_stage_latency_s.label == "assumed"
    assert calibrated.execution.per_layer_overhead_s.label == "calibrated"
    assert calibrated.unit("mxu").weight_push_s_per_tile.value == 22e-9  # type: ignore[union-attr]
    assert calibrated.dma.concurrency_penalty_per_dma.value == 0.05
    # the published figures stay reachable
    assert published.hbm.sustained_bandwidth_bytes_per_s.value == 3.33e12
    assert published.hbm.sustained_bandwidth_bytes_per_s.label == "prior"
    assert all(figure.label != "calibrated" for _, figure in iter_figures(published))


def test_overlay_can_fill_an_unset_optional_figure() -> None:
    chip = load_chip("tpu-v5e", calibrated=False)
    assert chip.unit("mxu").weight_push_s_per_tile is None
    overlay = CalibrationOverlay(
        chip="tpu-v5e",
        fitted_on="test",
        parameters={"compute.mxu.weight_push_s_per_tile": CalibratedValue(value=10e-9)},
    )
    fitted = apply_overlay(chip, overlay)
    push = fitted.unit("mxu").weight_push_s_per_tile
    assert push is not None and push.label == "calibrated" and "no published value" in push.source
    assert chip.unit("mxu").weight_push_s_per_tile is None  # input chip untouched


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        ("hbm.nonsense_bytes", "does not exist"),
        ("links.nvlink.latency_s", "no element named 'nvlink'"),
        ("dma.engines", "not a figure"),
        ("hbm", "not a figure"),
    ],
)
def test_overlay_with_a_bad_path_is_an_input_error(key: str, fragment: str) -> None:
    overlay = CalibrationOverlay(
        chip="tpu-v7", fitted_on="test", parameters={key: CalibratedValue(value=1.0)}
    )
    with pytest.raises(InputError, match=fragment):
        apply_overlay(load_chip("tpu-v7", calibrated=False), overlay)


def test_overlay_for_another_chip_is_refused() -> None:
    overlay = _overlay(dma__issue_latency_s=1e-6)
    with pytest.raises(InputError, match="not 'h100'"):
        apply_overlay(load_chip("h100", calibrated=False), overlay)


def test_overlay_that_breaks_an_invariant_names_the_overlay() -> None:
    overlay = _overlay(hbm__sustained_bandwidth_bytes_per_s=9e12)  # above the 3.7e12 peak
    save_overlay(overlay)
    with pytest.raises(InputError, match=r"tpu-v7\.yaml: hbm: .*exceeds the published peak"):
        load_chip("tpu-v7")


def test_invalid_overlay_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad-overlay.yaml"
    _write_yaml(
        path,
        {"chip": "tpu-v7", "fitted_on": "x", "parameters": {"dma.issue_latency_s": {"value": -1}}},
    )
    with pytest.raises(InputError) as caught:
        load_overlay(path)
    message = str(caught.value)
    assert "\n" not in message and "bad-overlay.yaml" in message
    assert "parameters.dma.issue_latency_s.value" in message


def test_interrupted_save_keeps_the_previous_overlay(monkeypatch: pytest.MonkeyPatch) -> None:
    first = _overlay(dma__issue_latency_s=0.5e-6)
    path = save_overlay(first)
    before = path.read_bytes()

    def failing_replace(src: Any, dst: Any) -> None:
        raise OSError("simulated crash during rename")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        save_overlay(_overlay(dma__issue_latency_s=9e-6))
    assert path.read_bytes() == before
    assert load_overlay(path) == first
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp file left


def test_overlays_are_never_written_into_the_published_catalog() -> None:
    with pytest.raises(InputError, match="published catalog"):
        save_overlay(_overlay(dma__issue_latency_s=1e-6), BUILTIN_DIR / "tpu-v7.yaml")


# --------------------------------------------------------------------------- CLI


def test_cli_lists_chips(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED_CHIPS:
        assert name in out


def test_cli_list_marks_calibrated_chips(capsys: pytest.CaptureFixture[str]) -> None:
    save_overlay(_overlay(dma__issue_latency_s=0.5e-6))
    assert main(["hardware"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "tpu-v7" in line)
    assert "yes" in row


def test_cli_show_tpu_v7(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware", "show", "tpu-v7"]) == 0
    out = capsys.readouterr().out
    assert "TFLOP/s" in out and "published" in out and "[INF]" in out


def test_cli_show_json_and_uncalibrated(capsys: pytest.CaptureFixture[str]) -> None:
    save_overlay(_overlay(dma__issue_latency_s=0.5e-6))
    assert main(["hardware", "show", "tpu-v7", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dma"]["issue_latency_s"]["label"] == "calibrated"
    assert main(["hardware", "show", "tpu-v7", "--json", "--uncalibrated"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dma"]["issue_latency_s"]["label"] == "measured"


def test_cli_show_unknown_chip_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware", "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown chip 'nope'" in err and "tpu-v7" in err
    assert len(err.strip().splitlines()) == 1


def test_catalog_module_exposes_its_folders(local_dir: Path) -> None:
    assert catalog.catalog_dirs() == [BUILTIN_DIR, local_dir]
