"""The kernel's DMA issue points equal the simulator's, copy for copy, for the same schedule.

The kernel side is :func:`megakernel.events.planned_event_order`, which
``test_megakernel_kernel`` proves equal to the order the kernel records in interpret mode;
the simulator side is ``simulate(..., record_events=True)`` on the program built with the
kernel's routing (saved as a ``trace:`` routing file; a seeded draw, or the reference step's own
routing under ``-m heavy``). Both read one issue plan
(:mod:`tpusim.schedule.issue_plan`), so every copy must start after the same op: the
built-in schedules, and schedules drawn from the sweep space whose prefetch distances reach
back past ``moe.topk`` (the horizon clamp) and whose pools overlap (the free clamp). Three
naming differences are normalised here: the kernel copies a layer's small parameters as one
ring (``small``) where the program lists each tensor, packs scales with their values in one
copy, and numbers the head layer ``num_layers`` where the program uses -1.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from hwmodels.catalog import load_chip
from megakernel.dims import model_dims
from megakernel.dma_plan import UnsupportedSchedule
from megakernel.events import planned_event_order, save_routing_trace, weight_events
from megakernel.examples import ring_schedule
from megakernel.kernel import Megakernel
from megakernel.layout import random_weights
from megakernel.reference import decode_step_with_routing, device_params, init_state
from tpusim.engine import simulate
from tpusim.schedule.schema import BUILTIN_SCHEDULES, Schedule, load_schedule
from tpusim.schedule.vmem import InfeasibleSchedule
from tpusim.sweep.candidates import sample
from tpusim.sweep.space import default_space
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program
from tpusim.workload.routing import parse_routing

pytestmark = pytest.mark.slow
SAMPLES = 12


def _normalise_sim(events: list[tuple], num_layers: int) -> list[tuple]:
    out: list[tuple] = []
    for event in events:
        if event[0] != "compute" and event[1] in ("kda_state", "kv_cache", "kv", "state"):
            continue
        if event[0] == "compute" and event[2] == -1:
            event = (*event[:2], num_layers)
        if event[0] != "compute":
            if event[3] == -1:
                event = (*event[:3], num_layers, *event[4:])
            tensor = event[2]
            if tensor.endswith(".scales"):
                continue
            if tensor.startswith("small."):
                event = (event[0], event[1], "small", event[3], event[4])
                if event in out[-12:]:
                    continue
        out.append(event)
    return out


def _issue_points(events: list[tuple]) -> dict[tuple, tuple]:
    """copy -> the last op computed before it starts (None before the first op)."""
    last, points = None, {}
    for event in events:
        if event[0] == "compute":
            last = (event[1], event[2])
        elif event[0] == "dma_start":
            points.setdefault(event[1:], last)
    return points


def _drawn_routing(model, seed: int = 0) -> np.ndarray:  # type: ignore[no-untyped-def]
    """i32[MoE layers, 1, top_k]: distinct experts a layer, drawn in selection order (seeded)."""
    assert model.moe is not None
    rng = np.random.default_rng(seed)
    moe_layers = [layer for layer in range(model.num_layers) if layer not in model.dense_layers]
    return np.asarray([[rng.permutation(model.moe.num_experts)[: model.moe.top_k]] for _ in moe_layers], np.int32)


def _reference_routing(dims, model) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The routing the reference's step computes (one jitted 93-layer step: ~10 s of XLA compile)."""
    params = device_params(random_weights(dims, 0))
    state = init_state(dims, 1, 256, context=130, seed=1)
    tokens = jnp.asarray(np.arange(1) * 37 % dims.vocab_rows, jnp.int32)
    _, _, routing = decode_step_with_routing(dims, params, state, tokens)
    return np.asarray(routing)


# Both sides read the routing as an input (the plan's expert order, the program's trace), so any
# routing of the right form checks the issue points: a seeded draw by default; the reference step's
# own routing under ``-m heavy`` (suite time: its 93-layer compile was ~10 s of the file's ~14 s)
@pytest.fixture(scope="module", params=["drawn", pytest.param("reference", marks=pytest.mark.heavy)])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    model = load_model("kimi-k3-mini")
    plan = plan_for(model, 1)
    dims = model_dims(model, plan)
    routing = _drawn_routing(model) if request.param == "drawn" else _reference_routing(dims, model)
    assert routing.shape == (model.num_layers - len(model.dense_layers), 1, model.moe.top_k)
    trace = tmp_path_factory.mktemp("routing") / "routing.json"
    save_routing_trace(routing, trace)
    program = build_program(model, plan, batch=1, context_tokens=130, routing=parse_routing(f"trace:{trace}"))
    return {"model": model, "dims": dims, "routing": routing, "program": program,
            "chip": load_chip("tpu-v7", calibrated=False)}


def _compare(setup: dict, schedule: Schedule) -> tuple[int, int]:
    """Assert every issue point agrees; return (copies compared, copies clamped by the horizon)."""
    kernel = Megakernel(setup["dims"], schedule, 1, 256, trace=False, interpret=pltpu.InterpretParams())
    kernel_events = weight_events(planned_event_order(kernel, setup["routing"]))
    result = simulate(setup["program"], schedule, setup["chip"], record_events=True)
    assert result.events is not None
    sim_events = _normalise_sim(result.events, setup["model"].num_layers)
    kernel_compute = [e for e in kernel_events if e[0] == "compute"]
    assert kernel_compute == [e for e in sim_events if e[0] == "compute"]  # same ops, experts included
    kernel_points, sim_points = _issue_points(kernel_events), _issue_points(sim_events)
    assert set(kernel_points) == set(sim_points)  # the same copies
    differ = {key: (kernel_points[key], sim_points[key]) for key in kernel_points if kernel_points[key] != sim_points[key]}
    assert not differ, f"{schedule.name}: {len(differ)} of {len(kernel_points)} differ, e.g. {list(differ.items())[:3]}"
    position = {(e[1], e[2]): i for i, e in enumerate(kernel_compute)}
    distance = schedule.family("kda_proj").prefetch_distance_ops
    clamped = sum(1 for key, point in kernel_points.items() if key[1] == "kda.qkvgb" and point is not None
                  and position[point] + 1 > position[("kda.qkvgb", key[2])] - distance)
    return len(kernel_points), clamped


@pytest.mark.parametrize("schedule_name", BUILTIN_SCHEDULES)
def test_builtin_schedules_issue_every_copy_at_the_same_op(setup: dict, schedule_name: str) -> None:
    copies, _ = _compare(setup, load_schedule(schedule_name))
    assert copies > 1000


# Ring pools: the Muse layout at mini sizes (4 banks: in-op refills, banks wrapping across
# layers), a deep ring (12 banks of 2 MiB: every tensor one slab, far lookahead) and a ring of
# some families beside per-kind rings (3 banks; KDA and the shared expert keep their own).
RING_SCHEDULES = [ring_schedule(), ring_schedule(12, 2 << 20),
                  ring_schedule(3, 128 << 10, members=("mla_proj", "router", "latent_proj", "lm_head"))]


@pytest.mark.parametrize("schedule", RING_SCHEDULES, ids=lambda s: s.name)
def test_ring_pool_schedules_issue_every_copy_at_the_same_op(setup: dict, schedule: Schedule) -> None:
    copies, _ = _compare(setup, schedule)
    assert copies > 1000


def test_sampled_schedules_issue_every_copy_at_the_same_op(setup: dict) -> None:
    """Sweep draws with long distances: the horizon clamp must bind, and still agree."""
    space = default_space()
    present = [f for f in space.families if f != "gqa_proj"]
    rng = np.random.default_rng(7)
    compared = clamped = 0
    for index in range(4 * SAMPLES):
        schedule = sample(space, present, rng, index)
        schedule = schedule.with_changes(
            families={**schedule.model_dump()["families"],
                      "kda_proj": {**schedule.family("kda_proj").model_dump(), "prefetch_distance_ops": 12}})
        try:
            _, bound = _compare(setup, schedule)
        except (UnsupportedSchedule, InfeasibleSchedule):
            continue  # the kernel cannot lay it out (e.g. a chunked mla.kv_b): nothing to compare
        compared += 1
        clamped += bound
        if compared == SAMPLES:
            break
    assert compared == SAMPLES
    assert clamped > 0  # distances crossing moe.topk were clamped at the horizon, on both sides
