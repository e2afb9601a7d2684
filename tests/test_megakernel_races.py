"""Race detection: the TPU interpreter's detector (``detect_races=True``,
``vector_clock_size=256``, fixed seeds, uninitialised VMEM as NaN) finds no race for valid
schedules in both DMA modes, and finds one when the plan is broken on purpose.

Each check runs in a subprocess with a timeout (:mod:`megakernel.commands.race_check`): a kernel
that waits on a semaphore nobody signals would hang forever. The two race-free runs share one
process (:func:`race_free_runs`: its start-up, weights and reference step are paid once). They run
on a 5-layer kimi-k3-mini, batch 2: the prologue (dense layer 0), KDA windows 1-2 and the MLA
window 3 inside the layer loop, the last window (KDA layer 4) and the head, so every window kind
of the 93-layer kernel (the same loop) and every kind-to-kind lead-in (dense to KDA, KDA to KDA,
KDA to MLA, MLA to KDA, last window to head) runs under the detector; the same pairs on 8 layers
(MLA also as the last window) are ``-m heavy``. The planted race runs on 4 layers.

The broken schedule of the issue (refilling a buffer that is still being read) has two
forms. A chunked family with one buffer and a prefetch distance is rejected by
``Schedule`` validation (``test_megakernel_plan``); every other schedule is realised by the
kernel's plan, which never reuses a busy buffer (proved for whole steps by the replay
checker in ``test_megakernel_plan``), so the negative control here disables that rule in
the plan (``--unsafe``): the next layer's attention weights then land in expert slots still
being read, and the detector reports the race (eager DMA mode).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from planted_races import frame, issuer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def race_check(*args: str, timeout_s: int) -> list[dict]:
    # one Eigen thread; XLA reads only "--" flags and silently drops everything after the first
    # word without "--" (a bare "intra_op_parallelism_threads=1", not an XLA flag, stood here)
    env = {**os.environ, "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
    proc = subprocess.run([sys.executable, "-m", "megakernel.commands.race_check", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _assert_race_free(results: list[dict], runs: int) -> None:
    assert len(results) == runs
    for result in results:
        assert not result["races"], result
        assert result["max_abs_error"] < 1e-2, result  # batch-2 tolerance (see test_megakernel_kernel)


RACE_FREE_PAIRS = "chunked:on_wait,ring:eager"


def _race_free_pairs(layers: int) -> dict[str, dict]:
    results = race_check(RACE_FREE_PAIRS, "--layers", str(layers), timeout_s=900)
    assert [r["mode"] for r in results] == ["on_wait", "eager"], results
    return {"chunked": results[0], "ring": results[1]}


@pytest.fixture(scope="module")
def race_free_runs() -> dict[str, dict]:
    """The chunked schedule in ``on_wait`` mode and the ring pool in ``eager`` mode, one process:
    the same kernel runs as in a process each (the detector's seed is set before each run), and
    the weights, start-up and reference step are paid once (measured 2026-12-07: 73.6 s of CPU for
    both, against 77.1 s in two processes). On 5 layers (see the module docstring; suite time:
    41 s of CPU against 53 s on 8 layers, measured side by side 2026-12-07)."""
    return _race_free_pairs(5)


def test_no_race_for_valid_schedules_in_both_dma_modes(race_free_runs):
    """Each DMA mode once, each on a different schedule: ``on_wait`` on the chunked schedule here,
    ``eager`` on the ring pool (next test); published in eager mode and the other pairs are
    ``-m heavy`` (suite time: each run 30-100 s). The published schedule runs race-free in CI
    in the multi-device collective kernel, race detector on (tests/test_plan_variants_kernel.py,
    tests/test_kernel_deployment.py)."""
    _assert_race_free([race_free_runs["chunked"]], 1)


def test_no_race_for_the_ring_pool_schedule(race_free_runs):
    """The ring pool (every dense tensor through 4 shared banks, wrapping across layers) in
    eager mode, where a copy into a bank still being read would land at once."""
    _assert_race_free([race_free_runs["ring"]], 1)


@pytest.mark.heavy
def test_no_race_for_the_same_pairs_on_8_layers():
    """The two race-free runs above on 8 layers: the MLA layer 7 also as the last window."""
    runs = _race_free_pairs(8)
    _assert_race_free([runs["chunked"], runs["ring"]], 2)


@pytest.mark.heavy
def test_no_race_for_the_other_schedule_and_mode_pairs():
    _assert_race_free(race_check("published,chunked:eager,ring:on_wait", timeout_s=1200), 4)


def test_race_detector_catches_a_plan_that_refills_busy_buffers():
    """On 4 layers (dense layer 0, KDA layers, the MLA layer 3): the planted race needs only a
    layer whose next weights land in its own expert slots; the same two reports as on 8 layers,
    at 26 s of CPU instead of 32 (measured 2026-12-06)."""
    (result,) = race_check("published", "--modes", "eager", "--unsafe", "--layers", "4", timeout_s=300)
    assert result["races"], result
    # the race planted, and only it: a weight copy (Copies.start, the copies role of Ctx) lands in a VMEM buffer a product
    # still reads through Copies.view, and overlaps the copy before it into the same rows; the
    # detector reports both (measured 2026-12-07: vmem buffer 137, the kernel's read from device 0)
    reports = result["race_reports"]
    assert result["race_count"] == len(reports) == 2, reports
    (buffer,) = {access["buffer"] for r in reports for access in (r["first"], r["second"])}
    assert buffer.startswith("('vmem', "), buffer  # one VMEM scratch buffer, every access
    pairs = sorted((r["first"]["kind"], frame(r["first"]), r["second"]["kind"], frame(r["second"])) for r in reports)
    assert pairs == [("read", "Copies.view", "write", "Copies.start"), ("write", "Copies.start", "write", "Copies.start")]
    (read,) = [r["first"] for r in reports if r["first"]["kind"] == "read"]
    assert issuer(read) == (0, 0)  # the kernel's own read: device 0, core 0
    (copies,) = [r for r in reports if r["first"]["kind"] == "write"]
    assert issuer(copies["first"]) != issuer(copies["second"])  # two copies, not one seen twice


def test_race_check_runs_each_schedule_in_its_own_mode_or_every_mode(monkeypatch, capsys):
    """``SCHEDULE:MODE`` pairs and bare names (every ``--modes`` mode) in one process's run list."""
    from megakernel.commands import race_check as tool

    calls = []
    monkeypatch.setattr(tool, "check", lambda *args: calls.append(args) or {"schedule": args[0], "mode": args[1]})
    assert tool.main(["published,chunked:eager,ring:on_wait", "--layers", "4"]) == 0
    assert calls == [("published", "on_wait", 4, 2, False), ("published", "eager", 4, 2, False),
                     ("chunked", "eager", 4, 2, False), ("ring", "on_wait", 4, 2, False)]
    assert len(capsys.readouterr().out.splitlines()) == 4
