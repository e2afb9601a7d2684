"""Output paths are written, never destroyed (:mod:`hwmodels.atomic`): symlinks are written
through, a FIFO / device / folder is refused with one line and exit 2, modes follow the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hwmodels.atomic import append_bytes, check_output_file, check_output_folder, write_text_atomic
from hwmodels.errors import InputError
from tpusim.app.cli import main


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    target, link = tmp_path / "t.json", tmp_path / "l.json"
    target.write_text("old")
    link.symlink_to(target.name)
    write_text_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == "t.json"
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.json", "t.json"]  # no temporary left


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "l.json"
    link.symlink_to("sub-target.json")
    write_text_atomic(link, "x")
    assert link.is_symlink() and (tmp_path / "sub-target.json").read_text() == "x"


@pytest.mark.parametrize("kind", ["fifo", "folder", "link-to-fifo"])
def test_non_regular_paths_are_refused_and_left_alone(tmp_path: Path, kind: str) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    path = {"fifo": fifo, "folder": tmp_path, "link-to-fifo": tmp_path / "l"}[kind]
    if kind == "link-to-fifo":
        path.symlink_to(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        write_text_atomic(path, "x")
    with pytest.raises(InputError):
        append_bytes(path, b"x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # the FIFO is still a FIFO
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_device_is_refused() -> None:
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    with pytest.raises(InputError, match="a device"):
        check_output_file("/dev/null")


def test_modes_follow_the_umask_and_existing_files_keep_theirs(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        fresh = write_text_atomic(tmp_path / "fresh.txt", "x")
        appended = append_bytes(tmp_path / "log.jsonl", b"{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(appended).st_mode) == 0o640
    kept = tmp_path / "kept.txt"
    kept.write_text("a")
    kept.chmod(0o604)
    write_text_atomic(kept, "b")
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o604 and kept.read_text() == "b"


def test_an_output_folder_must_be_a_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        check_output_folder(tmp_path / "file")
    assert check_output_folder(tmp_path / "new") == tmp_path / "new"


def _one_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2  # one line from run_guard, not argparse's usage block
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and len(lines) == 1, lines
    return errors[0]


def test_the_cli_refuses_a_fifo_trace_and_a_file_as_out_folder(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    fifos = {suffix: tmp_path / f"fifo{suffix}" for suffix in (".json", ".png", ".jsonl")}  # the suffix each writes
    for fifo in fifos.values():
        os.mkfifo(fifo)
    workload = ["--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16"]
    assert "FIFO" in _one_error(capsys, ["simulate", *workload, "--trace", str(fifos[".json"])])
    assert "FIFO" in _one_error(capsys, ["simulate", *workload, "--plot", str(fifos[".png"])])
    (tmp_path / "f").write_text("keep")
    assert "not a folder" in _one_error(capsys, ["sweep", *workload, "--out", str(tmp_path / "f")])
    assert "FIFO" in _one_error(capsys, ["run-kernel", "--out", str(fifos[".jsonl"])])
    assert (tmp_path / "f").read_text() == "keep"


def test_simulate_writes_its_trace_through_a_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: ``ln -s t.json l.json; tpusim simulate ... --trace l.json``."""
    (tmp_path / "t.json").write_text("")
    link = tmp_path / "l.json"
    link.symlink_to("t.json")
    assert main(["simulate", "--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4",
                 "--trace", str(link), "--json"]) == 0
    capsys.readouterr()
    assert link.is_symlink() and (tmp_path / "t.json").stat().st_size > 0
