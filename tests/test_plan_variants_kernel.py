"""The multi-device kernels run the plan variants of :mod:`tpusim.workload.plan_variants`.

kimi-k3-nano on 8 virtual devices (4 layers: dense, KDA, KDA, MLA), Pallas TPU interpret
mode, race detector on, one decode step against the one-device reference, in a fresh process
under a timeout (virtual devices need ``XLA_FLAGS`` before JAX starts). The decode kernel
(:mod:`megakernel.commands.decode_check`) also checks its issue/wait log against the plan's events.
Measured on the 2-core build machine (shared): 55-100 s each, so ``slow`` / ``heavy``; in CPU
(2026-12-07, alone): 38 s the decode run, 27 s the 2-step collective run (46 s while its second
step compiled the program again: :mod:`megakernel.commands.collective_check` places the first state).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

FUSED = "base=published,expert_reduce=fused"
DEFERRED = "base=published,shared_wait=deferred"
RUN_TIMEOUT_S = 600


def _run(module: str, *args: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", module, "--devices", "8", "--layers", "4", "--steps", "1", *args],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _decode(plan: str) -> dict:
    """The decode kernel with f32 payloads: the sharded math held to the f32 tolerance."""
    return _run("megakernel.commands.decode_check", "--seed", "2", "--f32-payloads", "--plan", plan)


def _collective(plan: str, steps: int = 1) -> dict:
    """The schedule-driven kernel (published schedule) with the plan's bf16 payloads."""
    return _run("megakernel.commands.collective_check", "--races", "--seed", "0", "--plan", plan, "--steps", str(steps))


@pytest.mark.slow
def test_decode_kernel_runs_the_fused_expert_reduction() -> None:
    result = _decode(FUSED)
    assert result["algorithms"]["moe.fused_reduce"] == "one_shot_two_level"
    assert "moe.shared_reduce" not in result["algorithms"]
    assert result["matches_reference"] and result["log_matches_plan"] and not result["races"], result
    assert all(s["tokens_equal"] and s["within_f32_tolerance"] for s in result["steps"])


@pytest.mark.slow
def test_collective_kernel_runs_the_deferred_shared_wait() -> None:
    """2 steps: also the CI stand-in of the published plan's 2-step race-free run on 8 devices
    (tests/test_megakernel_collectives.py, ``-m heavy``): the same kernel, schedule and detector,
    the second step from the kernel's own first."""
    result = _collective(DEFERRED, steps=2)
    assert result["matches_reference"] and not result["races"], result


@pytest.mark.heavy
def test_decode_kernel_runs_the_deferred_shared_wait() -> None:
    result = _decode(DEFERRED)
    assert result["matches_reference"] and result["log_matches_plan"] and not result["races"], result


@pytest.mark.heavy
def test_collective_kernel_runs_the_fused_expert_reduction() -> None:
    result = _collective(FUSED)
    assert result["matches_reference"] and not result["races"], result


@pytest.mark.heavy
def test_decode_kernel_runs_the_published_structure_with_another_expert_split() -> None:
    """4 expert groups x expert TP 2 on the nano TP8 structure at nano's own widths (32-wide
    expert slices: the per-op decode kernel runs them; the schedule-driven kernel runs this split
    with nano's experts widened, tests/test_kernel_deployment.py)."""
    result = _decode("base=published,expert_groups=4,expert_tp=2")
    assert result["matches_reference"] and result["log_matches_plan"] and not result["races"], result
