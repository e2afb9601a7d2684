"""The engine prices the TPU kernel's panel-loop unroll (``ExecutionPolicy.panel_unroll``): the
panels in flight share one MXU round trip, so a product's fixed cost (``dot_overhead_s``) is
divided by them; one panel an iteration is what the probe measured and the default. Kernel
records of different builds stay apart (``ChipRecord.panel_unroll``)."""

from __future__ import annotations

import pytest

from calibration.sources.tpu_chip_records import KERNEL_PATH, load_chip_records
from hwmodels.catalog import load_chip
from hwmodels.overlay import _figure_slot
from hwmodels.schema import Chip
from tpusim.engine import simulate
from tpusim.schedule.schema import load_schedule
from tpusim.workload.model_catalog import load_model, plan_for
from tpusim.workload.program import build_program


def _chip(dot_s: float) -> Chip:
    data = load_chip("tpu-v5e").model_dump(mode="python")
    parent, name = _figure_slot(data, "compute.mxu.dot_overhead_s")
    parent[name] = {**(parent[name] or {"label": "measured", "source": "test"}), "value": dot_s}
    return Chip.model_validate(data)


@pytest.fixture(scope="module")
def program():
    model = load_model("kimi-k3-mini")
    return build_program(model, plan_for(model, 1), batch=1, context_tokens=256)


def _step(program, chip, unroll=None) -> float:
    return simulate(program, load_schedule("published"), chip, check_capacity=False, panel_unroll=unroll).step_s


def test_one_panel_an_iteration_is_the_default(program):
    chip = _chip(2e-6)
    assert _step(program, chip, (1, 1)) == _step(program, chip)


def test_unrolled_panel_loops_pay_less_fixed_cost_and_nothing_without_it(program):
    slow = _chip(2e-6)  # a product's fixed cost far above its pushes: the step is product-bound
    plain, dense, both = _step(program, slow, (1, 1)), _step(program, slow, (4, 1)), _step(program, slow, (4, 2))
    assert both < dense < plain
    free = _chip(0.0)
    assert _step(program, free, (4, 2)) == _step(program, free, (1, 1))


def test_an_unroll_below_one_is_refused(program):
    with pytest.raises(ValueError, match="panel_unroll"):
        _step(program, _chip(1e-7), (0, 1))


def test_kernel_records_of_two_builds_stay_apart():
    records = [r for r in load_chip_records(KERNEL_PATH, decoder="pairs-fold")
               if r.schedule == "published" and r.batch == 1]
    assert {r.panel_unroll for r in records} >= {(1, 1), (4, 2)}
    assert len({r.key for r in records}) == len(records)
