"""One writer per output folder (:mod:`tpusim.app.outdir_lock`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwmodels.errors import InputError
from tpusim.app.cli import main
from tpusim.app.outdir_lock import lock_path, output_lock

HOLD = """
import sys, time
from pathlib import Path
from tpusim.app.outdir_lock import output_lock
with output_lock(Path(sys.argv[1]), command="sweep"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_second_writer_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match=rf"in use by process {holder.pid} \(tpusim sweep, started "), \
                output_lock(tmp_path, command="sweep"):
            pass
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed: its pid stays in the file, the kernel released the lock
    notices: list[str] = []
    with output_lock(tmp_path, command="sweep", on_stale=notices.append):
        assert lock_path(tmp_path, is_folder=True).read_text().startswith(f"{os.getpid()} tpusim sweep")
    assert len(notices) == 1 and f"left by process {holder.pid}" in notices[0]
    assert lock_path(tmp_path, is_folder=True).read_text() == ""  # a clean finish leaves no pid behind


def test_a_clean_finish_is_not_reported_as_stale(tmp_path: Path) -> None:
    notices: list[str] = []
    for _ in range(2):
        with output_lock(tmp_path / "out", command="calibrate", on_stale=notices.append):
            pass
    assert notices == []


def test_a_file_output_locks_beside_the_file(tmp_path: Path) -> None:
    target = tmp_path / "measurements.jsonl"
    with output_lock(target, command="run-kernel", is_folder=False) as path:
        assert path == tmp_path / ".measurements.jsonl.lock"
        with pytest.raises(InputError, match="in use by process"), \
                output_lock(target, command="run-kernel", is_folder=False):
            pass
        with output_lock(tmp_path / "other.jsonl", command="run-kernel", is_folder=False):
            pass  # another file in the same folder is another output


@pytest.mark.slow  # a real sweep in a subprocess, ~7 s on the 2-core machine
def test_two_concurrent_sweeps_into_one_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    argv = ["sweep", "--model", "kimi-k3", "--hardware", "tpu-v7", "--chips", "16", "--batch", "1",
            "--out", str(out), "--quiet"]
    first = subprocess.Popen([sys.executable, "-m", "tpusim", *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        lock = lock_path(out, is_folder=True)
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text().startswith(f"{first.pid} ")):
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.1)
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2
        assert err.strip() == (f"tpusim sweep: error: {out} is in use by process {first.pid} "
                               f"({lock.read_text().split(' ', 1)[1].strip()}); wait for it to finish or "
                               f"choose another output")
        assert "tpusim sweep" in err
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    # the first sweep stops cleanly, its rows kept (SIGTERM may land while it still imports its modules)
    assert first.returncode in (130, 143), first.stderr.read() if first.stderr else ""
