"""Every command picks a model's weight formats for a system one way
(tpusim.workload.format_choice.formats_for_chip) and says which: K3 on a GPU in the MXFP4
variant its model file names for GPUs, unless --formats says otherwise. (serving:
tests/test_serving_lengths.py; compare: its rows' source.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpusim.app.cli import build_parser, main
from tpusim.app.cli.common import resolve_workload

GPU_CHOICE = "kimi-k3@mxfp4, the format the model file names for gpus"


def _floor(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    assert main(["floor", "--model", "kimi-k3", "--hardware", "b300", "--chips", "8", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_floor_labels_the_formats_it_chose(capsys: pytest.CaptureFixture[str]) -> None:
    chosen = _floor(capsys)
    assert chosen["formats"].startswith(GPU_CHOICE)
    forced = _floor(capsys, "--formats", "experts=nvfp4")
    assert forced["formats"] == "--formats experts=nvfp4"
    assert forced["bytes_per_device"] != chosen["bytes_per_device"]  # the choice changes the answer


@pytest.mark.parametrize("command", ["simulate", "floor", "sweep"])
def test_simulate_floor_and_sweep_resolve_formats_alike(command: str, tmp_path: Path) -> None:
    extra = ["--out", str(tmp_path / "out")] if command == "sweep" else []
    args = build_parser().parse_args([command, "--model", "kimi-k3", "--hardware", "b300", "--chips", "8", *extra])
    model, _, _, _ = resolve_workload(args)
    assert model.variant == "mxfp4" and args.formats_choice.startswith(GPU_CHOICE)
    tpu = build_parser().parse_args([command, "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", *extra])
    model, _, _, _ = resolve_workload(tpu)
    assert model.variant is None and tpu.formats_choice == "the model file's formats"
