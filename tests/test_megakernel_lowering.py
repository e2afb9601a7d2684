"""The whole kernel lowers for TPU from this CPU machine (Pallas -> Mosaic, a
``tpu_custom_call``), at kimi-k3-mini sizes and at full Kimi K3 per-device sizes of the
TP32 plan built from ``ShapeDtypeStruct``s (nothing allocated), and its VMEM scratch equals
tpusim.schedule.vmem's accounting. Here the TP32 kernel is the one-device build at one
device's widths (collectives omitted, the stand-ins of :mod:`megakernel.dims`), so it is set
beside the accounting without the collective buffers; the kernel with the collectives inside it
lowers on a 32-device mesh in tests/test_megakernel_collectives.py.

Lowering does not run libtpu's Mosaic compiler, so layout/tiling limits surface only on a
real TPU; what this proves is that every op of the kernel has a Mosaic lowering rule.
"""

from __future__ import annotations

import pytest

from hwmodels.units import MIB
from megakernel.dims import model_dims
from megakernel.examples import chunked_schedule, ring_schedule
from megakernel.kernel import Megakernel
from megakernel.tpu_lowering import lower_for_tpu
from tpusim.schedule.schema import load_schedule
from tpusim.schedule.vmem import vmem_plan
from tpusim.workload.model_catalog import load_model, plan_for

# Every test traces and lowers the whole kernel (3-13 s each on the 2-core machine, ~55 s in all).
pytestmark = pytest.mark.slow

TPU_V7_EXPLICIT_VMEM_BYTES = 58 * MIB  # usable explicit scratch on TPU v7 (issue / kimi-k3.md)


@pytest.mark.parametrize("schedule", [load_schedule("published"), chunked_schedule(), ring_schedule()],
                         ids=lambda s: s.name)
def test_lowers_for_tpu_at_kimi_k3_mini_sizes(schedule):
    model = load_model("kimi-k3-mini")
    kernel = Megakernel(model_dims(model, plan_for(model, 1)), schedule, 4, 256)
    assert "tpu_custom_call" in lower_for_tpu(kernel)


# tests/data/sweep-best-k3-b1.json: the schedule `tpusim sweep` chose for K3 on tpu-v7 x16 at
# batch 1 (written by `tpusim demo`; 5.40 ms simulated against published's 5.86 ms).
SWEEP_BEST = "tests/data/sweep-best-k3-b1.json"


# k3-ring: the Muse kernel's shared ring of 12 x 2 MiB banks on K3 (fits 58 MiB at batch 1; at
# batch 8 its three 256-token KV tiles per sequence do not).
@pytest.mark.parametrize(("name", "batch"), [("published", 1), ("published", 8), ("layer-double-buffer", 1),
                                             (SWEEP_BEST, 1), ("k3-ring", 1)])
def test_lowers_for_tpu_at_full_k3_tp32_sizes_and_scratch_matches_vmem_accounting(name, batch):
    model = load_model("kimi-k3")
    plan = plan_for(model, 32)
    schedule = load_schedule(name)
    kernel = Megakernel(model_dims(model, plan), schedule, batch, 1024)
    assert "tpu_custom_call" in lower_for_tpu(kernel)
    scratch = sum(kernel.scratch_bytes().values())
    vmem = vmem_plan(schedule, model, plan, batch)
    assert vmem.collective_bytes > 0  # what this build leaves out
    # the one-device build allocates everything the accounting counts but the collective buffers
    assert scratch == pytest.approx(vmem.total_bytes - vmem.collective_bytes, rel=0.01)
    assert scratch <= TPU_V7_EXPLICIT_VMEM_BYTES
