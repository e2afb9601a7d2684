"""The simulator's collective issue/wait order equals the order the multi-device kernel runs.

Kernel side: :func:`megakernel.collective_plan.layer_events`, the sequence the multi-device
kernels walk and record (their logs are checked against it on 8 devices in
``test_megakernel_multi_device_decode.py``). Simulator side: the engine's own event stream
(``simulate(..., record_events=True)``: ``collective_issue`` when a collective's copies
start, ``collective_wait`` when the compute stream reaches its consumer), for the same
model, plan, batch and routing (every row picks experts 0, 2, 4, ...: rank 0 runs an expert in
every MoE layer, as in the kernel's runs; a device without one waits for the latent at the
next layer's start instead). A chained collective (``attn.half_gather``) must issue right after the
stream's wait on its parent, as in the kernel, not when the parent lands.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hwmodels.catalog import make_system
from megakernel.collective_plan import layer_events
from tpusim.engine import simulate
from tpusim.engine.collective_messages import MessageCollective, MessageGroup
from tpusim.engine.collectives import MessageFabric
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.routing import RoutingModel


def engine_events(model_name: str, devices: int, batch: int, folder: Path,
                  choice: str | None = None) -> tuple[list[list[tuple]], list[tuple], object]:
    """The engine's collective events as ``layer_events`` shapes them: per layer where they
    happen, ``(kind, name, layer - issuing layer)``; the head's with ``num_layers - issuing``."""
    model = load_model(model_name)
    system = make_system("tpu-v7", devices // 2)
    plan = plan_for(model, devices, devices_per_chip=2, choice=choice)
    trace = folder / "routing.json"
    assert model.moe is not None
    trace.write_text(json.dumps({"layers": [[list(range(0, 2 * model.moe.top_k, 2))]]}))
    program = build_program(model, plan, batch=batch, context_tokens=16, device_view=0,
                            routing=RoutingModel("trace", trace_path=trace))
    result = simulate(program, load_schedule("naive"), system.chip, record_events=True)
    layers: list[list[tuple]] = [[] for _ in range(model.num_layers)]
    head: list[tuple] = []
    for event in result.events or []:
        if event[0] in ("collective_issue", "collective_wait"):
            kind, name, issued, at = event
            if at < 0:
                head.append((kind.removeprefix("collective_"), name, model.num_layers - issued))
            else:
                layers[at].append((kind.removeprefix("collective_"), name, at - issued))
    return layers, head, (model, plan)


@pytest.mark.parametrize(("model_name", "devices", "batch"),
                         [("kimi-k3-nano", 8, 1), ("kimi-k3-nano", 32, 1), ("kimi-k3", 32, 1), ("kimi-k3", 32, 8)])
def test_engine_order_equals_the_kernel_order(model_name: str, devices: int, batch: int, tmp_path: Path) -> None:
    layers, head, (model, plan) = engine_events(model_name, devices, batch, tmp_path)
    kernel_layers, kernel_head = layer_events(model, plan, batch)  # type: ignore[arg-type]
    assert sum(map(len, layers)) > 8 * model.num_layers  # every layer's collectives were seen
    assert layers == kernel_layers
    assert head == kernel_head


@pytest.mark.parametrize(("model_name", "devices", "batch", "choice"), [
    ("kimi-k3-nano", 8, 1, "base=published,expert_reduce=fused"),
    ("kimi-k3-nano", 8, 1, "base=published,shared_wait=deferred"),
    ("kimi-k3", 32, 8, "base=published,expert_groups=4,expert_tp=8,expert_reduce=fused")])
def test_plan_variants_keep_the_engine_and_kernel_order(model_name: str, devices: int, batch: int, choice: str,
                                                        tmp_path: Path) -> None:
    """The fused expert reduction and the deferred shared wait (tpusim.workload.plan_variants)."""
    layers, head, (model, plan) = engine_events(model_name, devices, batch, tmp_path, choice)
    kernel_layers, kernel_head = layer_events(model, plan, batch)  # type: ignore[arg-type]
    assert (layers, head) == (kernel_layers, kernel_head)
    if "deferred" in choice:  # the shared reduce of layer 1 is waited at layer 2's start
        assert ("wait", "moe.shared_reduce", 1) in layers[2]


def test_a_chain_issues_after_the_wait_on_its_parent(tmp_path: Path) -> None:
    layers, _, _ = engine_events("kimi-k3", 32, 1, tmp_path)
    attention = [e for e in layers[5] if e[1].startswith("attn.")]
    assert attention == [("issue", "attn.head_exchange", 0), ("wait", "attn.head_exchange", 0),
                         ("issue", "attn.partial_reduce", 0), ("wait", "attn.partial_reduce", 0),
                         ("issue", "attn.half_gather", 0), ("wait", "attn.half_gather", 0)]


def test_a_chain_waits_for_the_stream_not_for_the_parent_landing() -> None:
    """Parent lands at 3 µs, the stream reaches its wait at 10 µs: the chained child's copy
    (1 µs latency, no bytes) issues at 10 µs, so it completes at 11 µs, not at 4 µs."""
    group = MessageGroup("sibling", 1, 0, 1e9, 1e9, 1e-6, 0.0, (1,))
    fabric = MessageFabric()
    parent = fabric.issue(MessageCollective("parent", ((replace(group, latency_s=3e-6),),), 1), 0.0)
    child = fabric.issue(MessageCollective("child", ((group,),), 1, parent="parent"), 0.0, parent)
    assert fabric.complete_s(parent) == pytest.approx(3e-6)
    assert child.phase < 0  # landed parent, no wait yet: the child is not issued
    done_s, chained = fabric.wait(parent, 10e-6)
    assert done_s == pytest.approx(3e-6) and chained == [child]
    assert fabric.complete_s(child) == pytest.approx(11e-6)
