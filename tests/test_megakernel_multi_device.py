"""The plan's collectives inside the kernel on 8 virtual devices (kimi-k3-nano, TP8 plan).

Fast: the kernel's message tables are the message lists of :mod:`tpusim.workload.collectives`
(every arrival has its own slot), and every collective issued is waited for once, in the
same layer or the next. Slow (each a fresh process under a timeout: virtual devices need
``XLA_FLAGS`` before JAX starts, and a wrong semaphore hangs the interpreter): the kernel on
8 devices delivers every message (exact integer payload chain), with the race detector on,
and records on every rank the issue/wait sequence the plan and the simulator's program
give; a skipped receive wait is reported as a race. Measured here: ~90 s per 2-layer
8-device run on this shared 2-core host; the two runs are under ``-m heavy`` since the
decode on the same collectives (``test_megakernel_multi_device_decode.py``) checks delivery,
races and order in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from planted_races import assert_landing_buffer_race

from megakernel.collective_plan import kernel_collectives, layer_events, loop_range
from megakernel.multi_device import EVENT_WORDS, ISSUE, CollectiveKernel, planned_log
from tpusim.workload.collectives import incoming
from tpusim.workload.model_catalog import load_model, plan_for

RUN_TIMEOUT_S = 400


@pytest.fixture(scope="module")
def nano():
    model = load_model("kimi-k3-nano")
    return model, plan_for(model, 8)


@pytest.mark.parametrize("devices", [8, 32])
def test_tables_deliver_every_message_to_its_own_slot(devices):
    plan = plan_for(load_model("kimi-k3-nano"), devices)
    for coll in kernel_collectives(plan, 1):
        for phase in range(coll.phases):
            landed = Counter()
            for rank in range(plan.devices):
                count = coll.counts[phase]
                for dst, slot in zip(coll.dst[rank, phase, :count], coll.slot[rank, phase, :count], strict=True):
                    landed[int(dst), int(slot)] += 1
            assert set(landed.values()) == {1}, coll.name
            for rank in range(plan.devices):
                arrivals = [m for m in incoming(coll.algorithm, coll.group, 2 * coll.elems, rank, plan.topology)
                            if m.phase == phase]
                assert sorted(s for (d, s) in landed if d == rank) == list(range(len(arrivals))), coll.name


def test_every_issue_is_waited_once_within_a_layer(nano):
    model, plan = nano
    layers, head = layer_events(model, plan, 1)
    issued, waited = Counter(), Counter()
    for layer, events in [*enumerate(layers), (model.num_layers, head)]:
        for kind, name, delta in events:
            assert delta in (0, 1), (layer, name, delta)
            (issued if kind == "issue" else waited)[name, layer - delta] += 1
    assert issued == waited
    assert loop_range(layers) == (2, model.num_layers)  # one loop body for layers 2..92


@pytest.mark.parametrize("devices", [8, 32])
def test_planned_log_has_one_line_per_message_the_kernel_records(devices):
    """The log buffer holds exactly the planned events (phase-1 sends of two-level reductions
    included), and every planned send goes to a member of the collective's group."""
    model = load_model("kimi-k3-nano")
    kernel = CollectiveKernel(model, plan_for(model, devices), 1, interpret=True)
    for rank in (0, devices - 1):
        log = planned_log(kernel, rank)
        assert EVENT_WORDS * len(log) == kernel.max_events
        for kind, c, _phase, peer, _layer in log:
            if kind == ISSUE:
                assert peer != rank and peer in kernel.colls[c].members[rank]


def run_check(*args: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-m", "megakernel.commands.multi_device_check", *args],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.heavy  # the decode test (test_megakernel_multi_device_decode.py) covers this in CI
def test_8_devices_deliver_exactly_race_free_in_plan_order():
    result = run_check("--devices", "8", "--layers", "2", "--seed", "0")
    assert result["matches_expected"], result
    assert result["log_matches_plan"], result
    assert not result["races"], result


@pytest.mark.heavy  # the decode test (test_megakernel_multi_device_decode.py) covers this in CI
def test_planted_race_skipped_wait_is_caught():
    result = run_check("--devices", "8", "--layers", "2", "--seed", "1", "--mode", "eager",
                       "--bug", "skip_wait:attn.partial_reduce")
    assert result["races"], result
    # the race planted: a collective's landing buffer read (where the skipped wait stood) while
    # another device's copy into it (issued by CollectiveKernel._issue) may still be writing, on
    # every device in each of the 2 layers (measured 2026-12-07: 16 reports, vmem buffer 110)
    readers = assert_landing_buffer_race(result, "CollectiveKernel._wait", "CollectiveKernel._issue")
    assert result["race_count"] == 8 * 2 and readers == dict.fromkeys(range(8), 2), result["race_reports"]


@pytest.mark.slow
def test_run_kernel_devices_refuses_a_plan_without_message_algorithms(tmp_path):
    """The generic 4-device plan's collectives are not the kernel's (kernel_cannot_run): one
    error line, exit 2."""
    done = subprocess.run([sys.executable, "-m", "tpusim", "run-kernel", "--model", "kimi-k3-nano",
                           "--devices", "4", "--json"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          cwd=tmp_path)
    assert done.returncode == 2
    assert "collective attn.allreduce is not run in the kernel" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_k3_tp32_collective_program_lowers_for_tpu():
    """Full K3 payloads (bf16[3584] partials, 7168-wide shared reduce) on a 32-device mesh."""
    result = run_check("--model", "kimi-k3", "--devices", "32", "--lower")
    assert result["tpu_custom_calls"] == 1
    assert result["payload_bytes"]["moe.routed_reduce"] == 7168
