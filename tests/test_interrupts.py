"""Interrupted runs lose nothing: real SIGINT / SIGTERM during ``calibrate`` and ``demo``
leave the previous report and overlay byte for byte, and no temporary file behind."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpusim.app.cli.run_guard import EXIT_INTERRUPTED, EXIT_TERMINATED, run_command
from tpusim.app.interrupts import deferred_interrupts, terminate_as_interrupt

PREVIOUS = {"report.md": "# previous report\n", "fit.json": '{"previous": true}\n',
            "measurements.jsonl": '{"previous": 1}\n', "scatter.png": "previous png"}


def test_signals_are_held_during_a_commit_and_delivered_after() -> None:
    reached_end = False
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # a handler that raised would have raised by now
        reached_end = True
    assert reached_end


def test_sigterm_unwinds_like_ctrl_c() -> None:
    cleaned = False
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        finally:
            cleaned = True
    assert cleaned and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


class _WrappedInterrupt(RuntimeError):
    """What a library may make of an interrupt it was running when the signal landed."""


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, EXIT_INTERRUPTED, "interrupted"),
                                                   (signal.SIGTERM, EXIT_TERMINATED, "terminated")])
def test_an_interrupt_a_library_wraps_still_exits_as_interrupted(
        sig: signal.Signals, code: int, word: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Seen in CI: a sweep killed while it imported its modules exited 1 with a traceback, because
    pydantic, building a model's schema when SIGTERM landed, raised ``SchemaError: ... Terminated:
    signal SIGTERM``. Whatever the interrupt becomes, the command exits as interrupted."""
    def command(args: argparse.Namespace) -> int:
        try:
            os.kill(os.getpid(), sig)
            time.sleep(1)
        except KeyboardInterrupt as error:
            raise _WrappedInterrupt(f"while building: {error!r}") from None
        return 0

    assert run_command(argparse.Namespace(command="probe", func=command)) == code
    assert capsys.readouterr().err == f"tpusim probe: {word}\n"


def test_a_bug_without_a_signal_keeps_its_traceback() -> None:
    def command(args: argparse.Namespace) -> int:
        raise _WrappedInterrupt("a bug")

    with pytest.raises(_WrappedInterrupt, match="a bug"):
        run_command(argparse.Namespace(command="probe", func=command))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _interrupt_when(argv: list[str], marker: str, sig: signal.Signals, env: dict[str, str]) -> int:
    """Start ``tpusim ARGV``; once ``marker`` is on stderr, wait a moment and send ``sig``."""
    proc = subprocess.Popen([sys.executable, "-m", "tpusim", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if marker in line:
                break
        time.sleep(1.0)
        assert proc.poll() is None, "finished before the signal: the test would prove nothing"
        proc.send_signal(sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


@pytest.mark.slow  # two subprocesses with the calibration imports, ~10 s
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_calibrate_interrupted_keeps_the_previous_report_and_overlay(tmp_path: Path, sig: signal.Signals) -> None:
    out, local = tmp_path / "calib", tmp_path / "local"
    out.mkdir()
    for name, text in PREVIOUS.items():
        (out / name).write_text(text)
    overlay = local / "calibrated" / "tpu-v7.yaml"
    overlay.parent.mkdir(parents=True)
    overlay.write_text("# previous overlay\n")
    before = _snapshot(tmp_path)
    env = {**os.environ, "TPUSIM_LOCAL_DIR": str(local)}
    code = _interrupt_when(["calibrate", "--hardware", "tpu-v7", "--measurements", "published:tpu7x-musespark",
                            "--uncalibrated-start", "--out", str(out)], "calibrating", sig, env)
    assert code == (130 if sig == signal.SIGINT else 143)
    after = _snapshot(tmp_path)
    after.pop("calib/.tpusim.lock")
    assert after == before


@pytest.mark.slow  # the demo's first steps in a subprocess, ~15 s
def test_demo_terminated_keeps_the_previous_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.md").write_text("# previous demo report\n")
    env = {**os.environ, "TPUSIM_LOCAL_DIR": str(tmp_path / "local")}
    code = _interrupt_when(["demo", "--quick", "--jobs", "1", "--out", str(out)], "[demo] sweep b1", signal.SIGTERM,
                           env)
    assert code in (130, 143)
    assert (out / "report.md").read_text() == "# previous demo report\n"
    assert not [p for p in tmp_path.rglob("*.tmp")]
