"""Ring-pool schedules in the kernel (fast, no kernel run): the bank the kernel computes for every
pooled slab, from its per-layer SMEM bases and per-kind offsets, is the bank the schema's rule
gives (the pool's slabs take the banks in turn, in the order they are consumed: counted here
from the planned events, not from the issue plan); and layouts the kernel cannot run are
refused with the rule they break."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from megakernel.dims import model_dims
from megakernel.dma_plan import UnsupportedSchedule, geometry
from megakernel.events import planned_event_order
from megakernel.examples import ring_schedule
from megakernel.kernel import Megakernel
from megakernel.kernel_dma import Ctx
from megakernel.ring_pool import bank_table
from tpusim.app.cli import main
from tpusim.schedule.issue_plan import UnsupportedIssuePlan
from tpusim.schedule.program_issue import program_issue_plan
from tpusim.schedule.schema import Schedule, load_schedule, save_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program


def consumed_banks(kernel: Megakernel, routing: np.ndarray) -> dict[tuple[str, int, int], int]:
    """(tensor, layer, slab) -> bank: the n-th pooled slab waited for is in bank n % banks."""
    banks: dict[tuple[str, int, int], int] = {}
    for event in planned_event_order(kernel, routing):
        spec = kernel.schedule.ring_pool(event[1]) if event[0] == "dma_wait" else None
        if spec is not None and event[2:] not in banks:
            banks[event[2:]] = len(banks) % spec.banks
    return banks


def routing_for(dims, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = dims.moe
    return np.stack([rng.choice(e.scored_experts, (1, e.top_k), replace=False) for _ in dims.moe_layers])


@pytest.mark.parametrize(("name", "devices", "schedule"), [
    ("kimi-k3-mini", 1, ring_schedule()),
    ("kimi-k3-mini", 1, ring_schedule(3, 128 << 10, members=("mla_proj", "router", "latent_proj", "lm_head"))),
    pytest.param("kimi-k3", 32, load_schedule("k3-ring"), marks=pytest.mark.slow),  # ~5 s: 2800 slabs
], ids=lambda v: getattr(v, "name", v))
def test_kernel_bank_of_every_pooled_slab_is_the_consumption_order(name, devices, schedule):
    model = load_model(name)
    dims = model_dims(model, plan_for(model, devices))
    kernel = Megakernel(dims, schedule, 1, 512)
    want = consumed_banks(kernel, routing_for(dims, 0))
    assert len(want) > 3 * dims.num_layers  # router and latent projections at least
    ctx = Ctx(dims, kernel.geo, 1, {"smem.banks": jnp.asarray(bank_table(dims.num_layers, kernel.geo.pools))},
              {}, {}, [], 1)
    for (tensor, layer, slab), bank in want.items():
        ring = kernel.geo.rings[tensor]
        assert ring.bank_rows
        assert ctx.buffer(ring, layer, slab) == bank, (tensor, layer, slab)  # a static layer
        traced = ctx.buffer(ring, jnp.int32(layer), slab)  # the loop's path: SMEM base + offset
        assert int(traced) == bank, (tensor, layer, slab)


def with_families(schedule: Schedule, **families: dict) -> Schedule:
    data = schedule.model_dump()
    data["families"].update(families)
    return Schedule.model_validate(data)


def test_unrealisable_ring_layouts_are_refused_with_the_rule():
    k3 = load_model("kimi-k3")
    k3_dims = model_dims(k3, plan_for(k3, 32))
    ring = load_schedule("k3-ring")
    # K3 TP32's 2112-wide dense MLP slabs pad to 2176 columns: more than a 2 MiB bank.
    with pytest.raises(UnsupportedSchedule, match="more than a bank"):
        geometry(k3_dims, with_families(ring, dense_mlp={"prefetch_distance_ops": 4096, "pool": "ring"}))
    # Two kinds of one op (kda.decay) would share a bank: with 2 banks of 256 KiB decay_b's
    # slab needs the bank decay_a's 6th of 7 slabs still occupies.
    tiny_banks = ring.with_changes(pools={"ring": {"mode": "ring", "banks": 2, "bank_bytes": 262144}})
    tiny_banks = with_families(tiny_banks, mla_proj={"prefetch_distance_ops": 2, "buffers": 2},
                               lm_head={"prefetch_distance_ops": 2, "chunk_bytes": 2097152, "buffers": 2})
    with pytest.raises(UnsupportedSchedule, match=r"reads kda\.decay_a and kda\.decay_b: 8 slabs"):
        Megakernel(k3_dims, tiny_banks, 1, 512)
    # the one issue plan refuses it, so the simulator and the sweep do too
    with pytest.raises(UnsupportedIssuePlan, match=r"reads kda\.decay_a and kda\.decay_b: 8 slabs"):
        program_issue_plan(build_program(k3, plan_for(k3, 32), batch=1, context_tokens=512), tiny_banks)
    mini = load_model("kimi-k3-mini")
    mini_dims = model_dims(mini, plan_for(mini, 1))
    with pytest.raises(UnsupportedSchedule, match=r"pools\.ring\.bank_bytes to at least 131072"):
        geometry(mini_dims, ring_schedule(4, 64 << 10))  # mla.kv_b (128 KiB) must be whole
    with pytest.raises(UnsupportedSchedule, match="multiple of 256"):
        geometry(mini_dims, ring_schedule(4, (128 << 10) + 64))


@pytest.mark.slow  # builds the kernel's plan for K3 (~7-9 s)
def test_run_kernel_refuses_an_unrealisable_ring_in_one_line(tmp_path, capsys):
    path = tmp_path / "ring.json"
    save_schedule(ring_schedule(4, 64 << 10), path)
    assert main(["run-kernel", "--schedule", str(path), "--backend", "interpret", "--steps", "1",
                 "--out", str(tmp_path / "m.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tpusim run-kernel: error:"), err
    assert "pools.ring.bank_bytes" in err
