"""One VMEM truth: the accounting the feasibility check uses (``VmemPlan.total_bytes``) is what
the multi-device kernel allocates, collective buffers included, for either receive-slot layout.

The kernel's scratch is read from its own layout (``scratch_bytes`` of the kernel objects: shapes
only, nothing traced or lowered). Fast checks use kimi-k3-nano on 8 devices (collective buffers
and working scratch; its tiny arenas are padded to whole tiles by the kernel's geometry, so the
arena part is checked at K3 size); the K3 TP32 checks build the kernel at full size (seconds
each) and are marked slow; one slow test lowers a sweep-chosen schedule at batch 8.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from hwmodels.catalog import make_system
from tpusim.schedule.schema import BUILTIN_SCHEDULES, FamilySchedule, Schedule, load_schedule
from tpusim.schedule.vmem import buffer_hosts, collective_bytes, vmem_plan, working_bytes
from tpusim.sweep.candidates import candidates
from tpusim.sweep.prune import VmemAccountant, check_candidate
from tpusim.sweep.space import default_space
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.registry.names import Collective, Family

BATCHES = (1, 2, 3, 8, 16, 33, 64)


@cache
def nano() -> tuple:
    model = load_model("kimi-k3-nano")
    return model, plan_for(model, 8)


@cache
def k3() -> tuple:
    model = load_model("kimi-k3")
    system = make_system("tpu-v7", 16)
    return model, plan_for(model, system.devices, devices_per_chip=system.chip.devices_per_chip), system


def link_scratch(model, plan, batch: int, receive_slots: str) -> int:
    from megakernel.kernel import Megakernel  # noqa: F401  (pltpu import order)
    from megakernel.kernel_collectives import KernelLink
    from megakernel.multi_device import Bugs

    link = KernelLink(model, plan, batch, bugs=Bugs(), receive_slots=receive_slots)
    return _vmem_bytes(link.scratch_shapes())


def _vmem_bytes(shapes) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl

    leaves = jax.tree_util.tree_leaves(shapes, is_leaf=lambda x: isinstance(x, pl.MemoryRef))
    return sum(int(np.prod(s.shape)) * jnp.dtype(s.dtype).itemsize for s in leaves
               if isinstance(s, pl.MemoryRef) and str(s.memory_space) == "vmem")


@pytest.mark.parametrize("receive_slots", ["per_message", "shared"])
def test_kernel_collective_buffers_equal_the_accounting(receive_slots: str) -> None:
    model, plan = nano()
    for batch in (1, 64):
        assert link_scratch(model, plan, batch, receive_slots) == collective_bytes(model, plan, batch, receive_slots)


def test_shared_layout_puts_the_dense_all_reduce_in_the_shared_experts_buffers() -> None:
    model, plan, _ = k3()
    for batch in BATCHES:
        assert buffer_hosts(model, plan, batch, "shared") == {Collective.MLP_ALLREDUCE: Collective.MOE_SHARED_REDUCE}
        saved = collective_bytes(model, plan, batch, "per_message") - collective_bytes(model, plan, batch, "shared")
        assert saved == (2 + 10) * 14336 * batch  # its send (2 phases) and 7 + 3 receive slots, once
    assert buffer_hosts(model, plan_for(model, 1), 1, "shared") == {}


def test_kernel_working_scratch_equals_the_accounting() -> None:
    from megakernel.dims import model_dims
    from megakernel.kernel import Megakernel

    model, plan = nano()
    for batch in (1, 9):
        kernel = Megakernel(model_dims(model, plan, routes_all_experts=True), load_schedule("published"), batch, 256)
        scratch = kernel.scratch_bytes()
        assert (scratch["route"] + scratch["expert_rows"] + scratch["kv_entry"] + scratch["conv"]
                == working_bytes(model, plan, batch))


@cache
def sampled_schedules(count: int) -> list[Schedule]:
    """Built-ins, both layouts, plus ``count`` draws of the default sweep space (vmem-guided at batch 8)."""
    model, plan, system = k3()
    space = default_space().with_capacity(system.chip.staging_memory.usable_bytes, "tpu-v7 usable VMEM")
    space = space.model_copy(update={"samples": count, "neighbours": False})
    present = [f for f in (Family.KDA_PROJ, Family.MLA_PROJ, Family.SMALL_PARAMS, Family.ROUTER, Family.LATENT_PROJ,
                           Family.SHARED_EXPERT, Family.ROUTED_EXPERT, Family.DENSE_MLP, Family.LM_HEAD)]
    drawn = [c.schedule for c in candidates(space, present, seed=11, guide=VmemAccountant(model, plan, 8))
             if c.source == "sample"][:count]
    built = [load_schedule(name) for name in BUILTIN_SCHEDULES]
    return [*built, built[1].model_copy(update={"receive_slots": "per_message"}), *drawn]


def test_feasible_by_the_accounting_means_the_kernels_buffers_fit_on_sampled_schedules() -> None:
    """Accounting-level invariant over sampled schedules and batches 1–64 rows: the sweep's
    pruning verdict (memoised accountant) is ``vmem_plan``'s, whose ``total_bytes`` holds the
    kernel's collective buffers (checked against the kernel above) on top of everything else."""
    model, plan, system = k3()
    capacity = system.chip.staging_memory.usable_bytes
    space = default_space().with_capacity(capacity, "tpu-v7 usable VMEM")
    for batch in (1, 4, 16, 64):
        accountant = VmemAccountant(model, plan, batch)
        coll = {slots: collective_bytes(model, plan, batch, slots) for slots in ("per_message", "shared")}
        for schedule in sampled_schedules(4):
            full = vmem_plan(schedule, model, plan, batch)
            assert accountant.plan_for(schedule).total_bytes == full.total_bytes
            assert full.collective_bytes == coll[schedule.receive_slots]
            verdict = check_candidate(schedule, space, accountant)
            assert verdict.vmem_static_bytes == full.total_bytes
            assert verdict.feasible == (full.total_bytes <= capacity)


@pytest.mark.slow  # builds the K3 TP32 kernel (no tracing) ~2 s per schedule and batch on a loaded machine
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_k3_kernel_scratch_equals_total_bytes(batch: int) -> None:
    from megakernel.kernel_collectives import CollectiveMegakernel

    model, plan, system = k3()
    capacity = system.chip.staging_memory.usable_bytes
    for schedule in sampled_schedules(2)[:4]:  # the built-ins, published with per_message slots
        kernel = CollectiveMegakernel(model, plan, schedule, batch, 1024)
        scratch = sum(kernel.scratch_bytes().values())
        total = vmem_plan(schedule, model, plan, batch).total_bytes
        assert scratch == total, (schedule.name, batch)
        assert (total <= capacity) == (scratch <= capacity)


def test_published_fits_k3_at_batch_8_only_with_shared_receive_slots() -> None:
    model, plan, system = k3()
    capacity = system.chip.staging_memory.usable_bytes
    published = load_schedule("published")
    assert vmem_plan(published, model, plan, 8).total_bytes <= capacity
    per_message = published.model_copy(update={"receive_slots": "per_message"})
    assert vmem_plan(per_message, model, plan, 8).total_bytes > capacity


@pytest.mark.slow  # lowers K3 TP32 at batch 8 on 32 virtual devices (~15 s, more on a loaded machine)
def test_a_sweep_chosen_schedule_lowers_and_fits_at_batch_8(tmp_path) -> None:
    model, plan, system = k3()
    capacity = system.chip.staging_memory.usable_bytes
    space = default_space().with_capacity(capacity, "tpu-v7 usable VMEM")
    accountant = VmemAccountant(model, plan, 8)
    feasible = [s for s in sampled_schedules(4)[4:] if check_candidate(s, space, accountant).feasible]
    chosen = max(feasible, key=lambda s: vmem_plan(s, model, plan, 8).total_bytes)  # the tightest fit
    path = tmp_path / "chosen.json"
    path.write_text(chosen.model_dump_json())
    done = subprocess.run([str(Path(sys.executable).parent / "tpusim"), "lower", "--schedule", str(path), "--batch", "8",
                           "--json"], capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    # equal, but for the one known gap: the kernel pads mlp.gate_up's 2112 columns to 2176 lanes when
    # dense_mlp has a chunked arena of its own (61,440 bytes; pinned by the strict xfail above)
    # (which sample is tightest moved with this round's loop scratch: its gap is 30,720 bytes)
    assert data["fits"] and 0 <= data["scratch_total_bytes"] - data["accounting_total_bytes"] <= 61440


def test_a_family_only_schedule_gets_the_shared_layout_by_default() -> None:
    assert Schedule(name="x", families={Family.ROUTER: FamilySchedule()}).receive_slots == "shared"


def test_verify_rows_count_one_cache_per_row_like_the_kernel() -> None:
    """The kernel has no shared-cache verify mode: 16 verify rows of 4 sequences allocate what 16
    rows do, while the engine's KV pool still models the shared cache."""
    model, plan, _ = k3()
    for schedule in sampled_schedules(4):
        verify = vmem_plan(schedule, model, plan, 16, 4)
        assert verify.total_bytes == vmem_plan(schedule, model, plan, 16).total_bytes
        assert verify.kv_bytes == schedule.kv_buffers * schedule.kv_tile_tokens * 1280 * 4
        assert VmemAccountant(model, plan, 16, 4).plan_for(schedule).total_bytes == verify.total_bytes


@pytest.mark.slow  # lowers K3 TP32 at batch 8 on 32 virtual devices (~15 s, more on a loaded machine)
def test_lower_exits_1_when_the_kernel_does_not_fit(tmp_path) -> None:
    path = tmp_path / "per-message.json"
    path.write_text(load_schedule("published").model_copy(update={"receive_slots": "per_message"}).model_dump_json())
    done = subprocess.run([str(Path(sys.executable).parent / "tpusim"), "lower", "--schedule", str(path), "--batch", "8",
                           "--json"], capture_output=True, text=True, timeout=900, check=False)
    data = json.loads(done.stdout)
    assert done.returncode == 1 and data["lowered"] and not data["fits"]
    assert data["scratch_total_bytes"] == data["accounting_total_bytes"] > data["usable_vmem_bytes"]


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="known gap: the kernel pads each slab row to whole 128-lane rows "
                   "(mlp.gate_up: 2112 columns -> 2176), the accounting's slab_bytes does not; seen only when "
                   "dense_mlp has an arena of its own and is chunked (+61440 bytes at 1 MiB chunks, 2 buffers)")
def test_k3_kernel_scratch_equals_total_bytes_with_a_chunked_dense_mlp_arena() -> None:
    from megakernel.kernel_collectives import CollectiveMegakernel

    model, plan, _ = k3()
    schedule = sampled_schedules(2)[4]  # sample-00000: dense_mlp alone, 1 MiB chunks, 2 buffers
    kernel = CollectiveMegakernel(model, plan, schedule, 8, 1024)
    assert sum(kernel.scratch_bytes().values()) == vmem_plan(schedule, model, plan, 8).total_bytes
