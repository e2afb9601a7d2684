"""The host probe: a quick measurement of this machine becomes the `host-cpu` chip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwmodels import probe
from hwmodels.catalog import list_chips, load_chip
from hwmodels.overlay import iter_figures
from hwmodels.schema import Chip
from tpusim.app.cli import main


@pytest.fixture(scope="module")
def host_chip() -> Chip:
    """One quick probe (~1–3 s) shared by the tests in this file."""
    return probe.probe_host(quick=True)


def test_quick_probe_describes_this_host(host_chip: Chip) -> None:
    assert host_chip.name == "host-cpu"
    assert (host_chip.kind, host_chip.vendor, host_chip.devices_per_chip) == ("cpu", "host", 1)
    cpu = host_chip.unit("cpu")
    assert set(cpu.peak_flops_per_s) == {"f32", "bf16"}
    for figure in cpu.peak_flops_per_s.values():
        assert 1e8 < figure.value < 1e15 and figure.label == "measured"
        assert figure.source.startswith("probed on ")
    copy = host_chip.hbm.sustained_bandwidth_bytes_per_s
    assert 1e8 < copy.value < 1e13 and "read + write" in copy.source
    assert host_chip.hbm.capacity_bytes.value > 1 << 28
    launch = host_chip.execution.launch_overhead_s
    assert launch.label == "measured" and 1e-7 < launch.value < 1e-2
    assert host_chip.execution.mode == "per_op_launch"
    assert host_chip.memory("l2").capacity_bytes.value > 0
    assert all(figure.source for _, figure in iter_figures(host_chip))


def test_host_entry_is_saved_and_found(host_chip: Chip, local_dir: Path) -> None:
    path = probe.write_host_entry(host_chip)
    assert path == local_dir / "host-cpu.yaml"
    assert "host-cpu" in list_chips()
    assert load_chip("host-cpu") == host_chip


def test_parse_sysfs_cache_sizes() -> None:
    assert probe._parse_size("2048K") == 2 << 20
    assert probe._parse_size("32M\n") == 32 << 20
    assert probe._parse_size("512") == 512


def test_cli_probe_writes_the_entry(
    host_chip: Chip,
    local_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tpusim.app.cli import hardware

    calls: list[bool] = []

    def fake_probe(*, quick: bool = False) -> Chip:
        calls.append(quick)
        return host_chip

    monkeypatch.setattr(hardware, "probe_host", fake_probe)
    assert main(["hardware", "probe", "--quick", "--json"]) == 0
    assert calls == [True]
    assert json.loads(capsys.readouterr().out)["name"] == "host-cpu"
    assert (local_dir / "host-cpu.yaml").is_file()
    assert main(["hardware", "probe"]) == 0
    assert "host-cpu" in capsys.readouterr().out
